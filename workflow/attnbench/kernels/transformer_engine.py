"""cuDNN fused attention through TransformerEngine's public DotProductAttention.

TransformerEngine picks among its backends; the environment forces the cuDNN fused one
(NVTE_FUSED_ATTN=1, flash and unfused off), so a call it cannot serve fails instead of silently
running another backend; that refusal (TE's ValueError "No dot product attention backend is
available") is recorded as unsupported, with TE's words. Packed documents use the thd format with
cu_seqlens; windows are TE's (left, right), the same convention as FlashAttention's.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

from ..record.status import Unsupported
from .base import Kernel
from .varlen import cu_seqlens

FORCE_CUDNN = {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"}


def use_torch_cudnn():
    """TE loads the cuDNN under CUDNN_HOME, else the CUDA toolkit's (/usr/local/cuda), before the
    one torch brings; two cuDNNs in one process fail (seen on the H200: the toolkit's 9.14 beside
    torch's 9.19). libtransformer_engine.so needs every cuDNN sub-library by name, and torch opens
    those lazily, so the dynamic linker took the ones it had not opened yet from the system
    (libcudnn_heuristic.so.9 of 9.14, missing a symbol of torch's libcudnn_graph.so.9). So: open
    all of torch's cuDNN libraries first, and point CUDNN_HOME at them unless it is set."""
    import torch

    torch.backends.cudnn.version()
    spec = importlib.util.find_spec("nvidia.cudnn")
    if not (spec and spec.submodule_search_locations):
        return
    home = Path(list(spec.submodule_search_locations)[0])
    # libcudnn_graph first: the others link against it
    libs = sorted(
        (home / "lib").glob("libcudnn*.so.9"),
        key=lambda p: (p.name != "libcudnn_graph.so.9", p.name),
    )
    for lib in libs:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    os.environ.setdefault("CUDNN_HOME", str(home))


def te_arguments(form, heads_q, heads_kv, head_dim, device):
    """(constructor kwargs, call kwargs) for DotProductAttention on a NativeForm, thd format."""
    left, right = form.window
    window = (left, 0 if form.causal else right)
    ctor = dict(
        num_attention_heads=heads_q,
        kv_channels=head_dim,
        num_gqa_groups=heads_kv,
        attention_dropout=0.0,
        qkv_format="thd",
        attn_mask_type="padding_causal" if form.causal else "padding",
        window_size=window,
    )
    cu = cu_seqlens(form.doc_lengths, device)
    longest = max(form.doc_lengths)
    call = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest)
    return ctor, call


class CudnnTE(Kernel):
    layout = "thd"
    backward_once = True  # FusedAttnFunc.backward drops its saved state (TE 2.20)

    def version(self) -> str:
        use_torch_cudnn()
        import transformer_engine

        return f"transformer_engine {transformer_engine.__version__}"

    def prepare(self, mask):
        form = self.half_precision_form(mask)
        os.environ.update(FORCE_CUDNN)
        use_torch_cudnn()
        import transformer_engine.pytorch as te

        ctor, call = te_arguments(form, self.heads_q, self.heads_kv, self.head_dim, self.device)
        module = te.DotProductAttention(**ctor).to(self.device)
        hq, d = self.heads_q, self.head_dim

        def attend(q, k, v):
            try:
                out = module(q, k, v, **call)
            except ValueError as e:
                if "No dot product attention backend" not in str(e):
                    raise
                raise Unsupported(
                    f"cudnn_te: TransformerEngine's cuDNN fused attention refused {mask.name}: {e}"
                ) from e
            return out.view(q.shape[0], hq, d)

        return attend
