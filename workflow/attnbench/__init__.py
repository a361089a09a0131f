"""attnbench: attention kernels and context-parallel methods, measured cell by cell."""

__version__ = "0.1.0"
