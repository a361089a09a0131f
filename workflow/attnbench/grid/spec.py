"""A cell's parameters as typed objects (torch-free): what it computes (`Problem`), how it is
measured (`Measurement`, its float64 `Check`), a CP cell's settings (`CPSettings`, its `Degrees`)
and the whole cell (`CellSpec`).

They are built once: where a grid expands (the families build a CellSpec per cell and keep its
`to_dict()`) and where a record starts (`CellSpec.from_dict` of the spec the cell reads). The
dict is what a record stores under "cell", hashes into its id (grid.expand) and what a cell's
spec file holds: `to_dict()` gives it with its keys (and its check's and cp's) sorted, as the spec
file has them, the values it holds (mask_params, samples, histograms) as they were given, and
leaves out a CP setting at its default, as cells did before the setting existed (so their ids
hold). The defaults live here, once: each vocabulary's first entry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Each vocabulary's first entry is its default (the schema's too).
PLACEMENTS = ("contiguous", "strided")
# cp.split_documents: which documents the ring family cuts over its ranks (cp/layout.py). all: every
# document, zigzag (the paper's layout, and every record before this setting); as_needed: only as
# many of the longest as the load balance needs, the others kept whole on one ring rank.
SPLIT_DOCUMENTS = ("all", "as_needed")
# cp.dkv_comm_dtype: the dtype dK/dV travel the ring in (accumulator: float32, float64 for float64
# inputs; input: the inputs' dtype, bfloat16 on GPUs); every rank still sums in the accumulator.
DKV_COMM_DTYPES = ("accumulator", "input")
# cp.emulate_contents: what an emulated rank's receive buffers hold (cp/emulate.py)
EMULATE_CONTENTS = ("peers", "synthetic")


def _take(d: dict, required: tuple, optional: tuple, where: str) -> dict:
    """d, checked: every required key present, no key outside required + optional."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    unknown = [k for k in d if k not in required and k not in optional]
    if missing or unknown:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"unknown {', '.join(map(repr, unknown))}"] if unknown else []
        raise ValueError(
            f"{where}: {'; '.join(parts)} (valid keys: {', '.join(required + optional)})"
        )
    return d


def _sorted(d: dict) -> dict:
    return {k: d[k] for k in sorted(d)}


def _one_of(value, valid: tuple, what: str):
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")
    return value


@dataclass(frozen=True)
class Problem:
    """What a cell computes: the same for every kernel and method at a grid point (with `seed`
    it fixes the masks and inputs: harness.inputs.data_seed). `histograms`: the document-length
    histogram a document mask draws from ({name: histogram}), None for other masks."""

    mask: str
    mask_params: dict
    seqlen: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    direction: str
    seed: int
    histograms: dict | None = None

    @property
    def backward(self) -> bool:
        """Whether the cell runs a backward (bwd, or fwdbwd)."""
        return self.direction != "fwd"


@dataclass(frozen=True)
class Check:
    """The float64 check: cells longer than max_seqlen are checked shorter; `samples` checked
    per cell; the gate's tolerance factor (harness.gate)."""

    max_seqlen: int
    tolerance_factor: float
    samples: int

    def to_dict(self) -> dict:
        return _sorted(dataclasses.asdict(self))


@dataclass(frozen=True)
class Measurement:
    """How a cell is measured: masks drawn per sample class (`samples`: {class: count}, the
    pattern's sample_class), warm-ups and repetitions per sample, and its check; `side_by_side`:
    with its point's other contenders, in one job, interleaved draw by draw (families/kernel/
    point.py; absent from the dict when off, as cells had it before the setting existed)."""

    samples: dict
    warmup: int
    reps: int
    check: Check
    side_by_side: bool = False


