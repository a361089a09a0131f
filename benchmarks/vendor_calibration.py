"""The vendors' own attention benchmarks, run as their authors ship them, and read back.

Two benchmarks, each run unchanged from its repository:
- cudnn-frontend's `benchmark/sdpa_benchmark_training/benchmark_single_sdpa.py`, once per case,
  with the llama preset of NVIDIA's published H200 results (GQA 64:8, head dim 128, bf16, batch 1,
  `top_left` = causal and `no_mask`, forward and backward, 10 iterations, their default of no
  warm-up) on each backend installed here: `cudnn` (the frontend's graph API), `pyt_cudnn` (SDPA's
  cuDNN backend: our `sdpa_cudnn`), `flash_attention` (FA2), `flash_attention_3`,
  `flash_attention_4`. It times the kernels' device time with torch's profiler (kineto), the L2
  flushed before every call. `--format_output` makes it print one CSV line per case.
- FlashAttention's `benchmarks/benchmark_attn.py` (fa2, fa3, cudnn, fa4 where installed), which
  times with `triton.testing.do_bench` (calls back to back, L2 flushed between them). It imports
  `flash_attn.cute.bench_utils`, which only FA4's package carries; where FA4 is not installed
  the file of the same commit is loaded under that name (`--fa-bench-utils`).

    python benchmarks/vendor_calibration.py run --vendor DIR --out DIR [--seqlens 8192,16384,32768]
    python benchmarks/vendor_calibration.py make-source --cudnn-frontend GIT_DIR --flash-attention GIT_DIR \
        --out .src/vendor_bench.tar.gz

`make-source` writes the tarball the GPU machine unpacks (it has no network): the two benchmarks'
files at pinned commits, with a note of where they came from. `run` writes into `--out`:
`cudnn_frontend.csv` (their CSV lines, one per backend, mask and length), `fa_benchmark_attn.txt`
(their printed tables), `nvidia_smi.txt` (clocks and power before and after) and `vendor_runs.json`
(what ran, with each command's exit status and seconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

# What each vendor file is and where it is taken from (repository path at a pinned commit).
CUDNN_FRONTEND_COMMIT = "3929da2ef4c1dba1bb8acb68727b9134f26f40c0"  # 2026-05-08
CUDNN_FRONTEND_PATHS = ("benchmark/sdpa_benchmark_training", "LICENSE.txt")
FLASH_ATTENTION_COMMIT = (
    "0251105a2fb19d2957484b7f023cd8c115286ced"  # 2026-08-15 (FA3's build commit)
)
FLASH_ATTENTION_PATHS = (
    "benchmarks/benchmark_attn.py",
    "flash_attn/cute/bench_utils.py",
    "LICENSE",
)

# cudnn-frontend's backend names, and the module each needs
CUDNN_FRONTEND_BACKENDS = {
    "cudnn": "cudnn",
    "pyt_cudnn": "torch",
    "flash_attention": "flash_attn",
    "flash_attention_3": "flash_attn_interface",
    "flash_attention_4": "flash_attn.cute.interface",
}
# benchmark_attn.py's backend names, and the module each needs
FA_BACKENDS = {
    "fa2": "flash_attn",
    "fa3": "flash_attn_interface",
    "cudnn": "cudnn",
    "fa4": "flash_attn.cute.interface",
}
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 128  # the llama preset of NVIDIA's published H200 CSV


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def make_source(args: argparse.Namespace) -> None:
    """The vendor files at their commits, as one tarball (git archive of each repository)."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_suffix(".staging")
    subprocess.run(["rm", "-rf", str(staging)], check=True)
    for name, git_dir, commit, paths in (
        ("cudnn-frontend", args.cudnn_frontend, CUDNN_FRONTEND_COMMIT, CUDNN_FRONTEND_PATHS),
        ("flash-attention", args.flash_attention, FLASH_ATTENTION_COMMIT, FLASH_ATTENTION_PATHS),
    ):
        dest = staging / name
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "--git-dir", git_dir, "archive", "--format=tar", commit, *paths],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "xf", "-", "-C", str(dest)], input=archive, check=True)
        (dest / "ATTNBENCH_SOURCE").write_text(f"{name} {commit}: {' '.join(paths)}\n")
    with tarfile.open(out, "w:gz") as tar:
        tar.add(staging, arcname="vendor_bench")
    subprocess.run(["rm", "-rf", str(staging)], check=True)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def nvidia_smi(out: Path, when: str) -> None:
    query = "name,uuid,driver_version,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active"
    text = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True
    ).stdout
    with open(out / "nvidia_smi.txt", "a") as f:
        f.write(f"# {when} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n{text}")


