"""The group vectors of a GROUP BY, for tests that plan one over a small cube."""

from __future__ import annotations

import numpy as np

from sqlmap.vector import LinearQuery


def first_two_dimensions(shape: tuple[int, ...]) -> list[LinearQuery]:
    """One vector per pair of values of the cube's first two dimensions (over the rest)."""
    groups = []
    for a in range(shape[0]):
        for b in range(shape[1]):
            tensor = np.zeros((*shape[:2], 1))
            tensor[a, b] = 1.0
            groups.append(LinearQuery.from_tensor(shape, tensor))
    return groups
