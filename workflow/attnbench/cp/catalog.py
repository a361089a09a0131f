"""The context-parallel methods: names, layouts (how each one's degrees follow from the GPU count),
and what each (and its local kernel) cannot run. The local kernels' registry is
kernels/catalog.py's LOCAL_KERNELS, beside the kernels'.

Torch-free on purpose: config validation and Snakemake read it without importing torch.
A method's implementation lives in its own module (`impl`), loaded only when a cell runs it; a
grid may also name a method of its own as 'module:Class' (resolve_method).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# a cell's CP settings and their vocabularies (defaults first) are the grid stage's (grid/spec.py)
from ..grid.spec import DKV_COMM_DTYPES, PLACEMENTS, SPLIT_DOCUMENTS, Degrees
from ..kernels.catalog import KERNELS, LOCAL_KERNELS, LocalKernelInfo, lookup, style_problem
from ..kernels.libraries import first_missing, first_version, own_class, own_files
from ..masks import CP_MASKS, pattern

# The CP masks that are causal inside each document (their patterns' `causal`; the others are
# bidirectional there)
CAUSAL_MASKS = tuple(m for m in CP_MASKS if pattern(m).causal)


@dataclass(frozen=True)
class CPImplementation:
    """What names a CP method: its name, what it does, its class and devices."""

    name: str
    summary: str
    impl: str  # "module:Class" under attnbench.cp
    devices: tuple


# How a layout takes its Ulysses degree U: `none`: 1 (one ring over every rank); `all`: N (one
# Ulysses group); `grid`: the grid's cp.ulysses_degree (auto: min(N, gpus_per_node)), a ring of
# R = N / U groups.
ULYSSES_RULES = ("none", "all", "grid")


@dataclass(frozen=True)
class Layout:
    """How a method's degrees follow from its N ranks: the Ulysses degree U (ULYSSES_RULES), the
    ring degree R = N / U, and whether the ring is split into windows W (the grid's cp.windows;
    auto: the largest divisor of R up to sqrt(R)) or is one window. U > 1 spreads the heads over
    U ranks (head_split_reason)."""

    ulysses: str = "none"
    windows: bool = False

    def __post_init__(self):
        if self.ulysses not in ULYSSES_RULES:
            raise ValueError(
                f"unknown Ulysses rule {self.ulysses!r}; valid: {', '.join(ULYSSES_RULES)}"
            )

    @property
    def ring(self) -> bool:
        """Whether the layout can have a ring of 2 or more ranks."""
        return self.ulysses != "all"

    def degrees(
        self, name, gpus, ulysses_degree, windows, placement, gpus_per_node, split_documents
    ) -> Degrees:
        """The degrees on `gpus` ranks; ValueError names a grid setting that does not divide them."""
        if self.ulysses == "all":
            return Degrees(gpus, 1, 1, placement, split_documents)
        if self.ulysses == "none":
            u = 1
        else:
            u = min(gpus, gpus_per_node) if ulysses_degree == "auto" else int(ulysses_degree)
            if u < 1 or gpus % u:
                raise ValueError(
                    f"{name}: ulysses_degree {u} does not divide the {gpus} GPUs "
                    f"(valid degrees: {', '.join(str(d) for d in _divisors(gpus))})"
                )
        ring = gpus // u
        if not self.windows:
            return Degrees(u, ring, 1, placement, split_documents)
        w = default_windows(ring) if windows == "auto" else int(windows)
        if w < 1 or ring % w:
            raise ValueError(
                f"{name}: windows {w} does not divide the ring degree {ring} "
                f"(valid: {', '.join(str(d) for d in _divisors(ring))})"
            )
        return Degrees(u, ring, w, placement, split_documents)


# The layouts of the built-in methods (a method of one's own names one of these, or its own).
RING = Layout("none")  # U = 1, R = N: Ring P2P, Ring AllGather, torch's context_parallel
ULYSSES = Layout("all")  # U = N, R = 1
HYBRID = Layout("grid")  # U from the grid, R = N / U: USP
DOUBLE_RING = Layout("grid", windows=True)  # and the ring in W windows: LoongTrain


@dataclass(frozen=True)
class MethodInfo(CPImplementation):
    masks: tuple = CP_MASKS
    label: str = ""  # how tables and legends name it, where not by `name`
    max_gpus: int | None = None  # None: any number of ranks
    colour: str = (
        ""  # how every figure draws it (its order in legends and tables: its place in METHODS)
    )
    marker: str = ""
    layout: Layout = RING  # how its degrees follow from the GPU count (degrees())
    ring_dkv: bool = False  # its backward sends dK/dV around its ring (cp.dkv_comm_dtype applies)
    # it runs our local kernel (cp.local_kernel); torch's context_parallel runs SDPA itself
    runs_local_kernel: bool = True
    # it shards the documents with cp/layout.py's ShardLayout, so cp.split_documents applies to it
    shard_layout: bool = False
    # how the CP model (cp_model/) times it past the GPUs measured: one of MODEL_SCHEDULES; None:
    # not modelled
    model_schedule: str | None = None


# The CP model's schedules (cp/schedule.py): Ulysses all-to-alls around ring steps (hybrid_schedule:
# Ulysses is R = 1, a ring U = 1), or K and V all-gathered once (allgather_schedule).
HYBRID_SCHEDULE, ALLGATHER_SCHEDULE = "hybrid", "allgather"
MODEL_SCHEDULES = (HYBRID_SCHEDULE, ALLGATHER_SCHEDULE)


def _torch_cp(name, how, colour, marker, **kw) -> MethodInfo:
    """PyTorch's own context parallelism: one class (torch_cp.py), SDPA pinned or left to choose."""
    return MethodInfo(
        name,
        f"torch.distributed.tensor.experimental.context_parallel (SDPA), {how}",
        "torch_cp:TorchCP",
        ("cuda",),
        masks=("full", "causal"),
        colour=colour,
        marker=marker,
        runs_local_kernel=False,
        **kw,
    )


