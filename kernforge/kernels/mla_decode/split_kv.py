"""Split-KV dense decode as one runnable: the split kernel, then the combine.

With ``num_splits > 1`` :func:`~.kernel.mla_decode` leaves float32 partials that
:func:`~.kernel.mla_decode_combine` merges.  The op (:func:`kernforge.ops.flash_mla_with_kvcache`)
and the catalogue entry ``mla_decode_splitkv`` both run the pair through :class:`SplitKV`,
which takes the unsplit kernel's arguments: the tuner then verifies the merged output
against the attention reference and times both launches (the partials' allocation
included, as the op pays it), so a split count that saves attention time but costs more
in the combine does not win.
"""
import torch

import kernforge
import kernforge.dsl as T
from kernforge.kernels.mla_decode import config
from kernforge.kernels.mla_decode.kernel import mla_decode, mla_decode_combine

#: the split counts ``kernforge tune mla_decode_splitkv`` sweeps by default: the powers
#: of two up to the 32 that :func:`~.config.choose_splits` stops at
SPLITS = (1, 2, 4, 8, 16, 32)

#: :func:`~.kernel.mla_decode` with only its split count declared tunable: its tiles are
#: problem parameters (the heuristic's, or a tuned ``mla_decode``'s), so the split sweep
#: stays six points and its results are keyed on the tiles they were measured with
mla_decode_splitkv = T.tunable(num_splits=SPLITS)(mla_decode.fn)


class SplitKV:
    """``split`` (``mla_decode`` at ``num_splits``) and then ``combine``, called as the
    unsplit kernel is: ``(q, kv, block_table, cache_seqlens, attn_sink, sm_scale, out, lse)``.
    ``launches`` are the two compiled kernels (:func:`kernforge.tune.fit.misfit` checks
    each)."""

    def __init__(self, split, combine, num_splits: int):
        self.split, self.combine, self.num_splits = split, combine, num_splits
        self.launches = (split, combine)

    def __call__(self, q, kv, block_table, cache_seqlens, attn_sink, sm_scale, out, lse):
        b, s_q, h_q, _ = q.shape
        o_part = torch.empty(b, self.num_splits, s_q, h_q, out.shape[-1], dtype=torch.float32, device=q.device)
        lse_part = torch.empty(b, self.num_splits, h_q, s_q, dtype=torch.float32, device=q.device)
        self.split(q, kv, block_table, cache_seqlens, attn_sink, sm_scale, o_part, lse_part)
        self.combine(o_part, lse_part, attn_sink, out, lse)


def build(backend: str, params: dict):
    """The runnable for ``mla_decode`` parameters ``params`` on ``backend``: the kernel
    itself at one split, else :class:`SplitKV` with the combine the op would pick
    (:func:`~.config.choose_combine`, the tuning database's if it has one)."""
    split = kernforge.compile(mla_decode, backend=backend, **params)
    n = params.get("num_splits", 1)
    if n == 1:
        return split
    options = {k: params[k] for k in ("arch", "checks") if k in params}  # compile options given with the parameters
    combine = kernforge.compile(mla_decode_combine, backend=backend, **options, **config.choose_combine(
        backend, params["heads"], n, params.get("seq_q", 1), params.get("dim_v", 512)))
    return SplitKV(split, combine, n)
