"""A throughput model of the context-parallel methods beyond the GPUs we have (issue 17).

Built from the methods' own schedules (cp/schedule.py), local-kernel times interpolated from
kernel records (kernel_time.py), bandwidth + latency per message (network.py), and the overlap
each schedule declares (predict.py). Modelled numbers are never written into cell records.
"""
