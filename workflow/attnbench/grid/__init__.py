"""Stage 1: config.yaml -> validated grids -> cells (ids and record paths). Torch-free."""
