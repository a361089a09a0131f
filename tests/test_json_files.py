"""The files a cell reads its spec from (grid.json_files): one per folder of records, so that a
run of 20,000 cells writes a few files before its first job; each cell reads its own entry."""

import pytest
from attnbench.grid.json_files import read_json_arg, spec_file, write_spec_files


def test_the_specs_of_one_folder_share_a_file_and_each_cell_reads_its_own(tmp_path):
    out = tmp_path / "results"
    cells = {
        f"{out}/cells/g/kernel/sdpa/causal/s{n}-fwd.json": {"seqlen": n, "mask": "causal"}
        for n in (128, 256)
    }
    cells[f"{out}/cells/g/kernel/sdpa/full/s128-fwd.json"] = {"seqlen": 128, "mask": "full"}
    assert write_spec_files(out, cells) == 2  # two folders, two files
    assert write_spec_files(out, cells) == 0  # unchanged: nothing written again
    for record, spec in cells.items():
        assert read_json_arg(spec_file(out, record), "--spec") == spec
    cells[f"{out}/cells/g/kernel/sdpa/full/s128-fwd.json"]["seqlen"] = 129
    assert write_spec_files(out, cells) == 1  # only the folder whose spec changed


def test_a_spec_the_file_does_not_hold_is_an_error_naming_the_file(tmp_path):
    out = tmp_path / "results"
    record = f"{out}/cells/g/kernel/sdpa/causal/s128-fwd.json"
    write_spec_files(out, {record: {"seqlen": 128}})
    missing = spec_file(out, record).replace("s128", "s999")
    with pytest.raises(ValueError, match="holds no spec named 's999-fwd.json'"):
        read_json_arg(missing, "--spec")
    with pytest.raises(ValueError, match="not a readable JSON file"):
        read_json_arg(
            spec_file(tmp_path / "elsewhere", f"{tmp_path}/elsewhere/x/y.json"), "--spec"
        )