def run_logged(
    cmd: list[str], env: dict, log: list, timeout: float
) -> subprocess.CompletedProcess:
    t0 = time.time()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        done = subprocess.CompletedProcess(cmd, 124, e.stdout or "", e.stderr or "")
    log.append({"cmd": cmd, "rc": done.returncode, "seconds": round(time.time() - t0, 1)})
    return done


def run_cudnn_frontend(
    vendor: Path, out: Path, seqlens: list[int], env: dict, log: list, deadline: float
) -> None:
    script = vendor / "cudnn-frontend/benchmark/sdpa_benchmark_training/benchmark_single_sdpa.py"
    backends = [b for b, module in CUDNN_FRONTEND_BACKENDS.items() if installed(module)]
    with (
        open(out / "cudnn_frontend.csv", "a") as csv,
        open(out / "cudnn_frontend.err", "a") as err,
    ):
        for seqlen in seqlens:
            for mask in ("top_left", "no_mask"):
                for backend in backends:
                    if time.time() > deadline:
                        return
                    cmd = [
                        sys.executable,
                        str(script),
                        "--batch_size",
                        "1",
                        "--q_seqlen",
                        str(seqlen),
                        "--kv_seqlen",
                        str(seqlen),
                        "--num_q_heads",
                        str(HEADS),
                        "--num_kv_heads",
                        str(KV_HEADS),
                        "--head_dim",
                        str(HEAD_DIM),
                        "--data_type",
                        "bfloat16",
                        "--num_iterations",
                        "10",
                        "--attn_mask",
                        mask,
                        "--sdpa_backend",
                        backend,
                        "--fwd_bwd",
                        "--format_output",
                        "--skip_ref",
                        "--case_tag",
                        mask,
                    ]
                    done = run_logged(cmd, env, log, timeout=240)
                    lines = [
                        ln
                        for ln in done.stdout.splitlines()
                        if ln.startswith(f"{mask},{backend},")
                    ]
                    csv.write("".join(ln + "\n" for ln in lines))
                    if done.returncode or not lines:
                        err.write(
                            f"## {' '.join(cmd[2:])}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}\n"
                        )


def run_fa_benchmark(
    vendor: Path, out: Path, seqlens: list[int], env: dict, log: list, deadline: float
) -> None:
    root = vendor / "flash-attention"
    backends = [b for b, module in FA_BACKENDS.items() if installed(module)]
    env = dict(env)
    shim = out / "fa_shim"
    if not installed("flash_attn.cute.interface"):
        # only FA4's package has flash_attn.cute.bench_utils: the same commit's file under that name
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(
            "import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('flash_attn.cute.bench_utils', {str(root / 'flash_attn/cute/bench_utils.py')!r})\n"
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
            "sys.modules['flash_attn.cute.bench_utils'] = module\n"
        )
        env["PYTHONPATH"] = f"{shim}:{env.get('PYTHONPATH', '')}"
    with open(out / "fa_benchmark_attn.txt", "a") as f:
        for causal in ("true", "false"):
            if time.time() > deadline:
                return
            cmd = [
                sys.executable,
                str(root / "benchmarks/benchmark_attn.py"),
                "--backend",
                ",".join(backends),
                "--seqlen",
                ",".join(map(str, seqlens)),
                "--batch-size",
                "1",
                "--nheads",
                str(HEADS),
                "--nheads-kv",
                str(KV_HEADS),
                "--headdim",
                str(HEAD_DIM),
                "--causal",
                causal,
                "--fwd",
                "--bwd",
            ]  # without them it times the forward only
            done = run_logged(cmd, env, log, timeout=max(30.0, deadline - time.time()))
            f.write(
                f"## {' '.join(cmd[2:])}: exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}\n"
            )


def run(args: argparse.Namespace) -> None:
    vendor, out = Path(args.vendor), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seqlens = [int(s) for s in args.seqlens.split(",")]
    env = dict(os.environ)
    log: list = []
    deadline = time.time() + args.budget_s
    nvidia_smi(out, "before")
    if "cudnn" in args.which:
        run_cudnn_frontend(vendor, out, seqlens, env, log, deadline)
    if "fa" in args.which:
        run_fa_benchmark(vendor, out, seqlens, env, log, deadline)
    nvidia_smi(out, "after")
    (out / "vendor_runs.json").write_text(json.dumps(log, indent=1))
    print(f"{len(log)} vendor commands, {sum(e['rc'] != 0 for e in log)} failed; outputs in {out}")