# The 1-GPU baseline of `cp_vs_single_gpu`: the local kernel alone, not a CP method.
BARE_KERNEL = "local"

METHODS = {
    m.name: m
    for m in (
        # `local` (the bare kernel on one GPU) first: the baseline the methods are read against
        MethodInfo(
            BARE_KERNEL,
            "the local kernel alone over the whole sequence on one device, no CP framework "
            "(the baseline of cp_vs_single_gpu)",
            "local:BareKernel",
            ("cpu", "cuda"),
            label="1 GPU, bare kernel",
            max_gpus=1,
            colour="#000000",
            marker="*",
        ),
        MethodInfo(
            "ulysses",
            "all-to-all sequence <-> heads, one local attention per head group",
            "ulysses:Ulysses",
            ("cpu", "cuda"),
            colour="#377eb8",
            marker="o",
            layout=ULYSSES,
            shard_layout=True,
            model_schedule=HYBRID_SCHEDULE,
        ),
        MethodInfo(
            "ring_p2p",
            "ring of R steps, batched isend/irecv overlapped with compute, zigzag",
            "ring_p2p:RingP2P",
            ("cpu", "cuda"),
            colour="#e41a1c",
            marker="s",
            ring_dkv=True,
            shard_layout=True,
            model_schedule=HYBRID_SCHEDULE,
        ),
        MethodInfo(
            "ring_allgather",
            "all-gather K and V once, local q chunks against the visible prefix",
            "ring_allgather:RingAllGather",
            ("cpu", "cuda"),
            colour="#ff7f00",
            marker="^",
            shard_layout=True,
            model_schedule=ALLGATHER_SCHEDULE,
        ),
        MethodInfo(
            "usp",
            "Ulysses inside groups of U, Ring P2P across the R groups",
            "usp:USP",
            ("cpu", "cuda"),
            colour="#4daf4a",
            marker="D",
            layout=HYBRID,
            ring_dkv=True,
            shard_layout=True,
            model_schedule=HYBRID_SCHEDULE,
        ),
        MethodInfo(
            "loongtrain",
            "Ulysses inside groups of U, double ring (W windows) across the R groups",
            "loongtrain:LoongTrain",
            ("cpu", "cuda"),
            colour="#984ea3",
            marker="v",
            layout=DOUBLE_RING,
            ring_dkv=True,
            shard_layout=True,
            model_schedule=HYBRID_SCHEDULE,
        ),
        _torch_cp("torch_cp", "pinned to the backend the local kernel names", "#a65628", "P"),
        _torch_cp(
            "torch_cp_auto",
            "SDPA's own backend choice (PyTorch at its best)",
            "#f781bf",
            "h",
            label="torch_cp, SDPA's choice",
        ),
    )
}


