# Records -> tidy table -> tables and figures (with a report caption each). These rules read only
# the tidy table, so regenerating them reruns no cell; the code files their commands import are
# inputs (rule_code), so editing the plotting code reruns only the figure rules, editing the table
# code only the table rules, and a family's own module only that family's rules.
# `snakemake --report report.html` shows every figure and table with its caption (any family).


rule collect:
    input:
        records=[p for g in RUN for p in grid_records(g)],
        code=code_files("attnbench.report.collect"),
    output:
        # the new tables, complete and checked, beside the old ones (tidy_table puts them in place):
        # one row per cell, and one per cell and sample (what the paired advice reads)
        cells=temp(f"{OUT}/tables/cells.new.csv"),
        samples=temp(f"{OUT}/tables/samples.new.csv"),
    log:
        f"{OUT}/logs/collect.log",
    group:
        # Under Slurm, the tidy table, tables and figures run as one job (ignored when run locally).
        "report"
    params:
        # the outdated records kept as they are: the table's `outdated` column names them
        kept_outdated=stable_hash(sorted(o.line() for o in KEPT)),
    run:
        write_tidy_table(input.records, output.cells, output.samples, log[0])


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
        "report"
    conda:
        "../../envs/cpu.yaml"
    shell:
        "cp {input.cells:q} {output.cells:q} 2> {log:q} && cp {input.samples:q} {output.samples:q} 2>> {log:q}"


for _grid in RUN:

    rule:
        name:
            f"tables_{_grid}"
        input:
            cells=f"{OUT}/tables/cells.csv",
            samples=f"{OUT}/tables/samples.csv",
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
        shell:
            "python -m attnbench tables --cells {input.cells:q} --out-dir {params.outdir:q}"
            " --grid {params.grid} --grid-config {params.grid_cfg:q} > {log:q} 2>&1"

    rule:
        name:
            f"figures_{_grid}"
        input:
            cells=f"{OUT}/tables/cells.csv",
            samples=f"{OUT}/tables/samples.csv",
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
        shell:
            "python -m attnbench figures --cells {input.cells:q} --out-dir {params.outdir:q}"
            " --grid {params.grid} --style {params.style:q} --grid-config {params.grid_cfg:q}"
            " > {log:q} 2>&1"


rule tables:
    input:
        [f for g in RUN for f in table_files(g) + caption_files(g, "tables")],


rule figures:
    input:
        [f for g in RUN for f in figure_files(g) + caption_files(g, "figures")],
