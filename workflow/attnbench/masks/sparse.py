"""Dynamic block-sparse patterns (docs/masks.md): a random set of kept key blocks per query
block, drawn per head or per KV-head group.

A sample's params hold the seed and sizes; the kept blocks are regenerated from them
deterministically (torch CPU generator), so the record stays small and the mask exact.
The structure is kept as block indices (O(blocks)), never as an S x S matrix.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field

from .patterns import CheckShape
from .ranges import Slice, check_block_multiple

GRANULARITIES = ("head", "kv_head")


@dataclass
class BlockLayout:
    """Per group g: row/col block boundaries and the kept blocks."""

    row_bounds: "torch.Tensor"  # [G, nrb + 1] long  # noqa: F821
    col_bounds: "torch.Tensor"  # [G, ncb + 1] long  # noqa: F821
    keep: "torch.Tensor"  # [G, nrb, ncb] bool  # noqa: F821
    kv_indices: "torch.Tensor"  # [G, nrb, k] long, sorted kept column blocks per row block  # noqa: F821
    _sha256: str | None = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.row_bounds, self.col_bounds, self.keep, self.kv_indices)
        )

    @property
    def groups(self) -> int:
        return self.keep.shape[0]

    def area_per_group(self):
        rows = self.row_bounds.diff(dim=1)  # [G, nrb]
        cols = self.col_bounds.diff(dim=1)  # [G, ncb]
        kept_cols = (self.keep * cols[:, None, :]).sum(-1)  # [G, nrb]
        return (rows * kept_cols).sum(-1)

    def fingerprint(self) -> str:
        """sha256 of the block boundaries and kept block indices: equal iff the masks are equal.
        Computed once per layout (a 128K mask's indices are over a GB)."""
        if self._sha256 is None:
            self._sha256 = self._hash()
        return self._sha256

    def _hash(self) -> str:
        import torch

        h = hashlib.sha256()
        for t in (self.row_bounds, self.col_bounds, self.kv_indices):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.to(device="cpu", dtype=torch.long).contiguous().numpy())  # no copy
        return h.hexdigest()

    def key_block_lists(self, device="cpu"):
        """The transpose of kv_indices, as CSR over (group, key block): offsets [G * ncb + 1] and
        the query blocks that keep each key block, in increasing order. O(kept blocks) memory;
        computed on `device` (a GPU sorts the 10^8 kept blocks of the paper's largest cells fast)."""
        import torch

        g, nrb, k = self.kv_indices.shape
        ncb = self.keep.shape[-1]
        cols = self.kv_indices.to(device)
        key = (torch.arange(g, device=device).view(g, 1, 1) * ncb + cols).reshape(
            -1
        )  # (group, key block)
        rows = torch.arange(nrb, device=device).view(1, nrb, 1).expand(g, nrb, k).reshape(-1)
        order = torch.sort(key, stable=True).indices  # stable: query blocks stay increasing
        counts = torch.bincount(key, minlength=g * ncb)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=device), counts.cumsum(0)])
        return offsets, rows[order]

    def tile_counts(self, tile: int, seqlen: int, device="cpu"):
        """Visible pairs in every (tile x tile) square, per group: [G, nt, nt] int32, exact.

        counts = R @ keep @ C with R[t, r] = rows of block r inside query tile t (and C alike):
        O(tiles x blocks) memory, never S x S. float64 keeps every product and sum exact.
        """
        import torch

        def overlap(bounds):  # [G, nt, nblocks]: tokens of each block inside each tile
            nt = -(-seqlen // tile)
            t0 = (torch.arange(nt, device=device) * tile).view(1, nt, 1)
            t1 = torch.clamp(t0 + tile, max=seqlen)
            b = bounds.to(device)
            lo, hi = b[:, None, :-1], b[:, None, 1:]
            return (torch.minimum(t1, hi) - torch.maximum(t0, lo)).clamp(min=0).to(torch.float64)

        r, c = overlap(self.row_bounds), overlap(self.col_bounds)
        counts = r @ self.keep.to(device=device, dtype=torch.float64) @ c.transpose(1, 2)
        return counts.round().to(torch.int32)

    def block_of(self, bounds, seqlen: int):
        """[G, S + padding]: the block index of every position (padding: block 0, see INDEX_PAD)."""
        import torch

        from .predicates import padded_length

        sizes = bounds.diff(dim=1)
        idx = torch.arange(sizes.shape[1]).expand_as(sizes)
        out = torch.stack(
            [torch.repeat_interleave(idx[g], sizes[g]) for g in range(sizes.shape[0])]
        )
        return torch.nn.functional.pad(out, (0, padded_length(seqlen) - seqlen))


def _top_k_keep(gen, groups, nrb, ncb, density):
    """Keep the k = density x ncb column blocks of highest uniform score in each row block."""
    import torch

    k = max(1, int(density * ncb))
    return top_k_blocks(torch.rand(groups, nrb, ncb, generator=gen), k)


def top_k_blocks(scores, k: int):
    """The k highest scores of each row: keep (bool, the shape of scores) and the kept columns in
    increasing order [..., k].

    The layouts of the committed records were drawn as `scores.topk(k).indices.sort()`; this is
    that set, in that order, bit for bit even among equal scores (tests/test_sparse_masks.py), and
    2-3x faster at 128K: torch's CPU topk selects the same elements whether or not it sorts them
    afterwards, and the kept columns come out in increasing order from the kept flags (nonzero
    lists them row by row) instead of a sort."""
    import torch

    shape = scores.shape
    keep = torch.zeros(shape, dtype=torch.bool)
    keep.scatter_(-1, scores.topk(k, dim=-1, sorted=False).indices, True)
    del scores  # the caller's only reference (_top_k_keep): a GiB at 128K, freed before nonzero
    columns = keep.view(-1, shape[-1]).nonzero()[:, 1]  # row-major: increasing in each row
    return keep, columns.contiguous().view(*shape[:-1], k)


def _random_partition(gen, total, parts, minimum):
    """`parts` sizes >= minimum summing to total: minimum plus a uniform random split of the rest."""
    import torch

    rest = total - parts * minimum
    cuts = torch.randint(0, rest + 1, (parts - 1,), generator=gen).sort().values
    edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([rest])])
    return edges.diff() + minimum


