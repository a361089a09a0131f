#!/usr/bin/env bash
# Builds a MagiAttention wheel (module `magi_attention`, entry `magi_attention.functional.
# flex_flash_attn.flex_flash_attn_func`, kernel `ffa`) holding only what attnbench runs: its C++
# helper extension `magi_attn_ext` (which FFA imports) and the Flex-Flash-Attention kernel modules,
# compiled ahead of time, for sm90a, bf16, the chosen head dims (default 128), forward and backward,
# with the atomic reduction flex_flash_attn_func uses by default and (unless --reductions says
# otherwise) the non-atomic one its disable_*_atomic_reduction flags pick. No NVSHMEM
# communication module (`magi_attn_comm`, for distributed attention) is built.
#
# At v1.1.1 FFA compiles a kernel variant when it is first called (JIT, into
# $MAGI_ATTENTION_WORKSPACE_BASE/.cache/magi_attention/<arch>/cached_ops) unless the package holds
# the variant ready in magi_attention/lib/<variant>/ (upstream's setup.py can prebuild 32 of them,
# fp16 and bf16, head dims 64 and 128). This build compiles exactly the variants attnbench asks for
# (2 per head dim, or 4 with the non-atomic ones) into magi_attention/lib/, so a cell loads them
# without nvcc and never pays a compile; anything else still compiles at first use.
#
# Its CUTLASS is a git submodule, so it builds from a source tarball (or a folder) holding both,
# made once on a machine that has the two git repositories:
#   envs/build_magi_attention.sh --make-source .src/magi_attention-src.tar.gz \
#     --git-dir MagiAttention/.git --rev v1.1.1 --cutlass-git-dir cutlass/.git
# Nothing is installed and nothing is downloaded: the wheel is written to the output folder.
set -euo pipefail

PROG=$(basename "$0")
# shellcheck source=envs/build_lib.sh
source "$(dirname "$0")/build_lib.sh"
# What FFA has kernels for at v1.1.1 (its sanity_check: head dims 64 and 128, sm90 only).
VALID_HEAD_DIMS=(64 128)
VALID_ARCHS=(90)
VALID_REDUCTIONS=(atomic nonatomic)
KNOWN_TAG=v1.1.1
LIB_NAME=magi_attention
# What a source tarball holds (git archive paths): the Python package and the sources FFA and
# magi_attn_ext compile; not the NVSHMEM communication sources (csrc/comm) nor the
# flash-attention submodule (FFA's FA4 backend for Blackwell), nor docs, tests and examples.
SOURCE_PATHS=(magi_attention ':(exclude)magi_attention/csrc/comm'
  ':(exclude)magi_attention/functional/flash-attention' setup.py pyproject.toml README.md LICENSE MANIFEST.in)
CUTLASS_SUBMODULE=magi_attention/csrc/cutlass
CUTLASS_PATHS=(include LICENSE.txt)
rev=$KNOWN_TAG

