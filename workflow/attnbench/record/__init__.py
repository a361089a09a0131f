"""Stage 4: a cell's record: the status vocabulary, the skeleton every family fills, and its
validation (which fields exist for which status)."""
