"""TopK's compile-time configuration: the one place its tile sizes are chosen.

:func:`choose` is what :func:`kernforge.ops.topk` compiles (``kernel_params`` there is
this function); it keys on the language a backend generates
(:func:`kernforge.backends.lang`), never on backend names.
"""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


def compaction(backend: str) -> str:
    """How survivors are appended to the buffer (both keep index order, so results are
    identical): one group at a time on a CPU, where survivors are rare; a parallel
    prefix-sum scatter for GPUs and the vectorised interpreter."""
    return "group_serial" if backends.lang(backend) == "c++" else "tile_scan"


@tuned(("topk_fp32", "topk_bf16"))  # one factory: the bucket's dtypes tell them apart
def choose(backend: str, k: int, dtype: str = "float32", index_dtype: str = "int64",
           sorted_values: bool = False, return_value: bool = True) -> dict:
    """The :func:`~kernforge.kernels.topk.topk_select` parameters for one call on ``backend``.

    C++ (CPU): 1024-element tiles in groups of 16 (a survivor-free group costs one vector
    compare; a group with survivors is one 16-lane chunk of the append loop, which the
    CPU backend compresses with AVX-512), a buffer slack of ``max(2048, 2k)`` and
    chunks of 128 tiles whose group maxima set the start threshold (``prescan``), and a
    radix sort of the winners for sorted output, measured on ``benchmarks/bench_topk.py``;
    the interpreter (``"ir"``) gets small tiles (its cost is per statement); GPUs scan
    whole tiles with the parallel compaction."""
    lang = backends.lang(backend)
    common = dict(k=k, dtype=dtype, index_dtype=index_dtype, sorted_values=sorted_values,
                  return_value=return_value, compaction=compaction(backend))
    if lang == "ir":
        return dict(common, tile=256, group=8, slack=256)
    if lang == "c++":
        return dict(common, tile=1024, group=16, slack=max(2048, 2 * k), mask_append=False, prescan=128,
                    sort="radix")
    if lang == "ascend-c":
        # the AI Core's scalar unit runs the compaction and the sort (as on a CPU), and every
        # buffer must fit the Unified Buffer (192 KiB on 910B): group-serial appends, a radix
        # sort and a 1024-element slack keep k = 4096 float32 at 161 KiB
        return dict(common, compaction="group_serial", tile=1024, group=16, slack=1024, sort="radix")
    # GPUs: the buffers (six arrays of k + tile + slack) must fit one block's shared memory
    small = k <= 1024
    return dict(common, tile=2048 if small else 1024, group=32, slack=2048 if small else 1024)
