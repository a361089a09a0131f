"""Expansion and checks of `family: cp` grids."""


def grid_problems(grid, prod, at):
    return [f"{at}: family cp is not available in this version"]


def expand_cp_grid(cfg, gname):
    raise NotImplementedError("family cp grids are not available in this version")
