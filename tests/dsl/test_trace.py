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
                    y = x and True  # MARK bool
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


# ------------------------------------------------- grid / name mismatch, dtype typos (issue 16)


def _raised_at(build, mark: str, error=ir.KernelError) -> ir.KernelError:
    """The error ``build()`` raises, checked to start with this file and the marked line."""
    with pytest.raises(error) as ei:
        build()
    err = ei.value
    line = _line_of(build, f"# MARK {mark}")
    assert err.loc is not None and (err.loc.file, err.loc.line) == (__file__, line), err.loc
    assert str(err).startswith(f"{__file__}:{line}: ")
    return err


@pytest.mark.parametrize("grid, target, names", [
    ((4, 8), "bx", 1), ((4, 8, 2), "(bx, by)", 2), ((4,), "(bx, by)", 2)])
def test_grid_bound_to_wrong_number_of_names_is_one_clear_line(grid, target, names):
    def build():
        @T.prim_func
        def main(A: T.Tensor((32, 32), "float32")):
            if len(grid) == 1:
                with T.Kernel(*grid, threads=32) as (bx, by):  # MARK kernel1
                    A[bx, by] = 1.0
            elif len(grid) == 2:
                with T.Kernel(*grid, threads=32) as bx:  # MARK kernel2
                    s = T.alloc_shared((8, 4), "float32")
                    T.copy(A[bx * 128, 0], s)  # (bx, by) * 128 used to build a 256-element tuple
            else:
                with T.Kernel(*grid, threads=32) as (bx, by):  # MARK kernel3
                    A[bx, by] = 1.0
        return main
    err = _raised_at(build, f"kernel{len(grid)}")
    msg = str(err)
    assert "\n" not in msg and len(msg) < len(__file__) + 160, msg
    n = len(grid)
    assert f"{n} grid dimension{'s' if n > 1 else ''}" in err.message
    assert f"`as {target}` binds {names} name" in err.message
    assert "tuple" not in msg


