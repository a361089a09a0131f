# One job per context-parallel cell: N ranks started by attnbench.run.launch (torchrun on one node;
# srun + torchrun with a c10d rendezvous across nodes). Rank 0 writes the record. A cell still
# running at the grid's cell_timeout_s is stopped and recorded as `timeout` by the launcher; a
# collective that waits past cp.timeout_s before that ends the ranks, and the launcher writes a
# `crashed` record, which the next run retries.


rule cp_cell:
    input:
        peak=peak_input(cp_cell_of),
        # newer than the record where the record is outdated (attnbench.pipeline.currency): made again
        outdated=outdated_input_of("cp"),
    output:
        f"{OUT}/cells/{{grid}}/cp/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/cp/{{impl}}/{{mask}}/{{point}}.log",
    wildcard_constraints:
        grid=RUN_GRID,
    conda:
        cells_env(cp_cell_of)
    # CPU: one core per rank (Snakemake lowers it to --cores when there are fewer)
    threads: lambda wc: cp_ranks(wc) if cp_cell_of(wc)["device"] == "cpu" else 1
    resources:
        # nodes, GPUs, tasks, cpus per task (and `mpi` across nodes, so the plugin does not wrap
        # the launcher in srun): see attnbench.run.launch.resources
        **{name: cp_resource(name) for name in launch.RESOURCE_NAMES},
        runtime=lambda wc, attempt: GRIDS[wc.grid]["runtime_min"] * attempt,
        mem_mb=lambda wc, attempt: GRIDS[wc.grid]["mem_mb"] * attempt,
        # the time budget: a resource, not a param, so that changing it reruns no finished cell
        cell_timeout_s=lambda wc: cell_timeout_s(GRIDS[wc.grid]),
    params:
        # the cell's parameters, in a file (grid.json_files)
        spec=lambda wc: cell_spec_file(wc, "cp"),
        launch=lambda wc: cp_launch_args(wc),
    shell:
        # --record: ranks that end without the record give a `crashed` one (attnbench.run.launch)
        "python -m attnbench.run.launch {params.launch} --time-limit-s {resources.cell_timeout_s}"
        " --record {output:q} --log {log:q} --"
        " python -m attnbench cp-cell --spec {params.spec:q} --peak {input.peak:q}"
        " --out {output:q} > {log:q} 2>&1"
