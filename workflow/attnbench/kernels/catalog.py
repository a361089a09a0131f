"""Every kernel the benchmark knows: what it supports, which library it needs, how it is drawn.
Data: whether a library is installed here, its versions, your own kernel's files are probed by
kernels/libraries.py.

Torch-free on purpose: config validation and Snakemake parsing read it without importing
torch. The implementation of each kernel lives in its own module (`impl`), loaded only
when a cell runs it; the same module holds the library's CP local kernel (LOCAL_KERNELS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..masks import CP_MASKS, FA4_MASK_MOD_MASKS, REGULAR_MASKS, SPARSE_MASKS, STATIC_MASKS
from .libraries import FA3_FORWARD_ONLY, FA3_FULL, fa3_build_limits, missing_module, own_class

ALL_DIRECTIONS = ("fwd", "bwd", "fwdbwd")
# FlashAttention-4: the native form where a mask has one, else the mask's mask_mod
FA4_MASKS = tuple(m for m in STATIC_MASKS if m in REGULAR_MASKS + FA4_MASK_MOD_MASKS)
DENSE_MASKS = STATIC_MASKS + SPARSE_MASKS + tuple(m for m in CP_MASKS if m not in STATIC_MASKS)


@dataclass(frozen=True)
class KernelInfo:
    name: str
    family: str  # "dense" or "sparse"
    summary: str
    impl: str  # "module:Class" under attnbench.kernels, or of any importable module
    masks: tuple
    directions: dict  # device -> directions it runs there; the devices it exists on
    modules: tuple = ()  # importable modules it needs beyond torch
    dists: tuple = ("torch",)  # distributions whose versions identify it
    mha_only: bool = False
    min_capability: tuple = ()  # CUDA compute capability, e.g. (9, 0)
    block_sizes: tuple = ()  # block-sparse block sizes it accepts (empty: any)
    notes: dict = field(default_factory=dict)
    # What the installed build cannot do (a forward-only wheel, say): (mask, direction) -> reason or
    # None. Torch-free, like the rest of this module.
    build_limits: Callable[[str, str], str | None] | None = None
    # How every figure draws it (its legend label is its name; its place in legends, table columns
    # and colours is its place in KERNELS)
    colour: str = ""
    marker: str = ""

    @property
    def devices(self) -> tuple:
        return tuple(self.directions)


def _dense(name, summary, impl, masks, directions=None, **kw) -> KernelInfo:
    """A dense kernel; by default it runs on CUDA only, in every direction."""
    return KernelInfo(name, "dense", summary, impl, tuple(masks), directions or GPU_ALL, **kw)


def _sparse(name, summary, impl, masks=("block_sparse",), directions=None, **kw) -> KernelInfo:
    """A block-sparse kernel; by default of uniform blocks, on CUDA only, in every direction."""
    return KernelInfo(name, "sparse", summary, impl, tuple(masks), directions or GPU_ALL, **kw)


GPU_ALL = {"cuda": ALL_DIRECTIONS}
# SDPA's own forms of a mask (kernels/sdpa.py): none, is_causal; any other goes in as a dense bool
SDPA_NATIVE_MASKS = ("full", "causal")


def mask_note_key(mask: str) -> str:
    """The key of a note on how a kernel runs one mask (the advice shows it at that mask)."""
    return f"mask {mask}"


def mask_notes(masks, text: str) -> dict:
    return {mask_note_key(m): text for m in masks}


# What both of the vsa wheel's kernels (its CUDA one and its Triton port) run: MHA, blocks of 64.
VSA_SHAPES = {"modules": ("vsa",), "mha_only": True, "block_sizes": (64,)}
# How to tell FlashAttention-2 is here: its module, and the distributions naming its version
# (the kernel fa2 and the CP local kernel fa2 both call it).
FLASH_ATTN_2 = {"modules": ("flash_attn",), "dists": ("flash-attn", "flash_attn")}
# FlashAttention-3: the full build, else PyPI's forward-only fa3-fwd (the kernel fa3 and the CP
# local kernel fa3's forward).
FLASH_ATTN_3 = {
    "modules": (f"{FA3_FULL}|{FA3_FORWARD_ONLY}",),
    "dists": ("flash-attn-3", "flash_attn_3", "fa3-fwd"),
}
BOTH_ALL = {"cpu": ALL_DIRECTIONS, "cuda": ALL_DIRECTIONS}
KERNELS = {
    k.name: k
    for k in (
        _dense(
            "naive",
            "eager softmax(q k^T + bias) v",
            "naive:Naive",
            DENSE_MASKS,
            BOTH_ALL,
            colour="#7f7f7f",
            marker="o",
        ),
        _dense(
            "sdpa",
            "SDPA, PyTorch's own backend choice",
            "sdpa:SDPADefault",
            DENSE_MASKS,
            BOTH_ALL,
            colour="#1f77b4",
            marker="s",
        ),
        _dense(
            "sdpa_math",
            "SDPA, MATH backend",
            "sdpa:SDPAMath",
            DENSE_MASKS,
            BOTH_ALL,
            colour="#6baed6",
            marker="^",
        ),
        _dense(
            "sdpa_flash",
            "SDPA, FLASH backend (FA2 code)",
            "sdpa:SDPAFlash",
            ("full", "causal"),
            colour="#08306b",
            marker="D",
        ),
        _dense(
            "sdpa_efficient",
            "SDPA, memory-efficient backend",
            "sdpa:SDPAEfficient",
            DENSE_MASKS,
            colour="#17becf",
            marker="v",
        ),
        _dense(
            "sdpa_cudnn",
            "SDPA, cuDNN backend",
            "sdpa:SDPACudnn",
            DENSE_MASKS,
            # the advice says so at these masks: cuDNN computes the whole S x S there
            notes=mask_notes(
                (m for m in DENSE_MASKS if m not in SDPA_NATIVE_MASKS),
                "dense boolean mask (SDPA offers no other form)",
            ),
            colour="#5254a3",
            marker="P",
        ),
        _dense(
            "flex",
            "FlexAttention, compiled, BlockMask",
            "flex:Flex",
            DENSE_MASKS,
            {"cpu": ("fwd",), "cuda": ALL_DIRECTIONS},
            notes={
                "block_sparse": "BlockMask from the kept block indices; blocks under 128 tokens run as exactly "
                "masked 128-token tiles (CUDA: torch's default Hopper backward tiles do not "
                "divide 64; CPU: inductor's AVX2 flex kernel is wrong at small block sizes)",
                "variable_block_sparse": "128-token tiles counted from the block boundaries; cut tiles masked",
            },
            colour="#2ca02c",
            marker="*",
        ),
        _dense(
            "varlen",
            "torch.nn.attention.varlen.varlen_attn",
            "varlen:Varlen",
            REGULAR_MASKS,
            modules=("torch.nn.attention.varlen",),
            colour="#bcbd22",
            marker="<",
        ),
        _dense(
            "fa2",
            "FlashAttention-2 (flash_attn)",
            "flash_attn:FA2",
            REGULAR_MASKS,
            **FLASH_ATTN_2,
            colour="#ff7f0e",
            marker=">",
        ),
        _dense(
            "fa3",
            "FlashAttention-3 (flash_attn_interface; else PyPI fa3-fwd's forward-only build, Hopper)",
            "flash_attn:FA3",
            REGULAR_MASKS,
            **FLASH_ATTN_3,
            min_capability=(9, 0),
            build_limits=fa3_build_limits,
            notes={
                "build": "the record's library_version names the build that ran: flash-attn-3 (full) or "
                "fa3-fwd (forward only, no windows)"
            },
            colour="#d62728",
            marker="h",
        ),
        _dense(
            "fa4",
            "FlashAttention-4 (flash_attn.cute; mask_mod with tile lists where no causal/window/varlen form)",
            "flash_attn:FA4",
            FA4_MASKS,
            modules=("flash_attn.cute",),
            dists=("flash-attn-4", "nvidia-cutlass-dsl"),
            min_capability=(9, 0),
            colour="#8c564b",
            marker="p",
        ),
        _dense(
            "cudnn_te",
            "cuDNN fused attention via TransformerEngine",
            "transformer_engine:CudnnTE",
            REGULAR_MASKS,
            # the top-level package: finding transformer_engine.pytorch would import TE, which
            # loads a cuDNN (the adapter chooses torch's first)
            modules=("transformer_engine",),
            dists=("transformer-engine", "transformer_engine", "transformer-engine-torch"),
            colour="#9467bd",
            marker="H",
        ),
        _dense(
            "flashmask",
            "FlashMask V3 (PaddlePaddle's column-wise row intervals; its PyTorch extension)",
            "flashmask:FlashMask",
            STATIC_MASKS,
            modules=("interface_torch", "flashmask._C"),
            dists=("flashmask",),
            min_capability=(9, 0),
            colour="#e377c2",
            marker="d",
        ),
        _dense(
            "ffa",
            "MagiAttention's Flex-Flash-Attention (any mask as query/key range slices, Hopper)",
            "ffa:FFA",
            STATIC_MASKS,
            modules=("magi_attention.functional.flex_flash_attn",),
            dists=("magi_attention", "magi-attention"),
            min_capability=(9, 0),
            colour="#66a61e",
            marker="8",
        ),
        # Block-sparse kernels (docs/kernels.md); each receives the realised mask of its point.
        _sparse(
            "triton_block_sparse",
            "block-sparse attention in Triton, written in this project",
            "triton_block_sparse:TritonBlockSparse",
            modules=("triton",),
            dists=("triton",),
            block_sizes=(64, 128),
            notes={
                "gqa": "yes: KV head h // (Hq/Hkv), mask per head or per KV-head group",
                "backward": "own kernels: dQ per query tile, dK/dV per key tile over the transposed lists",
            },
            colour="#000000",
            marker="8",
        ),
        _sparse(
            "vsa",
            "VSA block-sparse attention (FastVideo; ThunderKittens on Hopper)",
            "vsa_sparse:VSA",
            dists=("vsa", "nvidia-cuda-runtime-cu12", "fastvideo-kernel"),
            # the vsa wheel, else the same kernels from its successor package
            **{**VSA_SHAPES, "modules": ("vsa|fastvideo_kernel",)},
            notes={
                "timed": "block_map -> index lists happens inside each call (the library's API)",
                "dtype": "bfloat16 only (its Hopper kernels)",
                "runtime": "vsa 0.0.4 links libcudart.so.12: loaded first from the "
                "nvidia-cuda-runtime-cu12 wheel where installed (notes.cuda_runtime says which); "
                "its binary also needs c10_cuda_check_implementation with an int line number, "
                "which torch 2.11 exports with an unsigned one: it does not load with torch 2.11; "
                "then fastvideo-kernel's copy of the kernels runs (notes.library says which)",
            },
            colour="#e7298a",
            marker="D",
        ),
        _sparse(
            "vsa_triton",
            "VSA's Triton block-sparse kernel (the vsa wheel's Triton port; the paper's Triton VSA)",
            "vsa_sparse:VSATriton",
            dists=("vsa",),
            **VSA_SHAPES,  # vsa found, not imported: its Triton file loads without the package
            notes={
                "timed": "block map -> index lists in prepare, outside the timed region",
                "dtype": "bfloat16 only (its kernels cast P to bfloat16)",
                "backward": "vsa's own Triton backward: one program per key tile computes dK/dV "
                "over the query blocks keeping it, then dQ of the query tile with the same index",
            },
            colour="#7570b3",
            marker="d",  # VSA's diamond, thin (X is the out-of-memory mark)
        ),
        _sparse(
            "flashinfer",
            "FlashInfer VariableBlockSparseAttentionWrapper",
            "flashinfer_sparse:FlashInferVariableBlockSparse",
            SPARSE_MASKS,
            {"cuda": ("fwd",)},
            modules=("flashinfer",),
            dists=("flashinfer-python", "flashinfer"),
            notes={
                "mask": "one block mask per KV head: granularity=head with GQA is unsupported",
                "timed": "plan() (token-level index expansion) in prepare, outside the timed region",
            },
            colour="#e6ab02",
            marker="v",
        ),
        _sparse(
            "fa2_sparse",
            "MIT Han Lab Block-Sparse-Attention (FlashAttention-2 based)",
            "fa2_sparse:FA2BlockSparse",
            modules=("block_sparse_attn",),
            dists=("block_sparse_attn", "block-sparse-attn"),
            block_sizes=(128,),
            notes={
                "timed": "block mask -> row indices (a sort) happens inside each call (the library's API)",
                "build": "envs/build_block_sparse_attn.sh: sm90, bf16, head dim 128, no dropout",
                "backward": "the library's own (the paper measured its forward only)",
            },
            colour="#a6761d",
            marker="H",
        ),
    )
}
SPARSE_KERNELS = tuple(k for k, info in KERNELS.items() if info.family == "sparse")


# ---------------------------------------------------------------- CP local kernels


@dataclass(frozen=True)
class LocalKernelInfo:
    """A library as a CP local kernel (local_kernel.py: a chunk in, out and LSE back, and the
    backward); its class sits in the library's module beside its kernel adapter."""

    name: str
    summary: str
    impl: str  # "module:Class" under attnbench.kernels
    devices: tuple
    directions: dict  # device -> directions
    masks: tuple = CP_MASKS
    masks_note: str = ""  # why the masks outside `masks` are refused
    modules: tuple = ()  # Python modules it needs ("a|b": a, else b)
    bwd_modules: tuple = ()  # further modules its backward needs
    dists: tuple = ("torch",)  # distributions whose versions identify it
    bwd_dists: tuple = ()  # ... and its backward's, where that is another library
    # auto's evidence: per direction, the records of KERNELS above ("impl|other impl", direction)
    # that time the same library calls; their costs add up (flex's backward recomputes a forward)
    evidence: dict = field(default_factory=dict)