usage() {
  cat <<EOF
Usage: $PROG --source TARBALL|FOLDER [options]
       $PROG --make-source TARBALL --git-dir DIR --cutlass-git-dir DIR [--rev REV] [--cutlass-rev REV]

Builds a subset MagiAttention wheel (magi_attn_ext and ahead-of-time FFA kernels: sm90a, bf16, chosen
head dims, forward and backward; no NVSHMEM module) from a source tarball or folder, or
(--make-source) writes that tarball from the two git repositories.

Options (environment variable in brackets):
  --source PATH      the source tarball (.tar.gz) --make-source wrote, or a folder holding setup.py
                     and $CUTLASS_SUBMODULE (a checkout with its submodule) [FFA_SOURCE]
  --archs LIST       CUDA archs, from ${VALID_ARCHS[*]} (FFA is Hopper code, built as sm90a) [FFA_CUDA_ARCHS]; default 90
  --head-dims LIST   head dims, from ${VALID_HEAD_DIMS[*]}, comma separated [FFA_HEAD_DIMS]; default 128
  --reductions LIST  FFA's output reductions to prebuild, from ${VALID_REDUCTIONS[*]} [FFA_REDUCTIONS];
                     default atomic,nonatomic (atomic: flex_flash_attn_func's default; nonatomic: with
                     disable_fwd_atomic_reduction / disable_bwd_dkv_atomic_reduction)
  --jobs N           compile threads in all [MAX_JOBS]; default: cores, at most one per compile unit
  --out-dir DIR      where the wheel is written [FFA_OUT_DIR]; default ./dist
  --work-dir DIR     where the source is unpacked and built [FFA_WORK_DIR];
                     default a new temporary folder, removed after a successful build
  --python PY        Python with a CUDA build of torch, used to build [PYTHON]; default python3
  --local-version L  PEP 440 local label of the wheel, '' for none [FFA_LOCAL_VERSION];
                     default auto (e.g. sm90.bf16.hd128, so a subset wheel is not taken for a full one)
  --patch-only       unpack and patch, then stop before compiling (no torch/nvcc needed); prints
                     the patched source folder and the FFA variants it would prebuild
  --skip-gpu-check   after building, do not run the wheel's kernels (the check needs an sm90 GPU and
                     is skipped without one) [FFA_SKIP_GPU_CHECK=1]
  --keep-work-dir    keep the work folder after a successful build
  -h, --help         this help
EOF
  source_options_help | sed "s/default HEAD\$/default $KNOWN_TAG (the layout this script knows)/"
}

source_given="${FFA_SOURCE:-}"
archs="${FFA_CUDA_ARCHS:-90}"
head_dims="${FFA_HEAD_DIMS:-128}"
reductions="${FFA_REDUCTIONS:-atomic,nonatomic}"
jobs="${MAX_JOBS:-}"
out_dir="${FFA_OUT_DIR:-$PWD/dist}"
work_dir="${FFA_WORK_DIR:-}"
python="${PYTHON:-python3}"
local_version="${FFA_LOCAL_VERSION-auto}"
skip_gpu_check="${FFA_SKIP_GPU_CHECK:-0}"
patch_only=0
keep_work_dir=0

while [[ $# -gt 0 ]]; do
  used=0; common_option "$@" || used=$?
  (( used == 0 )) && { source_option "$@" || used=$?; }
  (( used == 0 )) || { shift "$used"; continue; }
  case "$1" in
    --source) need_value "$@"; source_given="$2"; shift 2 ;;
    --reductions) need_value "$@"; reductions="$2"; shift 2 ;;
    --skip-gpu-check) skip_gpu_check=1; shift ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

if [[ -n "$make_source" ]]; then
  write_source_tarball
  exit 0
fi