# `auto`: the fastest local kernel measured on the device (cp/choose.py); with no records, the first
# of these that can run the cell. The order is what the H200 sweep measured (README): FA3's forward,
# then cuDNN (the fastest backward on full and causal), FA2, PyTorch's FA2 code, FlashMask (head
# dim 128 only, its subset build), FlexAttention (which compiles per chunk shape and recomputes a
# forward in its backward), the explicit math.
AUTO = "auto"
AUTO_ORDER = {
    ("cuda", "fwd"): ("fa3", "sdpa_cudnn", "fa2", "sdpa_flash", "flashmask", "flex", "math"),
    ("cuda", "bwd"): ("sdpa_cudnn", "fa2", "fa3", "sdpa_flash", "flashmask", "flex", "math"),
    ("cpu", "fwd"): ("cpu_flash", "math", "flex"),
    ("cpu", "bwd"): ("cpu_flash", "math", "flex"),
}
# torch_cp runs SDPA itself; the cell's local kernel names the backend it is pinned to, so that it
# is compared with our methods over the same kernel (`auto`: FLASH, the pinned comparison it always
# was); torch_cp_auto leaves the choice to SDPA (on an H200 it picks cuDNN).
TORCH_CP_BACKENDS = ("sdpa_flash", "sdpa_cudnn")
TORCH_CP_PINNED_DEFAULT = "sdpa_flash"


def method(name: str) -> MethodInfo:
    return lookup(METHODS, name, "context-parallel method", "methods")


def resolve_method(entry: str) -> MethodInfo:
    """A method as a grid names it: a registry name, or 'module:Class' of a CPMethod subclass in
    any importable module (your own method: README, "Your own CP method"). The class carries
    `info`, a MethodInfo whose `impl` is that same 'module:Class'; it is registered under
    `info.name` for this process, so cells, records and figures call it by that name. ValueError
    names what is wrong."""
    if ":" not in entry:
        return method(entry)
    info = own_class(entry, "CP method", MethodInfo, "Your own CP method")
    if not isinstance(info.layout, Layout):
        raise ValueError(
            f"CP method {entry!r}: its info.layout must be a Layout (RING, ULYSSES, HYBRID, "
            f"DOUBLE_RING or one of its own), not {info.layout!r}"
        )
    taken = KERNELS.get(info.name) or METHODS.get(info.name)
    if taken is not None and taken.impl != entry:
        raise ValueError(
            f"CP method {entry!r}: the name {info.name!r} is taken by {taken.impl}; give it another name"
        )
    others = {n: (m.colour, m.marker) for n, m in METHODS.items() if n != info.name}
    # methods are drawn among themselves: their (colour, marker) pairs differ
    if why := style_problem(info, others, distinct_colours=False):
        raise ValueError(f"CP method {entry!r}: {why}")
    METHODS[info.name] = info
    return info


def own_method_files(entry: str) -> tuple[str, tuple[str, ...]]:
    """Your own method's module file and the Python files of its package (a cell's code inputs)."""
    return own_files(entry, "CP method")


