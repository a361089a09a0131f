# attnbench: attention kernels x masks x lengths x GPUs, one job per cell.
# The table of contents; each stage lives in workflow/rules/. Settings: config.yaml.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/kernels.smk"
include: "workflow/rules/context_parallel.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/cp_model.smk"


rule all:
    default_target: True
    input:
        report_outputs() + records_behind_a_table(),


onstart:
    start_run()


onsuccess:
    end_run(True)


onerror:
    end_run(False)
