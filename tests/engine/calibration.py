"""Calibration of stated probabilities: among answers that say p, the event holds a fraction p."""

from __future__ import annotations

import math

import numpy as np


def assert_calibrated(said: np.ndarray, held: np.ndarray, slack: float) -> None:
    """Per tenth of [0, 1], the event's frequency is within 3 standard errors of the mean said.

    Bins with fewer than 20 answers are skipped; ``slack`` absorbs rounding of the probabilities.
    """
    bins = np.minimum((said * 10).astype(int), 9)
    for k in range(10):
        chosen = bins == k
        n = int(chosen.sum())
        if n < 20:
            continue
        p = said[chosen]
        error = math.sqrt(float((p * (1 - p)).sum())) / n
        assert abs(float(held[chosen].mean()) - float(p.mean())) <= 3 * error + slack, (k, n)
