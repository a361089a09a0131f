# One job per context-parallel cell: N ranks started by attnbench.launch (torchrun on one node;
# srun + torchrun with a c10d rendezvous across nodes). Rank 0 writes the record. A cell still
# running at the grid's cell_timeout_s is stopped and recorded as `timeout` by the launcher; a
# collective that waits past cp.timeout_s before that fails the job, and a rerun retries the cell.


rule cp_cell:
    input:
        # ancient: measuring the ceiling again must not rerun every cell
        peak=lambda wc: ancient(peak_file(cp_cell_of(wc))),
        # your own method's module and the package it sits in: editing them reruns its cells
        code=lambda wc: own_method_code(cp_cell_of(wc)),
    output:
        f"{OUT}/cells/{{grid}}/cp/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/cp/{{impl}}/{{mask}}/{{point}}.log",
    conda:
        lambda wc: cell_env(cp_cell_of(wc))
    # CPU: one core per rank (Snakemake lowers it to --cores when there are fewer)
    threads: lambda wc: cp_ranks(wc) if cp_cell_of(wc)["device"] == "cpu" else 1
    resources:
        # nodes, GPUs, tasks, cpus per task (and `mpi` across nodes, so the plugin does not wrap
        # the launcher in srun): see attnbench.launch.resources
        **{name: cp_resource(name) for name in launch.RESOURCE_NAMES},
        runtime=lambda wc, attempt: GRIDS[wc.grid]["runtime_min"] * attempt,
        mem_mb=lambda wc, attempt: GRIDS[wc.grid]["mem_mb"] * attempt,
        # the time budget: a resource, not a param, so that changing it reruns no finished cell
        cell_timeout_s=lambda wc: cell_timeout_s(GRIDS[wc.grid]),
    params:
        spec=lambda wc: json.dumps(cp_cell_of(wc), sort_keys=True),
        launch=lambda wc: cp_launch_args(wc),
        # The local kernel's library version: installing a missing one reruns exactly its cells.
        library=lambda wc: cp_library(cp_cell_of(wc)["cp"]["local_kernel"]),
    shell:
        "python -m attnbench.launch {params.launch} --time-limit-s {resources.cell_timeout_s} --"
        " python -m attnbench cp-cell --spec {params.spec:q} --peak {input.peak} --out {output} > {log} 2>&1"
