"""`peak`: the device's dense matmul ceiling, which the cells' efficiency is measured against."""

from __future__ import annotations

import json

from ..families.cell_entry import claim_gpu_after_start


def cmd_peak(a):
    import torch

    from ..harness.ceiling import Machine, keep
    from ..harness.environment import fingerprint
    from ..harness.inputs import torch_dtype
    from ..harness.measure import matmul_ceiling
    from ..record.record import write_json

    device = a.device
    claim_gpu_after_start(device)
    if device == "cuda" and not torch.cuda.is_available():
        result = {
            "device": device,
            "matmul_peak_tflops": None,
            "reason": "no CUDA device is visible",
        }
    else:
        result = {"device": device, **matmul_ceiling(device, torch_dtype(a.dtype))}
    env = fingerprint(device)
    result.update(device_name=env.get("device_name"), host=env.get("host"))
    if a.keep and result["matmul_peak_tflops"]:
        # a ceiling measured under load is low: the cells get the best this machine ever measured
        machine = Machine(str(result["host"]), str(result["device_name"]), a.dtype)
        result = keep(result, machine, a.keep)
    write_json(result, a.out)  # the ceiling: no cell record
    print(json.dumps(result))


def add_parsers(sub) -> None:
    c = sub.add_parser("peak", help="measure the device's dense matmul ceiling")
    c.add_argument("--device", required=True, help="cpu or cuda")
    c.add_argument("--dtype", required=True, help="the matmul's dtype, e.g. bfloat16")
    c.add_argument("--out", required=True, help="the JSON file written")
    c.add_argument(
        "--keep",
        metavar="FOLDER",
        help="add the measurement to this machine's file there (<output_dir>/device/machines) "
        "and write the highest ceiling kept (attnbench.harness.ceiling)",
    )
    c.set_defaults(fn=cmd_peak)
