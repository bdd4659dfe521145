"""The tracer's source rewrite: each `if` body is written once, `break`/`continue` keep their
meaning, and a function is parsed and compiled once however many times it is specialised."""
from __future__ import annotations

import ast

import numpy as np
import pytest

import kernforge
import kernforge.dsl as T
from kernforge.dsl import rewrite


def _branchy(depth: int, stop_at: int):
    N = T.symbolic("N")

    @T.prim_func
    def branchy(X: T.Tensor((N,), "int32"), Y: T.Tensor((N,), "int32")):
        with T.Kernel(1, threads=1) as bx:
            for i in T.serial(N):
                v = T.alloc_var("int32")
                v = 0
                for level in range(depth):          # a Python loop: unrolled while tracing
                    if level == stop_at:           # a static if that breaks the Python loop
                        break
                    if X[i] > level:               # a symbolic if, nested `depth` deep below
                        v = v + (1 << level)
                    else:
                        if level % 2 == 0:         # static, inside the symbolic else
                            v = v - 1
                        else:
                            continue
                Y[i] = v
    return branchy


@pytest.mark.parametrize("depth,stop_at", [(1, 9), (4, 9), (6, 3)])
def test_nested_static_and_symbolic_ifs_trace_like_python(depth, stop_at):
    x = np.random.default_rng(depth).integers(-2, 8, size=37).astype(np.int32)
    y = np.full_like(x, -999)
    kernforge.compile(_branchy(depth, stop_at), backend="interp")(x, y)
    want = []
    for xi in x:
        v = 0
        for level in range(depth):
            if level == stop_at:
                break
            if xi > level:
                v += 1 << level
            elif level % 2 == 0:
                v -= 1
        want.append(v)
    np.testing.assert_array_equal(y, np.array(want, np.int32))


def test_each_if_body_is_compiled_once_not_once_per_dispatch():
    """Eight nested ifs: a rewrite that duplicates bodies would hold 2**8 copies of the
    innermost statement."""
    src = "def f(x):\n" + "".join("    " * (d + 1) + f"if x > {d}:\n" for d in range(8)) + "    " * 9 + "y = 1\n"
    tree = rewrite._Rewriter().visit(ast.parse(src).body[0])
    assert sum(isinstance(n, ast.Assign) and n.targets[0].id == "y" for n in ast.walk(tree)) == 1


def test_a_function_is_parsed_once_however_often_it_is_specialised(monkeypatch):
    parsed = []
    real_parse = ast.parse
    monkeypatch.setattr(rewrite.ast, "parse", lambda *a, **k: (parsed.append(1), real_parse(*a, **k))[1])
    for depth in (2, 3, 4):
        _branchy(depth, 9)
    assert len(parsed) <= 1  # zero when an earlier test already compiled this body



def test_a_runtime_if_and_its_body_record_the_authors_lines():
    """The branch is entered through contextlib's frames; the location is still the author's."""
    import inspect

    from kernforge.codegen import ir

    @T.prim_func
    def k(X: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=1) as bx:
            if X[0] > 0:
                X[1] = 1.0
    first = inspect.getsourcelines(test_a_runtime_if_and_its_body_record_the_authors_lines)[1]
    lines = inspect.getsource(test_a_runtime_if_and_its_body_record_the_authors_lines).splitlines()
    at = {text.strip(): first + i for i, text in enumerate(lines)}
    branch, = [n for n in ir.walk(k.ir.body) if isinstance(n, ir.If)]
    store, = [n for n in ir.walk(k.ir.body) if isinstance(n, ir.Store)]
    assert (branch.loc.file, branch.loc.line) == (__file__, at["if X[0] > 0:"])
    assert store.loc.line == at["X[1] = 1.0"]


def _shapes():
    """Function shapes that could fool a cut of the source by indentation (see
    ``rewrite._parse_function``), defined inside a factory like kernels are."""
    def deco(f):
        return f

    @deco
    @deco
    def black_signature(
        a,
        b=1,
    ):
        """A signature closed at the def's own indentation."""
        x = a
    # a comment at the def's indentation inside the body: the body goes on below it
        y = b
        return x + y

    def string_at_column_0(a):
        s = """
    not the end of the function
    """
        if a:
            return s
        return a  # trailing comment

    def one_line(a): return a

    def last(a):
        for i in range(a):
            if i:
                continue
        # an indented comment, then a blank line, then the factory's own code

    return [black_signature, string_at_column_0, one_line, last]


@pytest.mark.parametrize("fn", _shapes(), ids=lambda f: f.__name__)
def test_the_rewrite_parses_each_function_as_inspect_reads_it(fn):
    """The rewrite cuts a function's lines from its file instead of running ``inspect``'s
    tokenizer; the tree it parses (line and column numbers included) must be the one
    ``inspect.getsource`` gives, shifted to the function's first line."""
    import inspect
    import textwrap

    want = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    ast.increment_lineno(want, fn.__code__.co_firstlineno - 1)
    got = rewrite._parse_function(fn, inspect.getsourcefile(fn))
    assert ast.dump(got, include_attributes=True) == ast.dump(want, include_attributes=True)


@pytest.mark.parametrize("jump,loop", [("break", "T.serial(8)"), ("continue", "T.serial(8)"),
                                       ("continue", "range(8)")])
def test_a_jump_under_a_runtime_if_is_a_typed_error_at_its_line(tmp_path, jump, loop):
    """A runtime condition cannot end a traced loop or skip the rest of an iteration: the error
    names the jump at the author's line.  Python's own jump used to leave the loop's trace half
    built (``break``) or silently drop the statements after it from the trace (``continue``)."""
    import linecache

    from kernforge.dsl.compat import UnsupportedError

    src = ("def k(X: T.Tensor((8,), 'int32')):\n"
           "    with T.Kernel(1, threads=1):\n"
           f"        for i in {loop}:\n"
           "            if X[i] > 0:\n"
           f"                {jump}\n"
           "            X[i] = 1\n")
    path = tmp_path / "kf_runtime_jump.py"
    path.write_text(src)
    linecache.checkcache(str(path))
    scope = {"T": T}
    exec(compile(src, str(path), "exec"), scope)
    with pytest.raises(UnsupportedError, match=rf"kf_runtime_jump.py:5: `{jump}` under a runtime `if`"):
        T.prim_func(scope["k"])


def test_a_continue_that_skips_nothing_stays_legal():
    """``continue`` as the last thing an iteration runs (under a runtime ``if`` at the end of an
    unrolled loop's body) drops nothing from the trace."""
    @T.prim_func
    def k(X: T.Tensor((8,), "int32")):
        with T.Kernel(1, threads=1):
            for i in T.serial(8):
                for level in range(3):
                    X[i] = X[i] + 1
                    if X[i] > 2:
                        continue
    x = np.arange(-3, 5, dtype=np.int32)
    kernforge.compile(k, backend="interp")(x)
    np.testing.assert_array_equal(x, np.arange(-3, 5, dtype=np.int32) + 3)


def test_a_static_break_inside_a_runtime_if_still_breaks_its_python_loop():
    @T.prim_func
    def k(X: T.Tensor((8,), "int32")):
        with T.Kernel(1, threads=1):
            for i in T.serial(8):
                if X[i] > 0:
                    for level in range(5):      # unrolled while tracing
                        if level == 2:          # static: ends the Python loop
                            break
                        X[i] = X[i] + 10
    x = np.arange(-3, 5, dtype=np.int32)
    want = np.where(x > 0, x + 20, x)
    kernforge.compile(k, backend="interp")(x)
    np.testing.assert_array_equal(x, want)
