"""envs/build_magi_attention.sh on the real MagiAttention v1.1.1 source, up to (not including) the
CUDA compile: its options, the source tarball its --make-source writes from the git repositories,
the edits it makes, the FFA variants it would prebuild (checked against the ones MagiAttention's
own code asks for when flex_flash_attn_func runs, simulated on the CPU), and the wheel setup.py
packs from the patched tree.

The source tarball comes from FFA_SOURCE, else .src/magi_attention-src.tar.gz (an ignored folder),
else is made by the script from the two git repositories: MAGI_GIT_DIR and CUTLASS_GIT_DIR, else the
mirrors beside the checkout (../.mirror/SandAI-org+MagiAttention/repo, ../.mirror/NVIDIA+cutlass/repo).
Without any of them the tests that need the source are skipped.
"""

import ast
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

import build_scripts as build
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "envs" / "build_magi_attention.sh"
DEFAULT_SOURCE = REPO / ".src" / "magi_attention-src.tar.gz"
MIRRORS = REPO.parent / ".mirror"
TAG_COMMIT = "d7ea8afd44c790b65fab68a04a6a0fdd5adbf182"  # v1.1.1
CUTLASS_COMMIT = "81a43e6d92cdd8c20d22392f9579604ed5f710a1"  # what v1.1.1's submodule pins
TOP = f"magi_attention-{TAG_COMMIT[:12]}"
EXT = "magi_attention/csrc/extensions"
EXT_SOURCES = [
    f"{EXT}/{name}"
    for name in (
        "dyn_solver_alg.cpp",
        "magi_attn_ext.cpp",
        "kernel_barrier.cu",
        "preprocess_sparse_load.cu",
        "profile_utils.cu",
        "sort_and_reorder_ranges.cu",
        "unique_consecutive_pairs.cu",
    )
]


def uris(head_dim: int, reductions=("atomic", "nonatomic")) -> list[str]:
    """The FFA modules flex_flash_attn_func loads for bf16 at this head dim, as read from v1.1.1's
    flex_flash_attn.py and get_ffa_uri: the atomic forward writes float32, the non-atomic one
    bf16; the backward's dq and dk/dv are float32 either way; forward tiles 128 x 128."""
    base = f"flex_flash_attn_sm_90_{{}}_{head_dim}hd_compute_bfloat16"
    tile = "_m128n128" if head_dim == 128 else "_m192n128"
    names = []
    for reduction in reductions:
        atomic = "_atomic" if reduction == "atomic" else ""
        out = "float32" if reduction == "atomic" else "bfloat16"
        names.append(base.format("fwd") + f"_out_{out}{atomic}{tile}")
        names.append(base.format("bwd") + f"_dq_float32_dkv_float32{atomic}")
    return names


