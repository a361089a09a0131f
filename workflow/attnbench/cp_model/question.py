"""A user's own question to the CP model: one mask, GPU count, length, heads, direction, network,
local kernel and documents, from the command line (`python -m attnbench predict --mask ...`) or a
YAML file (`--question FILE`), checked against config.yaml's `cp_model` before anything is timed.

Documents: one or more lists of lengths (or cu_seqlens), each a realised mask the answer averages
over; `documents_per_gpu`: the lists are one GPU's tokens and the whole sequence is each length x
the GPU count (ring-flash-attention's benchmark); or a sampler of `cp_model.samplers` (packs drawn
with a cap and a packing rule, documents.py); or, for a document mask with neither, the config's
length histograms (as the grids sample them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import yaml

from ..cp.catalog import AUTO
from ..masks import CP_MASKS
from .documents import PackSampler, parse_documents, published
from .predict import ELEM_BYTES, MODELLED_METHODS

DIRECTIONS = {"fwd": "fwd", "bwd": "bwd", "train": "fwdbwd", "fwdbwd": "fwdbwd"}


@dataclass(frozen=True)
class Question:
    mask: str
    gpus: int
    tokens_per_gpu: int
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    direction: str = "fwd"  # fwd, bwd or fwdbwd (train: fwd + bwd)
    network: str = ""  # a preset of cp_model.networks ("": cp_model.network)
    local_kernel: str = ""  # "": AUTO, the fastest by the kernel records (answer.py)
    calls_kernel: str = ""  # the local kernel whose cells give the per-call terms ("": its own)
    # the grid(s) whose cells give the per-call terms (empty: cp_model.calls_from); the first's
    # network's per-transfer term applies where the question is asked on that network
    calls_from: tuple = ()
    documents: tuple = ()  # ((lengths of one realised mask), ...)
    documents_per_gpu: bool = False  # the lists are one GPU's; the sequence is each length x gpus
    sampler: str = ""  # a sampler of cp_model.samplers
    samples: int = 1  # packs the sampler draws (or sampled masks from the histograms)
    methods: tuple = MODELLED_METHODS

    @property
    def seqlen(self) -> int:
        return self.gpus * self.tokens_per_gpu

    @property
    def documented(self) -> bool:
        """A mask of documents (full_document, causal_document and their _long forms)."""
        return self.mask not in ("full", "causal")

    def with_defaults(self, mc: dict) -> Question:
        """The config's defaults filled in (network, local kernel, per-call grid)."""
        return dataclasses.replace(
            self,
            network=self.network or mc.get("network", ""),
            local_kernel=self.local_kernel or AUTO,
            calls_from=grids_of(self.calls_from or mc.get("calls_from", ())),
        )

    def check(self, cfg: dict) -> None:
        """ValueError naming the first bad value and the valid choices (before anything runs)."""
        mc = cfg["cp_model"]

        def choose(what, value, valid):
            if value not in valid:
                raise ValueError(
                    f"{what} {value!r} is not valid; valid: {', '.join(map(str, valid))}"
                )

        choose("mask", self.mask, CP_MASKS)
        choose("direction", self.direction, tuple(DIRECTIONS))
        choose("dtype", self.dtype, tuple(ELEM_BYTES))
        choose("network", self.network, tuple(mc["networks"]))
        for m in self.methods:
            choose("method", m, MODELLED_METHODS)
        cp_grids = [g for g, v in cfg["grids"].items() if v.get("family") == "cp"]
        if not self.calls_from:
            raise ValueError("calls_from: name the grid(s) whose cells give the per-call terms")
        for g in self.calls_from:
            choose("calls_from (a grid whose cells give the per-call terms)", g, cp_grids)
        choose(
            "calls_from's first grid (its network times the fit)",
            self.calls_from[0],
            tuple(mc["grids"]),
        )
        for name, v in (("gpus", self.gpus), ("tokens_per_gpu", self.tokens_per_gpu)):
            if int(v) < 1:
                raise ValueError(f"{name} must be at least 1, got {v}")
        for name, v in (("heads_q", self.heads_q), ("heads_kv", self.heads_kv)):
            if int(v) < 1:
                raise ValueError(f"{name} must be at least 1, got {v}")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads {self.heads_q}:{self.heads_kv}: the query heads must be a multiple of the "
                "KV heads"
            )
        if self.samples < 1:
            raise ValueError(f"samples must be at least 1, got {self.samples}")
        if not self.documented and (self.documents or self.sampler):
            raise ValueError(
                f"mask {self.mask} has no documents; give documents or a sampler with a document "
                f"mask ({', '.join(m for m in CP_MASKS if m not in ('full', 'causal'))})"
            )
        if self.documents and self.sampler:
            raise ValueError("give documents or a sampler, not both")
        if self.sampler:
            choose("sampler", self.sampler, tuple(mc.get("samplers", {})))
        want = self.tokens_per_gpu if self.documents_per_gpu else self.seqlen
        where = "one GPU's tokens" if self.documents_per_gpu else "the sequence"
        for docs in self.documents:
            if sum(docs) != want:
                raise ValueError(
                    f"documents {','.join(map(str, docs[:8]))}{'...' if len(docs) > 8 else ''} "
                    f"sum to {sum(docs)} tokens, not {where} ({want})"
                )
        if self.documents_per_gpu and not self.documents:
            raise ValueError("documents_per_gpu needs documents")