def test_matching_names_still_bind_and_one_tuple_name_unpacks_a_1d_grid():
    @T.prim_func
    def main(A: T.Tensor((4, 8), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(8, 4) as (bx, by):
            A[by, bx] = 1.0
    assert [v.name for v in main.ir.block_vars] == ["bx", "by"]

    @T.prim_func
    def one(B: T.Tensor((4,), "float32")):
        with T.Kernel(4) as (b,):
            B[b] = 2.0
    import numpy as np
    out = np.zeros(4, np.float32)
    kernforge.compile(one)(out)
    np.testing.assert_array_equal(out, 2.0)


@pytest.mark.parametrize("case", ["tensor", "shared", "fragment", "var", "cast", "strided"])
def test_dtype_typo_is_typed_error_at_the_line_with_suggestion(case):
    def build():
        if case == "tensor":
            @T.prim_func
            def main(A: T.Tensor((4,), "flaot32")):  # MARK tensor
                with T.Kernel(1) as bx:
                    A[0] = 1.0
        elif case == "strided":
            @T.prim_func
            def main(A: T.StridedTensor((4,), (1,), "flaot32")):  # MARK strided
                with T.Kernel(1) as bx:
                    A[0] = 1.0
        else:
            @T.prim_func
            def main(A: T.Tensor((4,), "float32")):
                with T.Kernel(1) as bx:
                    if case == "shared":
                        s = T.alloc_shared((4,), "flaot32")  # MARK shared
                    if case == "fragment":
                        s = T.alloc_fragment((4,), "flaot32")  # MARK fragment
                    if case == "var":
                        v = T.alloc_var("flaot32")  # MARK var
                    if case == "cast":
                        A[0] = T.cast(bx, "flaot32")  # MARK cast
        return main
    err = _raised_at(build, case, T.DTypeError)
    assert isinstance(err, TypeError)  # what kernforge.dtypes.dtype raised before, still catchable
    assert "unknown dtype 'flaot32' (did you mean 'float32'?)" in err.message
    what = {"tensor": "T.Tensor", "strided": "T.StridedTensor", "shared": "T.alloc_shared",
            "fragment": "T.alloc_fragment", "var": "T.alloc_var", "cast": "T.cast"}[case]
    # this file postpones annotations, so T.Tensor runs inside the tracer, which names the parameter
    prefix = "parameter 'A': " if case in ("tensor", "strided") else ""
    assert err.message.startswith(f"{prefix}{what}: ")


def test_dtype_typo_under_postponed_annotations_points_at_the_parameter(tmp_path):
    """With ``from __future__ import annotations`` the annotation is evaluated inside the
    tracer, far from the author's frame; the error still names the parameter's line."""
    src = tmp_path / "kern.py"
    src.write_text("from __future__ import annotations\n"
                   "import kernforge.dsl as T\n"
                   "@T.prim_func\n"
                   "def main(A: T.Tensor((4,), 'float32'),\n"
                   "         n: 'bfloat61'):\n"
                   "    with T.Kernel(1) as bx:\n"
                   "        A[0] = 1.0\n")
    src2 = tmp_path / "kern2.py"
    src2.write_text(src.read_text().replace("'float32'),\n         n: 'bfloat61'", "'float32'),\n"
                                            "         B: T.Tensor((4,), 'flaot32')"))
    src3 = tmp_path / "kern3.py"  # annotations evaluated eagerly, at the def
    src3.write_text(src2.read_text().replace("from __future__ import annotations\n", "#\n"))
    import importlib.util

    for path, bad, hint in ((src, "n", "did you mean 'bfloat16'?"), (src2, "B", "did you mean 'float32'?"),
                            (src3, "flaot32", "did you mean 'float32'?")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        with pytest.raises(T.DTypeError) as ei:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert str(ei.value).startswith(f"{path}:5: ") and f"'{bad}'" in str(ei.value)
        assert hint in str(ei.value)


def test_unknown_dtype_outside_the_dsl_suggests_too():
    from kernforge import dtypes

    with pytest.raises(TypeError, match=r"unknown dtype 'in32' \(did you mean 'int32'\?\)"):
        dtypes.dtype("in32")
    with pytest.raises(TypeError) as ei:
        dtypes.dtype("complex128")
    assert "did you mean" not in str(ei.value)  # nothing close: no guess


# -- the rewritten kernel functions are kept on disk (kernforge.runtime.code_cache) -------------

_CACHED_KERNEL = '''import kernforge.dsl as T


def factory(N):
    @T.prim_func
    def shift(X: T.Tensor((N,), "int32"), Y: T.Tensor((N,), "int32")):
        with T.Kernel(1, threads=1):
            for i in T.serial(N):
                if X[i] > 0:
                    Y[i] = X[i] + OFFSET
                else:
                    Y[i] = X[i] - OFFSET
    return shift
'''


def _kernel_module(tmp_path, offset: int, name: str):
    """The kernel above, with ``OFFSET`` spelled ``offset``, in ``tmp_path/kern.py``: every
    version at the same path and lines, so only the file's content tells them apart."""
    import importlib.util

    path = tmp_path / "kern.py"
    path.write_text(_CACHED_KERNEL.replace("OFFSET", str(offset)))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shifted(mod, n: int):
    import numpy as np

    x = np.random.default_rng(n).integers(-50, 50, size=n).astype(np.int32)
    y = np.full_like(x, -999)
    kernforge.compile(mod.factory(n), backend="interp")(x, y)
    return x, y


@pytest.fixture
def code_cache_root(tmp_path, monkeypatch):
    """A private code cache, and a process that has rewritten nothing yet."""
    from kernforge.dsl import rewrite
    from kernforge.runtime import code_cache

    root = tmp_path / "cache"
    monkeypatch.setattr(code_cache, "roots", lambda: (str(root),))
    monkeypatch.setattr(rewrite, "_CODE", {})
    return root


def _fresh_process(monkeypatch, compiling: bool):
    """Forget this process's rewritten functions; ``compiling=False``: rewriting one again fails."""
    from kernforge.dsl import rewrite

    monkeypatch.setattr(rewrite, "_CODE", {})
    if not compiling:
        def refuse(*a, **k):
            raise AssertionError("rewrote a function the cache holds")
        monkeypatch.setattr(rewrite, "_compile_rewritten", refuse)


def test_a_rewritten_kernel_is_read_back_from_disk(tmp_path, code_cache_root, monkeypatch):
    import numpy as np

    x, y = _shifted(_kernel_module(tmp_path, 3, "kern_a"), 17)
    np.testing.assert_array_equal(y, np.where(x > 0, x + 3, x - 3))
    assert list(code_cache_root.rglob("*.bin"))
    _fresh_process(monkeypatch, compiling=False)
    x, y = _shifted(_kernel_module(tmp_path, 3, "kern_b"), 23)
    np.testing.assert_array_equal(y, np.where(x > 0, x + 3, x - 3))


def test_an_edited_kernel_is_rewritten_again_not_served_stale(tmp_path, code_cache_root, monkeypatch):
    import numpy as np

    _shifted(_kernel_module(tmp_path, 3, "kern_v1"), 9)
    _fresh_process(monkeypatch, compiling=True)
    x, y = _shifted(_kernel_module(tmp_path, 5, "kern_v2"), 9)
    np.testing.assert_array_equal(y, np.where(x > 0, x + 5, x - 5))


def test_a_corrupt_rewrite_entry_is_rewritten_again(tmp_path, code_cache_root, monkeypatch):
    import numpy as np

    _shifted(_kernel_module(tmp_path, 4, "kern_c"), 5)
    for path in code_cache_root.rglob("*.bin"):
        path.write_bytes(path.read_bytes()[:-3] + b"\x00\x01\x02")
    _fresh_process(monkeypatch, compiling=True)
    x, y = _shifted(_kernel_module(tmp_path, 4, "kern_d"), 11)
    np.testing.assert_array_equal(y, np.where(x > 0, x + 4, x - 4))


_CHILD = r'''
import hashlib, json, sys
import jinja2
from kernforge import backends
from kernforge.codegen.renderer import Target
from kernforge.dsl import rewrite
counts = {"rewrites": 0, "templates": 0}
def counted(fn, what):
    def wrapper(*a, **k):
        counts[what] += 1
        return fn(*a, **k)
    return wrapper
rewrite._compile_rewritten = counted(rewrite._compile_rewritten, "rewrites")
jinja2.Environment.compile = counted(jinja2.Environment.compile, "templates")
import importlib.util
spec = importlib.util.spec_from_file_location("kern", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
source = backends.get("cpu").render(mod.factory(64).ir, Target("cpu")).source
print(json.dumps(dict(counts, source=hashlib.sha256(source.encode()).hexdigest())))
'''


def test_a_second_process_neither_rewrites_nor_compiles_templates(tmp_path):
    """The cold cost this cache removes is a fresh process's: two processes on one cache, the
    second renders the same source without parsing the kernel or compiling a template."""
    import json
    import os
    import subprocess
    import sys

    path = tmp_path / "kern.py"
    path.write_text(_CACHED_KERNEL.replace("OFFSET", "2"))
    env = dict(os.environ, KERNFORGE_CACHE_DIR=str(tmp_path / "cache"))
    runs = [json.loads(subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[0]["rewrites"] >= 1 and runs[0]["templates"] >= 1
    assert (runs[1]["rewrites"], runs[1]["templates"]) == (0, 0)
    assert runs[1]["source"] == runs[0]["source"]
