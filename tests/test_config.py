"""Bad config values give errors that name the key and the valid choices."""

import copy

import pytest
from attnbench.families import expand_cells, load_config, validate
from attnbench.grid.config import ConfigError
from attnbench.grid.expand import point_id
from attnbench.grid.spec import CellSpec


def bad(base, edit):
    cfg = copy.deepcopy(base)
    edit(cfg)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    return str(e.value)


def test_repo_config_is_valid(repo):
    cfg = load_config(repo / "config.yaml")
    cells = expand_cells(cfg)
    assert len(cells) > 100
    assert len({point_id(c) + c["impl"] + c["mask"] for c in cells}) == len(cells)
    paper = expand_cells(cfg, ["paper_kernels"])
    assert len(paper) == 12 * 12 * 9 * 2 * 2


def test_unknown_kernel(base):
    msg = bad(base, lambda c: c["grids"]["smoke"]["kernels"].append("flashy"))
    assert (
        "grids.smoke.kernels[3]: unknown kernel 'flashy'" in msg
        and "valid kernels: naive, sdpa" in msg
    )


def test_unknown_family_names_the_registered_ones(base):
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("family", "kernal"))
    assert "grids.smoke.family: unknown family 'kernal'; valid families: kernel, sparse, cp" in msg


def test_unknown_mask(base):
    msg = bad(base, lambda c: c["grids"]["smoke"]["masks"].__setitem__(1, "cauzal"))
    assert (
        "grids.smoke.masks[1]: unknown mask 'cauzal'" in msg and "valid masks: full, causal" in msg
    )


def test_impossible_head_split(base):
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("heads", [[6, 4]]))
    assert "grids.smoke.heads[0]: 6 query heads are not a multiple of 4 KV heads" in msg


def test_seqlen_not_divisible_by_block(base):
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("seqlen", [100]))
    assert (
        "block_causal_document at seqlen 100" in msg
        and "not a multiple of mask_params.block=64" in msg
    )


def test_a_grid_that_checks_nothing_is_refused(base):
    msg = bad(base, lambda c: c["grids"]["smoke"]["check"].__setitem__("samples", 0))
    assert "grids.smoke.check.samples: 0 is less than the minimum of 1" in msg
    assert "a grid that checks nothing could call no cell correct" in msg


def test_unknown_key_lists_valid_keys(base):
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("seqlens", [128]))
    assert "grids.smoke: Additional properties are not allowed ('seqlens' was unexpected)" in msg
    assert "valid keys:" in msg and "seqlen" in msg


def test_unknown_mask_param_names_the_keys_the_patterns_read(base, monkeypatch):
    """mask_params takes what some pattern reads (its cfg_keys): a misspelt key is refused with
    the valid ones; a pattern's own new key is accepted without a schema entry, and its values
    are checked by the pattern."""
    import attnbench.masks as M

    msg = bad(base, lambda c: c["grids"]["smoke"]["mask_params"].__setitem__("windw", 32))
    assert "grids.smoke.mask_params: 'windw' is read by no mask pattern; valid keys:" in msg
    assert "window, " in msg and "long_fraction" in msg
    assert "block_size" not in msg.split("valid keys:")[1]  # an axis of the grid, not a setting
    monkeypatch.setattr(type(M.PATTERNS["causal"]), "cfg_keys", ("windw",), raising=False)
    cfg = copy.deepcopy(base)
    cfg["grids"]["smoke"]["mask_params"]["windw"] = 32
    assert validate(cfg)["grids"]["smoke"]["mask_params"]["windw"] == 32


def test_bad_enum_and_type(base):
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("dtype", ["float8"]))
    assert "grids.smoke.dtype[0]: 'float8' is not one of ['float32', 'float16', 'bfloat16']" in msg
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("reps", "many"))
    assert "grids.smoke.reps: 'many' is not of type 'integer'" in msg


def test_unknown_grid_in_run(base):
    msg = bad(base, lambda c: c.__setitem__("run", ["smok"]))
    assert "run[0]: unknown grid 'smok'; grids in this config: smoke" in msg