@dataclass(frozen=True)
class Degrees:
    """N = U x R ranks: Ulysses degree U, ring degree R split into W windows; rank placement;
    which documents the ring cuts (SPLIT_DOCUMENTS)."""

    ulysses: int
    ring: int
    windows: int = 1
    placement: str = PLACEMENTS[0]
    split_documents: str = SPLIT_DOCUMENTS[0]

    @property
    def world(self) -> int:
        return self.ulysses * self.ring

    @property
    def window_size(self) -> int:
        return self.ring // self.windows

    def coords(self, rank: int) -> tuple[int, int]:
        """(ring rank r, Ulysses rank u) of a global rank. contiguous: a Ulysses group is U
        consecutive ranks (inside a node); strided: its members are R ranks apart."""
        if self.placement == "contiguous":
            return rank // self.ulysses, rank % self.ulysses
        return rank % self.ring, rank // self.ring

    def rank(self, r: int, u: int) -> int:
        r, u = r % self.ring, u % self.ulysses
        return r * self.ulysses + u if self.placement == "contiguous" else u * self.ring + r

    def to_json(self) -> dict:
        """Its fields; split_documents only when not the default (the cells and records made
        before it existed keep their spec)."""
        out = dataclasses.asdict(self)
        if out["split_documents"] == SPLIT_DOCUMENTS[0]:
            del out["split_documents"]
        return out


@dataclass(frozen=True)
class CPSettings:
    """A CP cell's settings (its dict's `cp`): its degrees, the local kernel as the grid names it
    (`auto` stays auto: the cell chooses when it runs, cp/choose.py), how its ranks are placed on
    nodes, the compute/communication breakdown, the process-group timeout, and the settings a
    cell names only away from their defaults: auto's evidence grids, dK/dV's dtype, degrees named
    by an `also:` entry (USP 2x4 beside 4x2: two cells), an emulation and its contents."""

    degrees: Degrees
    local_kernel: str
    gpus_per_node: int
    nodes: int
    nproc_per_node: int
    breakdown: bool
    timeout_s: float
    kernel_grids: tuple[str, ...] = ()
    dkv_comm_dtype: str = DKV_COMM_DTYPES[0]
    degrees_named: bool = False
    emulate: bool = False
    emulate_contents: str = EMULATE_CONTENTS[0]

    def __post_init__(self):
        _one_of(self.degrees.placement, PLACEMENTS, "placement")
        _one_of(self.degrees.split_documents, SPLIT_DOCUMENTS, "split_documents")
        _one_of(self.dkv_comm_dtype, DKV_COMM_DTYPES, "dkv_comm_dtype")
        _one_of(self.emulate_contents, EMULATE_CONTENTS, "emulate_contents")

    KEYS = ("local_kernel", "ulysses", "ring", "windows", "placement")
    KEYS += ("gpus_per_node", "nodes", "nproc_per_node", "breakdown", "timeout_s")
    OPTIONAL = ("split_documents", "kernel_grids", "dkv_comm_dtype", "degrees_named")
    OPTIONAL += ("emulate", "emulate_contents")

    @classmethod
    def from_dict(cls, c: dict) -> CPSettings:
        _take(c, cls.KEYS, cls.OPTIONAL, "cp")
        deg = Degrees(
            c["ulysses"],
            c["ring"],
            c["windows"],
            c["placement"],
            c.get("split_documents", SPLIT_DOCUMENTS[0]),
        )
        return cls(
            deg,
            c["local_kernel"],
            c["gpus_per_node"],
            c["nodes"],
            c["nproc_per_node"],
            c["breakdown"],
            c["timeout_s"],
            tuple(c.get("kernel_grids", ())),
            c.get("dkv_comm_dtype", DKV_COMM_DTYPES[0]),
            bool(c.get("degrees_named", False)),
            bool(c.get("emulate", False)),
            c.get("emulate_contents", EMULATE_CONTENTS[0]),
        )

    def to_dict(self) -> dict:
        out = {
            "local_kernel": self.local_kernel,
            **self.degrees.to_json(),
            "gpus_per_node": self.gpus_per_node,
            "nodes": self.nodes,
            "nproc_per_node": self.nproc_per_node,
            "breakdown": self.breakdown,
            "timeout_s": self.timeout_s,
        }
        if self.degrees_named:
            out["degrees_named"] = True
        if self.kernel_grids:
            out["kernel_grids"] = list(self.kernel_grids)
        if self.dkv_comm_dtype != DKV_COMM_DTYPES[0]:
            out["dkv_comm_dtype"] = self.dkv_comm_dtype
        if self.emulate:
            out["emulate"] = True
            if self.emulate_contents != EMULATE_CONTENTS[0]:
                out["emulate_contents"] = self.emulate_contents
        return _sorted(out)


