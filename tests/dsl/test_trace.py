"""Tracing: TileLang spellings produce the expected IR, and misuse points at the author's line."""
from __future__ import annotations

import inspect

import pytest

import kernforge
import kernforge.dsl as T
from kernforge.codegen import ir


def _line_of(fn, needle: str) -> int:
    src, start = inspect.getsourcelines(fn)
    for off, line in enumerate(src):
        if needle in line:
            return start + off
    raise AssertionError(needle)


def gemm_factory(M, N, K, BM=32, BN=32, BK=16, dtype="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
            A_s = T.alloc_shared((BM, BK), dtype)
            B_s = T.alloc_shared((BK, BN), dtype)
            C_l = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=3):
                T.copy(A[by * BM, k * BK], A_s)
                T.copy(B[k * BK, bx * BN], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * BM, bx * BN])
    return main


def test_tilelang_gemm_traces_to_tile_ir():
    M = T.symbolic("M")
    k = gemm_factory(M, 64, 48).ir
    assert k.symbols == (M,)
    assert [p.name for p in k.params] == ["A", "B", "C"]
    assert k.threads == 128 and len(k.grid) == 2
    kinds = [type(n).__name__ for n in ir.walk(k.body) if isinstance(n, ir.Stmt)]
    assert kinds.count("Copy") == 3 and kinds.count("Gemm") == 1 and "Fill" in kinds
    loops = [n for n in ir.walk(k.body) if isinstance(n, ir.For)]
    assert loops[0].kind == ir.LoopKind.PIPELINED and loops[0].num_stages == 3
    assert loops[0].var.name == "k"  # the author's loop variable name
    names = {n.buffer.name for n in ir.walk(k.body) if isinstance(n, ir.Allocate)}
    assert names == {"A_s", "B_s", "C_l"}  # buffers named after the author's variables
    copy_a = next(n for n in ir.walk(k.body) if isinstance(n, ir.Copy))
    assert copy_a.src.extents == (32, 16)  # inferred from the destination tile


def test_runtime_if_else_becomes_if_node_and_static_if_unrolls():
    def f(flag):
        @T.prim_func
        def main(A: T.Tensor((8,), "float32"), n: T.int32):
            with T.Kernel(1) as bx:
                if flag:  # static: decided while tracing
                    A[0] = 1.0
                if n > 3:  # symbolic: an If node
                    A[1] = 2.0
                else:
                    A[1] = 3.0
        return main
    body = f(False).ir.body
    ifs = [n for n in ir.walk(body) if isinstance(n, ir.If)]
    stores = [n for n in ir.walk(body) if isinstance(n, ir.Store)]
    assert len(ifs) == 1 and ifs[0].orelse is not None
    assert len(stores) == 2  # the static branch vanished
    assert len([n for n in ir.walk(f(True).ir.body) if isinstance(n, ir.Store)]) == 3


def test_alloc_var_assignment_stores():
    @T.prim_func
    def main(A: T.Tensor((4,), "int32")):
        with T.Kernel(1) as bx:
            acc = T.alloc_var("int32")
            acc = 0
            for i in T.serial(4):
                acc += A[i]
            A[0] = acc
    stores = [n for n in ir.walk(main.ir.body) if isinstance(n, ir.Store)]
    assert [s.buffer.name for s in stores] == ["acc", "acc", "A"]


def test_tunable_factory_space_and_attrs():
    fac = T.tunable(BM=[16, 32], BK=[8, 16])(gemm_factory)
    assert list(fac.space) == ["BM", "BK"]
    assert len(list(fac.configs())) == 4
    pf = fac(M=64, N=64, K=32, BM=16)
    assert pf.ir.attrs["BM"] == 16 and pf.ir.attrs["BK"] == 16 and pf.ir.attrs["dtype"] == "float16"
    assert fac(M=64, N=64, K=32, BM=16) is pf  # specialisations are memoised


@pytest.mark.parametrize("case", ["copy", "gemm_shape", "gemm_dtype", "scope", "bool", "reduce",
                                  "parallel_alloc", "index"])
def test_mistakes_report_the_kernel_line(case):
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "bfloat16")):
            with T.Kernel(1) as bx:
                s = T.alloc_shared((32, 32), "float16")
                t = T.alloc_shared((32, 32), "bfloat16")
                c = T.alloc_fragment((32, 32), "float32")
                r = T.alloc_fragment((16,), "float32")
                if case == "copy":
                    T.copy(A[0:16, 0:32], s)  # MARK copy
                if case == "gemm_shape":
                    T.gemm(s, s[0:32, 0:16], c)  # MARK gemm_shape
                if case == "gemm_dtype":
                    T.gemm(s, t, c)  # MARK gemm_dtype
                if case == "scope":
                    for k in T.serial(2):
                        u = T.alloc_fragment((8,), "float32")
                    T.fill(u, 0)  # MARK scope
                if case == "bool":
                    x = A[0, 0] > 0
                    if x and True:  # MARK bool
                        pass
                if case == "reduce":
                    T.reduce_max(c, r, dim=1)  # MARK reduce
                if case == "parallel_alloc":
                    for i in T.Parallel(4):
                        T.alloc_fragment((2,), "float32")  # MARK parallel_alloc
                if case == "index":
                    A[0] = 1  # MARK index
        return main
    with pytest.raises(ir.KernelError) as ei:
        build()
    err = ei.value
    assert err.loc is not None and err.loc.file == __file__
    assert err.loc.line == _line_of(build, f"# MARK {case}")
    assert str(err).startswith(f"{__file__}:{err.loc.line}:")


def test_compile_rejects_params_for_plain_prim_func():
    pf = gemm_factory(32, 32, 16)
    with pytest.raises(kernforge.ArgumentError):
        kernforge.compile(pf, backend="interp", BM=16)


def test_unknown_and_unimplemented_backends_are_clear():
    pf = gemm_factory(32, 32, 16)
    with pytest.raises(kernforge.BackendError, match="unknown backend 'tpu'"):
        kernforge.compile(pf, backend="tpu")
    with pytest.raises(kernforge.BackendError, match="ascend"):
        kernforge.compile(pf, backend="ascend")


def test_slice_length_folds_through_nonlinear_start():
    @T.prim_func
    def main(KV: T.Tensor((4, 64, 8), "float32"), p: T.int32):
        with T.Kernel(1) as bx:
            t = T.alloc_shared((16, 8), "float32")
            off = p % 48
            T.copy(KV[1, off:off + 16, 0:8], t)
    c = next(n for n in ir.walk(main.ir.body) if isinstance(n, ir.Copy))
    assert c.src.extents == (1, 16, 8)


@T.macro
def _clamp_store(dst, i, value, hi):
    if value > hi:  # a runtime branch inside a macro
        dst[i] = hi
    else:
        dst[i] = value


def test_macro_gets_runtime_if_and_runs():
    import numpy as np

    @T.prim_func
    def main(A: T.Tensor((8,), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.serial(8):
                _clamp_store(B, i, A[i], 0.5)
    assert any(isinstance(n, ir.If) for n in ir.walk(main.ir.body))
    a = np.linspace(-1, 1, 8).astype(np.float32)
    b = np.full(8, np.nan, np.float32)
    kernforge.compile(main)(a, b)
    np.testing.assert_array_equal(b, np.minimum(a, 0.5))
