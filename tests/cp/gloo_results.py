"""Every rank's results (out, lse, dq, dk, dv, positions) of CP methods on a real gloo world,
saved for tests/cp/test_cp_emulate.py to compare with the one-process emulation.

    python -m attnbench.run.launch --nproc-per-node N -- python tests/cp/gloo_results.py OUT.pt

The cases are emulate_cases.cases(N); rank 0 saves {case name: [rank results]}.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from attnbench.cp import run  # noqa: E402
from emulate_cases import SEED, cases, run_of  # noqa: E402


def main(out: str):
    session = run.Session(run.init("cpu", 120))
    saved = {}
    for name, method_name, deg, mask in cases(session.world):
        mrun = run_of(method_name, deg)
        rc = session.context(mrun)
        method = run.load_method(mrun, rc, mask)
        method.setup(True)
        inputs = run.rank_inputs(mrun, SEED, method.positions, session.device)
        res = run.on_cpu(run.run_counted(method, rc, inputs, True))
        gathered = [None] * session.world
        dist.all_gather_object(gathered, res)
        saved[name] = gathered
    if session.rank == 0:
        torch.save(saved, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
