"""`check-config`: a config validated before any cell runs, with what it would run and cost."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import WORKFLOW_CONFIG, config_of, config_options


def cmd_check_config(a):
    cfg = config_of(a, [a.file] if a.file else [])
    from ..families import expand_cells, plan_lines
    from ..grid.config import config_files

    files = [*([a.file] if a.file else []), *a.configfile] or [WORKFLOW_CONFIG]
    cells = expand_cells(cfg)
    read = " over ".join(str(f) for f in reversed(config_files(files, WORKFLOW_CONFIG)))
    print(f"config ok ({read}): {len(cells)} cells in grids {', '.join(cfg['run'])}")
    from ..pipeline.currency import config_report
    from ..record.validate import RecordError

    try:
        print(config_report(cfg))
    except RecordError as e:
        sys.exit(f"check-config: {e}")
    print("\n".join(plan_lines(cfg)))
    if a.profile:
        from ..pipeline.slurm_plan import slurm_plan

        # a name is a profile of profiles/, as snakemake --profile NAME finds it there first
        named = Path("profiles") / a.profile
        profile = named if (named / "config.yaml").is_file() else Path(a.profile)
        if not (profile / "config.yaml").is_file():
            names = sorted(
                d.name for d in Path("profiles").glob("*") if (d / "config.yaml").is_file()
            )
            sys.exit(
                f"check-config: --profile {a.profile}: no {profile}/config.yaml; valid --profile: "
                f"a profile folder, or one of {', '.join(names) or '(none in profiles/)'}"
            )
        try:
            print("\n".join(slurm_plan(cfg, profile).lines(str(profile))))
        except RecordError as e:
            sys.exit(f"check-config: {e}")


def add_parsers(sub) -> None:
    c = sub.add_parser(
        "check-config",
        help="validate a config before any cell runs: its grids, cells, records outdated and "
        "the device time its records estimate",
    )
    c.add_argument(
        "file", nargs="?", help="a config file read over config.yaml (the same as --configfile)"
    )
    config_options(c)
    c.add_argument(
        "--profile",
        help="a Slurm profile (a folder, or a name in profiles/, e.g. slurm): also the sbatch jobs "
        "the cells still to run make, the GPU-hours their records estimate, and the profile "
        "settings still unset",
    )
    c.set_defaults(fn=cmd_check_config)
