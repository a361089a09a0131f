"""docs/architecture.md, "Where to add", held true: each kind of thing its entries name is added in a
copy of the repository, touching exactly the files its entry names, and one cell of it runs under
Snakemake with the copy's code. An entry that misses a file the new thing needs, or names one it
does not, fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from bounded import run_bounded
from commands import PY, REPO, snakemake_cmd, tool_env
from tinygrids import cp_grid, kernel_grid


def entries() -> dict[str, list[str]]:
    """{kind: the files its entry names}: each `- **kind**` item of the section, and the path
    each of its sub-items starts with."""
    section = (REPO / "docs/architecture.md").read_text().split("## Where to add")[1]
    section = section.split("\n## ")[0]
    out, kind = {}, None
    for line in section.splitlines():
        if m := re.match(r"- \*\*(.+?)\*\*", line):
            kind = m.group(1)
            out[kind] = []
        elif kind and (m := re.match(r"  - `([^`]+)`", line)):
            out[kind].append(m.group(1))
    return out


def test_every_entry_has_its_test():
    tested = {k for k, _ in CASES}
    assert set(entries()) == tested, set(entries()) ^ tested


# ---------------------------------------------------------------- a copy, edited and run


class Copy:
    """The repository's workflow, config and docs in tmp/code; a run of it in tmp/run."""

    def __init__(self, tmp: Path):
        self.code, self.run = tmp / "code", tmp / "run"
        self.code.mkdir()
        self.run.mkdir()
        for name in ("Snakefile", "config.yaml"):
            shutil.copy(REPO / name, self.code / name)
        for folder in ("workflow", "envs", "docs"):
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(REPO / folder, self.code / folder, ignore=ignore)
        self.touched: set[str] = set()

    def edit(self, path: str, change: str | Callable[[str], str]):
        """Write a new file (text), or change one (a function of its text)."""
        f = self.code / path
        text = change if isinstance(change, str) else change(f.read_text())
        f.write_text(text)
        self.touched.add(path)

    def env(self, pythonpath: str = "") -> dict:
        """The copy's package first: the cells run its code, not the installed package's."""
        return tool_env(PYTHONPATH=f"{self.code / 'workflow'}:{pythonpath}")

    def run_cell(self, grids: dict, *targets: str, pythonpath: str = "") -> dict:
        """Snakemake with the copy's config.yaml, these grids and run: them, making `targets`
        (a record first, then tables or figures); the record."""
        cfg = yaml.safe_load((self.code / "config.yaml").read_text())
        cfg["grids"].update(grids)
        cfg["run"] = list(grids)
        (self.run / "config.yaml").write_text(yaml.safe_dump(cfg))
        cmd = snakemake_cmd(self.run, "--cores", "2", *targets, snakefile=self.code / "Snakefile")
        p = run_bounded(cmd, 600, env=self.env(pythonpath))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return json.loads((self.run / targets[0]).read_text())

    def python(self, code: str) -> str:
        p = subprocess.run(
            [PY, "-c", code], capture_output=True, text=True, env=self.env(), cwd=self.run
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout


def named_exactly(kind: str, touched: set[str]):
    """Every file touched is one its entry names, and every file named was touched."""
    named = entries()[kind]
    regex = {p: re.compile(re.sub(r"<[a-z]+>", "[A-Za-z0-9_]+", re.escape(p))) for p in named}
    unnamed = [t for t in touched if not any(r.fullmatch(t) for r in regex.values())]
    untouched = [p for p, r in regex.items() if not any(r.fullmatch(t) for t in touched)]
    assert not unnamed and not untouched, (
        f"{kind}: touched but not named in docs/architecture.md: {unnamed}; "
        f"named but not needed: {untouched}"
    )


def after(anchor: str, insert: str) -> Callable[[str], str]:
    """A change that inserts text right after the first occurrence of anchor."""

    def change(text: str) -> str:
        assert anchor in text, anchor
        return text.replace(anchor, anchor + insert, 1)

    return change


def ok(record: dict):
    assert record["status"] == "ok", record.get("status_reason")
    assert record["check_passed"] is True


# ---------------------------------------------------------------- a mask

CHUNKED = '''"""Chunked attention: causal inside consecutive chunks (a figure family of its own)."""

from __future__ import annotations

from .. import predicates as P
from ..ranges import Slice
from .base import NativeForm, Pattern, doc_bounds


class ChunkedCausal(Pattern):
    """Causal inside consecutive chunks of c tokens (chunked attention)."""

    name = "chunked_causal"
    figure_family = "chunked"
    cfg_keys = ("chunk",)
    causal = True

    def check(self, seqlen, cfg):
        if int(cfg.get("chunk", 0)) < 1:
            raise ValueError(f"{self.name} needs mask_params.chunk >= 1, got {cfg.get('chunk')!r}")

    def sample(self, seqlen, cfg, rng, histograms):
        return {"chunk": int(cfg["chunk"])}

    def chunks(self, seqlen, c):
        return [c] * (seqlen // c) + ([seqlen % c] if seqlen % c else [])

    def predicate(self, seqlen, params, device):
        c = P.scalar(params["chunk"], device)
        return lambda q, k: (k <= q) & (q // c == k // c)

    def slices(self, seqlen, params):
        bounds = doc_bounds(self.chunks(seqlen, params["chunk"]))
        return [Slice(a, b, a, b, "causal") for a, b in bounds]

    def native_form(self, seqlen, params):
        return NativeForm(tuple(self.chunks(seqlen, params["chunk"])), True, (-1, 0))
'''
SMOKE_MASKS = "            global_sliding_window, block_causal_document]\n"
SMOKE_PARAMS = "    mask_params: {window: 32, block: 64}\n"


def add_a_mask(c: Copy, tmp: Path):
    c.edit("workflow/attnbench/masks/patterns/chunked.py", CHUNKED)
    c.edit(
        "workflow/attnbench/masks/patterns/__init__.py",
        lambda t: after("        BlockCausalDocument(),\n", "        ChunkedCausal(),\n")(
            after(
                "from .blockwise import BlockCausalDocument, CausalBlockwise\n",
                "from .chunked import ChunkedCausal\n",
            )(t)
        ),
    )
    c.edit(
        "config.yaml",
        lambda t: t.replace(SMOKE_MASKS, SMOKE_MASKS.replace("]", ", chunked_causal]"), 1).replace(
            SMOKE_PARAMS, SMOKE_PARAMS.replace("}", ", chunk: 32}"), 1
        ),
    )
    row = (
        "| `chunked_causal` | `j <= i` inside chunks of `c` tokens | `c` (`mask_params.chunk`) |\n"
    )
    c.edit("docs/masks.md", after("| name | visible(i, j) | parameters |\n|---|---|---|\n", row))
    grid = kernel_grid(
        kernels=["sdpa"], masks=["chunked_causal"], seqlen=[64], mask_params={"chunk": 16}
    )
    ok(
        c.run_cell(
            {"chunks": grid},
            "results/cells/chunks/kernel/sdpa/chunked_causal/s64-h2x1-d16-float32-fwd.json",
        )
    )
    # a native form: FlashAttention-2/3, varlen and cuDNN claim it, without an edit of theirs;
    # its figure family, from its class; `make run`'s smoke grid runs it with the CPU kernels;
    # its check needs two chunks and one more token (its setting, no check_features of its own)
    claims = "from attnbench.kernels.catalog import get; print(get('fa2').masks, get('fa4').masks)"
    assert c.python(claims).count("chunked_causal") == 2
    family = "from attnbench.report.labels import MASK_FAMILIES as F; print(F['chunked'])"
    assert c.python(family).strip() == "('chunked_causal',)"
    smoke = (
        "from attnbench.families import expand_cells, load_config\n"
        "cells = expand_cells(load_config('../code/config.yaml'), ['smoke'])\n"
        "print(sorted({c['impl'] for c in cells if c['mask'] == 'chunked_causal'}))"
    )
    assert c.python(smoke).strip() == "['flex', 'naive', 'sdpa', 'sdpa_math']"
    need = "import attnbench.masks as M; print(M.pattern('chunked_causal').check_features({'chunk': 16}))"
    assert c.python(need).strip() == "[('two chunks plus one (2 x chunk 16 + 1)', 33)]"


# ---------------------------------------------------------------- kernels

DENSE = '''"""SDPA over the mask's dense boolean form (a dense kernel added in the package)."""

import torch.nn.functional as F

from .base import Kernel


class ProbeDense(Kernel):
    layout = "bhsd"

    def prepare(self, mask):
        visible = mask.dense(self.device)  # [S, S]; a block-sparse mask: [Hq, S, S]
        return lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, enable_gqa=self.gqa
        )
'''

DENSE_ENTRY = """        _dense(
            "probe_dense",
            "SDPA over the dense boolean mask",
            "probe_dense:ProbeDense",
            ("full", "causal"),
            BOTH_ALL,
            colour="#0a5c36",
            marker="o",
        ),
"""
SPARSE_ENTRY = """        _sparse(
            "probe_sparse",
            "SDPA over the block mask, dense per head",
            "probe_sparse:ProbeSparse",
            directions=BOTH_ALL,
            colour="#5c0a36",
            marker="s",
        ),
"""
SPARSE_COMMENT = "        # Block-sparse kernels (docs/kernels.md); each receives the realised mask of its point.\n"
KERNEL_ROWS = "| name | what | masks | notes |\n|---|---|---|---|\n"
# the CPU kernels of `make run`'s smoke grids
SMOKE_KERNELS = "    kernels: [naive, sdpa_math, sdpa]\n"
SMOKE_SPARSE_KERNELS = "    kernels: [naive, sdpa, flex]\n"


def add_a_dense_kernel(c: Copy, tmp: Path):
    c.edit("workflow/attnbench/kernels/probe_dense.py", DENSE)
    c.edit(
        "workflow/attnbench/kernels/catalog.py",
        lambda t: t.replace(SPARSE_COMMENT, DENSE_ENTRY + SPARSE_COMMENT, 1),
    )
    c.edit(
        "config.yaml",
        lambda t: t.replace(SMOKE_KERNELS, SMOKE_KERNELS.replace("]", ", probe_dense]"), 1),
    )
    c.edit(
        "docs/kernels.md",
        after(KERNEL_ROWS, "| `probe_dense` | SDPA, dense mask | full, causal | |\n"),
    )
    grid = kernel_grid(kernels=["probe_dense"], masks=["causal"])
    ok(
        c.run_cell(
            {"dense": grid},
            "results/cells/dense/kernel/probe_dense/causal/s64-h2x1-d16-float32-fwd.json",
        )
    )


def add_a_block_sparse_kernel(c: Copy, tmp: Path):
    c.edit(
        "workflow/attnbench/kernels/probe_sparse.py",
        DENSE.replace("ProbeDense", "ProbeSparse").replace(
            "a dense kernel", "a block-sparse kernel"
        ),
    )
    c.edit("workflow/attnbench/kernels/catalog.py", after(SPARSE_COMMENT, SPARSE_ENTRY))
    c.edit(
        "config.yaml",
        lambda t: t.replace(
            SMOKE_SPARSE_KERNELS, SMOKE_SPARSE_KERNELS.replace("]", ", probe_sparse]"), 1
        ),
    )
    c.edit(
        "docs/kernels.md",
        after(KERNEL_ROWS, "| `probe_sparse` | SDPA, block mask | block_sparse | |\n"),
    )
    grid = kernel_grid(
        family="sparse",
        kernels=["probe_sparse"],
        masks=["block_sparse"],
        block_size=[16],
        density=[0.5],
    )
    record = c.run_cell(
        {"blocks": grid},
        "results/cells/blocks/sparse/probe_sparse/block_sparse/s64-h2x1-d16-float32-fwd-b16-r0.5.json",
    )
    ok(record)


def add_a_kernel_of_your_own(c: Copy, tmp: Path):
    grid = kernel_grid(kernels=["tests.custom_kernel:RowBlockSDPA"], masks=["causal"])
    record = c.run_cell(
        {"own": grid},
        "results/cells/own/kernel/row_block_sdpa/causal/s64-h2x1-d16-float32-fwd.json",
        pythonpath=str(REPO),
    )
    ok(record)


# ---------------------------------------------------------------- CP

PROBE_RING = '''"""Ring AllGather under a name of its own (a CP method added in the package)."""

from .ring_allgather import RingAllGather


class ProbeRing(RingAllGather):
    """Ring AllGather's schedule: U = 1, R = N."""
'''
PROBE_RING_ENTRY = """        MethodInfo(
            "probe_ring",
            "Ring AllGather's schedule under a name of its own",
            "probe_ring:ProbeRing",
            ("cpu", "cuda"),
            colour="#1b9e77",
            marker="<",
            layout=RING,
        ),
"""
SMOKE_METHODS = "    methods: [ulysses, ring_p2p, ring_allgather, usp, loongtrain]\n"


def add_a_cp_method(c: Copy, tmp: Path):
    """The issue's own case: a subclass of Ring AllGather, which a name-keyed layout gave
    LoongTrain's degrees (U = min(N, gpus_per_node)) and a wrong answer."""
    c.edit("workflow/attnbench/cp/probe_ring.py", PROBE_RING)
    c.edit(
        "workflow/attnbench/cp/catalog.py",
        lambda t: t.replace(
            '        _torch_cp("torch_cp",', PROBE_RING_ENTRY + '        _torch_cp("torch_cp",', 1
        ),
    )
    c.edit(
        "config.yaml",
        lambda t: t.replace(SMOKE_METHODS, SMOKE_METHODS.replace("]", ", probe_ring]"), 1),
    )
    c.edit(
        "docs/context-parallelism.md",
        after("## Methods\n\n", "- **probe_ring**: Ring AllGather under a name of its own.\n"),
    )
    smoke = yaml.safe_load((c.code / "config.yaml").read_text())["grids"]["smoke_cp"]
    record = c.run_cell(
        {"smoke_cp": smoke},
        "results/cells/smoke_cp/cp/probe_ring/causal_document_long/s128-h4x2-d16-float32-fwdbwd-g2.json",
    )
    ok(record)
    assert (record["cp"]["degrees"]["ulysses"], record["cp"]["degrees"]["ring"]) == (1, 2)
    # the verify matrix reads its layout too
    verify = [
        PY,
        "-m",
        "attnbench.run.launch",
        "--nproc-per-node",
        "2",
        "--",
        PY,
        "-m",
        "attnbench.cp.verify",
    ]
    out = tmp / "verify.jsonl"
    verify += [
        "--device",
        "cpu",
        "--out",
        str(out),
        "--methods",
        "probe_ring",
        "--kernels",
        "math",
    ]
    p = run_bounded(verify, 300, env=c.env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["status"] == "ok" and r["passed"] for r in rows), rows


def add_a_cp_method_of_your_own(c: Copy, tmp: Path):
    grid = cp_grid(methods=["tests.custom_cp_method:ContiguousAllGather"])
    record = c.run_cell(
        {"owncp": grid},
        "results/cells/owncp/cp/allgather_contiguous/causal/s64-h2x1-d16-float32-fwd-g2.json",
        pythonpath=str(REPO),
    )
    ok(record)


PROBE_LOCAL = '''"""The explicit math local kernel under a name of its own (a CP local kernel added in the package)."""

from .naive import MathLocal


class ProbeLocal(MathLocal):
    pass
'''
PROBE_LOCAL_ENTRY = """        _local(
            "probe_local",
            "the math local kernel under a name of its own",
            "probe_local:ProbeLocal",
            BOTH_ALL,
        ),
"""
LOCAL_ROWS = "| local kernel | calls | masks | backward |\n|---|---|---|---|\n"


def add_a_cp_local_kernel(c: Copy, tmp: Path):
    c.edit("workflow/attnbench/kernels/probe_local.py", PROBE_LOCAL)
    c.edit(
        "workflow/attnbench/kernels/catalog.py",
        lambda t: t.replace(
            "LOCAL_KERNELS = {\n    k.name: k\n    for k in (\n",
            "LOCAL_KERNELS = {\n    k.name: k\n    for k in (\n" + PROBE_LOCAL_ENTRY,
            1,
        ),
    )
    c.edit(
        "docs/context-parallelism.md",
        after(LOCAL_ROWS, "| `probe_local` | the math kernel | every CP mask | yes |\n"),
    )
    grid = cp_grid(cp={"local_kernel": "probe_local", "timeout_s": 60}, direction=["fwdbwd"])
    record = c.run_cell(
        {"local": grid},
        "results/cells/local/cp/ring_p2p/causal/s64-h2x1-d16-float32-fwdbwd-g2-kprobe_local.json",
    )
    ok(record)
    assert record["kernel"]["local_kernel"] == "probe_local"


# ---------------------------------------------------------------- a family

FAMILY = '''"""Family `probe`: kernel cells, with a table and a figure of its own."""

from ..kernel import grid as kernel_grid
from ..kernel import provenance, record_skeleton  # noqa: F401  (the family interface)
from ..kernel.grid import expand  # noqa: F401

NAME = "probe"
CELL_COMMAND = "cell"


def problems(cfg, grid, prod, at):
    return kernel_grid.problems(cfg, grid, prod, at, family=NAME)


def table_stems(grid):
    return ["probe_tflops"]


def figure_stems(grid):
    return ["probe_tflops"]
'''
FAMILY_TABLES = '''"""The probe family's table: TFLOP/s per length and kernel."""

from ...report.tables import write_table


def tables(df, out, samples=None):
    t = df.pivot_table(index="seqlen", columns="impl", values="tflops", aggfunc="first")
    return write_table(t, out / "probe_tflops", "TFLOP/s per length and kernel")


def table_captions(df):
    return {"probe_tflops": "TFLOP/s per length (rows) and kernel (columns)."}, {}
'''
FAMILY_FIGURES = '''"""The probe family's figure: TFLOP/s per kernel."""

import matplotlib.pyplot as plt

from ...report.plotting import save


def figures(df, out, style, only=None, inputs=None):
    if only is not None and "probe_tflops" not in only:
        return []
    fig, ax = plt.subplots()
    ax.bar(df["impl"], df["tflops"])
    return save(fig, out, "probe_tflops", style)


def figure_captions(df, style, inputs=None):
    return {"probe_tflops": "TFLOP/s per kernel."}
'''
FAMILY_ADVICE = '''"""The probe family's answers: the kernel family's, under its name."""

import dataclasses

from ..kernel.advice import ADVICE as KERNEL_ADVICE

ADVICE = dataclasses.replace(KERNEL_ADVICE, name="probe")
'''


def add_a_family(c: Copy, tmp: Path):
    base = "workflow/attnbench/families/probe"
    (c.code / base).mkdir()
    c.edit(f"{base}/__init__.py", FAMILY)
    c.edit(f"{base}/tables.py", FAMILY_TABLES)
    c.edit(f"{base}/figures.py", FAMILY_FIGURES)
    c.edit(f"{base}/advice.py", FAMILY_ADVICE)
    c.edit(
        "workflow/attnbench/families/__init__.py",
        after('    "cp": "cp",\n', '    "probe": "probe",\n'),
    )
    grid = kernel_grid(family="probe", kernels=["sdpa"])
    record = c.run_cell(
        {"fam": grid},
        "results/cells/fam/probe/sdpa/causal/s64-h2x1-d16-float32-fwd.json",
        "results/tables/fam/probe_tflops.md",
        "results/tables/fam/advice.md",
        "results/figures/fam/probe_tflops.png",
    )
    ok(record)
    assert "sdpa" in (c.run / "results/tables/fam/probe_tflops.md").read_text()


CASES = [
    ("a mask", add_a_mask),
    ("a dense kernel", add_a_dense_kernel),
    ("a block-sparse kernel", add_a_block_sparse_kernel),
    ("a kernel of your own", add_a_kernel_of_your_own),
    ("a CP method, built in", add_a_cp_method),
    ("a CP method of your own", add_a_cp_method_of_your_own),
    ("a CP local kernel", add_a_cp_local_kernel),
    ("a family", add_a_family),
]


@pytest.mark.parametrize("kind, add", CASES, ids=[k for k, _ in CASES])
def test_adding_touches_exactly_the_files_named(kind, add, tmp_path):
    c = Copy(tmp_path)
    add(c, tmp_path)
    named_exactly(kind, c.touched)
