"""Arrow <-> numpy without copies and without pandas, for every step of reading a log."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMPY_TYPES = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def as_numpy(array: pa.Array) -> np.ndarray:
    """A null-free int32/int64/float64 arrow array as a read-only numpy view; not `Array.to_numpy`, which imports
    pandas, as does a Python object handed to arrow (`pa.array(...)`), so the readers avoid both."""
    assert array.null_count == 0, "as_numpy takes arrays without nulls"
    dtype = np.dtype(_NUMPY_TYPES[array.type])
    if not len(array):
        return np.empty(0, dtype)  # an empty array may have no data buffer
    return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize)


def as_arrow(values: np.ndarray) -> pa.Array:
    """An int32/int64/float64 numpy array as an arrow array sharing its memory (see `as_numpy`)."""
    kind = next(t for t, d in _NUMPY_TYPES.items() if d == values.dtype)
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
