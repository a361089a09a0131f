# One job per single-GPU cell (dense and block-sparse kernels), and the device's matmul ceiling.


rule device_peak:
    output:
        f"{OUT}/device/{{device}}-{{dtype}}.json",
    log:
        f"{OUT}/logs/device/{{device}}-{{dtype}}.log",
    conda:
        "../../envs/{device}.yaml"
    resources:
        gpu=lambda wc: int(wc.device == "cuda"),
        runtime=lambda wc, attempt: 10 * attempt,
        mem_mb=lambda wc, attempt: 4000 * attempt,
    shell:
        # launch: on one machine the cell claims a GPU of its own once started (Snakemake counts GPU
        # jobs, assigns none); with --resources gpu above the GPUs present, cells overlap their start-up
        "python -m attnbench.launch --gpus-per-node {resources.gpu} --claim-after-import --"
        " python -m attnbench peak --device {wildcards.device} --dtype {wildcards.dtype}"
        " --out {output:q} > {log:q} 2>&1"


rule kernel_cell:
    input:
        # ancient: measuring the ceiling again must not rerun every cell
        peak=lambda wc: ancient(peak_file(cell_of(wc))),
        # newer than the record where the record is outdated (attnbench.currency): made again
        outdated=lambda wc: outdated_input(wc),
    output:
        f"{OUT}/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.log",
    # shortest cells first: a run cut short (a session's device time, a wall-clock limit) is
    # missing only its longest lengths
    priority: lambda wc: run_priority(cell_of(wc))
    conda:
        lambda wc: cell_env(cell_of(wc))
    threads: lambda wc: GRIDS[wc.grid]["cpu_threads"]
    resources:
        # a GPU only for cells that will run on one (unavailable/unsupported ones end before)
        gpu=lambda wc: int(catalog.needs_device(catalog.get(wc.impl), cell_of(wc))),
        # profiles/slurm batches cells into one job that runs them one after another; each cell
        # takes the batch's one slot, so the batch asks for one cell's CPUs, memory and GPU.
        batch_slots=1,
        runtime=lambda wc, attempt: GRIDS[wc.grid]["runtime_min"] * attempt,
        mem_mb=lambda wc, attempt: GRIDS[wc.grid]["mem_mb"] * attempt,
        # the time budget: a resource, not a param, so that changing it reruns no finished cell
        cell_timeout_s=lambda wc: cell_timeout_s(GRIDS[wc.grid]),
        # a warm process per GPU measures the cells (attnbench.worker); a resource, as above
        worker_idle_s=lambda wc: GRIDS[wc.grid]["worker_idle_s"],
    params:
        # the cell's parameters, in a file (grid.json_files)
        spec=lambda wc: cell_spec_file(wc),
    shell:
        # --record: a process that ends without its record gets a `crashed` one (attnbench.launch)
        "python -m attnbench.launch --gpus-per-node {resources.gpu} --claim-after-import"
        " --time-limit-s {resources.cell_timeout_s} --record {output:q} --log {log:q} --"
        " python -m attnbench cell --spec {params.spec:q} --peak {input.peak:q} --threads {threads}"
        " --worker-idle-s {resources.worker_idle_s} --out {output:q} > {log:q} 2>&1"
