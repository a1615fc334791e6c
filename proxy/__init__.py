"""dpproxy: a PostgreSQL proxy that answers aggregate queries under differential privacy."""

import os

# One BLAS/OpenMP thread, set before numpy loads: the engine's solves are small, and idle
# helper threads spin on the cores the server needs (2.4-5x the CPU per decision, issue 10).
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