def _evidence(fwd, bwd) -> dict:
    return {"fwd": tuple(fwd), "bwd": tuple(bwd)}


def _local(name, summary, impl, directions=None, **kw) -> LocalKernelInfo:
    """A local kernel on the devices of its directions (by default CUDA only, every direction)."""
    directions = directions or GPU_ALL
    return LocalKernelInfo(name, summary, impl, tuple(directions), directions, **kw)


LOCAL_KERNELS = {
    k.name: k
    for k in (
        _local(
            "math",
            "explicit softmax(q k^T) v and its backward, float32 (float64 for float64 inputs)",
            "naive:MathLocal",
            BOTH_ALL,
            evidence=_evidence([("naive", "fwd")], [("naive", "bwd")]),
        ),
        _local(
            "cpu_flash",
            "aten._scaled_dot_product_flash_attention_for_cpu (+ _backward)",
            "sdpa:CpuFlashLocal",
            {"cpu": ALL_DIRECTIONS},
            evidence=_evidence([("sdpa", "fwd")], [("sdpa", "bwd")]),
        ),
        _local(
            "sdpa_flash",
            "aten._flash_attention_forward/_backward with cu_seqlens (varlen)",
            "sdpa:SdpaFlashLocal",
            evidence=_evidence([("sdpa_flash|varlen", "fwd")], [("sdpa_flash|varlen", "bwd")]),
        ),
        _local(
            "sdpa_cudnn",
            "aten._scaled_dot_product_cudnn_attention (+ _backward) with the LSE, native GQA, "
            "one dense call per rectangle",
            "sdpa:SdpaCudnnLocal",
            masks=("full", "causal"),
            masks_note="it makes one dense cuDNN call per rectangle, so documents would be one "
            "call each (cuDNN's ragged entry point ran tens of times slower than the varlen "
            "kernels on an H200); fa2, fa3, sdpa_flash and flex run documents in one varlen call",
            evidence=_evidence([("sdpa_cudnn", "fwd")], [("sdpa_cudnn", "bwd")]),
        ),
        _local(
            "flex",
            "FlexAttention with return_lse; backward by recomputation with the LSE gradient",
            "flex:FlexLocal",
            {"cpu": ("fwd",), "cuda": ALL_DIRECTIONS},
            evidence=_evidence([("flex", "fwd")], [("flex", "fwd"), ("flex", "bwd")]),
        ),
        _local(
            "fa2",
            "FlashAttention-2: flash_attn_interface._flash_attn_forward/_backward (one rectangle) "
            "and their varlen forms (documents)",
            "flash_attn:FA2Local",
            **FLASH_ATTN_2,
            evidence=_evidence([("fa2", "fwd")], [("fa2", "bwd")]),
        ),
        _local(
            "fa3",
            "FlashAttention-3 forward (flash_attn_interface, else PyPI fa3-fwd's "
            "fa3_fwd_interface) with the LSE; backward: FA3's own (the full flash_attn_interface "
            "build; fa3-fwd has none)",
            "flash_attn:FA3Local",
            **FLASH_ATTN_3,
            bwd_modules=(FA3_FULL,),
            evidence=_evidence([("fa3", "fwd")], [("fa3", "bwd")]),
        ),
        _local(
            "flashmask",
            "FlashMask V3 (torch.ops.flashmask fwd/bwd): a chunk's rectangles packed in one call, "
            "each key column's visible rows as FlashMask's row bounds; its own backward",
            "flashmask:FlashMaskLocal",
            modules=("flashmask._C",),
            dists=("flashmask",),
            evidence=_evidence([("flashmask", "fwd")], [("flashmask", "bwd")]),
        ),
    )
}


