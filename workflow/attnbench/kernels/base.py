"""What a kernel implementation provides to the harness.

A kernel receives leaf tensors in its own layout and a realised Mask; `prepare` builds the
mask representation (outside any timed region) and returns fn(q, k, v) -> out in that
layout. Backward is autograd through fn (each library's own backward), timed by the harness.
"""

from __future__ import annotations

import importlib
import importlib.util

from ..record.status import Unavailable, Unsupported
from .catalog import KernelInfo, findable

LAYOUTS = ("thd", "bshd", "bhsd")


def bhsd_view(x):
    """[S, H, D] -> [1, H, S, D], a view (no copy)."""
    return x.transpose(0, 1).unsqueeze(0)


def from_thd(x, layout: str):
    """[S, H, D] -> the kernel's layout, contiguous."""
    if layout == "thd":
        return x.contiguous()
    if layout == "bshd":
        return x.unsqueeze(0).contiguous()
    if layout == "bhsd":
        return bhsd_view(x).contiguous()
    raise ValueError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")


def to_thd(x, layout: str):
    if layout == "thd":
        return x
    if layout == "bshd":
        return x[0]
    if layout == "bhsd":
        return x[0].transpose(0, 1)
    raise ValueError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")


class Kernel:
    layout = "bhsd"
    # True where the autograd graph of one forward can be differentiated only once (the bwd
    # cells then run a new, untimed forward before each timed backward)
    backward_once = False

    def __init__(
        self, info: KernelInfo, device, dtype, heads_q: int, heads_kv: int, head_dim: int
    ):
        self.info, self.device, self.dtype = info, device, dtype
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, head_dim
        # How the library was loaded here (which runtime library, say): joins the record's notes
        self.load_notes: dict = {}

    @property
    def gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    @classmethod
    def preload(cls):
        """Imports a kernel needs at its first call (a compiler, say): done before the GPU is claimed."""

    @classmethod
    def import_modules(cls, info: KernelInfo):
        """Import what the kernel needs (info.modules); raises one of LOAD_ERRORS where an
        installed library cannot load here."""
        for entry in info.modules:
            importlib.import_module(findable(entry))

    def version(self) -> str:
        import torch

        return f"torch {torch.__version__}"

    def prepare(self, mask):
        """Return fn(q, k, v) -> out computing exactly `mask`, or raise Unsupported."""
        raise NotImplementedError

    def unsupported(self, why: str):
        raise Unsupported(f"{self.info.name}: {why}")

    def require_blocks(self, mask, block: int):
        """Unsupported unless the mask is block_sparse with `block`-token blocks."""
        if mask.name != "block_sparse" or mask.params["block_size"] != block:
            self.unsupported(
                f"needs block_sparse with {block}-token blocks, got {mask.name} {mask.params}"
            )

    def half_precision_form(self, mask):
        """The mask's documents/causal/window form for a FlashAttention-style kernel (fp16/bf16 only)."""
        import torch

        form = mask.native_form()
        if form is None:
            self.unsupported(f"{mask.name} has no documents/causal/window form")
        if self.dtype not in (torch.float16, torch.bfloat16):
            self.unsupported(f"needs float16 or bfloat16, got {self.dtype}")
        return form

    def import_library(self, name: str):
        """The kernel's library, imported; one that is installed but cannot load here (a binary built
        for another torch or CUDA, no device) makes the cell `unavailable`, not a crash."""
        try:
            return importlib.import_module(name)
        except LOAD_ERRORS as e:
            raise Unavailable(f"{self.info.name}: importing {name} failed: {load_error(e)}") from e


# What an installed library raises when it cannot load here: a binary built for another CUDA or
# torch, no device, or a release that does not match its dependency (FA4 4.0.0b36 on an older
# cutlass-dsl: AttributeError)
LOAD_ERRORS = (ImportError, OSError, RuntimeError, AttributeError)


# Itanium-mangled prefixes of torch's C++ namespaces (c10::, at::, torch::)
TORCH_SYMBOL_PREFIXES = ("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch")


def load_error(e: BaseException) -> str:
    """The first line of why a library failed to load; a missing torch C++ symbol says that the
    binary was built against another torch (its ABI), a missing NCCL function that it needs a newer
    NCCL than the one torch loads: neither is fixed by a runtime on the library path."""
    import torch

    line = (str(e).splitlines() or [type(e).__name__])[0][:300]
    symbol = line.rpartition("undefined symbol: ")[2].strip()
    if "undefined symbol: " not in line:
        return line
    if symbol.startswith(TORCH_SYMBOL_PREFIXES):
        line += f" (a torch C++ symbol: the binary was built against another torch than {torch.__version__})"
    elif symbol.startswith("nccl"):
        line += f" (an NCCL function: the binary needs a newer NCCL than torch's {nccl_version()})"
    return line


def nccl_version() -> str:
    """The NCCL torch loads, as 2.28.9; 'unknown' where torch has none (a CPU build)."""
    import torch

    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a torch without NCCL raises one of several kinds
        return "unknown"


def kernel_class(info: KernelInfo) -> type[Kernel]:
    """The implementation: "module:Class" of attnbench.kernels, or of any importable module."""
    module, cls = info.impl.split(":")
    local = importlib.util.find_spec(f"{__package__}.{module}") if "." not in module else None
    mod = importlib.import_module(f"{__package__}.{module}" if local else module)
    return getattr(mod, cls)


def load(info: KernelInfo, **kwargs) -> Kernel:
    return kernel_class(info)(info, **kwargs)


def preload(info: KernelInfo) -> None:
    """Import the kernel's adapter and libraries before the cell waits for its GPU, so that a cell
    holding a GPU does not spend it importing. Touches no device; a library that fails to import
    is left for the cell to record (`unavailable`)."""
    try:
        cls = kernel_class(info)
        cls.import_modules(info)
        cls.preload()
    except Exception:  # noqa: BLE001 - the cell itself reports what is wrong
        pass