def idle_vs_settled(args: argparse.Namespace) -> None:
    """The same call timed three ways on this GPU, to tell a difference of clocks from one of
    timing: the harness (settled clocks, device time), do_bench as FlashAttention's benchmark
    calls it (a 1 s sleep first, warmup 5, rep 10 ms), and cudnn-frontend's way (a fresh start,
    10 calls, no warm-up, each timed alone). Prints one line per case with each median."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from attnbench.harness.measure import L2Flush, time_gpu_call
    from triton.testing import do_bench

    def call(kernel, seqlen, direction):
        g = torch.Generator(device="cuda").manual_seed(0)

        def mk(h):
            return torch.randn(
                1, seqlen, h, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16
            )

        q, k, v = (
            x.requires_grad_(direction == "bwd") for x in (mk(HEADS), mk(KV_HEADS), mk(KV_HEADS))
        )
        if kernel == "sdpa_cudnn":

            def fwd():
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(
                        q.transpose(1, 2),
                        k.transpose(1, 2),
                        v.transpose(1, 2),
                        is_causal=True,
                        enable_gqa=True,
                    ).transpose(1, 2)
        elif kernel == "fa3":
            import flash_attn_interface

            def fwd():
                out = flash_attn_interface.flash_attn_func(q, k, v, causal=True)
                return out[0] if isinstance(out, tuple) else out
        else:
            import flash_attn

            def fwd():
                return flash_attn.flash_attn_func(q, k, v, causal=True)

        if direction == "fwd":
            return lambda: fwd().detach()
        out, dout = (
            fwd(),
            torch.randn(1, seqlen, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
        )
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    flush = L2Flush("cuda")
    for kernel in args.kernels.split(","):
        for seqlen in (int(s) for s in args.seqlens.split(",")):
            for direction in ("fwd", "bwd"):
                fn = call(kernel, seqlen, direction)
                time.sleep(2.0)  # idle, as between two of the vendors' cases
                cold = []
                for _ in range(10):  # cudnn-frontend's way: no warm-up, each call alone
                    flush()
                    s, e = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    cold.append(s.elapsed_time(e))
                time.sleep(1.0)  # FlashAttention's benchmark sleeps 1 s before each do_bench
                fa_way = do_bench(fn, warmup=5, rep=10)
                settled = float(
                    np.median(time_gpu_call(fn, warmup=5, reps=20, device="cuda").device_ms)
                )
                print(
                    f"{kernel} causal {seqlen} {direction}: settled {settled:.3f} ms, after 1 s idle (do_bench "
                    f"warmup 5 rep 10) {fa_way:.3f} ms ({fa_way / settled:.3f}), cold 10 calls {np.median(cold):.3f} ms "
                    f"({np.median(cold) / settled:.3f})",
                    flush=True,
                )


# Which of our kernels each vendor backend is, and how it calls the library: the same call path,
# or another entry to the same kernels (cuDNN's frontend graph against SDPA's cuDNN backend).
PAIRS = (
    ("sdpa_cudnn", "cudnn-frontend", "pyt_cudnn", "same call: SDPA's cuDNN backend"),
    ("sdpa_cudnn", "cudnn-frontend", "cudnn", "cuDNN through its frontend's graph API"),
    ("sdpa_cudnn", "flash-attention", "cuDNN", "cuDNN through its frontend's graph API"),
    ("fa2", "flash-attention", "FA2", "same call: flash_attn_func"),
    ("fa3", "flash-attention", "FA3", "same call: flash_attn_interface.flash_attn_func"),
    ("fa3_twin", "flash-attention", "FA3", "same call: flash_attn_interface.flash_attn_func"),
)
MASKS = {"top_left": "causal", "no_mask": "full", "True": "causal", "False": "full"}


def read_cudnn_frontend(path: Path) -> dict:
    """(backend, mask, S, direction) -> ms from cudnn-frontend's CSV lines."""
    out = {}
    for line in path.read_text().splitlines():
        f = line.split(",")
        if len(f) < 10:
            continue
        mask, backend, seqlen = MASKS[f[0]], f[1], int(f[3])
        out[(backend, mask, seqlen, "fwd")] = float(f[8])
        out[(backend, mask, seqlen, "bwd")] = float(f[9])
    return out


