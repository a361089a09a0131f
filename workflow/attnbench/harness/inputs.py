"""The seeded inputs of every cell, kernel or context-parallel: one generator for both families.

How a sample's data is seeded (the same grid point gets the same masks and inputs in every
family, on every kernel and method, in every direction):

- `data_seed(problem)` hashes the grid's `seed` with what fixes the data (the cell's problem,
  grid.spec.Problem): mask, mask parameters, length, heads, head dimension, dtype; not the kernel,
  method, direction, family or GPU count.
- The masks of a cell's samples are drawn one after another from `mask_rng(data_seed)`; a
  correctness check at a shorter length draws its mask from `check_mask_rng(data_seed, index,
  seqlen)`, so it does not disturb the timed samples' sequence.
- Sample `index` at length `seqlen` has the inputs `input_seed(data_seed, index, seqlen)`; the
  timed sample and a check at the same length share them, a shorter check gets its own.
- q, k, v and dout are generated in blocks of INPUT_BLOCK positions, each block from its own
  generator seeded by (input seed, tensor, block): a row depends on its position only, so a CP
  rank generating just its own shard gets exactly the rows of the whole-sequence tensor.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..grid.spec import Problem

DTYPES = ("float32", "float16", "bfloat16", "float64")
INPUT_BLOCK = 4096  # rows generated per seeded block (same rows whatever the sharding)
TENSORS = ("q", "k", "v", "dout")
DATA_KEYS = ("seed", "mask", "mask_params", "seqlen", "heads_q", "heads_kv", "head_dim", "dtype")


def data_seed(problem: Problem) -> int:
    """Same seed for every kernel, method and direction of a grid point: same masks, same inputs."""
    text = json.dumps({k: getattr(problem, k) for k in DATA_KEYS}, sort_keys=True, default=str)
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def mask_rng(seed: int) -> np.random.Generator:
    """The timed samples' masks, drawn in order from one generator."""
    return np.random.default_rng(seed)


def check_mask_rng(seed: int, index: int, seqlen: int) -> np.random.Generator:
    """The mask of sample `index`'s check at a shorter length `seqlen`."""
    return np.random.default_rng([seed, index, seqlen])


def input_seed(seed: int, index: int, seqlen: int) -> int:
    """The inputs of sample `index` at length `seqlen` (timed, or checked at that length)."""
    return _stream(seed, index, seqlen)


def _stream(*entropy: int) -> int:
    # SeedSequence mixes the parts into independent streams (no offsets that could collide)
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, np.uint64)[0]) % 2**63


def torch_dtype(name):
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, name)


def position_rows(seed: int, positions, heads: int, head_dim: int, dtype, device, which: str):
    """Rows of one input tensor (`which`, one of TENSORS) at the given global positions (-1: a
    zero row), N(0, 1) drawn in float32 and cast to `dtype`."""
    import torch

    pos = torch.as_tensor(np.asarray(positions), dtype=torch.long)
    out = torch.zeros(len(pos), heads, head_dim, dtype=dtype, device=device)
    tid = TENSORS.index(which)
    for b in torch.unique(pos[pos >= 0] // INPUT_BLOCK).tolist():
        gen = torch.Generator(device=device).manual_seed(_stream(seed, tid, b))
        block = torch.randn(
            INPUT_BLOCK, heads, head_dim, generator=gen, device=device, dtype=torch.float32
        )
        sel = (pos >= b * INPUT_BLOCK) & (pos < (b + 1) * INPUT_BLOCK)
        idx = sel.nonzero().squeeze(1)
        out[idx.to(device)] = block[(pos[idx] - b * INPUT_BLOCK).to(device)].to(dtype)
    return out


def local_inputs(seed, positions, hq, hkv, d, dtype, device):
    """q, k, v, dout (thd layout) at the given positions: a CP rank's shard."""
    heads = {"q": hq, "k": hkv, "v": hkv, "dout": hq}
    return [position_rows(seed, positions, heads[t], d, dtype, device, t) for t in TENSORS]


def make_inputs(seed, seqlen, hq, hkv, d, dtype, device):
    """q, k, v, dout ~ N(0, 1) in thd layout over the whole sequence."""
    return local_inputs(seed, np.arange(seqlen), hq, hkv, d, dtype, device)
