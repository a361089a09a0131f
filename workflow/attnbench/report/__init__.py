"""Stage 5, shared by every family: the tidy table, table and figure helpers, names, styles and
report captions. Reads only the tidy table (never a record, never a GPU)."""
