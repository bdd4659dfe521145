"""The hyper-connection kernels' compile-time configuration, keyed on the backend's language.

``hc_pre``/``hc_head`` stream ``fn [mix, M*D]`` once per block of ``block_tokens`` tokens,
so host backends take several tokens per block to reuse each ``fn`` tile: the interpreter 8,
the CPU 32 (the mixing ``T.gemm`` is then a 32-row micro-kernel call per ``block_k`` slice;
measured at 2048 tokens, M=4, D=128, one thread: 6.7 ms at 4 tokens, 3.8 at 8, 2.6 at 32,
against 20.7 ms for the former product-and-reduce loop).  CUDA takes one token per block.
``block_k`` is the largest of 256 / 128 / 64 / 32 dividing ``M*D``."""
from __future__ import annotations

from kernforge import backends
from kernforge.tune.consult import tuned


def _block_k(width: int, cap: int) -> int:
    for bk in (256, 128, 64, 32, 16, 8, 4, 2, 1):
        if bk <= cap and width % bk == 0:
            return bk
    return 1


@tuned("hc_pre")
def choose_pre(backend: str, hc_mult: int, dim: int, sinkhorn_iters: int, dtype: str = "float32",
               fn_dtype: str = "float32") -> dict:
    return dict(_mix_config(backend, hc_mult * dim), hc_mult=hc_mult, dim=dim, sinkhorn_iters=sinkhorn_iters,
                dtype=dtype, fn_dtype=fn_dtype)


@tuned("hc_head")
def choose_head(backend: str, hc_mult: int, dim: int, dtype: str = "float32", fn_dtype: str = "float32") -> dict:
    return dict(_mix_config(backend, hc_mult * dim), hc_mult=hc_mult, dim=dim, dtype=dtype, fn_dtype=fn_dtype)


@tuned("hc_post")
def choose_post(backend: str, hc_mult: int, dim: int, dtype: str = "float32") -> dict:
    lang = backends.lang(backend)
    if lang in ("ir", "c++"):
        return dict(hc_mult=hc_mult, dim=dim, dtype=dtype, block_tokens=4, block_d=min(dim, 1024), threads=128)
    return dict(hc_mult=hc_mult, dim=dim, dtype=dtype, block_tokens=1, block_d=256, threads=128)


def _mix_config(backend: str, width: int) -> dict:
    lang = backends.lang(backend)
    if lang == "ir":
        return dict(block_tokens=8, block_k=_block_k(width, 256), threads=128)
    if lang == "c++":
        return dict(block_tokens=32, block_k=_block_k(width, 256), threads=128)
    return dict(block_tokens=1, block_k=_block_k(width, 128), threads=128)
