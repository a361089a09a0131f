"""Every method x mask x degrees on 1, 2, 3 and 4 real processes (gloo), forward and backward,
against the float64 reference on every rank; counted bytes against the schedule's formula.

One torchrun per world size runs the whole matrix (attnbench.cp.verify) in one process group.
"""

import pytest
from attnbench.cp import catalog
from attnbench.cp.layout import ShardLayout
from attnbench.masks import CP_MASKS
from commands import VERIFY_HEADS, cp_verify

HQ, HKV = VERIFY_HEADS  # GQA; Ulysses at 4 ranks replicates the 2 KV heads
D = 16  # attnbench.cp.verify's default head dim


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def matrix(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"w{world}") / "verify.jsonl"
    return world, cp_verify(world, out, timeout=420)


def expected_unsupported(row) -> bool:
    u = row["degrees"]["ulysses"]
    return u > 1 and catalog.head_split_reason(u, HQ, HKV) is not None


def test_every_case_is_correct_or_says_why_not(matrix):
    world, rows = matrix
    for r in rows:
        what = f"{r['method']} {r['degrees']} {r['mask']} {r['local_kernel']}"
        if expected_unsupported(r):
            assert (
                r["status"] == "unsupported" and "does not divide the 8 query heads" in r["reason"]
            ), what
            continue
        assert r["status"] == "ok", f"{what}: {r.get('reason') or r.get('errors')}"
        assert r["passed"] and r["every_row_once"] and r["backward"], what
        assert set(r["errors"]) == {"out", "lse", "dq", "dk", "dv"}
        for errs, tol in zip(r["rank_errors"], r["tolerance"]):  # every rank within tolerance
            assert all(errs[n] <= tol[n] for n in errs), what


def test_the_matrix_covers_every_method_mask_and_local_kernel(matrix):
    world, rows = matrix
    ok = [r for r in rows if r["status"] == "ok"]
    methods = {"ulysses", "ring_p2p", "ring_allgather", "usp", "loongtrain"}
    for m in methods - ({"ulysses"} if world == 3 else set()):
        assert {r["mask"] for r in ok if r["method"] == m} == set(CP_MASKS), m
        assert {r["local_kernel"] for r in ok if r["method"] == m} == {"math", "cpu_flash"}
    assert all(r["seqlen"] % (2 * world) for r in rows)  # the sequence itself needs padding
    docs = [r for r in ok if r["doc_lengths"]]
    assert any(any(n % (2 * world) for n in r["doc_lengths"]) for r in docs)
    if world == 4:
        two_d = {
            (r["method"], r["degrees"]["placement"]) for r in ok if r["degrees"]["ulysses"] == 2
        }
        assert two_d == {(m, p) for m in ("usp", "loongtrain") for p in ("contiguous", "strided")}
        assert any(r["method"] == "loongtrain" and r["degrees"]["windows"] == 2 for r in ok)
        assert any(
            r["method"] == "ulysses" and r["degrees"]["ulysses"] == 4 for r in ok
        )  # U > Hkv: replicated
    if world == 3:
        assert {r["method"] for r in rows if r["status"] == "unsupported"} == {
            "ulysses",
            "usp",
            "loongtrain",
        }


def test_counted_bytes_equal_the_analytic_volume(matrix):
    world, rows = matrix
    for r in (r for r in rows if r["status"] == "ok"):
        assert r["bytes_match_analytic"], (r["method"], r["degrees"], r["bytes"])
        if world == 1 or (ring_local(r) and r["degrees"]["ulysses"] == 1):
            assert all(b["sent"] == 0 for b in r["bytes"])
        elif r["method"] in ("ring_p2p", "ring_allgather") or r["degrees"]["ulysses"] > 1:
            assert all(b["sent"] > 0 for b in r["bytes"])


def ring_local(row) -> bool:
    """Every document of the case whole on one ring rank (split_documents as_needed)."""
    if row["split_documents"] == "all" or not row["doc_lengths"]:
        return False
    deg = row["degrees"]
    return ShardLayout(row["doc_lengths"], deg["ring"], deg["ulysses"], "as_needed").ring_local


