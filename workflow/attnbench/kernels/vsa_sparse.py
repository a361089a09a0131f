"""VSA's block-sparse attention (FastVideo, PyPI `vsa`), two kernels of one wheel:

- `vsa`: `vsa.block_sparse_attn(q, k, v, block_map, variable_block_sizes) -> (out, lse)`, the
  ThunderKittens kernels on Hopper (module `vsa_cuda`, bf16). The library turns block_map into
  index lists inside each call: that work is part of its timing. vsa 0.0.4's binary links
  libcudart.so.12 (CUDA 12); where the `nvidia-cuda-runtime-cu12` wheel is installed its
  runtime is loaded first, globally, so that the binary finds it on a CUDA 13 machine.
- `vsa_triton`: the wheel's Triton kernels (`vsa/block_sparse_attn_triton.py`, the paper's
  "Triton VSA"), called with index lists built once in prepare, outside the timed region, as
  for this project's own Triton kernel. `import vsa` picks the CUDA kernels on Hopper and fails
  where they cannot load, so the Triton file is loaded on its own, without the package.

Both: q/k/v [B, H, S, D], 64-token blocks, as many KV heads as query heads. `import vsa` queries
the CUDA device at import time, so it happens in prepare, on the GPU only.

Where `vsa` cannot load (0.0.4's binary wants an older torch's C++ ABI: it fails with torch 2.11),
`vsa` runs the same kernels from their successor package, PyPI `fastvideo-kernel`
(`fastvideo_kernel.block_sparse_attn`, same arguments), and notes.library says which ran. That
package falls back to Triton by itself when its Hopper extension does not load; here that is
`unavailable` instead (its Triton kernel is `vsa_triton`'s). Which release: 0.3.4 and 0.3.5 link
NCCL >= 2.29 (`ncclCommQueryProperties`), which torch 2.11's NCCL 2.28.9 lacks (0.3.5 failed so on
the H200); 0.3.0-0.3.2 need no NCCL and only torch C++ symbols that torch 2.11 exports (checked
with nm), and import einops. Their wheels bundle a libcuda of another driver release; the machine's
libcuda.so.1 is loaded first, globally, so that the extension's driver calls (TMA descriptors)
bind to the driver the kernel module matches, not to the bundled copy, which is never initialised.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.metadata
import importlib.util
from pathlib import Path

from ..record.status import Unavailable
from .base import LOAD_ERRORS, Kernel, load_error

VSA_BLOCK = 64
CUDART12_DIST = "nvidia-cuda-runtime-cu12"
CUDART12_FILE = "nvidia/cuda_runtime/lib/libcudart.so.12"


def preload_cuda12_runtime() -> str:
    """Load libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel with RTLD_GLOBAL (the
    dynamic loader then satisfies vsa_cuda's dependency with it); says what was used."""
    try:
        dist = importlib.metadata.distribution(CUDART12_DIST)
    except importlib.metadata.PackageNotFoundError:
        return f"{CUDART12_DIST} is not installed: libcudart.so.12 from the system library path"
    path = Path(dist.locate_file(CUDART12_FILE))
    if not path.is_file():
        raise OSError(f"{CUDART12_DIST} {dist.version} has no {CUDART12_FILE} (looked at {path})")
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return f"libcudart.so.12 loaded from {path} ({CUDART12_DIST} {dist.version})"


def import_vsa():
    """The vsa module (load_vsa loads its CUDA 12 runtime first)."""
    try:
        return importlib.import_module("vsa")
    except AssertionError as e:  # its import asks torch for the device: a CPU-only torch asserts
        raise RuntimeError(f"importing vsa failed: {e}") from e


FASTVIDEO = "fastvideo_kernel"
# what makes fastvideo_kernel run its Triton kernels instead of the Hopper ones
FASTVIDEO_FORCE_TRITON = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_KERNEL_VSA_FORCE_TRITON")


def bundled_libcuda() -> list:
    """The libcuda copies an installed fastvideo_kernel wheel carries (auditwheel's .libs folder)."""
    spec = importlib.util.find_spec(FASTVIDEO)
    if spec is None or not spec.submodule_search_locations:
        return []
    libs = Path(next(iter(spec.submodule_search_locations))).parent / f"{FASTVIDEO}.libs"
    return sorted(libs.glob("libcuda-*.so*"))


def import_fastvideo_kernel():
    """fastvideo_kernel with its Hopper block-sparse kernels loaded (the package itself swallows
    their load error and runs Triton: importing the extension directly gives the reason)."""
    import os

    forced = [v for v in FASTVIDEO_FORCE_TRITON if os.environ.get(v, "0") == "1"]
    if forced:
        raise RuntimeError(f"{forced[0]}=1 makes {FASTVIDEO} run Triton, not VSA's CUDA kernels")
    if bundled_libcuda():  # the machine's driver first: the bundled one would bind otherwise
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    ops = importlib.import_module(f"{FASTVIDEO}._C.fastvideo_kernel_ops")
    if not (hasattr(ops, "block_sparse_fwd") and hasattr(ops, "block_sparse_bwd")):
        raise ImportError(f"this {FASTVIDEO} has no Hopper block_sparse_fwd/bwd")
    return importlib.import_module(FASTVIDEO)


def load_vsa(notes: dict):
    """The module whose block_sparse_attn runs VSA: vsa where it loads, else fastvideo_kernel.
    notes gets how (also when neither loads: then Unavailable names why each failed)."""
    failed = []
    for name, load in (("vsa", import_vsa), (FASTVIDEO, import_fastvideo_kernel)):
        if importlib.util.find_spec(name) is None:
            failed.append(f"{name} is not installed")
            continue
        if name == "vsa":
            notes["cuda_runtime"] = preload_cuda12_runtime()
        try:
            module = load()
        except LOAD_ERRORS as e:
            failed.append(f"importing {name} failed: {load_error(e)}")
            continue
        version = importlib.metadata.version(name.replace("_", "-"))
        notes["library"] = f"{name} {version}" + (f" ({'; '.join(failed)})" if failed else "")
        return module
    raise Unavailable(f"vsa: {'; '.join(failed)}")


@functools.cache
def vsa_triton_module():
    """vsa/block_sparse_attn_triton.py of the installed wheel, loaded by path (not through the
    package, whose __init__ loads the CUDA kernels)."""
    spec = importlib.util.find_spec("vsa")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the vsa package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "block_sparse_attn_triton.py"
    if not path.is_file():
        raise ImportError(f"this vsa has no Triton kernel file ({path} is missing)")
    file_spec = importlib.util.spec_from_file_location("attnbench_vsa_triton", path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


def per_query_head(lay, heads_q: int):
    """The layout's keep map [G, nrb, ncb] repeated to one map per query head [Hq, nrb, ncb]."""
    return lay.keep.repeat_interleave(heads_q // lay.groups, dim=0)


def vsa_arguments(mask, device="cpu"):
    """(block_map [1, H, nqb, nkb] bool, variable_block_sizes [nb] int32) for this mask: the same
    kept blocks every other kernel of the grid point receives, one map per query head."""
    import torch

    lay = mask.layout()
    block_map = per_query_head(lay, mask.heads_q).unsqueeze(0).to(device)
    sizes = lay.row_bounds[0].diff().to(device=device, dtype=torch.int32)  # all full blocks
    return block_map, sizes


def padded_lists(keep):
    """Per row of keep [..., R, C] (bool): the kept column indices, increasing, padded with -1
    to the longest row, and their count: ([..., R, kmax] int32, [..., R] int32). VSA's form."""
    import torch

    num = keep.sum(-1)
    kmax = max(int(num.max()), 1)
    # a stable descending sort of 0/1 puts the kept columns first, in increasing order
    order = torch.sort(keep.to(torch.int8), dim=-1, descending=True, stable=True).indices
    index = order[..., :kmax].to(torch.int32)
    index[torch.arange(kmax, device=keep.device) >= num[..., None]] = -1
    return index.contiguous(), num.to(torch.int32).contiguous()


def vsa_triton_arguments(mask, device="cpu") -> dict:
    """The index lists of vsa's Triton forward and backward for this mask: q2k (kept key blocks
    of each query block) and k2q (query blocks keeping each key block), [1, H, blocks, max]
    int32 padded with -1 plus counts [1, H, blocks], and the block sizes [nb] int32."""
    keep = per_query_head(mask.layout(), mask.heads_q).to(device)
    q2k_index, q2k_num = padded_lists(keep)
    k2q_index, k2q_num = padded_lists(keep.transpose(-1, -2))
    _, sizes = vsa_arguments(mask, device)
    lists = dict(q2k_index=q2k_index, q2k_num=q2k_num, k2q_index=k2q_index, k2q_num=k2q_num)
    return {**{k: t.unsqueeze(0) for k, t in lists.items()}, "variable_block_sizes": sizes}


class VSA(Kernel):
    layout = "bhsd"

    @classmethod
    def import_modules(cls, info):
        try:
            load_vsa({})
        except Unavailable as e:
            raise ImportError(e.reason) from e

    def check_cell(self, mask):
        """What both VSA kernels refuse, before any import."""
        import torch

        self.require_blocks(mask, VSA_BLOCK)
        if self.gqa:
            self.unsupported(
                f"needs as many KV heads as query heads, got {self.heads_q}:{self.heads_kv}"
            )
        if self.dtype != torch.bfloat16:
            self.unsupported(f"its Hopper kernels take bfloat16 only, got {self.dtype}")

    def prepare(self, mask):
        self.check_cell(mask)
        vsa = load_vsa(self.load_notes)
        block_map, sizes = vsa_arguments(mask, self.device)

        def fn(q, k, v):
            out, _lse = vsa.block_sparse_attn(q, k, v, block_map, sizes)
            return out

        return fn


@functools.cache
def vsa_triton_function():
    """An autograd function over vsa's Triton forward and backward (defined on first use: torch)."""
    import torch

    class VSATritonAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, args):
            mod = vsa_triton_module()
            out, lse2 = mod.triton_block_sparse_attn_forward(
                q, k, v, args["q2k_index"], args["q2k_num"], args["variable_block_sizes"]
            )
            ctx.save_for_backward(q, k, v, out, lse2)
            ctx.args = args
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse2 = ctx.saved_tensors
            a = ctx.args
            grads = vsa_triton_module().triton_block_sparse_attn_backward(
                dout.contiguous(),
                q,
                k,
                v,
                out,
                lse2,
                a["q2k_index"],
                a["q2k_num"],
                a["k2q_index"],
                a["k2q_num"],
                a["variable_block_sizes"],
            )
            return (*grads, None)

    return VSATritonAttention


class VSATriton(VSA):
    @classmethod
    def import_modules(cls, info):
        vsa_triton_module()

    def version(self) -> str:
        import triton

        return f"triton {triton.__version__}"

    def prepare(self, mask):
        self.check_cell(mask)
        try:
            vsa_triton_module()
        except ImportError as e:
            raise Unavailable(f"{self.info.name}: {str(e).splitlines()[0][:300]}") from e
        args = vsa_triton_arguments(mask, self.device)
        attention = vsa_triton_function()
        return lambda q, k, v: attention.apply(
            q.contiguous(), k.contiguous(), v.contiguous(), args
        )
