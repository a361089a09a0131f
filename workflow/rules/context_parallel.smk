# One job per context-parallel cell: N ranks started by attnbench.launch (torchrun on one node;
# srun + torchrun with a c10d rendezvous across nodes). Rank 0 writes the record; a hang past
# the cell's process-group timeout fails the job, so a rerun retries exactly that cell.


def cp_cell_of(wc):
    path = f"{OUT}/cells/{wc.grid}/cp/{wc.impl}/{wc.mask}/{wc.point}.json"
    try:
        return CELLS[path]
    except KeyError:
        raise WorkflowError(f"{path} is not a cell of the grids {', '.join(RUN)} in this config") from None


def cp_library(kernel):
    from attnbench.cp import catalog as cp_catalog

    return cp_catalog.library_version(kernel)


def cp_ranks(wc):
    return cp_cell_of(wc)["gpus"]


rule cp_cell:
    input:
        # ancient: measuring the ceiling again must not rerun every cell
        peak=lambda wc: ancient(peak_file(cp_cell_of(wc))),
    output:
        f"{OUT}/cells/{{grid}}/cp/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/cp/{{impl}}/{{mask}}/{{point}}.log",
    params:
        spec=lambda wc: json.dumps(cp_cell_of(wc), sort_keys=True),
        launch=lambda wc: "--nodes {nodes} --nproc-per-node {nproc_per_node}".format(**cp_cell_of(wc)["cp"]),
        # The local kernel's library version: installing a missing one reruns exactly its cells.
        library=lambda wc: cp_library(cp_cell_of(wc)["cp"]["local_kernel"]),
    # CPU: one core per rank (Snakemake lowers it to --cores when there are fewer)
    threads: lambda wc: cp_ranks(wc) if cp_cell_of(wc)["device"] == "cpu" else 1
    resources:
        nodes=lambda wc: cp_cell_of(wc)["cp"]["nodes"],
        tasks=lambda wc: cp_ranks(wc),
        # GPUs per node (Slurm assigns them; the local profile only caps how many run at once)
        gpu=lambda wc: cp_cell_of(wc)["cp"]["nproc_per_node"] if cp_cell_of(wc)["device"] == "cuda" else 0,
        runtime=lambda wc, attempt: GRIDS[wc.grid]["runtime_min"] * attempt,
        mem_mb=lambda wc, attempt: GRIDS[wc.grid]["mem_mb"] * attempt,
    shell:
        "python -m attnbench.launch {params.launch} --"
        " python -m attnbench cp-cell --spec {params.spec:q} --peak {input.peak} --out {output} > {log} 2>&1"
