"""Stage 4: a cell's record: its statuses (record.status), the skeleton every family fills
(record.record), its schema (record.schema: which fields each status carries) and its validation
(record.validate). Imports nothing: kernels and harness import record.status alone."""
