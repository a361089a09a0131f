"""Stage 3, used by every family's cells: seeded inputs, timing and memory, FLOPs, the float64
reference and the correctness gate, the environment fingerprint."""
