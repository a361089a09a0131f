"""What the pipeline asks across families: whether a record on disk is current, a folder's tables and figures made again from its records, and which cells to run next."""
