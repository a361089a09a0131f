"""benchmarks/sparse_bwd_bench.py --write-tuned: the file the Triton kernel's backward reads.

The script runs on the CPU under Triton's interpreter at a tiny size (its numbers mean nothing
there); what is checked is the choice and the file: the best median ratio among the settings that
ran and agreed at every point of a block, written so that triton_bsa.load_tuned accepts it.
"""

import importlib.util
import json
import subprocess
import sys

import pytest
from attnbench.kernels import triton_bsa


@pytest.fixture(scope="module")
def bench(repo):
    spec = importlib.util.spec_from_file_location(
        "sparse_bwd_bench", repo / "benchmarks/sparse_bwd_bench.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(block, seqlen, mode, config, ratio=None, tiles=None):
    r = dict(block=block, seqlen=seqlen, density=0.5, heads="64:8", mode=mode, config=config)
    if ratio is not None:
        r.update(ratio=ratio, tiles=tiles or {})
    return r


def test_best_setting_is_the_best_median_among_those_that_ran_everywhere(bench):
    fast = {"dkdv": [128, 64, 8, 3]}
    rows = [
        row(128, 32768, "split", "default", 0.5),
        row(128, 65536, "split", "default", 0.6),
        row(128, 32768, "split", "fast", 1.2, fast),
        row(128, 65536, "split", "fast", 1.1, fast),
        row(128, 32768, "atomic", "faster_once", 2.0),  # failed at 64K: not eligible
        row(128, 65536, "atomic", "faster_once"),
        row(64, 32768, "atomic", "default", 0.7),
    ]
    best = bench.best_settings(rows)
    assert best[128][:3] == ("split", "fast", fast)
    assert sorted(best[128][3]) == [1.1, 1.2]
    assert best[64][:2] == ("atomic", "default")


def test_write_tuned_writes_what_the_kernel_loads(repo, tmp_path):
    out = tmp_path / "tuned.json"
    cmd = [
        sys.executable,
        str(repo / "benchmarks/sparse_bwd_bench.py"),
        *("--device", "cpu", "--dtype", "float32", "--seqlen", "128", "--heads", "2:1"),
        *("--head-dim", "16", "--dense", "sdpa", "--blocks", "64", "--densities", "0.5"),
        *("--modes", "split", "--config", "default", "--config", "dkdv=64x32w4s3"),
        *("--warmup", "0", "--reps", "1", "--write-tuned", str(out)),
    ]
    env = {
        **__import__("os").environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": str(repo / "workflow"),
    }
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["blocks"]) == {"64"} and doc["blocks"]["64"]["mode"] == "split"
    assert doc["blocks"]["64"]["config"] in ("default", "dkdv=64x32w4s3")
    assert doc["measured"]["points"] == [[128, 0.5, "2:1"]]
    tuned = triton_bsa.load_tuned(out)
    assert tuned[64]["mode"] == "split"
    if doc["blocks"]["64"]["config"] != "default":
        assert tuned[64]["dkdv"] == (64, 32, 4, 3)
