"""The record's schema (attnbench.record.schema): a record of each status reads through it and is
written byte-identically; a status with a field it must not carry, or without one it must, and an
unknown status are refused naming the field or the choices; every committed record reads."""

import json
from pathlib import Path

import pytest
from attnbench.record import schema
from attnbench.record.record import CHECKSUM, content_sha256, json_safe, write_record
from attnbench.record.schema import FIELDS_BY_STATUS, SUMMARY, Record, SchemaError
from attnbench.record.validate import read_record, record_problems
from attnbench.report import collect
from attnbench.status import STATUSES, Status

REPO = Path(__file__).resolve().parents[1]
# A committed record (written before records had a checksum or a schema module).
OLD = (
    REPO
    / "results/h100/cells/h100_calibration/kernel/sdpa_cudnn/full/s16384-h64x8-d128-bfloat16-fwd.json"
)


def old_record() -> dict:
    return json.loads(OLD.read_text())


def of_status(status: str) -> dict:
    """The committed ok record as a record of `status` would be: its summary where the status
    carries one, the fields of its status where it has some."""
    r = old_record()
    if not FIELDS_BY_STATUS[Status(status)].allows("tflops"):
        for key in SUMMARY:
            r.pop(key, None)
    r["status"] = status
    if status == "incorrect":  # its check failed (record.validate reads it from the samples)
        for sample in r["samples"]:
            sample.get("check", {})["passed"] = False
        r["check_passed"] = False
    if status == "timeout":
        r["time_budget_s"] = 600
    if status == "crashed":
        r["crash"] = {"how": "was killed by signal 9 (SIGKILL)", "log_tail": ["a line"]}
    return r


def test_a_status_is_its_plain_string_in_every_text_output():
    assert json.dumps({"status": Status.OK}) == '{"status": "ok"}'
    assert str(Status.OOM) == f"{Status.OOM}" == "%s" % Status.OOM == "oom"
    assert Status.OK == "ok" and "ok" in STATUSES and Status("crashed") is Status.CRASHED
    assert set(FIELDS_BY_STATUS) == set(Status)


def test_an_old_record_reads_and_gives_back_its_bytes():
    text = OLD.read_text()
    record = Record.from_dict(json.loads(text))
    assert record.status is Status.OK and record.timed and record.cell["impl"] == "sdpa_cudnn"
    assert record.numbers["tflops"] == json.loads(text)["tflops"]
    assert json.dumps(record.to_dict(), indent=1) + "\n" == text


@pytest.mark.parametrize("status", STATUSES)
def test_a_record_of_each_status_is_written_and_read_byte_identically(tmp_path, status):
    r = of_status(status)
    assert Record.from_dict(r).to_dict() == r
    path = tmp_path / "r.json"
    write_record(r, path)
    # exactly what the writer wrote before it checked the schema
    signed = {**json_safe(r), CHECKSUM: content_sha256(r)}
    assert path.read_text() == json.dumps(signed, indent=1, allow_nan=False) + "\n"
    assert read_record(path) == signed


@pytest.mark.parametrize(
    "status, edit, why",
    [
        (
            "unsupported",
            {"tflops": 1.0},
            "with tflops, which only ok, incorrect, implausible carry",
        ),
        (
            "oom",
            {"peak_mem_bytes": 10},
            "with peak_mem_bytes, which only ok, incorrect, implausible",
        ),
        (
            "timeout",
            {"crash": {"how": "x"}},
            "status 'timeout' with crash, which only crashed carry",
        ),
        ("crashed", {"time_budget_s": 5}, "with time_budget_s, which only timeout carry"),
        ("ok", {"flops": None}, "status 'ok' without flops, which it carries"),
        ("implausible", {"tflops_p80": None}, "without tflops_p80"),
        ("ok", {"time_ms_p20": "fast"}, "time_ms_p20 is 'fast', not a number"),
        ("ok", {"status": "hung"}, "status 'hung' is none of " + ", ".join(STATUSES)),
    ],
)
def test_a_field_its_status_does_not_carry_is_refused_naming_it(tmp_path, status, edit, why):
    r = {**of_status(status), **edit}
    with pytest.raises(SchemaError) as e:
        Record.from_dict(r)
    assert any(why in p for p in e.value.problems), e.value.problems
    assert any(why in p for p in record_problems(r))
    path = tmp_path / "r.json"
    with pytest.raises(SchemaError, match=f"{path}: not written"):
        write_record(r, path)
    assert not path.exists()


def test_every_problem_is_named_in_one_pass():
    r = {**of_status("unavailable"), "tflops": -1.0, "crash": {}}
    problems = schema.schema_problems(r)
    assert len(problems) == 3, problems
    assert "tflops is -1.0, not a finite number >= 0" in problems


def test_one_vocabulary_of_numbers():
    assert collect.TIMINGS is schema.TIMINGS  # the tables' columns are the schema's numbers
    assert set(schema.TIMINGS) | set(schema.MEMORY) <= set(schema.NUMBERS) <= set(SUMMARY)


def committed_records():
    for path in sorted(REPO.glob("results/**/*.json")):
        parts = path.relative_to(REPO).parts
        if ".attnbench" in parts:  # a run's spec files (make run's too), not records
            continue
        if "cells" in parts:
            yield str(path), json.loads(path.read_text())
        elif "points" in parts:
            yield from json.loads(path.read_text())["records"].items()


def test_every_committed_record_reads_through_the_schema():
    records = dict(committed_records())
    assert len(records) > 3000
    refused = {p: record_problems(r) for p, r in records.items()}
    assert not {p: why for p, why in refused.items() if why}
    assert all(Record.from_dict(r).to_dict() == r for r in records.values())


def test_a_window_the_host_fell_behind_marks_its_record(tmp_path):
    """A sample whose timed window the host had not queued ahead of the GPU (harness.measure:
    queued_ahead false) makes its record say host_waited; the record still reads and is
    written through the schema; an unavailable record refuses the field, as any summary field."""
    from attnbench.record.record import summarise

    r = old_record()
    for sample in r["samples"]:
        sample["queued_ahead"] = True
    summarise(r, None)
    assert r["host_waited"] is False
    r["samples"][1]["queued_ahead"] = False
    summarise(r, None)
    assert r["host_waited"] is True
    write_record(r, tmp_path / "r.json")
    assert read_record(tmp_path / "r.json")["host_waited"] is True
    before = old_record()  # records from before the check: no field, nothing claimed
    summarise(before, None)
    assert before["host_waited"] is None
    assert any(
        "host_waited" in p
        for p in record_problems({**of_status("unavailable"), "host_waited": True})
    )
