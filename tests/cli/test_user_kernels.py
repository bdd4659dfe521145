"""`kernforge emit|run|build FILE.py:NAME`: an author's own kernels on the command line."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

import kernforge
from kernforge import cli as kcli
from kernforge.kernels import check
from tests.cli.conftest import assert_one_line_error

KERNELS = textwrap.dedent('''
    import kernforge.dsl as T

    n = T.symbolic("n")
    m = T.symbolic("m")
    LIMIT = 3

    @T.prim_func
    def scale(x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32"), a: T.float32):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    y[bx * 64 + i] = x[bx * 64 + i] * a

    @T.prim_func
    def accumulate(x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    y[bx * 64 + i] = y[bx * 64 + i] + x[bx * 64 + i]

    @T.prim_func
    def shift(x: T.Tensor((n,), "int32"), y: T.Tensor((n,), "int32"), k: T.int32):
        with T.Kernel(T.ceildiv(n, 64), threads=64) as bx:
            for i in T.Parallel(64):
                if bx * 64 + i < n:
                    y[bx * 64 + i] = x[bx * 64 + i] + k

    @T.prim_func
    def gather(x: T.Tensor((m,), "float32"), idx: T.Tensor((n,), "int32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 32), threads=32) as bx:
            for i in T.Parallel(32):
                if bx * 32 + i < n:
                    y[bx * 32 + i] = x[idx[bx * 32 + i]]

    @T.tunable(BM=[16, 32])
    def matmul(M, N, K, BM=32, BN=32, BK=32, dtype="bfloat16"):
        @T.prim_func
        def mm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
            with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
                A_s = T.alloc_shared((BM, BK), dtype)
                B_s = T.alloc_shared((BK, BN), dtype)
                C_f = T.alloc_fragment((BM, BN), "float32")
                T.clear(C_f)
                for k in T.Pipelined(T.ceildiv(K, BK), num_stages=2):
                    T.copy(A[by * BM, k * BK], A_s)
                    T.copy(B[k * BK, bx * BN], B_s)
                    T.gemm(A_s, B_s, C_f)
                T.copy(C_f, C[by * BM, bx * BN])
        return mm

    def plain_factory(size):
        @T.prim_func
        def copy_k(x: T.Tensor((size,), "float32"), y: T.Tensor((size,), "float32")):
            with T.Kernel(1, threads=size) as bx:
                for i in T.Parallel(size):
                    y[i] = x[i]
        return copy_k

    def not_a_factory(size):
        return size
''')


@pytest.fixture
def kfile(tmp_path):
    path = tmp_path / "my_kernels.py"
    path.write_text(KERNELS)
    return str(path)


def test_run_a_prim_func_on_cpu_checks_it_against_the_interpreter(cli, kfile):
    code, out, err = cli("run", f"{kfile}:scale", "--dim", "n=1000", "--backend", "cpu", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["verified"] and res["kernel"] == "scale" and res["problem"] == "n=1000"
    assert "against the interpreter" in res["label"] and res["median_ms"] > 0
    assert err == ""  # not a terminal: no progress, no compile notice


def test_run_a_tunable_factory_with_params_and_a_ragged_symbolic_dim(cli, kfile):
    code, out, err = cli("run", f"{kfile}:matmul", "--param", "M=symbolic", "--param", "N=64", "--param", "K=96",
                         "--param", "BM=16", "--dim", "M=37", "--backend", "cpu", "--repeat", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["verified"]


def test_run_reports_a_backend_that_disagrees_with_the_interpreter(cli, kfile, monkeypatch):
    real = kernforge.compile

    def off_by_one(func, backend="interp", **kw):  # a planted backend bug: one element wrong
        kernel = real(func, backend=backend, **kw)
        if backend == "interp":
            return kernel

        def call(*args):
            kernel(*args)
            args[1][3] += 1.0
        call.backend = kernel.backend
        return call

    monkeypatch.setattr(kernforge, "compile", off_by_one)
    code, out, err = cli("run", f"{kfile}:scale", "--dim", "n=100", "--json")
    assert code == 1
    res = json.loads(out)
    assert not res["verified"]
    assert "y: 1 of 100 elements differ" in res["error"] and "[3]" in res["error"]


def test_outputs_are_poisoned_and_read_write_buffers_are_not(kfile):
    mod = kcli._load_file(kfile)
    scale_inputs = check.kernel_inputs(mod.scale.ir, {"n": 70}, {}, seed=1)
    x, y, a = scale_inputs
    assert torch.isnan(y).all() and torch.isfinite(x).all() and (x != 0).all()
    assert 0.5 <= a < 1.5
    _, y_acc = check.kernel_inputs(mod.accumulate.ir, {"n": 70}, {}, seed=1)
    assert torch.isfinite(y_acc).all()  # y += x reads y: random, not NaN
    _, y_int, _ = check.kernel_inputs(mod.shift.ir, {"n": 5}, {"k": 2}, seed=0)
    assert (y_int == torch.iinfo(torch.int32).min).all()


def test_an_out_of_bounds_index_is_caught_by_the_interpreter_before_the_backend_runs(cli, kfile, monkeypatch):
    built = []
    real = kernforge.compile
    monkeypatch.setattr(kernforge, "compile", lambda f, backend="interp", **kw: built.append(backend) or
                        real(f, backend=backend, **kw))
    code, out, err = cli("run", f"{kfile}:gather", "--dim", "n=50", "--dim", "m=4", "--backend", "cpu")
    assert_one_line_error(code, err, "my_kernels.py:", "out-of-bounds read x[")
    assert built == ["interp"]  # the compiled backend never saw the bad index


def test_emit_and_build_a_file_kernel(cli, kfile, tmp_path):
    code, out, err = cli("emit", f"{kfile}:plain_factory", "--param", "size=32", "--backend", "cuda")
    assert code == 0, err
    assert "copy_k" in out and "__global__" in out
    code, out, err = cli("emit", f"{kfile}:scale", "--backend", "cpu", "-o", str(tmp_path / "src"))
    assert code == 0 and out.strip().endswith(".cpp")
    assert "scale" in open(out.strip()).read()


@pytest.mark.parametrize("argv, fragments", [
    (["run", "/no/such/file.py:k"], ["no such file: /no/such/file.py"]),
    (["run", "{f}:nope"], ["has no 'nope'", "accumulate, gather, matmul, scale, shift"]),
    (["run", "{f}:LIMIT"], ["LIMIT", "is not a kernel (int)"]),
    (["run", "{f}:not_a_factory", "--param", "size=4"], ["returned int, not a @T.prim_func"]),
    (["run", "{f}"], ["defines 5 kernels"]),
    (["emit", "{f}:matmul", "--param", "M"], ["bad --param 'M': expected NAME=VALUE"]),
    (["emit", "{f}:matmul", "--param", "M=1", "--param", "N=2", "--param", "K=3", "--param", "Q=4"],
     ["--param", "'Q'", "its parameters: M, N, K"]),
    (["emit", "{f}:scale", "--param", "M=1"], ["@T.prim_func with no compile-time parameters"]),
    (["emit", "{f}:plain_factory"], ["--param", "missing a required argument: 'size'"]),
    (["run", "{f}:scale"], ["symbolic dimension(s) n", "--dim n="]),
    (["run", "{f}:scale", "--dim", "n=4", "--dim", "q=3"], ["no symbolic dimension 'q'"]),
    (["run", "{f}:scale", "--dim", "n=-4"], ["bad --dim n=-4"]),
    (["run", "{f}:shift", "--dim", "n=4"], ["scalar parameter 'k' (int32) needs a value", "--arg k="]),
    (["run", "{f}:shift", "--dim", "n=4", "--arg", "k=x"], ["bad --arg k=x"]),
    (["run", "{f}:scale", "--problem", "small"], ["--problem applies to library kernels"]),
    (["run", "topk_bf16", "--dim", "n=4"], ["--dim applies to kernels from a file"]),
])
def test_mistakes_are_one_line_errors(cli, kfile, argv, fragments):
    code, out, err = cli(*[a.replace("{f}", kfile) for a in argv])
    assert_one_line_error(code, err, *fragments)
