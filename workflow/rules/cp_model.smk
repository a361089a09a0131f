# The CP throughput model (docs/cp-model.md): predicted per-GPU TFLOP/s to 1024 GPUs for the cp
# grids named in config `cp_model.grids`, from the methods' schedules, the kernel records on disk
# and a network preset; validated against the grid's measured cells. Reads records, runs no cell.


# One rule per modelled grid of this config: its figures (one per tokens per GPU) are named from
# its config. (A config of other grids, e.g. the tests' tiny ones, keeps cp_model and has none.)
for _g in [g for g in CFG.get("cp_model", {}).get("grids", {}) if g in CFG["grids"]]:
    # imported here: it imports matplotlib, a second of every plan of a config without such a grid
    from attnbench.cp_model.figures import figure_stems

    rule:
        name:
            f"cp_model_{_g}"
        input:
            code=rule_code("attnbench.cp_model.run"),
        output:
            table=f"{OUT}/tables/{_g}/cp_model.csv",
            validation=f"{OUT}/tables/{_g}/cp_model_validation.csv",
            summary=f"{OUT}/tables/{_g}/cp_model.md",
            figures=[
                f"{OUT}/figures/{_g}/{stem}.{fmt}"
                for stem in figure_stems(CFG["grids"][_g])
                for fmt in CFG["figures"]["formats"]
            ],
        log:
            f"{OUT}/logs/cp_model/{_g}.log",
        conda:
            "../../envs/cpu.yaml"
        params:
            grid=_g,
            overrides=as_file({"cp_model": CFG["cp_model"], "output_dir": OUT}),
        shell:
            "python -m attnbench predict --grid {params.grid} --configfile {params.overrides:q}"
            " > {log:q} 2>&1"


# The model against published CP benchmarks (cp_model/data/published_cp.yaml, a test set: nothing
# is fitted on them): per point the configuration, published, predicted and their ratio, and the
# error per mask family. Reads the kernel records and cp cells under OUT/cells, runs no cell.
rule cp_validation:
    input:
        code=rule_code("attnbench.cp_model.validation"),
        published=f"{PKG}/cp_model/data/published_cp.yaml",
    output:
        table=f"{OUT}/tables/cp_validation/published.csv",
        summary=f"{OUT}/tables/cp_validation/published.md",
    log:
        f"{OUT}/logs/cp_model/validation.log",
    conda:
        "../../envs/cpu.yaml"
    params:
        overrides=as_file({"cp_model": CFG["cp_model"], "output_dir": OUT}),
    shell:
        "python -m attnbench predict --validate --configfile {params.overrides:q} > {log:q} 2>&1"


# Bandwidth and latency per pattern on this machine (NCCL on GPUs, gloo on the CPU): the numbers a
# cp_model network preset takes. e.g. snakemake results/comm/cuda_n8.json
rule comm_bench:
    output:
        f"{OUT}/comm/{{device}}_n{{ranks}}.json",
    log:
        f"{OUT}/logs/comm/{{device}}_n{{ranks}}.log",
    wildcard_constraints:
        device="cpu|cuda",
        ranks=r"\d+",
    conda:
        "../../envs/{device}.yaml"
    threads: lambda wc: int(wc.ranks) if wc.device == "cpu" else 1
    params:
        gpus=lambda wc: wc.ranks if wc.device == "cuda" else 0,
    shell:
        "python -m attnbench.run.launch --nproc-per-node {wildcards.ranks}"
        " --gpus-per-node {params.gpus} --"
        " python -m attnbench.cp_model.commbench --device {wildcards.device} --out {output:q}"
        " > {log:q} 2>&1"
