"""On the GPU machine, after build_wheels.sh: each built wheel imports and computes causal attention
close to float64 (FA3 at every head dim it holds, its FP8 forward and MLA's 192/128; FlashMask;
FFA at head dims 64 and 128). A smoke check of the build, not the kernels' correctness gate (the
GPU tests and every cell's float64 check are that)."""
import math

import torch


def reference(q, k, v, causal=True):
    qf, kf, vf = (x.double().transpose(1, 2) for x in (q, k, v))
    g = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(g, 1), vf.repeat_interleave(g, 1)
    s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return (s.softmax(-1) @ vf).transpose(1, 2)


def first(o):
    return o[0] if isinstance(o, tuple) else o


def inputs(d, dv, s=1024, h=8, hk=2):
    mk = lambda hh, dd: torch.randn(1, s, hh, dd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return mk(h, d), mk(hk, d), mk(hk, dv)


def check(name, fn):
    try:
        print(name, fn())
    except Exception as e:  # report and go on: one variant missing says what the wheel lacks
        print(name, "FAILED:", type(e).__name__, str(e)[:160])


torch.manual_seed(0)
import flash_attn_interface as fa3

for d, dv in [(64, 64), (128, 128), (192, 192), (256, 256), (192, 128)]:
    def bf16(d=d, dv=dv):
        q, k, v = inputs(d, dv)
        o = first(fa3.flash_attn_func(q, k, v, causal=True))
        err = (o.double() - reference(q, k, v)).abs().max().item()
        o.float().sum().backward()
        return f"fwd max err {err:.4f}, bwd ran (dq finite: {bool(q.grad.isfinite().all())})"

    def fp8(d=d, dv=dv):
        q, k, v = (x.detach().to(torch.float8_e4m3fn) for x in inputs(d, dv))
        o = first(fa3.flash_attn_func(q, k, v, causal=True))
        up = [x.to(torch.bfloat16) for x in (q, k, v)]
        return f"{o.dtype}, max err {(o.double() - reference(*up)).abs().max().item():.4f}"
    check(f"fa3 bf16 {d}/{dv}", bf16)
    check(f"fa3 fp8 {d}/{dv}", fp8)


def flashmask():
    from interface_torch import flashmask_attention  # the wheel's top-level module
    q, k, v = inputs(128, 128)
    ends = torch.full((1, 1, q.shape[1], 1), q.shape[1], dtype=torch.int32, device="cuda")
    o = first(flashmask_attention(q, k, v, ends, causal=True))
    o.float().sum().backward()
    return f"max err {(o.double() - reference(q, k, v)).abs().max().item():.4f}, bwd ran"


check("flashmask 128", flashmask)
for d in (64, 128):
    def ffa(d=d):
        from magi_attention.functional.flex_flash_attn import flex_flash_attn_func
        q, k, v = (x[0] for x in inputs(d, d))
        r = torch.tensor([[0, q.shape[0]]], dtype=torch.int32, device="cuda")
        o = first(flex_flash_attn_func(q, k, v, q_ranges=r, k_ranges=r,
                                       attn_type_map=torch.tensor([1], dtype=torch.int32, device="cuda")))
        o.float().sum().backward()
        return f"max err {(o.double() - reference(q[None], k[None], v[None])[0]).abs().max().item():.4f}, bwd ran"
    check(f"ffa {d}", ffa)