def test_malformed_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("grids: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_a_key_given_twice_is_an_error(tmp_path, repo):
    """Plain YAML keeps the last of two grids of one name silently; here it names both lines."""
    text = (repo / "config.yaml").read_text()
    p = tmp_path / "c.yaml"
    p.write_text(text.replace("grids:\n", "grids:\n  smoke: {kernels: [naive]}\n", 1))
    with pytest.raises(
        ConfigError, match=r"key 'smoke' appears twice in one mapping \(lines \d+ and \d+\)"
    ):
        load_config(p)


def test_defaults_are_filled(base):
    cfg = copy.deepcopy(base)
    cfg["grids"]["tiny"] = {"kernels": ["naive"], "masks": ["causal"], "seqlen": [64]}
    validate(cfg)
    g = cfg["grids"]["tiny"]
    assert g["warmup"] == 5 and g["reps"] == 20 and g["samples"] == {"document": 30, "single": 2}
    assert g["device"] == "cuda" and g["check"]["tolerance_factor"] == 5


def test_also_products_and_sparse_axes(base):
    cfg = copy.deepcopy(base)
    cfg["run"] = ["sp"]
    cfg["grids"]["sp"] = {
        "family": "sparse",
        "device": "cpu",
        "kernels": ["naive"],
        "masks": ["block_sparse", "variable_block_sparse"],
        "seqlen": [1024],
        "block_size": [64, 128],
        "density": [0.2, 0.5],
        "avg_block": [256],
        "direction": ["fwd"],
    }
    cells = expand_cells(validate(cfg))
    assert len(cells) == 4 + 2
    ids = sorted(point_id(c) for c in cells)
    assert (
        "s1024-h64x8-d128-bfloat16-fwd-b64-r0.2" in ids
        and "s1024-h64x8-d128-bfloat16-fwd-a256-r0.5" in ids
    )


# ---------------------------------------------------------------- a grid file of one's own

OWN_GRID = {
    "run": ["mine"],
    "grids": {
        "mine": {
            "family": "kernel",
            "device": "cpu",
            "kernels": ["naive"],
            "masks": ["causal", "causal_document"],
            "seqlen": [64],
            "heads": [[2, 1]],
            "head_dim": [16],
            "dtype": ["float32"],
            "direction": ["fwd"],
            "samples": {"document": 1, "single": 1},
            "warmup": 0,
            "reps": 2,
        }
    },
}


def attnbench_cli(*args, cwd):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd
    )


def test_histograms_are_package_data_not_config(repo, base):
    from attnbench.masks.lengths import HISTOGRAMS_PATH, packaged_histograms

    assert "doc_length_histograms" not in base  # config.yaml keeps grids
    assert HISTOGRAMS_PATH.parent == repo / "workflow" / "attnbench" / "masks"
    cfg = load_config(repo / "config.yaml")
    assert cfg["doc_length_histograms"] == packaged_histograms()
    assert list(packaged_histograms()) == ["pile", "prolong64k", "prolong512k"]
    # a config's own histograms replace the package's (and are validated as before)
    own = {"flat": {"use_up_to": None, "buckets": [[1, 17, 1.0]]}}
    cfg = validate({**copy.deepcopy(base), "doc_length_histograms": own})
    cell = next(c for c in expand_cells(cfg) if c["mask"] == "causal_document")
    assert cell["histograms"] == own