class SparsePattern(CheckShape):
    sample_class = "single"
    uses_documents = False
    cfg_keys = ()

    def groups(self, cfg, heads_q, heads_kv):
        gran = cfg.get("granularity", "kv_head")
        if gran not in GRANULARITIES:
            raise ValueError(
                f"mask_params.granularity={gran!r}; valid: {', '.join(GRANULARITIES)}"
            )
        return heads_kv if gran == "kv_head" else heads_q

    def predicate_h(self, seqlen, params, device):
        """The predicate over (h, q, k): kept[group(h), rowblock(q), colblock(k)]."""
        import torch

        lay = self.layout(seqlen, params)
        per = params["heads_q"] // lay.groups
        keep = lay.keep.to(device)
        rows = lay.block_of(lay.row_bounds, seqlen).to(device)
        cols = lay.block_of(lay.col_bounds, seqlen).to(device)

        def pred(h, q, k):
            g = torch.div(h, per, rounding_mode="floor")
            return keep[g, rows[g, q], cols[g, k]]

        return pred

    def slices_for_group(self, seqlen, params, group) -> list[Slice]:
        lay = self.layout(seqlen, params)
        rb, cb = lay.row_bounds[group].tolist(), lay.col_bounds[group].tolist()
        out = []
        for i, j in lay.keep[group].nonzero().tolist():
            out.append(Slice(rb[i], rb[i + 1], cb[j], cb[j + 1], "full"))
        return out

    def area_per_head(self, seqlen, params) -> list[int]:
        lay = self.layout(seqlen, params)
        per = params["heads_q"] // lay.groups
        return [int(a) for a in lay.area_per_group().repeat_interleave(per)]

    # Keys the generator reads; the others in params are what it produced (recorded, not inputs).
    generator_keys = ()

    def check_blocks(self, seqlen, cfg):
        """Raise ValueError unless cfg's block sizes fit seqlen (each pattern its own)."""
        raise NotImplementedError

    def block_params(self, cfg) -> dict:
        """The pattern's block sizes from cfg, as the generator reads them."""
        raise NotImplementedError

    def check(self, seqlen, cfg):
        self.check_blocks(seqlen, cfg)
        d = float(cfg.get("density", -1))
        if not 0 < d <= 1:
            raise ValueError(
                f"{self.name} needs 0 < mask_params.density <= 1, got {cfg.get('density')!r}"
            )

    def sample(self, seqlen, cfg, rng, heads_q, heads_kv):
        self.check(seqlen, cfg)
        params = {
            **self.block_params(cfg),
            "density": float(cfg["density"]),
            "granularity": cfg.get("granularity", "kv_head"),
            "groups": self.groups(cfg, heads_q, heads_kv),
            "heads_q": heads_q,
            "seed": int(rng.integers(2**31 - 1)),
        }
        return self._realised(params, self.layout(seqlen, params))

    def _realised(self, params, lay):
        params["kept_blocks"] = int(lay.keep.sum())
        params["total_blocks"] = int(lay.keep.numel())
        params["realised_density"] = params["kept_blocks"] / params["total_blocks"]
        params["layout_sha256"] = lay.fingerprint()
        return params

    def layout(self, seqlen, params) -> BlockLayout:
        """The kept blocks, regenerated from the seed (cached: one cell rebuilds it several times)."""
        key = json.dumps({k: params[k] for k in self.generator_keys}, sort_keys=True)
        return _cached_layout(self.name, int(seqlen), key)

    def verify(self, seqlen, params) -> None:
        """Raise ValueError unless the seed rebuilds exactly the recorded layout."""
        got = self.layout(seqlen, params).fingerprint()
        if "layout_sha256" in params and got != params["layout_sha256"]:
            raise ValueError(
                f"{self.name}: seed {params['seed']} rebuilds layout {got[:12]}, "
                f"the record says {params['layout_sha256'][:12]}"
            )


