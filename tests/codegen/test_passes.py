"""Passes: simplification, edge-mask lowering, memory planning and the pipeline runner.

Semantic preservation is checked by running the interpreter (the oracle) on a
kernel before and after a pass on the same random inputs: results must agree
bit for bit.  No compiler is needed.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernforge.dsl as T
from kernforge import dtypes
from kernforge.codegen import arith, ir
from kernforge.codegen.passes import (PassError, edge_conditions, expr_range, lifetimes, lower_copies,
                                      nonneg_vars, plan_memory, proves, run_pipeline, simplify, var_ranges)
from kernforge.codegen.passes.gemm_layout import gemm_operand_layout
from kernforge import backends

FEW = settings(max_examples=15, deadline=None)


def interp(kernel: ir.Kernel, args: list, dims: list) -> list:
    env = dict(zip(kernel.symbols, dims))
    env.update({p: a for p, a in zip(kernel.params, args) if isinstance(p, ir.Var)})
    grid = [arith.evaluate(g, env) for g in kernel.grid]
    out = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    backends.get("interp").build(kernel)(out, dims, grid)
    return out


def nodes(kernel: ir.Kernel, cls) -> list:
    return [n for n in ir.walk(kernel.body) if isinstance(n, cls)]


# ---------------------------------------------------------------- kernels

def tiled_copy(BM=8, BN=16, static=False, dtype="bfloat16"):
    M = 64 if static else T.symbolic("M")
    N = 48 if static else T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), dtype), off: T.int32):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=32) as (bx, by):
            s = T.alloc_shared((BM, BN), dtype)
            f = T.alloc_fragment((BM, BN), "float32")
            T.fill(f, 1.5)
            T.copy(A[by * BM + off, bx * BN], s)  # off may be negative: a lower mask too
            for i, j in T.Parallel(BM, BN):
                f[i, j] = f[i, j] + T.cast(s[i, j], "float32")
            T.copy(f, B[by * BM, bx * BN])
    return main


def index_math():
    N = T.symbolic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "int32"), O: T.Tensor((N,), "int32"), s: T.int32):
        with T.Kernel(T.ceildiv(N, 16), threads=16) as bx:
            for i in T.Parallel(16):
                j = (bx * 16 + 0) * 1 + i
                if j < N:
                    O[j] = ((A[j] + 3) + 4) * 1 + (s - 0) // 1 + A[j] % 1 + (0 * s) + (2 + 3) * 4
            if 3 > 4:
                O[0] = 99
            for k in T.serial(0):
                O[0] = 98
    return main


# ---------------------------------------------------------------- simplify

def test_simplify_folds_index_math_and_prunes_dead_code():
    k = simplify(index_math().ir)
    stores = nodes(k, ir.Store)
    assert len(stores) == 1  # the constant-false branch and the empty loop are gone
    assert not nodes(k, ir.For)
    assert repr(stores[0]) == "O[((bx * 16) + i)] = ((A[((bx * 16) + i)] + s) + 27)"


def test_simplify_leaves_float_math_alone():
    @T.prim_func
    def main(A: T.Tensor((8,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.Parallel(8):
                A[i] = A[i] + 0.0  # not an identity for -0.0
    k = simplify(main.ir)
    store = nodes(k, ir.Store)[0]
    assert isinstance(store.value, ir.Binary) and store.value.op == ir.Op.ADD


_OPS = [ir.Op.ADD, ir.Op.SUB, ir.Op.MUL, ir.Op.FLOORDIV, ir.Op.MOD, ir.Op.MAX, ir.Op.MIN]


@st.composite
def int_exprs(draw, x, depth=0):
    if depth >= 3 or draw(st.booleans()):
        return x if draw(st.booleans()) else ir.const(draw(st.integers(-9, 9)))
    op = draw(st.sampled_from(_OPS))
    return ir.binary(op, draw(int_exprs(x, depth + 1)), draw(int_exprs(x, depth + 1)))


def _eval(e, x):
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Var):
        return x
    a, b = _eval(e.a, x), _eval(e.b, x)
    if a is None or b is None:
        return None
    if e.op in (ir.Op.FLOORDIV, ir.Op.MOD) and b == 0:
        return None
    return {ir.Op.ADD: a + b, ir.Op.SUB: a - b, ir.Op.MUL: a * b, ir.Op.MAX: max(a, b), ir.Op.MIN: min(a, b),
            ir.Op.FLOORDIV: a // b if b else None, ir.Op.MOD: a % b if b else None}[e.op]


@FEW
@given(data=st.data(), x=st.integers(-50, 50))
def test_simplify_preserves_integer_values(data, x):
    v = ir.Var("x")
    e = data.draw(int_exprs(v))

    @T.prim_func
    def main(O: T.Tensor((1,), "int32"), xv: T.int32):
        with T.Kernel(1) as bx:
            O[0] = 0
    k = main.ir
    xv = k.params[1]
    body = ir.Store(k.params[0], (ir.const(0),), ir.cast(_Substitute(v, xv).visit(e), dtypes.int32))
    k2 = simplify(ir.Kernel(k.name, k.params, k.grid, k.block_vars, k.threads, body, k.symbols))
    want = _eval(e, x)
    if want is None or not -2**31 <= want < 2**31:  # division by zero or overflow: undefined
        return
    assert interp(k2, [np.zeros(1, np.int32), x], [])[0][0] == want


class _Substitute(ir.Mutator):
    def __init__(self, old, new):
        self.old, self.new = old, new

    def visit_Var(self, v):
        return self.new if v is self.old else v


# ---------------------------------------------------------------- ranges

def test_ranges_of_block_loop_and_parallel_vars():
    k = tiled_copy(static=True).ir
    table = var_ranges(k)
    bx, by = k.block_vars
    assert table[bx] == (0, 2) and table[by] == (0, 7)
    assert bx in nonneg_vars(k)
    assert k.params[2] not in nonneg_vars(k)  # a scalar parameter may be negative
    assert expr_range(ir.binary(ir.Op.MOD, ir.binary(ir.Op.MUL, by, 8), 5), table) == (0, 4)
    assert expr_range(ir.binary(ir.Op.FLOORDIV, ir.binary(ir.Op.ADD, by, 1), 2), table) == (0, 4)
    assert proves(ir.binary(ir.Op.LE, ir.binary(ir.Op.ADD, ir.binary(ir.Op.MUL, bx, 16), 16), 48), table)
    assert not proves(ir.binary(ir.Op.LE, ir.binary(ir.Op.ADD, ir.binary(ir.Op.MUL, bx, 16), 17), 48), table)


# ---------------------------------------------------------------- masks

def test_lower_copies_masks_only_dims_that_can_leave_their_buffer():
    static = tiled_copy(static=True).ir
    low = run_pipeline(static, [simplify, lower_copies, simplify])
    assert not nodes(low, ir.Copy) and not nodes(low, ir.Fill)
    table = var_ranges(static)
    a_copy = [c for c in nodes(static, ir.Copy) if c.src.buffer.scope == ir.Scope.GLOBAL][0]
    b_copy = [c for c in nodes(static, ir.Copy) if c.dst.buffer.scope == ir.Scope.GLOBAL][0]
    # rows of A shift by a runtime offset (both sides masked); columns divide exactly
    assert edge_conditions(a_copy.src, table) == [(0, True, True)]
    assert edge_conditions(b_copy.dst, table) == []
    assert edge_conditions(a_copy.dst, table) == []  # on-chip side
    symbolic = run_pipeline(tiled_copy().ir, [simplify, lower_copies])
    ifs = [s for s in nodes(symbolic, ir.If) if isinstance(s.then, ir.Parallel)]
    assert len(ifs) == 2  # one whole-tile test per masked copy, an unmasked fast path inside


@FEW
@given(m=st.integers(1, 40), n=st.integers(1, 40), off=st.integers(-9, 9), seed=st.integers(0, 2**16),
       static=st.booleans())
def test_lowered_copies_match_the_original_in_the_interpreter(m, n, off, seed, static):
    k = tiled_copy(static=static).ir
    if static:
        m, n = 64, 48
    low = run_pipeline(k, [simplify, lower_copies, simplify])
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)).astype(np.float32)
    b = np.full((m, n), np.nan, np.float32).astype(dtypes.bfloat16.np_dtype)
    dims = [] if static else [m, n]
    want = interp(k, [a, b, off], dims)[1]
    got = interp(low, [a, b, off], dims)[1]
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_fill_whose_value_reads_its_own_tile_is_evaluated_once():
    @T.prim_func
    def main(O: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            f = T.alloc_fragment((4,), "float32")
            for i in T.Parallel(4):
                f[i] = T.cast(i, "float32") + 2.0
            T.fill(f, f[1] * 2.0)  # every element gets 6, not a value already overwritten
            T.copy(f, O[0])
    low = run_pipeline(main.ir, [lower_copies])
    out = interp(low, [np.full(4, np.nan, np.float32)], [])[0]
    assert np.array_equal(out, np.full(4, 6.0, np.float32))


# ---------------------------------------------------------------- memory plan

def scoped_buffers():
    @T.prim_func
    def main(O: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            big = T.alloc_shared((100,), "float32")
            T.fill(big, 1.0)
            for k in T.serial(2):
                tmp = T.alloc_fragment((30,), "float32")
                T.fill(tmp, 2.0)
                O[0] = tmp[0] + big[0]
            for k2 in T.serial(2):
                tmp2 = T.alloc_fragment((20,), "float64")
                T.fill(tmp2, 3.0)
                O[1] = T.cast(tmp2[0], "float32")
            loc = T.alloc_local((3,), "int32")
            loc[0] = 1
    return main


def test_memory_plan_reuses_bytes_only_across_disjoint_lifetimes():
    k = scoped_buffers().ir
    plan = plan_memory(k, lambda b: b.scope != ir.Scope.LOCAL, align=64)
    by_name = {s.buffer.name: s for s in plan.slots}
    assert set(by_name) == {"big", "tmp", "tmp2"}
    for s in plan.slots:
        assert s.offset % 64 == 0 and s.size % 64 == 0 and s.size >= 4
    for a in plan.slots:
        for b in plan.slots:
            if a is not b and a.first <= b.last and b.first <= a.last:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
    # the two loop-body temporaries are never live together: they share bytes
    assert by_name["tmp"].offset == by_name["tmp2"].offset
    assert plan.total == 448 + 192
    assert plan.offset(by_name["big"].buffer) == by_name["big"].offset
    live = lifetimes(k.body)
    assert all(first <= last for first, last in live.values())


# ---------------------------------------------------------------- runner

def test_run_pipeline_names_and_dumps_each_pass():
    seen = []
    run_pipeline(tiled_copy().ir, [simplify, lower_copies], dump=lambda name, k: seen.append((name, k)))
    assert [n for n, _ in seen] == ["simplify", "lower_copies"]
    assert not nodes(seen[-1][1], ir.Copy)
    stream = io.StringIO()
    run_pipeline(tiled_copy().ir, [simplify], dump=stream)
    assert stream.getvalue().startswith("# after simplify\nkernel main(")


def test_run_pipeline_rejects_a_pass_that_breaks_the_ir():
    def drop_allocations(k: ir.Kernel) -> ir.Kernel:
        body = k.body
        return ir.Kernel(k.name, k.params, k.grid, k.block_vars, k.threads,
                         ir.Seq(tuple(s for s in body.body if not isinstance(s, ir.Allocate))), k.symbols)

    with pytest.raises(PassError, match="drop_allocations"):
        run_pipeline(tiled_copy().ir, [drop_allocations])


# ---------------------------------------------------------------- append idiom recogniser


def _append_loops(variant: str):
    """One loop of the append idiom, or a near miss of it (``variant``)."""
    dt = "int64" if variant == "wide" else "float32"

    @T.prim_func
    def k(x: T.Tensor((64,), dt), g: T.Tensor((64,), dt), out: T.Tensor((64,), dt)):
        with T.Kernel(1, threads=1) as bx:
            buf = T.alloc_shared((64,), dt)
            other = T.alloc_shared((64,), dt)
            cnt = T.alloc_var("int32", 0)
            for j in T.serial(64):
                if variant == "global":
                    g[cnt] = x[j]
                elif variant == "twice":
                    buf[cnt] = x[j]
                    buf[cnt] = x[j] + x[j]
                elif variant == "shifted_read":
                    buf[cnt] = buf[T.min(j + 1, 63)]
                elif variant == "in_place":
                    buf[cnt] = buf[j]
                    other[cnt] = x[j]
                else:
                    buf[cnt] = x[j]
                cnt = cnt + T.cast(x[j] > T.cast(0, dt), "int32")
            for i in T.Parallel(64):
                out[i] = buf[i] + other[i]

    return [n for n in ir.walk(k.ir.body) if isinstance(n, ir.For)]


@pytest.mark.parametrize("variant,matched,trailing", [
    ("plain", True, False), ("in_place", True, True), ("global", False, None), ("twice", False, None),
    ("shifted_read", False, None), ("wide", False, None),
])
def test_append_recogniser_accepts_only_the_exact_idiom(variant, matched, trailing):
    from kernforge.codegen.passes.append import match_append
    (loop,) = _append_loops(variant)
    found = match_append(loop)
    assert (found is not None) == matched
    if matched:
        assert found.needs_trailing_counter == trailing
        assert len(found.stores) == (2 if variant == "in_place" else 1)


# ---------------------------------------------------------------- GEMM operand layout


def tiled_bf16_gemm(twice: bool = False):
    """C = A @ B in 32 x 64 x 16 tiles, B N-major bf16 (``twice``: a second GEMM reads B's tile)."""
    @T.prim_func
    def main(A: T.Tensor((64, 48), "bfloat16"), B: T.Tensor((48, 128), "bfloat16"), C: T.Tensor((64, 128), "float32")):
        with T.Kernel(2, 2, threads=32) as (bx, by):
            a_s = T.alloc_shared((32, 16), "bfloat16")
            b_s = T.alloc_shared((16, 64), "bfloat16")
            acc = T.alloc_fragment((32, 64), "float32")
            T.clear(acc)
            for k in T.serial(3):
                T.copy(A[by * 32, k * 16], a_s)
                T.copy(B[k * 16, bx * 64], b_s)
                T.gemm(a_s, b_s, acc)
                if twice:
                    T.gemm(a_s, b_s, acc)
            T.copy(acc, C[by * 32, bx * 64])
    return main


@pytest.mark.parametrize("packed, twice, b_in_place", [((), False, False), ((dtypes.bfloat16,), False, True),
                                                       ((dtypes.bfloat16,), True, False)])
def test_packed_b_reads_a_many_row_b_in_place_and_keeps_the_values(packed, twice, b_in_place):
    """``packed_b`` (a target whose micro-kernel packs an N-major B itself) drops a B tile's copy for
    a 32-row GEMM, which ``direct_b_rows`` (16) alone keeps, but not for a tile that two GEMMs read;
    A's copy goes either way.  The interpreter gives the same bits before and after."""
    k = tiled_bf16_gemm(twice).ir
    out = gemm_operand_layout(k, widen=(), direct=True, k_major_b=(dtypes.bfloat16,), packed_b=packed)
    gemms = nodes(out, ir.Gemm)
    assert all(g.a.buffer.scope == ir.Scope.GLOBAL for g in gemms)
    assert all((g.b.buffer.scope == ir.Scope.GLOBAL) == b_in_place for g in gemms)
    assert len(nodes(out, ir.Copy)) == (1 if b_in_place else 2)  # C's write-back (+ B's copy)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 48)).astype(dtypes.bfloat16.np_dtype)
    b = rng.standard_normal((48, 128)).astype(dtypes.bfloat16.np_dtype)
    c = np.full((64, 128), np.nan, np.float32)
    assert np.array_equal(interp(out, [a, b, c], [])[2], interp(k, [a, b, c], [])[2])
