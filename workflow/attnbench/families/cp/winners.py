"""Where the CP family's answers sit in the winner map (report.winner_map): a row per mask, a
column per tokens per GPU, grouped by GPU count (and heads setting); a contender is coloured by
its method, whatever local kernel or setting its name adds."""

from __future__ import annotations

from ...report.advice import Answer
from ...report.labels import heads_label, mask_families, seqlen_label
from ...report.winner_map import Column, MapAxes


def _masks(found: list[Answer]) -> list[str]:
    return [m for ms in mask_families(a.point["mask"] for a in found).values() for m in ms]


def _tokens(a: Answer) -> Column:
    heads = (int(a.point["heads_q"]), int(a.point["heads_kv"]))
    tokens = int(a.point["tokens_per_gpu"])
    return Column(
        (a.gpus, heads),
        tokens,
        f"{seqlen_label(tokens)}/GPU",
        f"{a.gpus} GPUs, {heads_label(*heads)}",
    )


def method_of(name: str) -> str:
    """'ring_p2p [auto] [dkv input]' -> 'ring_p2p': the method whose colour it is drawn in."""
    return name.split(" [", 1)[0]


MAP_AXES = MapAxes(
    row=lambda a: a.point["mask"],
    rows=_masks,
    column=_tokens,
    row_words="mask",
    column_words="tokens per GPU",
    group_words="GPUs and heads",
    base=method_of,
    cell_width=2.6,  # a tie names two methods with their settings: 'ulysses [auto]~ring_p2p [auto] +2'
)
