"""The cases on which the emulation is compared with a real gloo world: every method at its
degrees for the world (USP and LoongTrain as 2-D factorisations where the world has one,
LoongTrain with two windows at 8), on the four CP masks (full, causal and the two document masks)."""

from attnbench.cp import catalog
from attnbench.cp.run import MethodRun
from attnbench.cp.verify import masks_for

HQ, HKV, D = 8, 2, 16
DTYPE = "float32"
KERNEL = "cpu_flash"
SEED = 0
MASKS = ("full", "causal", "full_document", "causal_document")
TOKENS_PER_RANK = 24


def degrees(world: int):
    yield "ulysses", catalog.degrees("ulysses", world)
    yield "ring_p2p", catalog.degrees("ring_p2p", world)
    yield "ring_allgather", catalog.degrees("ring_allgather", world)
    if world >= 4:  # 2-D: Ulysses 2 x ring N/2 (strided groups); a double ring of 2 windows
        yield "usp", catalog.degrees("usp", world, ulysses_degree=2, placement="strided")
        yield "loongtrain", catalog.degrees("loongtrain", world, ulysses_degree=1, windows=2)
    if world == 8:
        yield "loongtrain", catalog.degrees("loongtrain", world, ulysses_degree=2, windows=2)


def run_of(method: str, deg) -> MethodRun:
    """The method at `deg` over KERNEL on the cases' heads, head dim and dtype, with its backward."""
    return MethodRun(method, KERNEL, deg, HQ, HKV, D, DTYPE, backward=True)


def cases(world: int):
    """(name, method, degrees, mask) for a world of `world` ranks."""
    seqlen = TOKENS_PER_RANK * world + 3  # padded: never a multiple of 2R
    masks = [m for m in masks_for(world, seqlen, SEED) if m.name in MASKS]
    for method, deg in degrees(world):
        for mask in masks:
            d = deg.to_json()
            name = f"{method}-u{d['ulysses']}r{d['ring']}w{d['windows']}{d['placement'][0]}-{mask.name}"
            yield name, method, deg, mask
