"""A throughput and memory model of the context-parallel methods beyond the GPUs we have
(docs/cp-model.md).

Built from the methods' own schedules (cp/schedule.py) over the layout's chunks as arrays
(geometry.py), local-kernel times interpolated from kernel records (kernel_time.py), bandwidth +
latency per message (network.py), per-call overheads fitted on the grid's own compute-only and
comm-only runs (overhead.py), the overlap each schedule declares (predict.py), and the bytes each
rank holds during a call (memory.py). Modelled numbers are never written into cell records.
"""
