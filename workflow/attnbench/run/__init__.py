"""The run machinery: the launcher of every cell, one run per output folder, the warm worker process."""
