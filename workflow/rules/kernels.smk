# Single-GPU kernel cells (dense and block-sparse): a job per cell, or a job per grid point whose
# cells are measured side by side (grid key side_by_side); and the device's matmul ceiling.


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
    params:
        machines=f"{OUT}/device/machines",
    shell:
        # launch: on one machine the cell claims a GPU of its own once started (Snakemake counts GPU
        # jobs, assigns none); with --resources gpu above the GPUs present, cells overlap their start-up
        "python -m attnbench.run.launch --gpus-per-node {resources.gpu} --claim-after-import --"
        " python -m attnbench peak --device {wildcards.device} --dtype {wildcards.dtype}"
        # every measurement is kept per machine; the cells get the highest (attnbench.harness.ceiling)
        " --out {output:q} --keep {params.machines:q} > {log:q} 2>&1"


rule kernel_cell:
    input:
        peak=peak_input(cell_of),
        # newer than the record where the record is outdated (attnbench.pipeline.currency): made again
        outdated=outdated_input_of(),
    output:
        f"{OUT}/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.log",
    wildcard_constraints:
        grid=SINGLE_CELL_GRID,
    # shortest cells first: a run cut short (a session's device time, a wall-clock limit) is
    # missing only its longest lengths
    priority: lambda wc: run_priority(cell_of(wc))
    conda:
        cells_env(cell_of)
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
        # a warm process per GPU measures the cells (attnbench.run.worker); a resource, as above
        worker_idle_s=lambda wc: GRIDS[wc.grid]["worker_idle_s"],
    params:
        # the cell's parameters, in a file (grid.json_files)
        spec=lambda wc: cell_spec_file(wc),
    shell:
        # --record: a process that ends without its record gets a `crashed` one (attnbench.run.launch)
        "python -m attnbench.run.launch --gpus-per-node {resources.gpu} --claim-after-import"
        " --time-limit-s {resources.cell_timeout_s} --record {output:q} --log {log:q} --"
        " python -m attnbench cell --spec {params.spec:q} --peak {input.peak:q} --threads {threads}"
        " --worker-idle-s {resources.worker_idle_s} --out {output:q} > {log:q} 2>&1"


rule kernel_point:
    input:
        peak=lambda wc: ancient(peak_file(point_cells(wc)[0])),
        # newer than the point's records where one is outdated or missing: all measured again
        outdated=lambda wc: point_outdated_input(wc),
    output:
        f"{OUT}/points/{{grid}}/{{family}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/points/{{grid}}/{{family}}/{{mask}}/{{point}}.log",
    wildcard_constraints:
        grid=SIDE_BY_SIDE_GRID,
    priority: lambda wc: run_priority(point_cells(wc)[0])
    conda:
        cells_env(lambda wc: point_cells(wc)[0])
    threads: lambda wc: GRIDS[wc.grid]["cpu_threads"]
    resources:
        gpu=lambda wc: point_needs_gpu(wc),
        batch_slots=1,
        # a cell's time and budget for each contender (each contender keeps its own budget)
        runtime=lambda wc, attempt: GRIDS[wc.grid]["runtime_min"] * len(point_cells(wc)) * attempt,
        mem_mb=lambda wc, attempt: GRIDS[wc.grid]["mem_mb"] * attempt,
        point_timeout_s=lambda wc: cell_timeout_s(GRIDS[wc.grid]) * len(point_cells(wc)),
    params:
        point=lambda wc: point_spec_file(wc),
    shell:
        "python -m attnbench.run.launch --gpus-per-node {resources.gpu} --claim-after-import"
        " --time-limit-s {resources.point_timeout_s} --log {log:q} --"
        " python -m attnbench point --point {params.point:q} --peak {input.peak:q} --threads {threads}"
        " --log {log:q} --out {output:q} > {log:q} 2>&1"


# One record out of its point's file: no measuring, on the machine that runs Snakemake.
localrules:
    point_record,


rule point_record:
    input:
        point=point_record_input,
        # newer than the record where it is outdated: taken again from its point, measured again
        outdated=outdated_input_of(),
    output:
        f"{OUT}/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.log",
    wildcard_constraints:
        grid=SIDE_BY_SIDE_GRID,
    run:
        from attnbench.families.kernel.point import write_point_record

        if not input.point:
            raise WorkflowError(
                f"{output[0]}: no point file to take it from; it is kept as it is"
            )
        write_point_record(input.point, output[0], log[0])