def read_fa_benchmark(path: Path) -> dict:
    """(backend, mask, S, direction) -> ms from benchmark_attn.py's printed tables."""
    out, direction, names = {}, None, []
    for line in path.read_text().splitlines():
        words = line.split()
        if line.strip().startswith(("FWD", "BWD")):
            direction = words[0].lower()
        elif words[:4] == ["hdim", "causal", "batch", "seqlen"]:
            names = words[4:]
        elif direction and names and len(words) == 4 + len(names) and words[0].isdigit():
            for name, cell in zip(names, words[4:]):
                if "/" in cell:
                    out[(name, MASKS[words[1]], int(words[3]), direction)] = float(
                        cell.split("/")[0]
                    )
    return out


def compare(args: argparse.Namespace) -> None:
    """Our records beside the vendors' numbers from the same session: a Markdown table."""
    import numpy as np
    import pandas as pd

    cells = pd.read_csv(args.cells)
    samples = pd.read_csv(Path(args.cells).with_name("samples.csv"))
    cells = cells[(cells.grid == args.grid) & (cells.status == "ok")]
    vendor = Path(args.vendor)
    theirs = {
        "cudnn-frontend": read_cudnn_frontend(vendor / "cudnn_frontend.csv"),
        "flash-attention": read_fa_benchmark(vendor / "fa_benchmark_attn.txt"),
    }
    lines = [
        "| kernel | mask | S | dir | ours ms (draws) | SM MHz | benchmark: backend | theirs ms | ours / theirs | call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for _, c in cells.sort_values(["impl", "mask", "seqlen", "direction"]).iterrows():
        per_draw = samples[(samples.cell_id == c.cell_id)].time_ms_median
        ours = float(np.median(per_draw))
        for impl, bench, backend, call in PAIRS:
            if impl != c.impl or (backend, c["mask"], c.seqlen, c.direction) not in theirs[bench]:
                continue
            ms = theirs[bench][(backend, c["mask"], c.seqlen, c.direction)]
            ratios.append(ours / ms)
            lines.append(
                f"| {c.impl} | {c['mask']} | {c.seqlen // 1024}K | {c.direction} | {ours:.3f} "
                f"({per_draw.min():.3f}-{per_draw.max():.3f}, {len(per_draw)}) | {c.sm_clock_mhz:.0f} | "
                f"{bench}: {backend} | {ms:.3f} | {ours / ms:.3f} | {call} |"
            )
    within = sum(abs(r - 1) <= 0.03 for r in ratios)
    lines.append("")
    lines.append(
        f"{within} of {len(ratios)} within 3%; ours / theirs {min(ratios):.3f}-{max(ratios):.3f}, "
        f"median {np.median(ratios):.3f}."
    )
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    src = sub.add_parser(
        "make-source", help="the vendor files at their commits, as a tarball for the GPU machine"
    )
    src.add_argument("--cudnn-frontend", required=True, help="git dir of NVIDIA/cudnn-frontend")
    src.add_argument(
        "--flash-attention", required=True, help="git dir of Dao-AILab/flash-attention"
    )
    src.add_argument("--out", required=True, help="the tarball to write")
    go = sub.add_parser("run", help="run the vendors' benchmarks on this GPU")
    go.add_argument("--vendor", required=True, help="the unpacked tarball's vendor_bench folder")
    go.add_argument("--out", required=True, help="where their outputs go")
    go.add_argument(
        "--seqlens", default="8192,16384,32768", help="comma-separated sequence lengths"
    )
    go.add_argument(
        "--which",
        default="cudnn,fa",
        help="cudnn (cudnn-frontend's), fa (FlashAttention's), or both",
    )
    go.add_argument(
        "--budget-s",
        type=float,
        default=480,
        help="stop starting new commands after this many seconds",
    )
    idle = sub.add_parser(
        "idle-vs-settled",
        help="one call timed settled, after idle (FA's way) and cold (cuDNN's way)",
    )
    idle.add_argument("--kernels", default="sdpa_cudnn,fa3,fa2")
    idle.add_argument("--seqlens", default="16384,32768")
    cmp = sub.add_parser(
        "compare", help="our records beside the vendors' numbers, as a Markdown table"
    )
    cmp.add_argument("--cells", required=True, help="our tidy table (samples.csv beside it)")
    cmp.add_argument("--grid", default="h100_calibration")
    cmp.add_argument("--vendor", required=True, help="the folder `run` wrote in the same session")
    cmp.add_argument("--out", help="the Markdown file to write (default: print)")
    args = parser.parse_args()
    commands = {
        "make-source": make_source,
        "run": run,
        "idle-vs-settled": idle_vs_settled,
        "compare": compare,
    }
    commands[args.command](args)


if __name__ == "__main__":
    main()
