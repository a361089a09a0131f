"""attnbench: attention kernels and context-parallel methods, measured cell by cell."""

import time

__version__ = "0.1.0"
STARTED = time.time()  # when this process imported the package: records say where their time went
