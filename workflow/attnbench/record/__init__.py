"""A cell's record: the skeleton every family fills (record.record), its schema (record.schema:
which fields each status of attnbench.status carries) and its validation (record.validate)."""
