"""Kernel registry: `catalog` (torch-free facts) and one small module per library."""

from .catalog import KERNELS, KernelInfo, get  # noqa: F401