def test_a_file_of_own_grids_is_read_over_config_yaml(repo, tmp_path):
    """check-config FILE and regenerate --config FILE take what snakemake --configfile FILE
    takes: a file of grids alone, over the defaults of config.yaml."""
    import yaml
    from attnbench.families.kernel.cell import run_cell
    from attnbench.grid.expand import cell_path
    from attnbench.record.record import write_record

    own = tmp_path / "mine.yaml"
    grids = {**OWN_GRID, "output_dir": str(tmp_path / "out")}
    own.write_text(yaml.safe_dump(grids))
    p = attnbench_cli("check-config", str(own), cwd=repo)
    assert p.returncode == 0, p.stderr
    assert f"config ok ({own} over config.yaml): 2 cells in grids mine" in p.stdout
    cfg = load_config(own, base=repo / "config.yaml")
    assert {"mine", "smoke", "h200_sweep"} <= set(cfg["grids"])  # config.yaml's grids beside
    for spec in expand_cells(cfg):
        write_record(run_cell(CellSpec.from_dict(spec)), tmp_path / "out" / cell_path(spec))
    p = attnbench_cli("regenerate", "--configfile", str(own), "--jobs", "1", cwd=repo)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "out" / "tables" / "mine" / "tflops.md").is_file()


def test_a_yaml_error_names_the_file_and_line(repo, tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("grids:\n  mine:\n    kernels: [naive\n    masks: [causal]\n")
    p = attnbench_cli("check-config", str(own), cwd=repo)
    assert p.returncode == 2
    assert f"{own}:4:10: not valid YAML: expected ',' or ']', but got ':'" in p.stderr
    assert "(while parsing a flow sequence at line 3)" in p.stderr
    own.write_text("- a list\n- not settings\n")
    with pytest.raises(ConfigError, match="expected a mapping of settings"):
        load_config(own)


def test_a_grid_of_two_dtypes_or_head_dims_is_refused(base):
    """Its tables and figures would put two cells on one point; refused before any cell runs."""
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("dtype", ["float32", "bfloat16"]))
    assert "grids.smoke.dtype: float32, bfloat16 (over the grid and its also: entries)" in msg
    assert "keep one of float32, bfloat16 and put each other in a grid of its own" in msg
    # an also: entry counts as part of the grid
    msg = bad(base, lambda c: c["grids"]["smoke"]["also"][0].__setitem__("head_dim", [64]))
    assert "grids.smoke.head_dim: 32, 64 (over the grid and its also: entries)" in msg
    # the same for the other families
    msg = bad(base, lambda c: c["grids"]["smoke_cp"].__setitem__("head_dim", [16, 32]))
    assert "grids.smoke_cp.head_dim: 16, 32" in msg


# ---------------------------------------------------------------- a check long enough to see the mask


def with_check(base, max_seqlen, **grid):
    cfg = copy.deepcopy(base)
    cfg["run"] = ["c"]
    cfg["grids"]["c"] = {
        "device": "cpu",
        "kernels": ["sdpa"],
        "heads": [[4, 2]],
        "head_dim": [32],
        "dtype": ["float32"],
        "check": {"max_seqlen": max_seqlen},
        **grid,
    }
    return cfg


def test_a_check_shorter_than_two_windows_plus_one_is_refused(base):
    """At 256 tokens a window of 256 and one of 257 are the same mask, so a kernel one key too
    wide passes any check there; the config asking for it is refused, naming the length."""
    import attnbench.masks as M

    same = [M.Mask("sliding_window_causal", 256, {"window": w}).dense() for w in (256, 257)]
    assert bool((same[0] == same[1]).all())
    window = dict(masks=["sliding_window_causal"], seqlen=[1024], mask_params={"window": 256})
    with pytest.raises(ConfigError) as e:
        validate(with_check(base, 256, **window))
    assert (
        "grids.c: mask sliding_window_causal (window 256) at seqlen 1024 is checked at 256 tokens "
        "(check.max_seqlen 256), fewer than two windows plus one (2 x window 256 + 1) needs: set "
        "check.max_seqlen to at least 513" in str(e.value)
    )
    validate(with_check(base, 513, **window))
    validate(with_check(base, 256, **{**window, "seqlen": [256]}))  # checked whole: nothing hidden