def padded_tokens(doc_lengths, seqlen, ring):
    """Every document is padded to a multiple of 2R before the zigzag split (Sharding, in
    docs/context-parallelism.md)."""
    return sum(-(-n // (2 * ring)) * 2 * ring for n in (doc_lengths or [seqlen]))


def test_ring_bytes_are_the_papers_volume(matrix):
    """Per rank, in bytes (float32 data and accumulators here, K and V each Hkv x D per token):
    Ring P2P sends (R-1) KV shards forward and (R-1) KV + (R-1) dKV shards backward, whatever the mask;
    Ring AllGather's ring all-gather sends (R-1) shards of K and V per gather (forward, and again
    backward) and its reduce-scatter (R-1) shards of dK, dV. Written from the spec, not from the code."""
    world, rows = matrix
    checked = set()
    for r in rows:
        if (
            r["status"] != "ok"
            or r["method"] not in ("ring_p2p", "ring_allgather")
            or r["degrees"]["ulysses"] != 1
            or r["split_documents"] != "all"  # the zigzag's volume: test below for as_needed
        ):
            continue
        ring = r["degrees"]["ring"]
        assert r["dtype"] == "float32" and r["backward"]
        kv_shard = 2 * padded_tokens(r["doc_lengths"], r["seqlen"], ring) // ring * HKV * D * 4
        expected = (ring - 1) * kv_shard * 3  # fwd KV, bwd KV, bwd dKV (both methods, fp32 dKV)
        assert all(b["sent"] == b["received"] == expected for b in r["bytes"]), (
            r["method"],
            r["mask"],
            r["bytes"],
        )
        checked.add(r["method"])
    assert checked == {"ring_p2p", "ring_allgather"}


def test_documents_split_as_needed_are_checked_cut_and_whole(matrix):
    """split_documents as_needed: the ring methods over both document masks, with some
    documents cut (odd lengths) and with none (short documents: the ring is local and moves
    nothing; USP and LoongTrain still move their Ulysses all-to-alls)."""
    world, rows = matrix
    mine = [r for r in rows if r["split_documents"] == "as_needed" and r["status"] == "ok"]
    if world == 1:
        assert not mine
        return
    methods = {"ring_p2p", "ring_allgather"} | ({"usp", "loongtrain"} if world == 4 else set())
    for m in methods:
        cases = [r for r in mine if r["method"] == m]
        assert {"full_document", "causal_document"} <= {r["mask"] for r in cases}, m
        local = [r for r in cases if ring_local(r)]
        assert local and len(local) < len(cases), m  # both kinds of layout
        for r in local:
            sent = [b["by_kind"] for b in r["bytes"]]
            assert all(set(k) <= {"ulysses"} for k in sent), (m, r["mask"], sent)
            if m.startswith("ring"):
                assert all(b["sent"] == 0 for b in r["bytes"])


def test_ranks_compute_exactly_the_mask(matrix):
    """The visible pairs all ranks compute add up to the mask's area x query heads: padding never
    counts and no pair is computed twice."""
    _, rows = matrix
    for r in (r for r in rows if r["status"] == "ok"):
        assert r["work_pairs_total"] == r["mask_area_all_heads"] * HQ, (r["method"], r["mask"])


def test_mha_and_the_flex_local_kernel(tmp_path):
    """MHA (4:4, so Ulysses splits KV heads 2 per rank) with cpu_flash forward and backward, and
    FlexAttention (eager on the CPU, forward only there) under the same methods."""
    kernels = ["--kernels", "cpu_flash", "flex"]
    methods = ["--methods", "ulysses", "ring_p2p", "ring_allgather", "usp"]
    masks = ["--masks", "full_document", "causal_document_long"]
    # a second --heads replaces cp_verify's
    mha = ["--heads", "4:4", *kernels, *methods, *masks, "--split-documents", "all"]
    rows = cp_verify(2, tmp_path / "verify.jsonl", *mha, timeout=420)
    assert len(rows) == 5 * 2 * 2 and all(r["status"] == "ok" for r in rows), [
        r for r in rows if r["status"] != "ok"
    ]
    assert all(r["backward"] == (r["local_kernel"] == "cpu_flash") for r in rows)
    assert all(r["bytes_match_analytic"] for r in rows)


def test_dkv_sent_in_bf16_halves_the_ring_dkv_bytes_and_stays_within_the_gate(tmp_path):
    """cp.dkv_comm_dtype input with bfloat16 inputs: dK/dV travel every ring (inner and LoongTrain's
    outer one) in bf16, summed in float32 on each rank; the ring's dK/dV bytes are then half its KV
    bytes (KV travels forward and backward, dK/dV once), every case passes the float64 gate, and
    the methods without a ring say so."""
    bf16 = ["--dtype", "bfloat16", "--dkv-comm-dtype", "input", "--kernels", "cpu_flash"]
    bf16 += ["--split-documents", "all"]
    cases = ["--methods", "ring_p2p", "usp", "loongtrain", "--masks", "full", "causal_document"]
    rows = cp_verify(4, tmp_path / "verify.jsonl", *bf16, *cases, timeout=420)
    ringed = [r for r in rows if r["degrees"]["ring"] > 1]
    assert ringed and all(r["status"] == "ok" and r["passed"] for r in ringed), ringed
    assert any(r["degrees"]["windows"] == 2 for r in ringed)  # LoongTrain's outer dK/dV ring too
    for r in ringed:
        assert r["bytes_match_analytic"], r["bytes"]
        assert all(2 * b["by_kind"]["ring_dkv"] == b["by_kind"]["ring_kv"] for b in r["bytes"])
    rest = [r for r in rows if r["degrees"]["ring"] == 1]
    assert rest and all(
        r["status"] == "unsupported" and "sends no dK/dV around a ring" in r["reason"]
        for r in rest
    )
