"""Kernel records as the kernel cells write them (cells/<grid>/kernel/<impl>/<mask>/<point>.json),
holding what `auto` reads: for the tests of the local-kernel choice (synthetic TFLOP/s, not
measurements)."""

import json


def write_kernel_record(root, impl, mask, point, tflops, device_name, grid="sweep", **changes):
    """`point`: the file name's fields after the length, e.g. 's16384-h64x8-d128-bfloat16-fwd'."""
    seqlen = int(point.split("-")[0][1:])
    rec = {
        "status": "ok",
        "check_passed": True,
        "tflops": tflops,
        "cell": {"impl": impl, "grid": grid, "mask": mask, "seqlen": seqlen, "reps": 20},
        "environment": {"device_name": device_name},
    }
    for key, value in changes.items():
        if key == "reps":
            rec["cell"]["reps"] = value
        else:
            rec[key] = value
    path = root / "cells" / grid / "kernel" / impl / mask
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{point}.json").write_text(json.dumps(rec))
