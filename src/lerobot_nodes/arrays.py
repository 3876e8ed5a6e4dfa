"""Set operations on integer arrays (episode indexes, frame numbers) that keep ``numpy.ma`` unimported.

numpy 2's plain ``np.unique`` (and ``union1d`` and ``setdiff1d``, which call it) asks
``np.ma.is_masked``, and the first such call imports ``numpy.ma``: about 30 ms in the constructor of
every process that builds a dataset, for arrays that are never masked. These give the same sorted
results for integer arrays.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def sorted_unique(values: ArrayLike) -> np.ndarray:
    """The distinct values of ``values`` (flattened), sorted: ``np.unique(values)`` for integers."""
    ordered = np.sort(np.ravel(values))
    if ordered.size < 2:
        return ordered
    first = np.empty(ordered.size, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def sorted_union(left: ArrayLike, right: ArrayLike) -> np.ndarray:
    """``np.union1d(left, right)`` for integers."""
    return sorted_unique(np.concatenate((np.ravel(left), np.ravel(right))))


def sorted_difference(left: ArrayLike, right: ArrayLike) -> np.ndarray:
    """``np.setdiff1d(left, right)`` for integers: the distinct values of ``left`` not in ``right``, sorted."""
    distinct = sorted_unique(left)
    return distinct[~np.isin(distinct, right)]
