"""Stage 4: a cell's record: the skeleton every family fills (statuses: attnbench.status), and its
validation (which fields exist for which status)."""