class BlockSparse(SparsePattern):
    name = "block_sparse"
    cfg_keys = ("block_size", "density", "granularity")
    block_key = "block_size"
    generator_keys = ("block_size", "density", "groups", "seed")

    def check_blocks(self, seqlen, cfg):
        check_block_multiple(self.name, cfg, "block_size", seqlen)

    def block_params(self, cfg):
        return {"block_size": int(cfg["block_size"])}

    @staticmethod
    def generate(seqlen, params) -> BlockLayout:
        import torch

        b, g = params["block_size"], params["groups"]
        n = seqlen // b
        gen = torch.Generator().manual_seed(params["seed"])
        keep, idx = _top_k_keep(gen, g, n, n, params["density"])
        bounds = (torch.arange(n + 1) * b).expand(g, n + 1).contiguous()
        return BlockLayout(bounds, bounds.clone(), keep, idx)


class VariableBlockSparse(SparsePattern):
    name = "variable_block_sparse"
    cfg_keys = ("avg_block", "min_block", "density", "granularity")
    block_key = "avg_block"
    generator_keys = ("avg_block", "min_block", "density", "groups", "seed")

    def check_blocks(self, seqlen, cfg):
        a, m = int(cfg.get("avg_block", 0)), int(cfg.get("min_block", 128))
        if a < m or m < 1:
            raise ValueError(
                f"variable_block_sparse needs mask_params.avg_block >= min_block >= 1, got avg_block={a}, min_block={m}"
            )
        if seqlen < a:
            raise ValueError(
                f"variable_block_sparse: seqlen {seqlen} is shorter than avg_block={a}"
            )

    def block_params(self, cfg):
        return {"avg_block": int(cfg["avg_block"]), "min_block": int(cfg.get("min_block", 128))}

    @staticmethod
    def generate(seqlen, params) -> BlockLayout:
        import torch

        g, n = params["groups"], seqlen // params["avg_block"]
        gen = torch.Generator().manual_seed(params["seed"])

        def bounds():
            sizes = torch.stack(
                [_random_partition(gen, seqlen, n, params["min_block"]) for _ in range(g)]
            )
            return torch.cat([torch.zeros(g, 1, dtype=torch.long), sizes.cumsum(1)], dim=1)

        row_bounds, col_bounds = bounds(), bounds()
        keep, idx = _top_k_keep(gen, g, n, n, params["density"])
        return BlockLayout(row_bounds, col_bounds, keep, idx)


SPARSE_PATTERNS = {p.name: p for p in (BlockSparse(), VariableBlockSparse())}


def _layout_cache_bytes() -> int:
    """At most an eighth of the memory, at most 16 GiB: room for every layout of a grid point's
    lengths on a GPU host, a few small ones on a laptop."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 << 30
    return min(memory // 8, 16 << 30)


# Every kernel and direction of a grid point draws the same layout (same data seed), and a warm
# worker measures them one after the other in any order: generating a 128K layout takes seconds
# (CPU generator, top-k), so the worker keeps the recent ones, least recently used out first.
_LAYOUTS: OrderedDict = OrderedDict()
LAYOUT_CACHE_BYTES = _layout_cache_bytes()


def _cached_layout(name: str, seqlen: int, key: str) -> BlockLayout:
    k = (name, seqlen, key)
    if k in _LAYOUTS:
        _LAYOUTS.move_to_end(k)
        return _LAYOUTS[k]
    lay = SPARSE_PATTERNS[name].generate(seqlen, json.loads(key))
    _LAYOUTS[k] = lay
    while len(_LAYOUTS) > 1 and sum(x.nbytes for x in _LAYOUTS.values()) > LAYOUT_CACHE_BYTES:
        _LAYOUTS.popitem(last=False)
    return lay