def run_script(*args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    if env is None:
        return build.run_build_script(SCRIPT, *args, timeout=timeout)
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def git_dir(env: str, mirror: str) -> Path | None:
    given = os.environ.get(env)
    if given:
        assert Path(given).is_dir(), f"{env}={given} is not a folder"
        return Path(given)
    default = MIRRORS / mirror / "repo"
    return default if (default / "HEAD").is_file() else None


def git(directory: Path, *args: str) -> bytes:
    return subprocess.run(
        ["git", "--git-dir", str(directory), *args], capture_output=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def mirrors() -> tuple[Path, Path]:
    magi = git_dir("MAGI_GIT_DIR", "SandAI-org+MagiAttention")
    cutlass = git_dir("CUTLASS_GIT_DIR", "NVIDIA+cutlass")
    if magi is None or cutlass is None:
        pytest.skip(
            "no MagiAttention and CUTLASS git repositories (set MAGI_GIT_DIR, CUTLASS_GIT_DIR)"
        )
    tag = ["git", "--git-dir", str(magi), "rev-parse", "-q", "--verify", "v1.1.1^{commit}"]
    if subprocess.run(tag, capture_output=True).returncode != 0:
        pytest.skip(f"{magi} has no tag v1.1.1")
    return magi, cutlass


@pytest.fixture(scope="module")
def made_source(mirrors, tmp_path_factory) -> tuple[Path, str]:
    """The tarball --make-source writes from the repositories, and what it printed."""
    magi, cutlass = mirrors
    target = tmp_path_factory.mktemp("made") / "magi_attention-src.tar.gz"
    result = run_script(
        "--make-source", str(target), "--git-dir", str(magi), "--cutlass-git-dir", str(cutlass)
    )
    assert result.returncode == 0, result.stderr
    return target, result.stdout


@pytest.fixture(scope="module")
def source(request) -> Path:
    given = os.environ.get("FFA_SOURCE")
    if given:
        assert Path(given).is_file(), f"FFA_SOURCE={given} is not a file"
        return Path(given)
    if DEFAULT_SOURCE.is_file():
        return DEFAULT_SOURCE
    return request.getfixturevalue("made_source")[0]


def patch(source: Path, work: Path, *extra: str) -> tuple[Path, str]:
    return build.patch_only(SCRIPT, source, work, *extra)


@pytest.fixture(scope="module")
def patched(source, tmp_path_factory) -> tuple[Path, str]:
    """The patched tree of the default build (head dim 128, both reductions) and the output."""
    return patch(source, tmp_path_factory.mktemp("work"))


def listed_units(stdout: str) -> list[str]:
    return re.findall(r"^  ((?:magi_attention/|ffa )\S+)", stdout, re.M)


# --- options -----------------------------------------------------------------------------------


def test_help_lists_the_options_and_the_tag_it_knows():
    result = run_script("--help")
    assert result.returncode == 0, result.stderr
    for option in (
        "--source",
        "--head-dims",
        "--reductions",
        "--skip-gpu-check",
        "--make-source",
        "--git-dir",
        "--cutlass-git-dir",
        "--patch-only",
        "FFA_SOURCE",
    ):
        assert option in result.stdout, option
    assert "default v1.1.1 (the layout this script knows)" in result.stdout
    assert "default HEAD" not in result.stdout


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--frobnicate"], {}, "unknown option '--frobnicate'"),
        (["--source"], {}, "option --source needs a value"),
        (
            ["--head-dims", "128,96"],
            {},
            "head dim '96' is not one this build supports; choose from: 64 128",
        ),
        (["--archs", "80"], {}, "CUDA arch '80' is not one this build supports; choose from: 90"),
        (
            ["--reductions", "atomic,fast"],
            {},
            "reduction 'fast' is not one this build supports; choose from: atomic nonatomic",
        ),
        (["--reductions", ""], {}, "no reduction given"),
        (["--jobs", "0"], {}, "positive integer, got '0'"),
        (
            ["--local-version", "Sub+Set"],
            {},
            "--local-version 'Sub+Set' is not a PEP 440 local label",
        ),
        ([], {"FFA_SKIP_GPU_CHECK": "yes"}, "FFA_SKIP_GPU_CHECK must be 0 or 1, got 'yes'"),
        ([], {"FFA_HEAD_DIMS": "256"}, "head dim '256'"),
        (
            ["--source", "/nonexistent/magi.tar.gz"],
            {},
            "--source '/nonexistent/magi.tar.gz' is neither",
        ),
    ],
)
def test_bad_options_are_refused_naming_the_value(args, env, message):
    extra = [] if "--source" in args else ["--source", str(REPO)]
    result = run_script("--patch-only", *extra, *args, env=env)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_a_full_build_checks_its_tools_before_unpacking_anything(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: the check would pass")
    result = run_script("--source", str(REPO), "--work-dir", str(tmp_path / "w"))
    assert result.returncode != 0
    assert "is not a CUDA build" in result.stderr
    assert not (tmp_path / "w").exists()


# --- the source tarball --------------------------------------------------------------------------


def test_make_source_writes_the_pinned_files_and_only_what_the_build_needs(mirrors, made_source):
    magi, cutlass = mirrors
    tarball, stdout = made_source
    assert f"magi_attention {TAG_COMMIT}, cutlass {CUTLASS_COMMIT}" in stdout
    assert tarball.stat().st_size < 4 * 2**20
    with tarfile.open(tarball) as tar:
        files = {m.name: m for m in tar if m.isfile()}
        assert {name.split("/")[0] for name in files} == {TOP}
        note = tar.extractfile(files[f"{TOP}/ATTNBENCH_SOURCE"]).read().decode()
        assert note.splitlines() == [
            f"magi_attention {TAG_COMMIT}",
            f"cutlass {CUTLASS_COMMIT} (the submodule pins {CUTLASS_COMMIT})",
        ]
        for name in (
            "setup.py",
            "pyproject.toml",
            "magi_attention/functional/flex_flash_attn.py",
            f"{EXT}/CMakeLists.txt",
        ):
            assert tar.extractfile(files[f"{TOP}/{name}"]).read() == git(
                magi, "show", f"{TAG_COMMIT}:{name}"
            ), name
        header = f"{TOP}/magi_attention/csrc/cutlass/include/cute/tensor.hpp"
        assert tar.extractfile(files[header]).read() == git(
            cutlass, "show", f"{CUTLASS_COMMIT}:include/cute/tensor.hpp"
        )
    pinned = (
        git(cutlass, "ls-tree", "-r", "--name-only", CUTLASS_COMMIT, "include").decode().split()
    )
    prefix = f"{TOP}/magi_attention/csrc/cutlass/"
    archived = sorted(name[len(prefix) :] for name in files if name.startswith(prefix))
    assert archived == sorted([*pinned, "LICENSE.txt"])
    # not the NVSHMEM communication sources, the flash-attention submodule, docs, tests or assets
    for left_out in (
        "magi_attention/csrc/comm/",
        "magi_attention/functional/flash-attention/",
        "tests/",
        "docs/",
        "assets/",
        "exps/",
        "extensions/",
    ):
        assert not any(name.startswith(f"{TOP}/{left_out}") for name in files), left_out


def test_make_source_refuses_what_it_cannot_archive(mirrors, tmp_path):
    magi, cutlass = mirrors
    target = str(tmp_path / "x.tar.gz")
    result = run_script("--make-source", target, "--git-dir", str(magi))
    assert result.returncode != 0 and "needs --git-dir and --cutlass-git-dir" in result.stderr
    result = run_script(
        "--make-source",
        target,
        "--git-dir",
        str(magi),
        "--rev",
        "v9.9.9",
        "--cutlass-git-dir",
        str(cutlass),
    )
    assert result.returncode != 0 and "'v9.9.9' is not a commit" in result.stderr
    assert not Path(target).exists()


# --- the patched tree ----------------------------------------------------------------------------


def test_patch_only_stops_before_compiling_and_lists_the_subset(patched):
    tree, stdout = patched
    assert "Stopped before compiling (--patch-only)" in stdout
    assert listed_units(stdout) == [
        *EXT_SOURCES,
        "ffa 128hd_common",
        *(f"ffa {uri}" for uri in uris(128)),
    ]
    variants = json.loads((tree / "ATTNBENCH_FFA_VARIANTS.json").read_text())
    assert [v["uri"] for v in variants] == uris(128)
    for v in variants:
        args = v["args"]
        assert (args["head_dim"], args["compute_dtype"], args["softcap"]) == (
            128,
            "bfloat16",
            False,
        )
        assert args["disable_atomic_reduction"] == ("_atomic" not in v["uri"])
    assert not list(tree.rglob("*.so")) and not list(tree.rglob("*.o"))


def test_reductions_and_head_dims_choose_the_variants(source, tmp_path):
    _, one = patch(source, tmp_path / "a", "--reductions", "atomic")
    assert listed_units(one)[len(EXT_SOURCES) + 1 :] == [f"ffa {u}" for u in uris(128, ["atomic"])]
    _, two = patch(
        source, tmp_path / "b", "--head-dims", "128,64", "--reductions", "nonatomic;atomic"
    )
    assert listed_units(two)[len(EXT_SOURCES) :] == [
        "ffa 64hd_common",
        "ffa 128hd_common",
        *(f"ffa {u}" for u in uris(64) + uris(128)),
    ]


def test_edits_give_a_fixed_version_and_a_tagged_wheel_and_leave_setup_py(
    source, patched, tmp_path
):
    tree, _ = patched
    project = tomllib.loads((tree / "pyproject.toml").read_text())
    assert project["project"]["version"] == "1.1.1+sm90.bf16.hd128"
    assert "dynamic" not in project["project"]
    assert "versioningit" not in project["tool"] and "setuptools_scm" not in project["tool"]
    assert "lib/*/*.so" in project["tool"]["setuptools"]["package-data"]["magi_attention"]
    version = (tree / "magi_attention/_version.py").read_text()
    assert "__version__ = '1.1.1+sm90.bf16.hd128'" in version
    cfg = (tree / "setup.cfg").read_text()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"python_tag = {tag}" in cfg and "plat_name = linux_x86_64" in cfg
    with tarfile.open(source) as tar:
        assert (tree / "setup.py").read_bytes() == tar.extractfile(f"{TOP}/setup.py").read()
    plain, _ = patch(source, tmp_path, "--local-version", "")
    assert tomllib.loads((plain / "pyproject.toml").read_text())["project"]["version"] == "1.1.1"


def test_debugpy_is_no_longer_imported_when_magi_attention_is(patched):
    tree, _ = patched
    module = ast.parse((tree / "magi_attention/utils/debug.py").read_text())
    top = [a.name for n in module.body if isinstance(n, ast.Import) for a in n.names]
    assert "debugpy" not in top
    listen = next(n for n in module.body if isinstance(n, ast.FunctionDef))
    inner = [a.name for n in ast.walk(listen) if isinstance(n, ast.Import) for a in n.names]
    assert inner == ["debugpy"]


# Run in a fresh interpreter on the patched tree: MagiAttention's own flex_flash_attn_func,
# forward and backward, as the ffa adapter calls it (and with the non-atomic flags), with the
# CUDA queries answering sm90, its custom ops given a CPU kernel (their own Python bodies) and
# JitSpec.build_and_load recording the module asked for instead of loading it. magi_attn_ext
# (not built) and einops (if missing) are stand-ins; nothing else is.
SIMULATION = r"""
import json, os, sys, types, warnings
tree, workspace = sys.argv[1], sys.argv[2]
os.environ["MAGI_ATTENTION_WORKSPACE_BASE"] = workspace
sys.path.insert(0, tree)
try:
    import einops  # noqa: F401
except ImportError:
    sys.modules["einops"] = types.SimpleNamespace(rearrange=None, reduce=None, repeat=None)
sys.modules["magi_attention.magi_attn_ext"] = types.ModuleType("magi_attention.magi_attn_ext")
warnings.simplefilter("ignore")
import torch
from magi_attention.common.jit import core
import magi_attention.functional.flex_flash_attn as ffa
asked = []
class Module:
    def fwd(self, *args):
        return None
    def bwd(self, dout, q, k, v, sink, out, dq, dk, dv, dsink, *rest):
        return dq, dk, dv, dsink
def build_and_load(spec):
    asked.append(spec.name)
    return Module()
core.JitSpec.build_and_load = build_and_load
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda *args: (9, 0)
torch.cuda.nvtx.range_push = torch.cuda.nvtx.range_pop = lambda *args, **kwargs: None
for op in (ffa._flex_flash_attn_forward_compilable, ffa._flex_flash_attn_backward_compilable):
    op.register_kernel("cpu", op._init_fn)
d = int(sys.argv[3])
for heads_k in (2, 8):
    for flags in ({}, {"disable_fwd_atomic_reduction": True, "disable_bwd_dkv_atomic_reduction": True}):
        q = torch.randn(256, 8, d, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(256, heads_k, d, dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
        ranges = torch.tensor([[0, 128], [128, 256], [128, 256]], dtype=torch.int32)
        k_ranges = torch.tensor([[0, 128], [0, 128], [128, 256]], dtype=torch.int32)
        types_ = torch.tensor([1, 0, 1], dtype=torch.int32)
        out = ffa.flex_flash_attn_func(q, k, v, ranges, k_ranges, types_, max_seqlen_q=128, **flags)[0]
        out.float().sum().backward()
print(json.dumps(sorted(set(asked))))
"""


@pytest.mark.parametrize("head_dim", [128, 64])
def test_the_variants_prebuilt_are_the_ones_flex_flash_attn_func_asks_for(
    source, tmp_path, head_dim
):
    for module in ("torch", "triton", "jinja2", "filelock", "numpy", "packaging"):
        pytest.importorskip(module)
    tree, _ = patch(source, tmp_path / "w", "--head-dims", str(head_dim))
    prebuilt = [v["uri"] for v in json.loads((tree / "ATTNBENCH_FFA_VARIANTS.json").read_text())]
    result = subprocess.run(
        [sys.executable, "-c", SIMULATION, str(tree), str(tmp_path / "ws"), str(head_dim)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    asked = json.loads(result.stdout.splitlines()[-1])
    assert asked == sorted(prebuilt) == sorted(uris(head_dim))


# wheel < 0.46 holds bdist_wheel itself; later ones (and setuptools >= 70.1) alias setuptools'.
WHEEL_ALIAS = "from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401\n"


def test_setup_py_packs_the_compiled_modules_into_a_tagged_wheel(patched, tmp_path):
    """With the switches the script gives it, setup.py compiles nothing and packs magi_attn_ext,
    the prebuilt FFA modules (stand-in files here) and FFA's sources for variants built later."""
    pytest.importorskip("torch")
    pytest.importorskip("setuptools.command.bdist_wheel")
    src, _ = patched
    tree = tmp_path / "tree"
    subprocess.run(["cp", "-r", str(src), str(tree)], check=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    (tree / f"magi_attention/magi_attn_ext{suffix}").write_bytes(b"stand-in")
    for uri in uris(128):
        (tree / "magi_attention/lib" / uri).mkdir(parents=True)
        (tree / "magi_attention/lib" / uri / f"{uri}.so").write_bytes(b"stand-in")
    path = [os.environ.get("PYTHONPATH", "")]
    try:
        import wheel.bdist_wheel  # noqa: F401
    except ImportError:
        (tmp_path / "alias/wheel").mkdir(parents=True)
        (tmp_path / "alias/wheel/__init__.py").write_text("")
        (tmp_path / "alias/wheel/bdist_wheel.py").write_text(WHEEL_ALIAS)
        path.insert(0, str(tmp_path / "alias"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "MAGI_ATTENTION_SKIP_MAGI_ATTN_EXT_BUILD": "1",
        "MAGI_ATTENTION_PREBUILD_FFA": "0",
        "MAGI_ATTENTION_SKIP_MAGI_ATTN_COMM_BUILD": "1",
        "MAGI_ATTENTION_BUILD_COMPUTE_CAPABILITY": "90",
    }
    result = subprocess.run(
        [sys.executable, "setup.py", "bdist_wheel", "--dist-dir", str(tmp_path / "dist")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Skipping Prebuilding FFA JIT kernels" in result.stdout
    (wheel,) = (tmp_path / "dist").iterdir()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.name == f"magi_attention-1.1.1+sm90.bf16.hd128-{tag}-none-linux_x86_64.whl"
    names = set(
        subprocess.run(
            [sys.executable, "-m", "zipfile", "-l", str(wheel)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    compiled = sorted(n for n in names if n.endswith(".so"))
    assert compiled == sorted(
        [f"magi_attention/magi_attn_ext{suffix}"]
        + [f"magi_attention/lib/{uri}/{uri}.so" for uri in uris(128)]
    )
    for needed in (
        "magi_attention/_version.py",
        "magi_attention/functional/flex_flash_attn.py",
        "magi_attention/csrc/flexible_flash_attention/fwd_inst_template.jinja",
        "magi_attention/csrc/cutlass/include/cute/tensor.hpp",
    ):
        assert needed in names, needed
    assert not any("csrc/comm/" in n or "ATTNBENCH" in n for n in names)


# --- sources of another layout --------------------------------------------------------------------

EDITS = [
    # a switch setup.py no longer reads would build the NVSHMEM module (or prebuild 32 variants)
    ("setup.py", '"MAGI_ATTENTION_SKIP_MAGI_ATTN_COMM_BUILD"', '"MAGI_SKIP_COMM"', "not found"),
    (
        "setup.py",
        'os.getenv("MAGI_ATTENTION_PREBUILD_FFA", "1")',
        'os.getenv("PREBUILD", "1")',
        "not found",
    ),
    # another output dtype rule would make the prebuilt forward one nobody asks for
    (
        "functional/flex_flash_attn.py",
        "else torch.float32,  # out_type",
        "else torch.float16,  # out_type",
        "not found",
    ),
    (
        "functional/_flex_flash_attn_jit.py",
        "def get_ffa_uri(",
        "def get_ffa_name(",
        "no function get_ffa_uri",
    ),
    (
        "functional/_flex_flash_attn_jit.py",
        "    swap_bwd_qk_loop: bool,\n    profile_mode: bool,",
        "    profile_mode: bool,\n    swap_bwd_qk_loop: bool,",
        "get_ffa_uri takes",
    ),
    (
        "common/jit/env.py",
        'MAGI_ATTENTION_AOT_DIR = _package_root / "lib"',
        'MAGI_ATTENTION_AOT_DIR = _package_root / "aot"',
        "not found",
    ),
    ("extensions/CMakeLists.txt", '    "*.cu"\n)', '    "*.cu"\n    "*.c"\n)', "not found"),
    (
        "pyproject.toml",
        'dynamic = ["version"]',
        'dynamic = ["version", "readme"]',
        "0 occurrences",
    ),
    ("pyproject.toml", "[tool.setuptools_scm]", "[tool.scm]", "0 [tool.setuptools_scm] tables"),
    (
        "utils/debug.py",
        "\nimport debugpy\n",
        "\nimport debugpy as dp\n",
        "0 occurrences of 'import debugpy'",
    ),
]


@pytest.mark.parametrize(
    "edit_file, old, new, message", EDITS, ids=[f"{e[0]}-{e[3]}" for e in EDITS]
)
def test_sources_of_another_layout_fail_loudly(source, tmp_path, edit_file, old, new, message):
    fake = build.rewritten_tarball(source, tmp_path, edit_file, old, new)
    result = run_script("--patch-only", "--source", str(fake), "--work-dir", str(tmp_path / "w"))
    assert result.returncode != 0
    assert "does not look as expected" in result.stderr and message in result.stderr, result.stderr
    assert Path(edit_file).name in result.stderr


def test_a_folder_is_a_source_too_and_is_left_as_it_was(source, tmp_path):
    with tarfile.open(source) as src:
        src.extractall(tmp_path / "checkout", filter="data")
    (folder,) = (tmp_path / "checkout").iterdir()
    before = {
        p: p.read_bytes()
        for p in (folder / "pyproject.toml", folder / "magi_attention/utils/debug.py")
    }
    _, stdout = patch(folder, tmp_path / "w")
    assert listed_units(stdout)[-4:] == [f"ffa {u}" for u in uris(128)]
    assert {p: p.read_bytes() for p in before} == before
    assert (
        not (folder / "setup.cfg").exists()
        and not (folder / "magi_attention/_version.py").exists()
    )


def test_a_source_without_cutlass_is_refused(source, tmp_path):
    fake = build.tarball_without(source, tmp_path / "no_cutlass.tar.gz", "/csrc/cutlass/")
    result = run_script("--patch-only", "--source", str(fake), "--work-dir", str(tmp_path / "w"))
    assert result.returncode != 0
    assert "has no magi_attention/csrc/cutlass/include/cute/tensor.hpp" in result.stderr