class WindowSink:
    """A pattern added by the docs alone: a causal window of w plus the first `sink` tokens, with
    no check_features of its own."""

    @staticmethod
    def make():
        from attnbench.masks import predicates as P
        from attnbench.masks.patterns import Pattern

        class _WindowSink(Pattern):
            name = "window_sink"
            cfg_keys = ("window", "sink")

            def predicate(self, seqlen, params, device):
                w, s = P.scalar(params["window"], device), P.scalar(params["sink"], device)
                return lambda q, k: (k <= q) & ((q - k <= w) | (k < s))

            def sample(self, seqlen, cfg, rng, histograms):
                return {"window": int(cfg["window"]), "sink": int(cfg["sink"])}

        return _WindowSink()


def test_a_new_mask_gets_a_check_long_enough_for_its_settings(base, monkeypatch):
    """A window-and-sink mask added without check_features: at 16 tokens a window of 16 hides its
    sink (a kernel ignoring the sink passes), so a check of 16 is refused, naming the length its
    settings need (2 x (window + sink) + 1), where the sink shows."""
    import attnbench.families.kernel.grid as kernel_grid
    import attnbench.masks as M

    sink = WindowSink.make()
    monkeypatch.setitem(M.PATTERNS, sink.name, sink)
    monkeypatch.setattr(kernel_grid, "VALID_MASKS", (*kernel_grid.VALID_MASKS, sink.name))

    def dense(s, params):
        return M.Mask(sink.name, s, params).dense()

    with_sink, without = {"window": 16, "sink": 4}, {"window": 16, "sink": 0}
    assert bool((dense(16, with_sink) == dense(16, without)).all())  # hidden at 16 tokens
    assert not bool((dense(41, with_sink) == dense(41, without)).all())  # seen at 41
    grid = dict(masks=[sink.name], seqlen=[1024], mask_params=with_sink)
    with pytest.raises(ConfigError) as e:
        validate(with_check(base, 16, **grid))
    assert (
        "mask window_sink (window 16, sink 4) at seqlen 1024 is checked at 16 tokens "
        "(check.max_seqlen 16), fewer than its spans twice plus one (2 x (window 16 + sink 4) + 1) "
        "needs: set check.max_seqlen to at least 41" in str(e.value)
    )
    validate(with_check(base, 41, **grid))


def test_the_smoke_grids_run_every_mask_and_kernel(repo):
    """`make run`'s grids (smoke, smoke_sparse) run every static mask with every kernel that runs
    on the CPU, and give every other kernel a record (`unavailable` on a CPU), so that a new mask
    or kernel runs there: a new mask goes in smoke's masks, a new CPU kernel in its kernels, a
    GPU-only one in its GPU-only `also` entry (smoke_sparse's for a block-sparse one). Left out on
    purpose: flex runs one length (256; it compiles each mask: seconds on a CPU); the GPU-only kernels run one mask (causal; block_sparse), one
    length, forward, since each gives the same `unavailable` record everywhere."""
    import attnbench.masks as M
    from attnbench.kernels import catalog

    # the registry's own (not one a grid registered in this process: `module:Class`)
    KERNELS = {n: k for n, k in catalog.KERNELS.items() if "." not in k.impl.split(":")[0]}
    cfg = load_config(repo / "config.yaml")
    assert {"smoke", "smoke_sparse"} <= set(cfg["run"])
    smoke = expand_cells(cfg, ["smoke"])
    assert cfg["grids"]["smoke"]["masks"] == list(M.STATIC_MASKS)
    for name, info in KERNELS.items():
        if info.family == "dense" and "cpu" in info.devices:
            masks = {c["mask"] for c in smoke if c["impl"] == name}
            assert masks == set(M.STATIC_MASKS), (name, set(M.STATIC_MASKS) - masks)
            directions = {c["direction"] for c in smoke if c["impl"] == name}
            assert directions >= set(info.directions["cpu"]) & {"fwd", "bwd"}, name
    assert {c["impl"] for c in smoke} == {n for n, k in KERNELS.items() if k.family == "dense"}
    sparse = {c["impl"] for c in expand_cells(cfg, ["smoke_sparse"])}
    assert sparse >= {n for n, k in KERNELS.items() if k.family == "sparse"}