# Markers no kernel or method may take: a line's X on the axis floor marks a cell that ran out of
# memory (report.style.OOM_MARKER draws it).
OUT_OF_MEMORY_MARKER = "X"
RESERVED_MARKERS = (OUT_OF_MEMORY_MARKER, OUT_OF_MEMORY_MARKER.lower())


def style_problem(info, others: dict, distinct_colours: bool) -> str | None:
    """Why `info`'s colour and marker cannot draw it beside `others` ({name: (colour, marker)}),
    or None: a reserved marker; the colour of another (dense and block-sparse kernels share
    figures, so each has its own colour); for CP methods, drawn among themselves, the same
    (colour, marker) pair as another. An empty colour or marker takes a fallback (report.style)."""
    if info.marker in RESERVED_MARKERS:
        return (
            f"marker {info.marker!r} is reserved (an X marks a cell that ran out of memory); "
            f"choose another matplotlib marker"
        )
    if not info.colour:
        return None
    if distinct_colours:
        same = [n for n, (c, _) in others.items() if c.lower() == info.colour.lower()]
        what = f"colour {info.colour}"
    else:
        pair = (info.colour.lower(), info.marker)
        same = [n for n, (c, m) in others.items() if (c.lower(), m) == pair]
        what = f"colour {info.colour} with marker {info.marker!r}"
    if same:
        return f"{what} is {', '.join(same)}'s; choose another, so that figures tell them apart"
    return None


