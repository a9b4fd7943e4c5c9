"""The per (rank, iteration) sums the closed forms take, added as pandas adds the event engine's records.

pandas sums each (rank, iteration) group of the sorted records with np.add.reduceat; a closed form that lays the
same numbers out in the same order and makes the same call gets the same bits (simfog.span_log does so for
the event engine's own records).
"""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 22  # rank x column cells per block of ranks (bounds the memory of the per-rank tables)


def row_sums(values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Per row of `values` (rows, m), the sum of its kept entries in column order, added as pandas adds a sorted
    group: np.add.reduceat over the row's values laid out one after another. Rows keeping nothing sum to 0."""
    rows, m = values.shape
    out = np.zeros(rows)
    if keep is None:
        if m:
            out[:] = np.add.reduceat(np.ascontiguousarray(values).ravel(), np.arange(rows) * m)
        return out
    counts = keep.sum(1)
    some = counts > 0
    if some.any():
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out[some] = np.add.reduceat(values[keep], starts[some])
    return out
