"""Warp shuffles (``T.shfl_xor/down/up/sync``) and ``T.sync_warp`` in thread-level code: the same
results on interp, cpu and cuda-emu (and ascend-emu for one kernel), against numpy references
written from CUDA's documented shuffle semantics; CUDA source with ``__shfl_*_sync`` that nvcc
builds for sm_90a; typed errors at the author's line for shuffles kernforge cannot run."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import kernforge.tilelang as tilelang
import kernforge.tilelang.language as T
from kernforge.backends import registry
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.codegen import ir

BACKENDS = ["interp", "cpu", "cuda-emu"]


@pytest.fixture(autouse=True)
def _tune_db(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNFORGE_TUNE_DB", str(tmp_path / "tune.sqlite"))


def _run(func, out_idx, backend, *args):
    return tilelang.compile(func, out_idx=out_idx, target=backend)(*args)


# ---------------------------------------------------------------- references (CUDA's wording)
#
# CUDA C++ Programming Guide, warp shuffle functions: lanes form segments of `width`;
# __shfl_sync reads lane srcLane % width of the caller's segment; __shfl_up_sync reads the
# lane delta below and __shfl_down_sync the lane delta above, a lane whose source would leave
# its segment keeping its own value; __shfl_xor_sync reads lane (lane ^ laneMask), and a lane
# whose source lies in a later segment keeps its own value (earlier segments may be read).


def ref_shuffle(kind: str, v: np.ndarray, arg, width: int) -> np.ndarray:
    out = v.copy()
    arg = np.broadcast_to(np.asarray(arg), v.shape)
    for t in range(len(v)):
        warp, lane = divmod(t, 32)
        seg, pos = divmod(lane, width)
        a = int(arg[t])
        if kind == "idx":
            src = seg * width + a % width
        elif kind == "up":
            src = lane - a if pos - a >= 0 else lane
        elif kind == "down":
            src = lane + a if pos + a < width else lane
        else:
            src = lane ^ a
            src = lane if src // width > seg else src
        out[t] = v[warp * 32 + src]
    return out


# ---------------------------------------------------------------- kernels


def warp_reduce(n_blocks: int, threads: int, width: int):
    """Sum and max of each `width`-lane segment by a shfl_xor butterfly, every lane ends with them."""
    steps = [1 << i for i in range(width.bit_length() - 1)][::-1]

    @T.prim_func
    def main(X: T.Tensor((n_blocks, threads), "float32"), S: T.Tensor((n_blocks, threads), "float32"),
             M: T.Tensor((n_blocks, threads), "float32")):
        with T.Kernel(n_blocks, threads=threads) as bx:
            tx = T.get_thread_binding()
            s = T.alloc_var("float32")
            m = T.alloc_var("float32")
            s = X[bx, tx]
            m = X[bx, tx]
            for off in steps:
                s = s + T.shfl_xor(s, off, width)
                m = T.max(m, T.shfl_xor(m, off, width))
            S[bx, tx] = s
            M[bx, tx] = m
    return main


def segment_scans(threads: int, width: int):
    """Inclusive prefix sums (shfl_up) and suffix sums (shfl_down) within `width`-lane segments,
    with a per-thread `if` on the lane position."""
    steps = [1 << i for i in range(width.bit_length() - 1)]

    @T.prim_func
    def main(X: T.Tensor((threads,), "int32"), P: T.Tensor((threads,), "int32"),
             Q: T.Tensor((threads,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            pos = tx % width
            p = T.alloc_var("int32")
            q = T.alloc_var("int32")
            p = X[tx]
            q = X[tx]
            for d in steps:
                below = T.shfl_up(p, d, width)
                above = T.shfl_down(q, d, width)
                if pos >= d:
                    p = p + below
                if pos + d < width:
                    q = q + above
            P[tx] = p
            Q[tx] = q
    return main


EDGE = [("xor", 1, 32), ("xor", 31, 32), ("xor", 16, 16), ("xor", 8, 4), ("down", 0, 32), ("down", 5, 8),
        ("up", 3, 4), ("up", 31, 32), ("idx", 31, 32), ("idx", 0, 1), ("idx", 2, 4)]
FN = {"xor": "shfl_xor", "down": "shfl_down", "up": "shfl_up", "idx": "shfl_sync"}


def edge_cases(threads: int, dtype: str):
    """One output row per (kind, constant argument, width) in EDGE, then one per kind with a
    runtime argument read from L (per thread, any lane 0..31), at width 8."""
    n = len(EDGE) + 4

    @T.prim_func
    def main(X: T.Tensor((threads,), dtype), L: T.Tensor((threads,), "int32"), Y: T.Tensor((n, threads), dtype)):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            for row, (kind, arg, width) in enumerate(EDGE):
                Y[row, tx] = getattr(T, FN[kind])(X[tx], arg, width)
            for row, kind in enumerate(("xor", "down", "up", "idx")):
                Y[len(EDGE) + row, tx] = getattr(T, FN[kind])(X[tx], L[tx], 8)
    return main


def warp_exchange(threads: int):
    """Lanes exchange through shared memory across T.sync_warp: each reads its xor-1 neighbour."""
    @T.prim_func
    def main(X: T.Tensor((threads,), "float32"), Y: T.Tensor((threads,), "float32")):
        with T.Kernel(1, threads=threads):
            s = T.alloc_shared((threads,), "float32")
            tx = T.get_thread_binding()
            s[tx] = X[tx] * 2
            T.sync_warp()
            Y[tx] = s[tx ^ 1] + X[tx]
    return main


# ---------------------------------------------------------------- results


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threads,width", [(64, 32), (32, 8)])
def test_butterfly_reduction(backend, threads, width):
    rng = np.random.default_rng(threads + width)
    x = rng.standard_normal((2, threads)).astype(np.float32)
    s, m = _run(warp_reduce(2, threads, width), [1, 2], backend, torch.from_numpy(x))
    seg = x.astype(np.float64).reshape(2, threads // width, width)
    np.testing.assert_allclose(s.numpy().reshape(seg.shape), np.broadcast_to(seg.sum(-1, keepdims=True), seg.shape),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m.numpy().reshape(seg.shape),
                                  np.broadcast_to(seg.max(-1, keepdims=True), seg.shape).astype(np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_segment_scans(backend):
    threads, width = 64, 16
    x = np.random.default_rng(1).integers(-50, 50, threads).astype(np.int32)
    p, q = _run(segment_scans(threads, width), [1, 2], backend, torch.from_numpy(x))
    seg = x.reshape(-1, width)
    np.testing.assert_array_equal(p.numpy(), np.cumsum(seg, axis=1).ravel())
    np.testing.assert_array_equal(q.numpy(), np.cumsum(seg[:, ::-1], axis=1)[:, ::-1].ravel())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_width_and_lane_edge_cases(backend, dtype):
    threads = 64
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(threads) * 100).astype(dtype)
    lanes = rng.integers(0, 32, threads).astype(np.int32)
    y = _run(edge_cases(threads, dtype), [2], backend, torch.from_numpy(x), torch.from_numpy(lanes)).numpy()
    for row, (kind, arg, width) in enumerate(EDGE):
        np.testing.assert_array_equal(y[row], ref_shuffle(kind, x, arg, width), err_msg=f"{kind} {arg} {width}")
    for row, kind in enumerate(("xor", "down", "up", "idx")):
        np.testing.assert_array_equal(y[len(EDGE) + row], ref_shuffle(kind, x, lanes, 8), err_msg=f"{kind} runtime")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_warp_orders_shared_memory(backend):
    x = torch.randn(64)
    y = _run(warp_exchange(64), [1], backend, x)
    torch.testing.assert_close(y, x.view(-1, 2).flip(1).reshape(-1) * 2 + x)


def test_low_precision_values_shuffle_as_float32():
    @T.prim_func
    def k(X: T.Tensor((32,), "float16"), Y: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            Y[tx] = T.shfl_sync(X[tx], 5)
    store = [n for n in ir.nodes(k.ir.body) if isinstance(n, ir.Store) and isinstance(n.value, ir.Shuffle)][0]
    assert store.value.dtype == T.float32
    x = torch.randn(32).half()
    torch.testing.assert_close(_run(k, [1], "interp", x), x[5].float().expand(32))


def test_ascend_emu_runs_a_shuffle_kernel():
    if "ascend-emu" not in registry.available():
        pytest.skip("ascend-emu is not available here")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(64) * 100).astype(np.float32)
    lanes = rng.integers(0, 32, 64).astype(np.int32)
    y = _run(edge_cases(64, "float32"), [2], "ascend-emu", torch.from_numpy(x), torch.from_numpy(lanes)).numpy()
    for row, (kind, arg, width) in enumerate(EDGE):
        np.testing.assert_array_equal(y[row], ref_shuffle(kind, x, arg, width))


# ---------------------------------------------------------------- lowering and CUDA source


def test_cpu_splits_the_thread_loop_at_each_shuffle():
    kernel = segment_scans(32, 4).ir
    lowered, _ = registry.get("cpu").renderer.lower(kernel, registry.get("cpu").target())
    maps = [n for n in ir.nodes(lowered.body) if isinstance(n, ir.Parallel)]
    assert len(maps) == 1 + 2 * 2  # two shuffles per step, two steps
    assert not any(isinstance(n, ir.Shuffle) for n in ir.nodes(lowered.body))


def test_cuda_source_uses_warp_shuffles():
    src = render_cuda(edge_cases(64, "float32").ir).source
    for fn in ("__shfl_xor_sync(0xffffffffu", "__shfl_down_sync", "__shfl_up_sync", "__shfl_sync(0xffffffffu"):
        assert fn in src
    assert "__syncthreads" not in src  # a shuffle needs no block barrier


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_nvcc_builds_the_shuffles_for_sm_90a():
    from kernforge.backends.cuda import backend as cuda_backend

    for kernel in (warp_reduce(2, 64, 32).ir, edge_cases(64, "int32").ir):
        report = cuda_backend.build_report(kernel, "sm_90a")
        try:
            sass = cuda_backend.disassemble(report["path"])
        except Exception as e:  # noqa: BLE001 - no cuobjdump: the build itself is the check
            pytest.skip(f"no disassembler: {e}")
        assert "SHFL.BFLY" in sass


# ---------------------------------------------------------------- typed errors


def _line(err) -> str:
    assert err.loc is not None and err.loc.file == __file__, err
    return open(__file__).read().splitlines()[err.loc.line - 1]


def test_shuffle_outside_thread_code_is_unsupported():
    with pytest.raises(T.UnsupportedError) as e:
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                f = T.alloc_fragment((32,), "float32")
                for i in T.Parallel(32):
                    f[i] = T.shfl_xor(A[i], 1)
    assert "T.shfl_xor(A[i], 1)" in _line(e.value) and "get_thread_binding" in str(e.value)


def test_shuffle_under_divergent_control_flow_is_typed():
    with pytest.raises(T.DivergentBarrierError) as e:
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                if tx < 16:
                    A[tx] = T.shfl_down(A[tx], 1)
    assert "T.shfl_down(A[tx], 1)" in _line(e.value)
    with pytest.raises(T.DivergentBarrierError) as e:
        @T.prim_func
        def k2(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                for i in T.serial(tx % 2):  # a trip count that depends on the thread
                    A[tx] = T.shfl_up(A[tx], 1)
    assert "T.shfl_up(A[tx], 1)" in _line(e.value)
    with pytest.raises(T.DivergentBarrierError, match=r"T\.sync_warp\(\)") as e:
        @T.prim_func
        def k3(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                if tx < 16:
                    T.sync_warp()
    assert "T.sync_warp()" in _line(e.value)


@pytest.mark.parametrize("call,match", [
    (lambda A, tx: T.shfl_xor(A[tx], 32), "lane mask 32 is outside 0 .. 31"),
    (lambda A, tx: T.shfl_xor(A[tx], -1), "lane mask -1"),
    (lambda A, tx: T.shfl_down(A[tx], 8, 8), r"lane distance 8 is outside 0 .. 7 \(width=8\)"),
    (lambda A, tx: T.shfl_up(A[tx], 4, width=4), "lane distance 4"),
    (lambda A, tx: T.shfl_sync(A[tx], 16, 16), "source lane 16"),
    (lambda A, tx: T.shfl_xor(A[tx], 1, 12), "width must be a power of two"),
    (lambda A, tx: T.shfl_xor(A[tx], 1, 64), "width must be a power of two"),
])
def test_lane_and_width_out_of_range(call, match):
    with pytest.raises(T.WarpLaneError, match=match) as e:
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                A[tx] = call(A, tx)
    assert "T.shfl" in _line(e.value)


PARTIAL = [("xor", 1, 8), ("xor", 7, 8), ("xor", 2, 4), ("xor", 8, 4), ("down", 3, 8), ("up", 1, 2),
           ("idx", 5, 8), ("idx", 3, 4)]


def partial_warp(threads: int):
    """A block of fewer than 32 threads (one partial warp, the Hadamard example below 256): one row
    per (kind, constant argument, width) in PARTIAL, then one per kind with a runtime argument at
    width 4 (any lane 0..31)."""
    n = len(PARTIAL) + 4

    @T.prim_func
    def main(X: T.Tensor((threads,), "float32"), L: T.Tensor((threads,), "int32"),
             Y: T.Tensor((n, threads), "float32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            for row, (kind, arg, width) in enumerate(PARTIAL):
                Y[row, tx] = getattr(T, FN[kind])(X[tx], arg, width)
            for row, kind in enumerate(("xor", "down", "up", "idx")):
                Y[len(PARTIAL) + row, tx] = getattr(T, FN[kind])(X[tx], L[tx], 4)
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_shuffles_in_a_partial_warp(backend):
    threads = 8
    rng = np.random.default_rng(3)
    x = rng.standard_normal(threads).astype(np.float32)
    lanes = rng.integers(0, 32, threads).astype(np.int32)
    y = _run(partial_warp(threads), [2], backend, torch.from_numpy(x), torch.from_numpy(lanes)).numpy()
    for row, (kind, arg, width) in enumerate(PARTIAL):
        np.testing.assert_array_equal(y[row], ref_shuffle(kind, x, arg, width), err_msg=f"{kind} {arg} {width}")
    for row, kind in enumerate(("xor", "down", "up", "idx")):
        np.testing.assert_array_equal(y[len(PARTIAL) + row], ref_shuffle(kind, x, lanes, 4), err_msg=kind)


def test_cuda_masks_a_partial_warps_lanes():
    src = render_cuda(partial_warp(8).ir).source  # a block of 8 threads: the mask names lanes 0..7
    assert "__shfl_xor_sync(0xffu," in src and "0xffffffffu" not in src


def test_partial_warps_and_masks_are_unsupported():
    with pytest.raises(T.UnsupportedError, match="whole segments") as e:
        @T.prim_func
        def k0(A: T.Tensor((12,), "float32")):
            with T.Kernel(1, threads=12):
                tx = T.get_thread_binding()
                A[tx] = T.shfl_xor(A[tx], 1, 8)  # 12 threads are not whole segments of 8 lanes
    assert "T.shfl_xor" in _line(e.value)
    with pytest.raises(T.UnsupportedError, match="whole warps") as e:
        @T.prim_func
        def k(A: T.Tensor((48,), "float32")):
            with T.Kernel(1, threads=48):
                tx = T.get_thread_binding()
                A[tx] = T.shfl_xor(A[tx], 1)
    assert "T.shfl_xor" in _line(e.value)
    with pytest.raises(T.UnsupportedError, match="full-warp mask") as e:
        @T.prim_func
        def k2(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                A[tx] = T.shfl_xor(A[tx], 1, mask=0xFFFF)
    assert "mask=0xFFFF" in _line(e.value)


def test_old_shfl_sync_spelling_takes_the_mask_first():
    @T.prim_func
    def k(A: T.Tensor((32,), "int32")):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            val = tx * 10
            A[tx] = T.shfl_sync(0xFFFFFFFF, val, 31)
    assert torch.equal(_run(k, [0], "interp"), torch.full((32,), 310, dtype=torch.int32))


# ---------------------------------------------------------------- 2-D and 3-D thread blocks


def rows_by_warp(rows: int):
    """threads=(32, rows): thread (tx, ty) is lane tx of warp ty; each warp sums its row."""
    @T.prim_func
    def main(X: T.Tensor((rows, 32), "float32"), S: T.Tensor((rows,), "float32")):
        with T.Kernel(1, threads=(32, rows)):
            tx = T.get_thread_binding(0)
            ty = T.get_thread_binding(1)
            s = T.alloc_var("float32")
            s = X[ty, tx]
            for off in (16, 8, 4, 2, 1):
                s = s + T.shfl_down(s, off)
            if tx == 0:
                S[ty] = s
    return main


def thread_coords():
    @T.prim_func
    def main(Y: T.Tensor((2, 3, 8), "int32"), L: T.Tensor((48,), "int32")):
        with T.Kernel(1, threads=(8, 3, 2)):
            tx, ty, tz = T.get_thread_bindings()
            Y[tz, ty, tx] = tx + 10 * ty + 100 * tz
            L[tz * 24 + ty * 8 + tx] = T.get_thread_binding(0) + 8 * T.get_thread_binding(1) + 24 * tz
    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_dimensional_block_reduces_a_row_per_warp(backend):
    x = torch.randn(4, 32)
    s = _run(rows_by_warp(4), [1], backend, x)
    torch.testing.assert_close(s.double(), x.double().sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_dimensional_thread_indices(backend):
    y, lin = _run(thread_coords(), [0, 1], backend)
    tz, ty, tx = np.indices((2, 3, 8))
    np.testing.assert_array_equal(y.numpy(), tx + 10 * ty + 100 * tz)
    np.testing.assert_array_equal(lin.numpy(), np.arange(48))


def test_thread_dimension_errors():
    with pytest.raises(T.UnsupportedError, match="dimensions 0, 1 and 2") as e:
        @T.prim_func
        def k(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=(8, 4)):
                A[T.get_thread_binding(3)] = 0
    assert "T.get_thread_binding(3)" in _line(e.value)
    with pytest.raises(ir.KernelError, match="1 to 3 positive extents"):
        @T.prim_func
        def k2(A: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=(2, 2, 2, 4)):
                A[0] = 0


def test_verifier_rejects_a_shuffle_below_the_top_of_its_thread_map():
    """A hand-built or transformed kernel cannot reach a renderer with a shuffle some threads skip."""
    from kernforge.codegen.verify import verify

    kernel = segment_scans(32, 4).ir
    verify(kernel)
    shuffle_store = next(n for n in ir.nodes(kernel.body) if isinstance(n, ir.Store) and isinstance(n.value, ir.Shuffle))

    class UnderIf(ir.Mutator):
        def visit_Store(self, s):
            return ir.If(ir.const(True), s) if s is shuffle_store else s

    with pytest.raises(ir.KernelError, match="top level of its thread Parallel"):
        verify(kernel.with_body(UnderIf().visit(kernel.body)))