def resolve(entry: str) -> KernelInfo:
    """A kernel as a grid names it: a registry name, or 'module:Class' of a kernel class in any
    importable module (your own kernel: README, "Your own kernel"). Such a class carries `info`, a
    KernelInfo whose `impl` is that same 'module:Class'; it is registered under `info.name` for
    this process, so cells, records and figures call it by that name."""
    if ":" not in entry:
        return get(entry)
    info = own_class(entry, "kernel", KernelInfo, "Your own kernel")
    known = KERNELS.get(info.name)
    if known is not None and known.impl != entry:
        raise ValueError(
            f"kernel {entry!r}: the name {info.name!r} is taken by {known.impl}; give it another name"
        )
    others = {n: (k.colour, k.marker) for n, k in KERNELS.items() if n != info.name}
    if why := style_problem(info, others, distinct_colours=True):
        raise ValueError(f"kernel {entry!r}: {why}")
    KERNELS[info.name] = info
    return info


def lookup(table: dict, name: str, what: str, plural: str = "", also: tuple = ()):
    """table[name], or a ValueError naming the valid names (`also`: names accepted elsewhere)."""
    try:
        return table[name]
    except KeyError:
        valid = ", ".join((*also, *table))
        raise ValueError(
            f"unknown {what} {name!r}; valid {plural or what + 's'}: {valid}"
        ) from None


