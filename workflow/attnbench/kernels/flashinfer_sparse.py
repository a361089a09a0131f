"""FlashInfer's VariableBlockSparseAttentionWrapper (PyPI `flashinfer-python`), forward only.

Checked against flashinfer-python 0.7.2.post1 (flashinfer/sparse.py): plan(block_mask_map
[Hkv, MB, NB] bool, block_row_sz [Hkv, MB], block_col_sz [Hkv, NB] int32, num_qo_heads,
num_kv_heads, head_dim, causal, ..., q_data_type, kv_data_type) then run(q [Hq, S, D],
k/v [Hkv, S, D]) -> out [Hq, S, D] (HND in and out; run rearranges q/k/v into its paged layout
and back in every call, timed as the library's API). Its mask is per KV head (a GQA group shares
it), so a mask drawn per query head under GQA is unsupported. It gets exactly the realised mask
every other kernel gets (the reference drew FlashInfer its own random mask). plan() happens in
prepare, outside the timed region: it expands the kept blocks into token indices (Hkv x density
x S^2 / B of them, and int64 temporaries), which is what runs out of memory at long lengths and
high densities, and it builds (JIT, ninja + nvcc) or loads (flashinfer/data/aot) the batch-prefill
module of the backend it picks: fa3 on Hopper for bf16, head dim 128 (notes.backend says).
FlashInfer's BlockSparseAttentionWrapper takes one BSR mask for all heads: it cannot run these
per-KV-head masks in one call, so it is not used.
"""

from __future__ import annotations

import math

from ..record.status import Unavailable, Unsupported, is_oom
from .base import Kernel

WORKSPACE_BYTES = 128 * 2**20  # the size FlashInfer's documentation recommends
# plan() lists every kept key token of every (KV head, query block) with int32 offsets: beyond
# this count they wrap and its own assertion fails (seen at 64K, MHA 64:64, block 64, density 0.5)
MAX_INDEXED_TOKENS = 2**31 - 1
JIT_FAILURE_WORDS = ("nvcc", "ninja", "cuda_home", "compilation", "failed to compile")


def jit_failure_line(message: str) -> str:
    """The line of a failed build that says why (FlashInfer's message starts 'Ninja build
    failed. Ninja output:' and the compiler's error comes later), else its first line."""
    lines = message.splitlines()
    why = next((ln for ln in lines if "error" in ln.lower() and "ninja" not in ln.lower()), None)
    return (why or lines[0]).strip()[:300]


def indexed_tokens(lay) -> int:
    """How many token indices plan() builds: kept key tokens summed over (KV head, query block)."""
    cols = lay.col_bounds.diff(dim=1)  # [G, ncb]
    return int((lay.keep.sum(dim=1) * cols).sum())


def plan_arguments(mask, heads_q: int, heads_kv: int, head_dim: int, dtype, device="cpu") -> dict:
    """Keyword arguments of VariableBlockSparseAttentionWrapper.plan for this mask."""
    import torch

    lay = mask.layout()
    if lay.groups != heads_kv:
        raise Unsupported(
            f"flashinfer: its block mask is per KV head ({heads_kv}), this mask has {lay.groups} "
            f"groups (granularity={mask.params.get('granularity')!r}); use granularity kv_head"
        )
    tokens = indexed_tokens(lay)
    if tokens > MAX_INDEXED_TOKENS:
        raise Unsupported(
            f"flashinfer: its plan indexes every kept key token of every (KV head, query block) "
            f"in int32: {tokens:,} here, more than {MAX_INDEXED_TOKENS:,}"
        )
    return {
        "block_mask_map": lay.keep.to(device),
        "block_row_sz": lay.row_bounds.diff(dim=1).to(device=device, dtype=torch.int32),
        "block_col_sz": lay.col_bounds.diff(dim=1).to(device=device, dtype=torch.int32),
        "num_qo_heads": heads_q,
        "num_kv_heads": heads_kv,
        "head_dim": head_dim,
        "causal": False,
        "sm_scale": 1.0 / math.sqrt(head_dim),
        "q_data_type": dtype,
        "kv_data_type": dtype,
    }


class FlashInferVariableBlockSparse(Kernel):
    layout = "bhsd"

    def prepare(self, mask):
        import torch

        if not mask.sparse:
            self.unsupported(f"runs block-sparse masks only, not {mask.name}")
        args = plan_arguments(
            mask, self.heads_q, self.heads_kv, self.head_dim, self.dtype, self.device
        )
        flashinfer = self.import_library("flashinfer")
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        wrapper = flashinfer.VariableBlockSparseAttentionWrapper(workspace)
        try:
            wrapper.plan(**args)  # JIT-compiles its kernel on first use
        except Exception as e:  # noqa: BLE001 - only a failed build is a cell outcome; the rest propagates
            if not is_oom(e) and any(w in str(e).lower() for w in JIT_FAILURE_WORDS):
                raise Unavailable(
                    f"flashinfer could not build its kernel here: {jit_failure_line(str(e))}"
                ) from e
            raise
        self.load_notes["backend"] = str(getattr(wrapper, "_backend", "unknown"))
        return lambda q, k, v: wrapper.run(q[0], k[0], v[0]).unsqueeze(0)
