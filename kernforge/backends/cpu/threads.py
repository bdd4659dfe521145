"""The thread count of generated CPU kernels.

Generated kernels run their grid under the system OpenMP runtime (``libgomp`` from
``g++ -fopenmp``), which is not the one torch bundles: ``torch.set_num_threads``
does not reach them.  ``set_num_threads`` sets the team size of the next launches
from the calling thread, as ``OMP_NUM_THREADS`` does at start-up.
"""
from __future__ import annotations

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def _gomp():
    return ctypes.CDLL("libgomp.so.1")


def set_num_threads(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"set_num_threads: n must be a positive int, got {n!r}")
    _gomp().omp_set_num_threads(ctypes.c_int(n))


def num_threads() -> int:
    """The team size the next launch from this thread gets (``omp_get_max_threads``)."""
    return int(_gomp().omp_get_max_threads())