def get(name: str) -> KernelInfo:
    return lookup(KERNELS, name, "kernel")


def unsupported_reason(
    info: KernelInfo,
    mask: str,
    direction: str,
    device: str,
    heads_q: int,
    heads_kv: int,
    mask_params: dict | None = None,
) -> str | None:
    """Why the kernel cannot compute this cell natively, or None. Static facts only."""
    if mask not in info.masks:
        return f"{info.name} cannot express the {mask} mask (it supports: {', '.join(info.masks)})"
    dirs = info.directions.get(device, ())
    if direction not in dirs:
        return (
            f"{info.name} has no {direction} on {device} (it runs: {', '.join(dirs) or 'nothing'})"
        )
    if info.build_limits and (why := info.build_limits(mask, direction)):
        return f"{info.name}: {why}"
    if info.mha_only and heads_q != heads_kv:
        return f"{info.name} needs as many KV heads as query heads (MHA), got {heads_q}:{heads_kv}"
    b = (mask_params or {}).get("block_size")
    if info.block_sizes and b is not None and b not in info.block_sizes:
        return f"{info.name} needs block size in {info.block_sizes}, got {b}"
    return None


def needs_device(info: KernelInfo, cell: dict) -> bool:
    """Whether the cell will run on its GPU (decides the `gpu` resource); cells that end as
    unavailable or unsupported before touching the device need none and run alongside."""
    if cell["device"] != "cuda" or "cuda" not in info.devices or missing_module(info):
        return False
    why = unsupported_reason(
        info,
        cell["mask"],
        cell["direction"],
        "cuda",
        cell["heads_q"],
        cell["heads_kv"],
        cell.get("mask_params"),
    )
    return why is None
