# Records -> each grid's tidy tables -> its tables and figures (with a report caption each); every
# grid's tidy tables -> the output folder's, their union (attnbench.pipeline.tidy). A grid's rules
# read only its own tidy tables (a cp grid's figures also its family's other grids': emulated
# cells, one-GPU baselines), so a changed record redraws only its own grid, and no table or figure
# reruns a cell. The code files their commands import are inputs (rule_code), so editing the
# plotting code reruns only the figure rules, editing the table code only the table rules, and a
# family's own module only that family's rules.
# `snakemake --report report.html` shows every figure and table with its caption (any family).


rule collect:
    input:
        # a grid of the run: its cells' records; another grid with records here: those on disk
        records=lambda wc: TABLED[wc.grid],
        code=TIDY_CODE,
    output:
        # one row per record, and one per record and sample (what the paired answers read)
        cells=grid_table("{grid}"),
        samples=grid_samples("{grid}"),
    log:
        f"{OUT}/logs/collect/{{grid}}.log",
    wildcard_constraints:
        grid=TABLED_GRID,
    group:
        # Under Slurm, the tidy tables, tables and figures run as one job (ignored when run locally).
        "report"
    params:
        # the grid's outdated records kept as they are: the table's `outdated` column names them
        kept_outdated=lambda wc: KEPT_HASH.get(wc.grid, ""),
    run:
        write_grid_table(wildcards.grid, output.cells, log[0])


rule union:
    input:
        cells=[grid_table(g) for g in TABLED],
        samples=[grid_samples(g) for g in TABLED],
        code=TIDY_CODE,
    output:
        # the new tables, complete, beside the old ones (tidy_table puts them in place)
        cells=temp(f"{OUT}/tables/cells.new.csv"),
        samples=temp(f"{OUT}/tables/samples.new.csv"),
    log:
        f"{OUT}/logs/union.log",
    group:
        # a job of its own under Slurm: in `report` it would run beside a grid's tables and
        # figures, and the group's request (the sum of what runs at once: 3 CPUs) outgrew a
        # 2-CPU partition, pending forever
        "union"
    run:
        write_union_table(input.cells, output.cells, log[0])


rule tidy_table:
    input:
        cells=f"{OUT}/tables/cells.new.csv",
        samples=f"{OUT}/tables/samples.new.csv",
    output:
        # update: the old tables stay until the new ones replace them, and are put back if that
        # fails (a shell rule: Snakemake 9 restores no `update` output of a failed `run:` rule)
        cells=update(f"{OUT}/tables/cells.csv"),
        samples=update(f"{OUT}/tables/samples.csv"),
    log:
        f"{OUT}/logs/tidy_table.log",
    group:
        "union"
    conda:
        "../../envs/cpu.yaml"
    shell:
        "cp {input.cells:q} {output.cells:q} 2> {log:q} && cp {input.samples:q} {output.samples:q} 2>> {log:q}"


for _grid in RUN:

    rule:
        name:
            f"tables_{_grid}"
        input:
            cells=grid_table(_grid),
            samples=grid_samples(_grid),
            code=report_code(_grid, "TABLES"),
        output:
            table_outputs(_grid),
        log:
            f"{OUT}/logs/tables_{_grid}.log",
        group:
            "report"
        conda:
            "../../envs/cpu.yaml"
        params:
            grid=_grid,
            # the folder of the outputs, from them (Snakemake's lint: not a second, hardcoded path)
            outdir=lambda wc, output: os.path.dirname(output[0]),
            grid_cfg=as_file(report_settings(GRIDS[_grid], CFG)),
            # the captions name the output folder's tidy table, where the rows are for a reader
            source=UNION_TABLE,
        shell:
            "python -m attnbench tables --cells {input.cells:q} --out-dir {params.outdir:q}"
            " --grid {params.grid} --grid-config {params.grid_cfg:q} --source {params.source:q}"
            " > {log:q} 2>&1"

    rule:
        name:
            f"figures_{_grid}"
        input:
            # its own tidy tables, and those of the grids whose rows its family's figures read
            cells=figure_tables(_grid),
            samples=[str(samples_path(t)) for t in figure_tables(_grid)],
            code=report_code(_grid, "FIGURES"),
        output:
            figure_outputs(_grid),
        log:
            f"{OUT}/logs/figures_{_grid}.log",
        group:
            "report"
        conda:
            "../../envs/cpu.yaml"
        params:
            grid=_grid,
            # the folder of the outputs, from them (Snakemake's lint: not a second, hardcoded path)
            outdir=lambda wc, output: os.path.dirname(output[0]),
            style=as_file(CFG["figures"]),
            grid_cfg=as_file(report_settings(GRIDS[_grid], CFG)),
            source=UNION_TABLE,
            # the CP model's tables, where it ran
            tables_dir=f"{OUT}/tables/{_grid}",
        shell:
            "python -m attnbench figures --cells {input.cells:q} --out-dir {params.outdir:q}"
            " --grid {params.grid} --style {params.style:q} --grid-config {params.grid_cfg:q}"
            " --source {params.source:q} --tables-dir {params.tables_dir:q} > {log:q} 2>&1"


rule tables:
    input:
        [f for g in RUN for f in table_files(g) + caption_files(g, "tables")],


rule figures:
    input:
        [f for g in RUN for f in figure_files(g) + caption_files(g, "figures")],