check_common_options
# parse_choices sorts numerically, which takes any two words for equal: each reduction is checked
# alone, and the list is kept in VALID_REDUCTIONS' order.
reduction_list=()
IFS=',;' read -r -a given_reductions <<<"$reductions"
[[ ${#given_reductions[@]} -gt 0 ]] || die "no reduction given; choose from: ${VALID_REDUCTIONS[*]}"
for item in "${given_reductions[@]}"; do
  parse_choices checked_reduction "reduction" "$item" "${VALID_REDUCTIONS[@]}"
done
reductions_csv=",$(tr ';' ',' <<<"${reductions// /}"),"
for item in "${VALID_REDUCTIONS[@]}"; do
  [[ "$reductions_csv" == *",$item,"* ]] && reduction_list+=("$item")
done
[[ "$skip_gpu_check" == 0 || "$skip_gpu_check" == 1 ]] \
  || die "FFA_SKIP_GPU_CHECK must be 0 or 1, got '$skip_gpu_check'"
source_given=$(absolute_source "$source_given")
resolve_python "$python"
# The label is settled here (patch_and_settle would do it after the edits) because the version the
# edits write carries it.
if [[ "$local_version" == auto ]]; then
  local_version="$(printf 'sm%s.' "${arch_list[@]}")bf16$(printf '.hd%s' "${head_dim_list[@]}")"
fi

# Beyond check_build_tools: what FFA's own build wants (CUDA >= 13 unless upstream's override is
# set; setuptools >= 77 for pyproject's SPDX license string; a C++ compiler) and what importing
# magi_attention needs at build and run time (its prebuild imports the package).
check_magi_tools() {
  "$python" - "$PROG" <<'PY'
import os
import shutil
import subprocess
import sys

prog = sys.argv[1]
def fail(why):
    sys.exit(f"{prog}: error: {why}")

from torch.utils.cpp_extension import CUDA_HOME

out = subprocess.run([f"{CUDA_HOME}/bin/nvcc", "--version"], capture_output=True, text=True).stdout
nvcc = tuple(int(x) for x in out.split("release ")[1].split(",")[0].split("."))
if nvcc < (13, 0) and os.environ.get("MAGI_ATTENTION_ALLOW_BUILD_WITH_CUDA12") != "1":
    fail(f"nvcc {'.'.join(map(str, nvcc))}: MagiAttention builds FFA with CUDA >= 13.0 (with CUDA 12 some "
         "Hopper WGMMA instructions become synchronous); set MAGI_ATTENTION_ALLOW_BUILD_WITH_CUDA12=1 to go on")
import setuptools

if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (77, 0):
    fail(f"setuptools {setuptools.__version__} cannot read pyproject.toml's license = \"Apache-2.0\" "
         "(needs setuptools >= 77); upgrade it in this environment")
cxx = os.environ.get("CXX", "c++")
if shutil.which(cxx) is None:
    fail(f"no C++ compiler '{cxx}' on PATH (set CXX)")
for module, why in (("jinja2", "renders FFA's kernel sources"), ("filelock", "locks FFA's build folders"),
                    ("triton", "magi_attention's range ops import it"),
                    ("einops", "magi_attention.functional imports it; a pure-Python wheel (pip wheel einops)")):
    try:
        __import__(module)
    except ImportError:
        fail(f"{sys.executable} cannot import {module} ({why}); install it into this environment")
PY
}

# Checks the layout of the v1.1.1 sources this build relies on (each snippet must be there), makes
# the edits it needs (each checked to apply once), writes the list of FFA variants to prebuild
# (ATTNBENCH_FFA_VARIANTS.json beside setup.py, outside the package) and prints the compile units.
patch_sources() {
  PYTHONPATH="$ENVS_DIR" "$python" - "$1" "${head_dim_list[*]}" "${reduction_list[*]}" "$local_version" <<'PY'
import ast
import json
import re
import sys
import sysconfig

from subset_patch import MARK, Sources

src = Sources(sys.argv[1], "build_magi_attention.sh", "MagiAttention v1.1.1 (commit d7ea8af, 2026-05)",
              "magi_attention", "magi_attention")
head_dims = [int(d) for d in sys.argv[2].split()]
reductions = sys.argv[3].split()
local = sys.argv[4]
PKG = "magi_attention"
FFA = f"{PKG}/csrc/flexible_flash_attention"
EXT = f"{PKG}/csrc/extensions"

# setup.py is used as it is: the script builds magi_attn_ext and the FFA variants itself and
# then has setup.py only package them, with these switches (each must still be read).
src.read_setup(['os.getenv("MAGI_ATTENTION_PREBUILD_FFA", "1") == "1"',
                '"MAGI_ATTENTION_SKIP_MAGI_ATTN_EXT_BUILD"', '"MAGI_ATTENTION_SKIP_MAGI_ATTN_COMM_BUILD"',
                "if SKIP_MAGI_ATTN_COMM_BUILD:\n        return None",
                'ext_modules.append(magi_attn_comm_module)'])

# Where FFA looks for a compiled variant: the package's lib/<uri>/ first, then the JIT cache.
src.read_setup(['MAGI_ATTENTION_AOT_DIR = _package_root / "lib"',
                'MAGI_ATTENTION_JIT_DIR = MAGI_ATTENTION_WORKSPACE_DIR / "cached_ops"',
                'MAGI_ATTENTION_CACHE_DIR = MAGI_ATTENTION_BASE_DIR / ".cache" / "magi_attention"'],
               f"{PKG}/common/jit/env.py")
src.read_setup(['os.getenv("MAGI_ATTENTION_WORKSPACE_BASE", pathlib.Path.home().as_posix())'], f"{PKG}/env/build.py")
src.read_setup(["and self.aot_path.exists()\n            and _artifact_exists(self.aot_path, mod_name)"],
               f"{PKG}/common/jit/core.py")

# The variant (the arguments of get_ffa_jit_mod) flex_flash_attn_func asks for: the forward's output
# is float32 with the atomic reduction, q's dtype without; the backward's dq, dk and dv are float32
# either way; no GQA packing unless asked, so one variant serves every head ratio.
src.read_setup([
    "        output_dtype=out_type\n        or (q.dtype if disable_fwd_atomic_reduction else torch.float32),",
    "            out_type=q.dtype\n            if disable_fwd_atomic_reduction\n            else torch.float32,  # out_type",
    "            dq_type=torch.float32,\n            dk_type=torch.float32,\n            dv_type=torch.float32,",
    "        dq_dtype=dq_type or torch.float32,\n        dkv_dtype=dk_type\n"
    "        or (k.dtype if disable_bwd_dkv_atomic_reduction else torch.float32),",
    "    softcap: float = 0.0,\n    deterministic: bool = False,",
    "    disable_fwd_atomic_reduction: bool = False,\n    disable_bwd_dkv_atomic_reduction: bool = False,",
], f"{PKG}/functional/flex_flash_attn.py")
jit_path, jit_text = src.read_setup(["qhead_per_khead = 1 if not pack_gqa and not cat_gqa else qhead_per_khead",
                                     'jit_env.FLEXIBLE_FLASH_ATTENTION_CSRC_DIR / "flex_flash_common.cpp"',
                                     'common_uri = f"{head_dim}hd_common"'],
                                    f"{PKG}/functional/_flex_flash_attn_jit.py")

# The variant's name is upstream's get_ffa_uri (a pure function, run here on stand-in dtypes).
functions = {node.name: node for node in ast.parse(jit_text).body if isinstance(node, ast.FunctionDef)}
SPEC_ARGS = ["arch", "direction", "head_dim", "compute_dtype", "output_dtype", "softcap",
             "disable_atomic_reduction", "deterministic", "ref_block_size", "auto_range_merge", "swap_ab",
             "pack_gqa", "cat_gqa", "qhead_per_khead", "sparse_load", "index_attn", "swap_bwd_qk_loop",
             "profile_mode", "return_max_logits", "dq_dtype", "dkv_dtype"]
URI_ARGS = ["arch_sm_num", *SPEC_ARGS[1:8], "kblock_m", "kblock_n", *SPEC_ARGS[9:]]
for name, expected in (("get_ffa_jit_spec", SPEC_ARGS), ("get_ffa_uri", URI_ARGS),
                       ("tile_size_fwd_sm90", ["head_dim", "softcap"])):
    if name not in functions:
        src.fail(jit_path, f"no function {name}")
    args = [a.arg for a in functions[name].args.args]
    if args != expected:
        src.fail(jit_path, f"{name} takes {args}, expected {expected}")
namespace = {"torch": type("torch", (), {"dtype": object})}  # for the annotations only
exec(compile(ast.Module([functions["get_ffa_uri"], functions["tile_size_fwd_sm90"]], []), str(jit_path), "exec"),
     namespace)


class Dtype:  # stands in for torch.<name>: get_ffa_uri only reads str(dtype)
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


variants = []
for d in head_dims:
    for reduction in reductions:
        atomic = reduction == "atomic"
        for direction in ("fwd", "bwd"):
            args = dict(direction=direction, head_dim=d, compute_dtype="bfloat16",
                        output_dtype=("float32" if atomic else "bfloat16") if direction == "fwd" else None,
                        softcap=False, disable_atomic_reduction=not atomic, deterministic=False,
                        ref_block_size=None, auto_range_merge=False, swap_ab=False, pack_gqa=False,
                        cat_gqa=False, qhead_per_khead=1, sparse_load=False, index_attn=False,
                        swap_bwd_qk_loop=False, profile_mode=False, return_max_logits=False,
                        dq_dtype="float32" if direction == "bwd" else None,
                        dkv_dtype="float32" if direction == "bwd" else None)
            block = namespace["tile_size_fwd_sm90"](d, False) if direction == "fwd" else (None, None)
            uri_args = {k: v for k, v in args.items() if k != "ref_block_size"}
            uri_args.update({k: Dtype(v) for k, v in uri_args.items() if k.endswith("dtype") and v})
            uri = namespace["get_ffa_uri"](arch_sm_num="90", kblock_m=block[0], kblock_n=block[1], **uri_args)
            variants.append({"uri": uri, "args": args})

# magi_attn_ext: CMake compiles every .cpp and .cu in csrc/extensions; the script compiles the same
# files (with torch's extension builder, no CMake needed), so the set must be the one it knows.
cmake_path, cmake = src.read_setup(['file(GLOB SOURCES\n    "*.cpp"\n    "*.cu"\n)',
                                    "${CMAKE_CURRENT_SOURCE_DIR}/../common",
                                    'LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/../../"'],
                                   f"{EXT}/CMakeLists.txt")
KNOWN_EXT = ["dyn_solver_alg.cpp", "magi_attn_ext.cpp", "kernel_barrier.cu", "preprocess_sparse_load.cu",
             "profile_utils.cu", "sort_and_reorder_ranges.cu", "unique_consecutive_pairs.cu"]
found = sorted(p.name for p in (src.root / EXT).iterdir() if p.suffix in (".cpp", ".cu"))
if found != sorted(KNOWN_EXT):
    src.fail(cmake_path, f"csrc/extensions compiles {found}, expected {sorted(KNOWN_EXT)}")
for name in ("flex_flash_common.cpp", "flash_fwd_postprocess.cu", "flash_bwd_postprocess.cu",
             "fwd_inst_template.jinja", "bwd_inst_template.jinja"):
    if not (src.root / FFA / name).is_file():
        src.fail(src.root / FFA / name, "file missing")

# pyproject.toml: a fixed version with the local label instead of one from git (versioningit or
# setuptools_scm would need the .git a tarball lacks), and the package data that carries the
# compiled modules into the wheel.
version = "1.1.1" + (f"+{local}" if local else "")
path, text = src.read_setup(['"lib/*/*.so"', '"*.so"', '"csrc/cutlass/include/**"', 'default-version = "1.1.1"'],
                            "pyproject.toml")
text = src.replace_once(path, text, 'dynamic = ["version"]\n',
                        f'version = "{version}"  # {MARK}: a fixed version, not one from git\n')
for table in ("tool.versioningit", "tool.versioningit.write", "tool.setuptools_scm"):
    block = re.compile(rf"^\[{re.escape(table)}\]\n(?:(?!\[).*\n)*", re.M)
    if len(block.findall(text)) != 1:
        src.fail(path, f"{len(block.findall(text))} [{table}] tables, expected 1")
    text = block.sub("", text)
path.write_text(text)
path = src.root / PKG / "_version.py"
if path.exists():
    src.fail(path, "already there (a built tree?)")
path.write_text(f"# {MARK}: what versioningit would write\n__version__ = '{version}'\n")

# magi_attention.utils imports debugpy (remote debugging, off unless MAGI_ATTENTION_ENABLE_REMOTE_DEBUG
# is set) at import time; it is imported where it is used instead, so FFA does not need it.
path, text = src.read(f"{PKG}/utils/debug.py")
text = src.replace_once(path, text, "\nimport debugpy\n", f"\n# {MARK}: debugpy is imported where it is used\n")
text = src.replace_once(path, text, "            debugpy.listen((",
                        "            import debugpy\n\n            debugpy.listen((")
path.write_text(text)

# The wheel holds compiled modules but no setuptools extension, so bdist_wheel would call it pure
# (py3-none-any); it is tagged with the building Python and platform instead.
path = src.root / "setup.cfg"
if path.exists():
    src.fail(path, "already there")
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
path.write_text(f"# {MARK}\n[bdist_wheel]\npython_tag = {tag}\nplat_name = {platform}\n")

(src.root / "ATTNBENCH_FFA_VARIANTS.json").write_text(json.dumps(variants, indent=1) + "\n")
units = [f"{EXT}/{name}" for name in KNOWN_EXT]
units += [f"ffa {d}hd_common (flex_flash_common.cpp, flash_fwd_postprocess.cu, flash_bwd_postprocess.cu)"
          for d in head_dims]
units += [f"ffa {v['uri']} ({v['args']['direction']}_inst_template.jinja)" for v in variants]
print("\n".join(units))
PY
}

# Runs a compile step ($1: what it is; then the command), appending its output to the log.
compile_step() {
  local what=$1 start=$SECONDS
  shift
  echo "Compiling $what; follow it with: tail -f $compile_log"
  if ! "$@" >>"$compile_log" 2>&1; then
    tail -n 40 "$compile_log" >&2
    die "compiling $what failed after $((SECONDS - start)) s; full log: $compile_log (work folder kept)"
  fi
  echo "  done in $((SECONDS - start)) s"
}

# magi_attn_ext with torch's extension builder (ninja), from the files and flags of upstream's
# CMakeLists.txt (sm_90, -O3, fast math, line info, NDEBUG), into magi_attention/ as CMake would.
build_magi_attn_ext() {
  MAX_JOBS="$jobs" "$python" - "$1" "$2" "$3" <<'PY'
import shutil
import sys
import sysconfig
from pathlib import Path

from torch.utils.cpp_extension import load

tree, build_dir, arch = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
ext = tree / "magi_attention" / "csrc" / "extensions"
build_dir.mkdir(parents=True, exist_ok=True)
sources = sorted(str(p) for p in ext.iterdir() if p.suffix in (".cpp", ".cu"))
# torch adds -D__CUDA_NO_HALF*_ macros that CMake does not; they are undone.
undo = [f"-U__CUDA_NO_{m}__" for m in ("HALF_OPERATORS", "HALF_CONVERSIONS", "BFLOAT16_CONVERSIONS", "HALF2_OPERATORS")]
load(name="magi_attn_ext", sources=sources, build_directory=str(build_dir), verbose=True,
     extra_cflags=["-O3", "-Wno-unused-variable"],
     extra_cuda_cflags=["-O3", "--use_fast_math", "-lineinfo", "-DNDEBUG", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                        *undo],
     extra_include_paths=[str(ext), str(ext.parent / "common")])
target = tree / "magi_attention" / f"magi_attn_ext{sysconfig.get_config_var('EXT_SUFFIX')}"
shutil.copy2(build_dir / "magi_attn_ext.so", target)
print(f"magi_attn_ext -> {target}")
PY
}

# The FFA variants ATTNBENCH_FFA_VARIANTS.json lists, each through upstream's own get_ffa_jit_spec
# (whose name for it must be the one listed) and its ninja build, in parallel, in a JIT workspace
# under the work folder; each module is then placed in magi_attention/lib/<uri>/, where FFA loads
# it ahead of any JIT cache.
prebuild_ffa() {
  MAGI_ATTENTION_WORKSPACE_BASE="$2" MAGI_ATTENTION_BUILD_VERBOSE=1 MAX_JOBS="$jobs" NVCC_THREADS="$3" \
    "$python" - "$1" <<'PY'
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

tree = Path(sys.argv[1])
sys.path.insert(0, str(tree))
import torch  # noqa: E402

from magi_attention.common.jit import env as jit_env  # noqa: E402
from magi_attention.functional._flex_flash_attn_jit import get_ffa_jit_spec  # noqa: E402

assert Path(jit_env.MAGI_ATTENTION_AOT_DIR).resolve() == (tree / "magi_attention" / "lib").resolve()
variants = json.loads((tree / "ATTNBENCH_FFA_VARIANTS.json").read_text())


def build(variant):
    args = {k: getattr(torch, v) if k.endswith("dtype") and v else v for k, v in variant["args"].items()}
    spec, uri = get_ffa_jit_spec(arch=(9, 0), **args)
    if uri != variant["uri"]:
        raise RuntimeError(f"get_ffa_jit_spec names the variant {uri}, the script expected {variant['uri']}")
    start = time.monotonic()
    print(f"[ffa] building {uri}", flush=True)
    spec.build()
    built = jit_env.MAGI_ATTENTION_JIT_DIR / uri / f"{uri}.so"
    target = jit_env.MAGI_ATTENTION_AOT_DIR / uri
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, target / built.name)
    print(f"[ffa] built {uri} in {time.monotonic() - start:.0f} s", flush=True)
    return uri


with ThreadPoolExecutor(max_workers=len(variants)) as pool:
    futures = [pool.submit(build, v) for v in variants]
failed = [(v["uri"], f.exception()) for v, f in zip(variants, futures) if f.exception()]
for uri, error in failed:
    print(f"[ffa] FAILED {uri}: {error}", flush=True)
sys.exit(1 if failed else 0)
PY
}

# On an sm90 GPU: the wheel, unpacked alone on the path with an empty FFA workspace and the
# compilers replaced by `false`, must import what the ffa adapter imports and run each prebuilt
# variant forward and backward, close to SDPA, without compiling anything.
gpu_check() {
  local wheel=$1 tmp
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/magi_check.XXXXXX")
  "$python" -m zipfile -e "$wheel" "$tmp/site"
  mkdir -p "$tmp/ws"
  if ! (cd "$tmp" && PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}" MAGI_ATTENTION_WORKSPACE_BASE="$tmp/ws" \
        PYTORCH_NVCC=false CXX=false "$python" - "$tmp/ws" "${head_dim_list[*]}" "${reduction_list[*]}" <<'PY'
import sys
import warnings
from pathlib import Path

import torch

workspace, head_dims, reductions = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    print("GPU check skipped: no sm90 GPU visible")
    sys.exit(0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # magi_attn_comm (not built) is reported missing
    import magi_attention
    from magi_attention.functional.flex_flash_attn import flex_flash_attn_func
print(f"magi_attention {magi_attention.__version__} from {Path(magi_attention.__file__).parent}")
assert str(Path(magi_attention.__file__)).startswith(str(workspace.parent)), "not the unpacked wheel"


def check(d, atomic):
    torch.manual_seed(0)
    heads_q, heads_k, n = (4, 2, 384) if atomic else (4, 4, 256)
    q = torch.randn(n, heads_q, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(n, heads_k, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(n, heads_k, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # atomic: one causal mask cut into slices that share query and key rows; else one slice
    slices = [(0, 128, 0, 128, 1), (128, 384, 0, 128, 0), (128, 384, 128, 384, 1)] if atomic else [(0, n, 0, n, 1)]
    q_ranges, k_ranges, types = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in (
        [s[0:2] for s in slices], [s[2:4] for s in slices], [s[4] for s in slices]))
    out = flex_flash_attn_func(q, k, v, q_ranges, k_ranges, types, disable_fwd_atomic_reduction=not atomic,
                               disable_bwd_dkv_atomic_reduction=not atomic)[0]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    rep = heads_q // heads_k

    def sdpa(dtype):  # SDPA on [heads, tokens, dim], K and V repeated for GQA; output and grads
        qs, ks, vs = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(
            qs.transpose(0, 1), ks.repeat_interleave(rep, 1).transpose(0, 1),
            vs.repeat_interleave(rep, 1).transpose(0, 1), is_causal=True).transpose(0, 1)
        return (o, *torch.autograd.grad(o, (qs, ks, vs), dout.to(dtype)))

    # FFA against SDPA in float32, allowed 3 times the error of SDPA in bf16 (and 0.5% of the
    # largest value), as FlashAttention's own tests judge their kernels
    exact, rounded = sdpa(torch.float32), sdpa(torch.bfloat16)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), (out, *grads), exact, rounded):
        scale = b.abs().max()
        err, ref_err = ((a.float() - b).abs().max() / scale).item(), ((c.float() - b).abs().max() / scale).item()
        assert err <= 3 * ref_err + 0.005, (f"head dim {d}, {'atomic' if atomic else 'non-atomic'}: {name} off SDPA "
                                            f"by {err:.3g} of its largest value (SDPA in bf16: {ref_err:.3g})")
    print(f"head dim {d}, {'atomic' if atomic else 'non-atomic'} reduction: forward and backward ran, close to SDPA")


for d in head_dims:
    for reduction in reductions:
        check(int(d), reduction == "atomic")
compiled = sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*.so"))
assert not compiled, f"FFA compiled modules at first use: {compiled}"
print("GPU check passed: every prebuilt variant loaded from the wheel, nothing compiled")
PY
  ); then
    rm -rf "$tmp"
    die "the wheel $wheel failed its GPU check (above); it was written all the same"
  fi
  rm -rf "$tmp"
}

[[ $patch_only -eq 1 ]] || { check_build_tools "${arch_list[@]}"; check_magi_tools; }
make_work_dir "$work_dir" magi_attention_build

echo "source: $source_given"
tree=$(unpack_source_tree "$source_given" setup.py "$CUTLASS_SUBMODULE/include/cute/tensor.hpp")
version=$(sed -n 's/^default-version = "\([0-9][^"]*\)"$/\1/p' "$tree/pyproject.toml" | head -n 1)
[[ -n "$version" ]] || die "'$source_given' has no default-version in pyproject.toml"
[[ -f "$tree/ATTNBENCH_SOURCE" ]] && sed 's/^/  /' "$tree/ATTNBENCH_SOURCE"

echo "Reductions prebuilt: ${reduction_list[*]}"
cores=${jobs:-$(nproc)}
patch_and_settle "$tree" magi_attention "$version"

compile_log="$work_dir/compile.log"
: >"$compile_log"
keep_work_dir_on_failure=1
variant_count=$(( ${#head_dim_list[@]} * ${#reduction_list[@]} * 2 ))
# The variants compile at once, each nvcc splitting its work over its share of the cores.
nvcc_threads=$(( cores / variant_count ))
(( nvcc_threads >= 1 )) || nvcc_threads=1
compile_step "magi_attn_ext (7 files)" build_magi_attn_ext "$tree" "$work_dir/magi_attn_ext_build" "$arch_env"
compile_step "$variant_count FFA variants ($nvcc_threads nvcc threads each)" \
  prebuild_ffa "$tree" "$work_dir/ffa_workspace" "$nvcc_threads"
# setup.py only packages now: magi_attn_ext and the FFA modules are in the tree, magi_attn_comm skipped.
build_wheel "$tree" MAGI_ATTENTION_SKIP_MAGI_ATTN_EXT_BUILD=1 MAGI_ATTENTION_PREBUILD_FFA=0 \
  MAGI_ATTENTION_SKIP_MAGI_ATTN_COMM_BUILD=1 MAGI_ATTENTION_BUILD_COMPUTE_CAPABILITY="$arch_env" \
  "magi_attention-${version}*.whl"
echo "Wheel contents (compiled modules):"
"$python" -m zipfile -l "$wheel" | awk '$1 ~ /\.so$/ {print "  " $1}'
if [[ "$skip_gpu_check" == 1 ]]; then
  echo "GPU check skipped (--skip-gpu-check)"
else
  gpu_check "$wheel"
fi
echo "At run time it needs einops beside torch; FFA writes its small per-call files under" \
  "\$MAGI_ATTENTION_WORKSPACE_BASE/.cache/magi_attention (default: \$HOME)."
