# One job per single-GPU cell (dense and block-sparse kernels), and the device's matmul ceiling.


rule device_peak:
    output:
        f"{OUT}/device/{{device}}-{{dtype}}.json",
    log:
        f"{OUT}/logs/device/{{device}}-{{dtype}}.log",
    resources:
        gpu=lambda wc: int(wc.device == "cuda"),
        runtime=10,
    shell:
        "python -m attnbench peak --device {wildcards.device} --dtype {wildcards.dtype} --out {output} > {log} 2>&1"


rule kernel_cell:
    input:
        # ancient: measuring the ceiling again must not rerun every cell
        peak=lambda wc: ancient(peak_file(cell_of(wc))),
    output:
        f"{OUT}/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.json",
    log:
        f"{OUT}/logs/cells/{{grid}}/{{family}}/{{impl}}/{{mask}}/{{point}}.log",
    params:
        spec=lambda wc: json.dumps(cell_of(wc), sort_keys=True),
        # The library's version: installing a missing library changes it, so Snakemake's
        # params trigger reruns exactly that kernel's (unavailable) cells.
        library=lambda wc: catalog.library_version(catalog.get(wc.impl)),
    threads: 1
    resources:
        gpu=lambda wc: int(catalog.needs_device(catalog.get(wc.impl), cell_of(wc))),
        runtime=lambda wc, attempt: GRIDS[wc.grid]["runtime_min"] * attempt,
        mem_mb=lambda wc, attempt: GRIDS[wc.grid]["mem_mb"] * attempt,
    shell:
        "python -m attnbench cell --spec {params.spec:q} --peak {input.peak} --threads {threads}"
        " --out {output} > {log} 2>&1"