def method_label(name: str) -> str:
    """How tables and legends name a method: its label, or its name (also for names not listed here)."""
    return (METHODS[name].label or name) if name in METHODS else name


def local_kernel(name: str) -> LocalKernelInfo:
    return lookup(LOCAL_KERNELS, name, "local kernel", also=(AUTO,))


def library_version(kernel_name: str) -> str:
    """The local kernel's library and version (first distribution found), or 'missing'; for
    `auto`, every local kernel's (any may be chosen). No import."""
    if kernel_name == AUTO:
        return "; ".join(f"{k}: {library_version(k)}" for k in LOCAL_KERNELS)
    k = local_kernel(kernel_name)
    version = first_version(k.dists)
    return f"{version} + {first_version(k.bwd_dists)} (backward)" if k.bwd_dists else version


def uses_local_kernel(method_name: str) -> bool:
    """Whether the method runs our local kernel (torch's context_parallel runs SDPA itself)."""
    return method(method_name).runs_local_kernel


def ring_dkv_methods() -> tuple[str, ...]:
    """The methods whose backward sends dK/dV around a ring (cp.dkv_comm_dtype applies to them)."""
    return tuple(n for n, m in METHODS.items() if m.ring_dkv)


# ---------------------------------------------------------------- degrees


def default_windows(ring: int) -> int:
    """LoongTrain: the largest divisor of R that is <= sqrt(R)."""
    return max(w for w in range(1, math.isqrt(ring) + 1) if ring % w == 0)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degrees(
    name: str,
    gpus: int,
    ulysses_degree="auto",
    windows="auto",
    placement=PLACEMENTS[0],
    gpus_per_node: int = 8,
    split_documents: str = SPLIT_DOCUMENTS[0],
) -> Degrees:
    """The degrees a method runs with on `gpus` ranks (its layout's rule); ValueError names an
    impossible setting."""
    info = method(name)
    if info.max_gpus is not None and gpus > info.max_gpus:
        raise ValueError(
            f"{name} ({info.label}) runs on at most {info.max_gpus} GPU, not {gpus}; "
            f"put it in an `also:` entry with gpus: [{info.max_gpus}]"
        )
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; valid: {', '.join(PLACEMENTS)}")
    if split_documents not in SPLIT_DOCUMENTS:
        raise ValueError(
            f"unknown split_documents {split_documents!r}; valid: {', '.join(SPLIT_DOCUMENTS)}"
        )
    return info.layout.degrees(
        name, gpus, ulysses_degree, windows, placement, gpus_per_node, split_documents
    )


def head_split_reason(ulysses: int, heads_q: int, heads_kv: int) -> str | None:
    """Why query/KV heads cannot be spread over U ranks, or None."""
    if heads_q % ulysses:
        return f"Ulysses degree {ulysses} does not divide the {heads_q} query heads"
    if heads_kv % ulysses and ulysses % heads_kv:
        return (
            f"Ulysses degree {ulysses} and {heads_kv} KV heads: KV heads can be neither split evenly "
            f"nor replicated evenly"
        )
    return None


def kv_replication(ulysses: int, heads_kv: int) -> int:
    """How many copies of each KV head Ulysses sends (1 unless U > Hkv)."""
    return ulysses // heads_kv if ulysses > heads_kv else 1


def unavailable_reason(
    method_name: str, kernel_name: str, device: str, direction: str = "fwd"
) -> str | None:
    """Why the method or its local kernel cannot run on this machine at all (device, library)."""
    m = method(method_name)
    if device not in m.devices:
        return f"{m.name} runs only on {', '.join(m.devices)}, not on {device}"
    if not uses_local_kernel(m.name):
        return None
    k = local_kernel(kernel_name)
    if device not in k.devices:
        return f"local kernel {k.name} runs only on {', '.join(k.devices)}, not on {device}"
    missing = first_missing(k.modules)
    if missing:
        return f"local kernel {k.name} needs the Python module {missing!r}, which is not installed"
    missing = first_missing(k.bwd_modules) if direction != "fwd" else None
    if missing:
        return (
            f"local kernel {k.name}'s backward needs the Python module {missing!r}, which is not "
            f"installed ({k.summary})"
        )
    return None


