"""One seeded input generator for every family: the same grid point gets the same masks and
inputs in a kernel cell and a context-parallel cell, and a CP rank's shard is exactly its rows
of the whole-sequence tensors."""

from dataclasses import replace

import numpy as np
import torch
from attnbench.grid.spec import CellSpec, Check, CPSettings, Degrees, Measurement, Problem
from attnbench.harness.inputs import (
    INPUT_BLOCK,
    check_mask_rng,
    data_seed,
    input_seed,
    local_inputs,
    make_inputs,
    mask_rng,
)

POINT = Problem("causal_document", {}, INPUT_BLOCK + 96, 4, 2, 8, "float32", "fwd", seed=0)
HOW = Measurement({"document": 2, "single": 1}, 1, 3, Check(512, 5, 1))


def test_a_kernel_cell_and_a_cp_cell_at_one_point_share_the_data_seed():
    kernel = CellSpec("k", "kernel", "flex", "cpu", 1, POINT, HOW)
    cp_settings = CPSettings(Degrees(1, 4), "math", 8, 1, 4, True, 60)
    cp_problem = replace(POINT, direction="bwd")
    cp = CellSpec(
        "c", "cp", "ring_p2p", "cpu", 4, cp_problem, HOW, None, POINT.seqlen // 4, cp_settings
    )
    assert data_seed(kernel.problem) == data_seed(cp.problem)
    assert data_seed(replace(POINT, seqlen=2048)) != data_seed(POINT)
    assert data_seed(replace(POINT, seed=1)) != data_seed(POINT)


def test_a_shard_is_its_rows_of_the_whole_sequence():
    seed, s = input_seed(data_seed(POINT), 0, POINT.seqlen), POINT.seqlen
    whole = make_inputs(seed, s, 4, 2, 8, torch.float32, "cpu")
    # zigzag-like shard across the block boundary, with padding (-1: a zero row)
    positions = np.array([0, 5, INPUT_BLOCK - 1, INPUT_BLOCK, s - 1, -1])
    shard = local_inputs(seed, positions, 4, 2, 8, torch.float32, "cpu")
    for w, part in zip(whole, shard):
        assert torch.equal(part[:-1], w[positions[:-1]])
        assert not part[-1].any()
    # each block is its own stream: the second block does not repeat the first
    assert not torch.equal(whole[0][:96], whole[0][INPUT_BLOCK:])


def test_samples_lengths_and_tensors_get_their_own_values():
    base = data_seed(POINT)
    s = POINT.seqlen
    q0, k0, v0, d0 = make_inputs(input_seed(base, 0, s), 64, 2, 2, 8, torch.float32, "cpu")
    q1 = make_inputs(input_seed(base, 1, s), 64, 2, 2, 8, torch.float32, "cpu")[0]
    q_short = make_inputs(input_seed(base, 0, 64), 64, 2, 2, 8, torch.float32, "cpu")[0]
    assert not torch.equal(q0, q1) and not torch.equal(q0, q_short)
    assert not torch.equal(k0, v0) and not torch.equal(q0, d0)  # each tensor its own stream
    # the same sample at the same length: the same inputs (the timed run and its check)
    assert torch.equal(
        q0, make_inputs(input_seed(base, 0, s), 64, 2, 2, 8, torch.float32, "cpu")[0]
    )


def test_mask_streams_are_fixed_by_the_seed():
    a, b = mask_rng(7), mask_rng(7)
    assert a.integers(1 << 30) == b.integers(1 << 30)
    assert check_mask_rng(7, 0, 64).integers(1 << 30) != check_mask_rng(7, 1, 64).integers(1 << 30)