def test_a_check_of_one_block_or_no_document_boundary_is_refused(base):
    blocks = dict(masks=["block_causal_document"], seqlen=[1024], mask_params={"block": 128})
    with pytest.raises(ConfigError, match=r"fewer than two blocks \(2 x block 128\) needs: set "):
        validate(with_check(base, 128, **blocks))
    docs = dict(masks=["causal_document"], seqlen=[1024])
    with pytest.raises(ConfigError) as e:
        validate(with_check(base, 64, **docs))
    msg = str(e.value)
    assert "mask causal_document at seqlen 1024 is checked at 64 tokens" in msg
    assert "none of its checked samples draws a document boundary (each is one document)" in msg
    need = int(msg.split("set check.max_seqlen to at least ")[1].split(",")[0])
    validate(with_check(base, need, **docs))
    # context parallelism: the same draws
    cp = copy.deepcopy(base)
    cp["grids"]["smoke_cp"]["masks"] = ["causal_document"]
    cp["grids"]["smoke_cp"]["check"]["max_seqlen"] = 16
    with pytest.raises(ConfigError, match="ring_p2p, ring_allgather, usp, loongtrain on mask "):
        validate(cp)


def test_the_config_draws_the_check_masks_the_cell_draws(base):
    """The refusal rests on the cell's own draws (its data seed), not on a likelihood."""
    from attnbench.families.kernel.cell import run_cell
    from attnbench.harness.samples import check_masks

    cfg = validate(
        with_check(
            base, 256, masks=["causal_document"], seqlen=[512], samples={"document": 3}, reps=1
        )
    )
    (spec, *_) = [c for c in expand_cells(cfg) if c["direction"] == "fwd"]
    cell = CellSpec.from_dict(spec)
    record = run_cell(cell)
    drawn = check_masks(cell.problem, cell.measurement, 256)
    assert [s["check"]["mask_params"]["doc_lengths"] for s in record["samples"]] == [
        m.params["doc_lengths"] for m in drawn
    ]


# ---------------------------------------------------------------- values that would fail after compute


def test_a_non_finite_number_is_refused_naming_its_key(base):
    msg = bad(base, lambda c: c["grids"]["smoke"]["check"].__setitem__("tolerance_factor", 1e400))
    assert "grids.smoke.check.tolerance_factor: inf is not a finite number" in msg
    msg = bad(base, lambda c: c["figures"].__setitem__("font_scale", float("nan")))
    assert "figures.font_scale: nan is not a finite number" in msg


def test_a_length_written_as_a_float_is_refused(base):
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("seqlen", [128.0]))
    assert "grids.smoke.seqlen[0]: 128.0 is not of type 'integer' (a whole number" in msg
    msg = bad(base, lambda c: c["grids"]["smoke"].__setitem__("reps", True))
    assert "grids.smoke.reps: True is not of type 'integer'" in msg


def test_a_grid_listed_twice_in_run_is_refused(base):
    msg = bad(base, lambda c: c.__setitem__("run", ["smoke", "smoke_cp", "smoke"]))
    assert "run[2]: grid 'smoke' is listed twice (also run[0])" in msg


@pytest.mark.parametrize("name", ["my.grid", "a/b", "gr\u00fcn", "two words", "x{y}"])
def test_a_grid_name_outside_letters_digits_underscore_dash_is_refused(base, name):
    def edit(c):
        c["grids"][name] = c["grids"]["smoke"]
        c["run"] = [name]

    msg = bad(base, edit)
    assert f"grids.{name}: {name!r} is not a valid grid name" in msg
    assert "letters A-Z a-z, digits, _ and - only" in msg