def mask_reason(m: MethodInfo, mask: str) -> str | None:
    """Why the method cannot express the mask, or None."""
    return (
        None
        if mask in m.masks
        else f"{m.name} cannot express the {mask} mask (it runs: {', '.join(m.masks)})"
    )


def kernel_reason(kernel_name: str, mask: str, direction: str, device: str) -> str | None:
    """Why our local kernel cannot run this mask or direction, or None."""
    k = local_kernel(kernel_name)
    if mask not in k.masks:
        note = f": {k.masks_note}" if k.masks_note else ""
        return f"local kernel {k.name} cannot express the {mask} mask (it runs: {', '.join(k.masks)}){note}"
    dirs = k.directions.get(device, ())
    if direction not in dirs:
        return f"local kernel {k.name} has no {direction} on {device} (it runs: {', '.join(dirs) or 'nothing'})"
    return None


def torch_cp_reason(method_name: str, kernel_name: str) -> str | None:
    """Why torch's context_parallel cannot run under this local-kernel setting, or None."""
    if method_name == "torch_cp" and kernel_name not in TORCH_CP_BACKENDS:
        return (
            f"torch_cp runs SDPA under one pinned backend; local kernel {kernel_name!r} is none "
            f"(valid: {', '.join(TORCH_CP_BACKENDS)}; SDPA's own choice is torch_cp_auto)"
        )
    if method_name == "torch_cp_auto" and kernel_name != AUTO:
        return (
            f"torch_cp_auto leaves the backend to SDPA; its local kernel must be {AUTO}, not "
            f"{kernel_name!r} (torch_cp pins one)"
        )
    return None


def dkv_reason(method_name: str, dkv_comm_dtype: str, direction: str, deg: Degrees) -> str | None:
    """Why cp.dkv_comm_dtype cannot apply to this cell, or None."""
    if dkv_comm_dtype not in DKV_COMM_DTYPES:
        return f"unknown dkv_comm_dtype {dkv_comm_dtype!r}; valid: {', '.join(DKV_COMM_DTYPES)}"
    if dkv_comm_dtype == DKV_COMM_DTYPES[0]:
        return None
    if not method(method_name).ring_dkv or deg.ring < 2:
        return (
            f"dkv_comm_dtype {dkv_comm_dtype}: {method_name} at ring degree {deg.ring} sends no dK/dV "
            f"around a ring (it applies to {', '.join(ring_dkv_methods())} at ring degree >= 2)"
        )
    if direction == "fwd":
        return f"dkv_comm_dtype {dkv_comm_dtype}: a forward cell communicates no dK/dV"
    return None


def unsupported_reason(
    method_name: str,
    kernel_name: str,
    mask: str,
    direction: str,
    device: str,
    deg: Degrees,
    heads_q: int,
    heads_kv: int,
    dkv_comm_dtype: str = DKV_COMM_DTYPES[0],
) -> str | None:
    """Why the method cannot run this configuration natively, or None. Static facts only."""
    m = method(method_name)
    if why := mask_reason(m, mask):
        return why
    if why := torch_cp_reason(m.name, kernel_name):
        return why
    # (auto: the cell chooses among the kernels that can run it, cp/choose.py)
    if (
        uses_local_kernel(m.name)
        and kernel_name != AUTO
        and (why := kernel_reason(kernel_name, mask, direction, device))
    ):
        return why
    if why := dkv_reason(m.name, dkv_comm_dtype, direction, deg):
        return why
    if heads_q % heads_kv:
        return f"{heads_q} query heads are not a multiple of {heads_kv} KV heads"
    if deg.ulysses > 1:
        return head_split_reason(deg.ulysses, heads_q, heads_kv)
    return None
