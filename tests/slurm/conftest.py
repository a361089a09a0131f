# Tests of the Slurm path; their helpers live in slurmtools.py (a module of this folder, which pytest
# puts on sys.path). Each module starts its own throwaway cluster and always stops it.
