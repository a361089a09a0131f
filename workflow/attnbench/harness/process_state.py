"""The per-process settings a cell may change and the next cell of the same process would inherit:
the warm worker (attnbench.run.worker) measures cells one after another, so it takes these once when
it starts and puts them back before every cell, and a record says which ones its cell changed.

Threads (intra-op; inter-op can only be read once work ran), the default dtype and device, float32
matmul precision and TF32 switches, deterministic algorithms, cuDNN benchmarking, grad mode, the
random generators (Python's and NumPy's as captured; torch's, on every device, seeded as a fresh
process seeds them) and the environment variables. A record lists the settings its cell changed,
not the generators (drawing random numbers changes them).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class ProcessState:
    threads: int
    interop_threads: int
    default_dtype: str
    default_device: str
    matmul_precision: str
    cuda_matmul_tf32: bool
    cudnn_tf32: bool
    cudnn_benchmark: bool
    deterministic: bool
    grad_enabled: bool
    environ: tuple
    python_rng: tuple
    numpy_rng: tuple
    torch_seed: int

    @classmethod
    def capture(cls) -> ProcessState:
        import torch

        return cls(
            threads=torch.get_num_threads(),
            interop_threads=torch.get_num_interop_threads(),
            default_dtype=str(torch.get_default_dtype()),
            default_device=str(torch.get_default_device()),
            matmul_precision=torch.get_float32_matmul_precision(),
            cuda_matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
            cudnn_tf32=bool(torch.backends.cudnn.allow_tf32),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            grad_enabled=torch.is_grad_enabled(),
            environ=tuple(sorted(os.environ.items())),
            python_rng=random.getstate(),
            numpy_rng=_numpy_state(),
            torch_seed=torch.initial_seed(),
        )

    def restore(self) -> None:
        """Put every setting back as captured (inter-op threads cannot be: only told apart)."""
        import torch

        torch.set_num_threads(self.threads)
        torch.set_default_dtype(getattr(torch, self.default_dtype.split(".")[-1]))
        torch.set_default_device(self.default_device)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.backends.cuda.matmul.allow_tf32 = self.cuda_matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.use_deterministic_algorithms(self.deterministic)
        torch.set_grad_enabled(self.grad_enabled)
        os.environ.clear()
        os.environ.update(dict(self.environ))
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        torch.manual_seed(self.torch_seed)  # every device's generator, as when the process began

    def changes_since(self, before: ProcessState) -> list[str]:
        """The settings that differ from `before`, named ('threads 1 -> 4'; the environment by
        its variables' names), not the random generators."""
        out = []
        for f in fields(self):
            old, new = getattr(before, f.name), getattr(self, f.name)
            if f.name in RANDOM or old == new:
                continue
            if f.name == "environ":
                a, b = dict(old), dict(new)
                keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                out.append(f"environment ({', '.join(keys)})")
            else:
                out.append(f"{f.name} {old} -> {new}")
        return out


RANDOM = ("python_rng", "numpy_rng", "torch_seed")


def _numpy_state() -> tuple:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return (kind, keys.copy(), pos, has_gauss, cached)