@pytest.mark.parametrize(
    "out, why",
    [
        ("", "output_dir: empty"),
        ("   ", "output_dir: empty"),
        ("/", "is the filesystem root"),
        ("//", "is the filesystem root"),
        ("/tmp/..", "is the filesystem root"),
        ("out $(touch PWNED)", "has characters a path given to shell commands must not"),
        ("my results", "has characters"),
        ("res'ults", "has characters"),
        ('res"ults', "has characters"),
        ("res{ults}", "has characters"),
        ("res;ls", "has characters"),
        ("r\u00e9sultats", "has characters"),
    ],
)
def test_an_output_dir_that_is_empty_the_root_or_shell_is_refused(base, out, why):
    msg = bad(base, lambda c: c.__setitem__("output_dir", out))
    assert why in msg


def test_a_plain_output_dir_is_accepted(base):
    for out in ("results", "results/h200/", "/tmp/a-b_c.d+e", "./out"):
        cfg = copy.deepcopy(base)
        cfg["output_dir"] = out
        validate(cfg)


def test_yaml_merge_keys_are_accepted_and_a_repeated_key_still_refused(tmp_path, repo):
    p = tmp_path / "mine.yaml"
    p.write_text(
        "run: [a, b]\n"
        "grids:\n"
        "  a: &tiny\n"
        "    family: kernel\n    device: cpu\n    kernels: [naive]\n    masks: [causal]\n"
        "    seqlen: [64]\n    heads: [[2, 1]]\n    head_dim: [16]\n    dtype: [float32]\n"
        "    direction: [fwd]\n"
        "  b:\n"
        "    <<: *tiny\n"
        "    seqlen: [128]\n"
    )
    cfg = load_config(p)
    assert cfg["grids"]["b"]["seqlen"] == [128] and cfg["grids"]["b"]["kernels"] == ["naive"]
    p.write_text(p.read_text() + "    seqlen: [256]\n")
    with pytest.raises(ConfigError, match="key 'seqlen' appears twice"):
        load_config(p)


def test_a_file_that_is_not_utf8_is_one_clear_line(tmp_path, repo):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("run: [smoke]\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.problems == [
        f"{p}: not UTF-8 text (byte 0xe9 at offset 18); save the file as UTF-8"
    ]
    p2 = attnbench_cli("check-config", str(p), cwd=repo)
    assert p2.returncode == 2 and "Traceback" not in p2.stderr
    assert "not UTF-8 text" in p2.stderr


def test_the_command_line_takes_snakemakes_words_and_names_them_for_the_old_ones(repo, tmp_path):
    """--configfile FILE (repeatable, later over earlier) and --config KEY=VALUE (YAML values),
    as Snakemake; --overrides and --config FILE are refused naming them; bare `attnbench` prints
    its help, and there is --version."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("output_dir: from_a\n")
    second.write_text("output_dir: from_b\nrun: [smoke]\n")
    p = attnbench_cli(
        "records", "--configfile", str(first), "--configfile", str(second), "--all", cwd=repo
    )
    assert p.returncode == 0 and p.stdout.splitlines()[0].startswith("from_b/cells/smoke/"), (
        p.stderr
    )
    p = attnbench_cli(
        "records", "--configfile", str(second), "--config", "output_dir=over", "run=[smoke_cp]",
        "--all", cwd=repo,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.splitlines()[0].startswith("over/cells/smoke_cp/")
    for args, says in (
        (["--overrides", '{"output_dir": "x"}'], "--overrides is no option any more: give settings as --config KEY=VALUE"),
        (["--config", str(first)], f"--config {first}: expected KEY=VALUE, as snakemake --config; a file of settings is --configfile {first}"),
        (["--config", "output_dir=["], "--config output_dir=[: its value is not YAML"),
    ):  # fmt: skip
        for command in ("regenerate", "records", "check-config", "predict"):
            p = attnbench_cli(command, *args, cwd=repo)
            assert p.returncode == 2 and says in p.stderr, (command, p.stderr)
            assert "Traceback" not in p.stderr
    p = attnbench_cli(cwd=repo)
    assert p.returncode == 0 and "usage: attnbench" in p.stdout and "advise" in p.stdout
    assert attnbench_cli("--version", cwd=repo).stdout.startswith("attnbench ")
