"""The environment fingerprint every record carries (docs/measurement.md)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from ..kernels.catalog import KERNELS
from ..kernels.libraries import all_library_versions, own_kernel_files

REPO = Path(__file__).resolve().parents[3]


def _run(cmd) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Instruction-set extensions that decide which CPU kernels torch (and SDPA's CPU flash) can use.
CPU_ISA = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_tile",
    "asimd",
    "sve",
)


@functools.cache
def cpu_facts() -> dict:
    """The CPU in full, from /proc/cpuinfo (where the model name alone can be a hypervisor's
    'AMD EPYC'): vendor, model name, family, model, stepping, microcode, cache, sockets, cores
    and logical CPUs, and the instruction-set extensions of CPU_ISA it has; `platform`'s
    machine and processor where /proc/cpuinfo is missing."""
    first, sockets, flags = {}, set(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for block in f.read().strip().split("\n\n"):
                entry = dict(
                    (k.strip(), v.strip())
                    for k, _, v in (line.partition(":") for line in block.splitlines())
                )
                first = first or entry
                sockets.add(entry.get("physical id"))
                flags |= set((entry.get("flags") or entry.get("Features") or "").split())
    except OSError:
        return {"model_name": cpu_model(), "machine": platform.machine()}
    keys = {
        "vendor": "vendor_id",
        "model_name": "model name",
        "family": "cpu family",
        "model": "model",
        "stepping": "stepping",
        "microcode": "microcode",
        "cache": "cache size",
        "cores_per_socket": "cpu cores",
    }
    out = {k: first[v] for k, v in keys.items() if v in first}
    out.update(
        model_name=out.get("model_name") or cpu_model(),
        machine=platform.machine(),
        sockets=len(sockets - {None}) or None,
        logical_cpus=os.cpu_count(),
        isa=[x for x in CPU_ISA if x in flags],
    )
    return out


@functools.cache
def git_state() -> dict:
    """The checkout's commit. Where the tree was copied (a remote GPU machine, without .git or with
    an older copy of the history), ATTNBENCH_GIT_COMMIT / ATTNBENCH_GIT_DIRTY say what it was
    copied from, and win: the copier knows what it copied."""
    env_commit, env_dirty = (os.environ.get(f"ATTNBENCH_GIT_{k}") for k in ("COMMIT", "DIRTY"))
    if env_commit:
        return {
            "git_commit": env_commit,
            "git_dirty": None if env_dirty is None else env_dirty == "1",
        }
    commit = _run(["git", "rev-parse", "HEAD"])
    if commit:
        dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
        return {"git_commit": commit, "git_dirty": None if dirty is None else bool(dirty)}
    return {"git_commit": "unknown", "git_dirty": None}


# The files whose content decides what a cell computes: the package, the rules, the schemas and the
# pinned environments. Results, tests and config.yaml are not code (the cell's config is hashed apart).
CODE_FILES = (
    "Snakefile",
    "pyproject.toml",
    "envs/*",
    "workflow/attnbench/**/*.py",
    "workflow/**/*.smk",
    "workflow/schemas/*",
    "workflow/scripts/**/*",
)


def code_files(root: Path) -> list[Path]:
    found = {
        p
        for pattern in CODE_FILES
        for p in root.glob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    }
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def tree_sha256(root: Path) -> dict:
    """sha256 over the sorted relative paths and bytes of the code files under `root`, read from
    the files themselves: it names the code that ran even where git's history is behind the tree
    (a GPU machine receives a copied working tree with an older .git). Each path and content is
    length-prefixed, so no two different trees give the same byte stream."""
    digest = hashlib.sha256()
    files = code_files(root)
    for path in files:
        for part in (path.relative_to(root).as_posix().encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return {"code_sha256": digest.hexdigest(), "code_files": len(files)}


@functools.cache
def code_hash() -> dict:
    """This checkout's code hash, computed once per process (a few ms)."""
    return tree_sha256(REPO)


def file_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_view(files) -> str | None:
    """What git says of these files of the checkout: 'untracked', 'modified' (against HEAD) or
    'clean'; None where git cannot say (no git, or a copied tree: ATTNBENCH_GIT_COMMIT)."""
    if os.environ.get("ATTNBENCH_GIT_COMMIT"):
        return None
    rel = [str(Path(f).relative_to(REPO)) for f in files]
    out = _run(["git", "status", "--porcelain", "--untracked-files=all", "--", *rel])
    if out is None:
        return None
    states = {line[:2] for line in out.splitlines()}
    return "untracked" if "??" in states else "modified" if states else "clean"


def own_kernel_source(entry: str) -> dict:
    """Your own kernel ('module:Class') as it ran: its module, class and file (relative to the
    repository where it lies inside), the file's sha256 and its package's (over the files a cell
    lists as its code inputs, kernels.libraries.own_kernel_files), the version it declares
    (`__version__` of the class, the module or its top package), and git's view of its files,
    or that they lie outside the repository (which git_dirty then does not cover)."""
    import importlib

    module, cls = entry.split(":", 1)
    path, files = own_kernel_files(entry)
    root = Path(path).parent  # the package's folder (own_kernel_files)
    digest = hashlib.sha256()
    for f in files:  # length-prefixed, as tree_sha256
        for part in (Path(f).relative_to(root).as_posix().encode(), Path(f).read_bytes()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    inside = Path(path).is_relative_to(REPO)
    mod = importlib.import_module(module)
    declared = next(
        (
            str(v)
            for v in (
                getattr(getattr(mod, cls, None), "__version__", None),
                getattr(mod, "__version__", None),
                getattr(sys.modules.get(module.split(".")[0]), "__version__", None),
            )
            if v is not None
        ),
        None,
    )
    return {
        "module": module,
        "class": cls,
        "path": str(Path(path).relative_to(REPO)) if inside else path,
        "sha256": file_sha256(path),
        "package_sha256": digest.hexdigest(),
        "package_files": len(files),
        "declared_version": declared,
        "git": git_view(files) if inside else "outside the repository",
    }


@functools.cache
def library_versions() -> dict:
    return all_library_versions(KERNELS)


@functools.cache
def nvidia_driver() -> str | None:
    return _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def prefetch() -> None:
    """The slow facts (git, nvidia-smi, package metadata, the code hash), gathered before a cell
    waits for its GPU so that it does not spend GPU time on them."""
    git_state(), library_versions(), nvidia_driver(), code_hash()


def fingerprint(device: str) -> dict:
    """Facts about this machine and checkout. Imports torch only if the cell already did."""
    libs = library_versions()
    env = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": libs.get("torch"),
        "libraries": libs,
        "cpu_count": os.cpu_count(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        # The devices Slurm (or the user) gave this process; None when nothing restricted them.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **git_state(),
        **code_hash(),
        "cpu": dict(cpu_facts()),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env.update(torch=torch.__version__, cpu_threads=torch.get_num_threads())
        # the vector code torch's CPU kernels dispatch to here (AVX512, AVX2, ...)
        env["cpu"]["torch_capability"] = torch.backends.cpu.get_cpu_capability()
    if device == "cuda" and torch is not None and torch.cuda.is_available():
        n = torch.cuda.device_count()
        env.update(
            device_name=torch.cuda.get_device_name(0),
            device_names=[torch.cuda.get_device_name(i) for i in range(n)],
            device_count=n,
            compute_capability=list(torch.cuda.get_device_capability(0)),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version()))
            if hasattr(torch.cuda, "nccl")
            else None,
            driver=nvidia_driver(),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    else:
        env.update(device_name=cpu_model(), device_count=1)
    return env