def grids_of(value) -> tuple:
    """A grid name, a comma-separated list or a list, as a tuple of grid names."""
    if isinstance(value, str):
        return tuple(g for g in value.replace(" ", "").split(",") if g)
    return tuple(value)


def sampler(cfg: dict, name: str) -> PackSampler:
    """A sampler of cp_model.samplers over the package's published distributions."""
    return PackSampler.from_config(
        name, cfg["cp_model"]["samplers"][name], published()["distributions"]
    )


def load_question(path=None, given: dict | None = None) -> Question:
    """A Question from a YAML file of question keys (`path`), the keys `given` (the command
    line's) over the file's; ValueError names an unknown or missing key or a bad value."""
    d = {}
    if path:
        try:
            d = yaml.safe_load(open(path))
        except OSError as e:
            raise ValueError(f"question file {path}: {e}") from None
        if not isinstance(d, dict):
            raise ValueError(f"question file {path}: expected a mapping of question keys")
    return question_from_dict({**d, **(given or {})})


def question_from_dict(d: dict) -> Question:
    """A Question from a mapping: heads as "32:8" or [32, 8], seqlen instead of tokens_per_gpu,
    documents as lists of lengths or strings of lengths / cu_seqlens."""
    d = dict(d)
    fields = {f.name for f in dataclasses.fields(Question)}
    if "heads" in d:
        d["heads_q"], d["heads_kv"] = parse_heads(d.pop("heads"))
    if "seqlen" in d:
        seqlen, gpus = int(d.pop("seqlen")), int(d.get("gpus") or 0)
        if gpus < 1 or seqlen % gpus:
            raise ValueError(
                f"seqlen {seqlen} must be a multiple of the GPUs ({gpus or 'none given'})"
            )
        d.setdefault("tokens_per_gpu", seqlen // gpus)
    unknown = sorted(set(d) - fields)
    if unknown:
        valid = sorted(fields - {"heads_q", "heads_kv"} | {"heads", "seqlen"})
        raise ValueError(f"unknown question keys {unknown}; valid: {', '.join(valid)}")
    missing = [k for k in ("mask", "gpus", "tokens_per_gpu") if d.get(k) is None]
    if missing:
        raise ValueError(f"a question needs {', '.join(missing)} (and tokens_per_gpu or seqlen)")
    docs = d.get("documents") or ()
    if isinstance(docs, str) or (docs and isinstance(docs[0], int)):
        docs = [docs]
    d["documents"] = tuple(
        parse_documents(x) if isinstance(x, str) else tuple(int(v) for v in x) for x in docs
    )
    if "methods" in d:
        d["methods"] = tuple(d["methods"])
    if "calls_from" in d:
        d["calls_from"] = grids_of(d["calls_from"])
    for k in ("gpus", "tokens_per_gpu", "head_dim", "samples", "heads_q", "heads_kv"):
        if k in d:
            d[k] = int(d[k])
    return Question(**d)


def parse_heads(value) -> tuple[int, int]:
    """(query heads, KV heads) from "32:8", "32" (MHA) or [32, 8]."""
    try:
        if isinstance(value, (list, tuple)):
            hq, hkv = (int(value[0]), int(value[-1]))
        else:
            parts = str(value).split(":")
            hq, hkv = int(parts[0]), int(parts[-1])
    except (ValueError, IndexError):
        raise ValueError(f"heads {value!r}: give query:KV heads, e.g. 32:8") from None
    return hq, hkv
