"""``T.gemm(A, B, C, transpose_A=False, transpose_B=False, policy=None, clear_accum=False,
k_pack=1, wg_wait=0)``: TileLang's signature and argument order (``docs/tilelang-hints.md``)."""
from __future__ import annotations

from kernforge import dtypes
from kernforge.codegen import ir
from kernforge.dsl import builder as _B
from kernforge.dsl import hints
from kernforge.dsl.handles import to_region

_ACCUM = {dtypes.float16: (dtypes.float32, dtypes.float16), dtypes.bfloat16: (dtypes.float32,),
          dtypes.float8_e4m3: (dtypes.float32,), dtypes.float32: (dtypes.float32,),
          dtypes.float64: (dtypes.float64,), dtypes.int8: (dtypes.int32,)}


def _mat(r: ir.Region, name: str, loc) -> tuple[int, int]:
    shape = r.squeezed() if len(r.extents) > 2 else r.extents
    if len(shape) != 2:
        raise _B.error(f"T.gemm operand {name} must be a 2-D tile, got shape {r.extents}", loc)
    return shape


def gemm(A, B, C, transpose_A: bool = False, transpose_B: bool = False, policy=None,
         clear_accum: bool = False, k_pack: int = 1, wg_wait: int = 0) -> None:
    """``C += op(A) @ op(B)`` on tiles (``C = ...`` with ``clear_accum``).  ``C`` is a
    fragment; ``A`` and ``B`` are shared or fragment tiles of the same dtype.  ``op``
    transposes with ``transpose_A`` / ``transpose_B`` (``Q @ K.T`` is ``T.gemm(Q_s, K_s,
    S_f, transpose_B=True)``).  Operand and accumulator dtypes: float16 into float32 or
    float16, bfloat16 and float8_e4m3 into float32, float32 into float32, float64 into
    float64, int8 into int32.  Products accumulate in ``C``'s dtype, so results agree with
    a float64 reference to accumulation rounding.

    ``policy`` (a ``T.GemmWarpPolicy``) is recorded in the IR and sets the CUDA backend's
    warp split of ``C``; ``k_pack`` other than 1 and ``wg_wait`` other than 0 are rejected."""
    loc = _B.user_loc(2)
    transpose_A, transpose_B, clear_accum = (hints.check_flag(v, n, loc) for v, n in (
        (transpose_A, "transpose_A"), (transpose_B, "transpose_B"), (clear_accum, "clear_accum")))
    policy = hints.warp_policy(policy, loc)
    hints.check_k_pack(k_pack, loc)
    hints.check_wg_wait(wg_wait, loc)
    a, b, c = (to_region(x, None, f"gemm {n}") for x, n in ((A, "A"), (B, "B"), (C, "C")))
    (am, ak), (bk, bn), (cm, cn) = _mat(a, "A", loc), _mat(b, "B", loc), _mat(c, "C", loc)
    if transpose_A:
        am, ak = ak, am
    if transpose_B:
        bk, bn = bn, bk
    if ak != bk or am != cm or bn != cn:
        raise _B.error(f"T.gemm shape mismatch: A is {am}x{ak}, B is {bk}x{bn}, C is {cm}x{cn} "
                      f"(transpose_A={transpose_A}, transpose_B={transpose_B})", loc)
    if a.buffer.dtype != b.buffer.dtype:
        raise _B.error(f"T.gemm dtype mismatch: A is {a.buffer.dtype}, B is {b.buffer.dtype}", loc)
    allowed = _ACCUM.get(a.buffer.dtype)
    if allowed is None or c.buffer.dtype not in allowed:
        raise _B.error(f"T.gemm: {a.buffer.dtype} inputs need a {'/'.join(map(str, allowed or ()))} "
                      f"accumulator, C is {c.buffer.dtype}", loc)
    if c.buffer.scope not in (ir.Scope.FRAGMENT, ir.Scope.LOCAL):
        raise _B.error(f"T.gemm accumulator {c.buffer.name} must be a fragment "
                      f"(T.alloc_fragment), not {c.buffer.scope.value}", loc)
    for r, n in ((a, "A"), (b, "B")):
        if r.buffer.scope == ir.Scope.GLOBAL:
            raise _B.error(f"T.gemm operand {n} is global memory: T.copy it into shared memory first", loc)
    _B.current().emit(ir.Gemm(a, b, c, transpose_A, transpose_B, clear_accum, loc, policy=policy))