@dataclass(frozen=True)
class CellSpec:
    """One cell: its grid, family and implementation (`impl`: the kernel's or method's name;
    `own_class`: your own, as 'module:Class', stored as kernel_class or method_class), its device
    and GPU count, the problem, the measurement, and a CP cell's tokens per GPU and settings."""

    grid: str
    family: str
    impl: str
    device: str
    gpus: int
    problem: Problem
    measurement: Measurement
    own_class: str | None = None
    tokens_per_gpu: int | None = None
    cp: CPSettings | None = None

    KEYS = ("grid", "family", "impl", "device", "gpus", "mask", "mask_params", "seqlen")
    KEYS += ("heads_q", "heads_kv", "head_dim", "dtype", "direction", "seed", "histograms")
    KEYS += ("samples", "warmup", "reps", "check")
    CP_KEYS = ("tokens_per_gpu", "cp")
    CHECK_KEYS = ("max_seqlen", "tolerance_factor", "samples")

    @property
    def own_key(self) -> str:
        """The key your own class is stored under: a CP method's, or a kernel's."""
        return "method_class" if self.cp is not None else "kernel_class"

    @property
    def entry(self) -> str:
        """The implementation as the registry resolves it: your own 'module:Class', or the name."""
        return self.own_class or self.impl

    @classmethod
    def from_dict(cls, d: dict) -> CellSpec:
        """The cell of a spec dict (a grid's expansion, a spec file); ValueError names a key
        missing or unknown."""
        cp_cell = "cp" in d or "tokens_per_gpu" in d
        own = "method_class" if cp_cell else "kernel_class"
        required = cls.KEYS + (cls.CP_KEYS if cp_cell else ())
        _take(d, required, (own, "side_by_side"), "cell spec")
        check = _take(d["check"], cls.CHECK_KEYS, (), "cell spec: check")
        return cls(
            d["grid"],
            d["family"],
            d["impl"],
            d["device"],
            d["gpus"],
            Problem(
                d["mask"],
                d["mask_params"],
                d["seqlen"],
                d["heads_q"],
                d["heads_kv"],
                d["head_dim"],
                d["dtype"],
                d["direction"],
                d["seed"],
                d["histograms"],
            ),
            Measurement(
                d["samples"],
                d["warmup"],
                d["reps"],
                Check(check["max_seqlen"], check["tolerance_factor"], check["samples"]),
                bool(d.get("side_by_side", False)),
            ),
            d.get(own),
            d.get("tokens_per_gpu"),
            CPSettings.from_dict(d["cp"]) if cp_cell else None,
        )

    def to_dict(self) -> dict:
        """The cell's dict (keys sorted, as its spec file has them): what its record stores under
        "cell" and hashes into cell_id and config_sha256."""
        p, m = self.problem, self.measurement
        out = {
            "grid": self.grid,
            "family": self.family,
            "impl": self.impl,
            "mask": p.mask,
            "mask_params": p.mask_params,
            "seqlen": p.seqlen,
            "heads_q": p.heads_q,
            "heads_kv": p.heads_kv,
            "head_dim": p.head_dim,
            "dtype": p.dtype,
            "direction": p.direction,
            "gpus": self.gpus,
            "device": self.device,
            "samples": m.samples,
            "warmup": m.warmup,
            "reps": m.reps,
            "seed": p.seed,
            "check": m.check.to_dict(),
            "histograms": p.histograms,
        }
        if self.own_class is not None:
            out[self.own_key] = self.own_class
        if m.side_by_side:
            out["side_by_side"] = True
        if self.cp is not None:
            out["tokens_per_gpu"] = self.tokens_per_gpu
            out["cp"] = self.cp.to_dict()
        return _sorted(out)
