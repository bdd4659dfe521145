"""Source rewrite that lets a traced kernel use Python's own syntax.

Tracing runs the kernel function once.  Three constructs need help, and we get
it by rewriting the function's AST (keeping its file name and line numbers, so
errors still point at the author's lines):

* ``if cond:`` -- when ``cond`` is symbolic, both branches are traced into an
  ``If`` node; when it is a Python value, the branch is chosen at trace time.  ``and``,
  ``or`` and ``not`` in the condition work on symbolic operands too (``&``, ``|``, ``~``,
  keeping Python's short-circuit for static ones).
* ``x = value`` where ``x`` holds a ``T.alloc_var`` -- a store, not a rebinding;
  and ``x = T.alloc_*(...)`` names the buffer ``x``.
* ``for i, j in T.Parallel(...)`` -- loop variables take the author's names.
* ``with T.Kernel(...) as <names>`` -- the kernel learns the names it is bound to, so a
  grid whose dimension count does not match them is reported at that line (instead of a
  tuple of block indices surfacing later as a confusing "got tuple" error).
"""
from __future__ import annotations

import ast
import copy
import functools
import inspect
import linecache
import textwrap


class _Rewriter(ast.NodeTransformer):
    def __init__(self, eager: bool = False):
        self.n = 0
        self.eager = eager

    def visit(self, node):
        # an expression holds no statement to rewrite (a lambda's body is an expression too):
        # not descending into them keeps the rewrite's cost to the statements, a fraction of the tree
        if isinstance(node, ast.expr):
            return node
        return super().visit(node)

    def visit_FunctionDef(self, node):
        if getattr(self, "_seen_top", False):
            return node  # nested helper functions are left alone
        self._seen_top = True
        node.decorator_list = []
        self.generic_visit(node)
        return node

    def visit_If(self, node):
        """``if c: A else: B`` becomes ``for taken in __kf_branches(c, has_else): if taken: A
        else: B``: a static condition yields once (its truth), a symbolic one yields True
        inside the ``If`` node's then-branch and False inside its else-branch.  Each body is
        written once, so nested ifs do not double the code at every level.  A body that
        ``break``s or ``continue``s the author's loop would act on the synthetic loop
        instead; such an ``if`` keeps the two-dispatch form below."""
        self.generic_visit(node)
        node.test = _logic(node.test)
        self.n += 1
        if not _jumps_out(node.body + node.orelse):
            taken = f"__kf_taken{self.n}"
            branch = ast.If(ast.Name(taken, ast.Load()), node.body, node.orelse)
            loop = ast.For(ast.Name(taken, ast.Store()),
                           _call("__kf_branches", node.test, ast.Constant(bool(node.orelse))), [branch], [])
            return _located(loop, node)
        tmp = f"__kf_cond{self.n}"
        cond_name = ast.Name(tmp, ast.Load())
        assign = ast.Assign([ast.Name(tmp, ast.Store())], node.test)
        static_if = ast.If(_call("__kf_truth", cond_name), node.body, node.orelse or [])
        # both dispatches share the body's nodes: the compiler only reads the tree, and the
        # line numbers were shifted before the rewrite
        runtime = [ast.With([ast.withitem(_call("__kf_then", cond_name))], _runtime_jumps(node.body))]
        if node.orelse:
            runtime.append(ast.With([ast.withitem(_call("__kf_else"))], _runtime_jumps(node.orelse)))
        dispatch = ast.If(_call("__kf_is_static", cond_name), [static_if], runtime)
        return [_located(assign, node), _located(dispatch, node)]

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            old = _call("__kf_lookup", _call("locals"), ast.Constant(name))
            node.value = _located(_call("__kf_assign", old, node.value, ast.Constant(name)), node)
        return node

    def visit_AnnAssign(self, node):
        """``@T.jit`` only: a bare ``A: T.Tensor((M, K), dtype)`` in the body declares the
        parameter ``A``.  Python never evaluates a local's annotation, so it becomes
        ``A = __kf_annotate(<A's value>, "A", <annotation>)``."""
        self.generic_visit(node)
        if not self.eager or node.value is not None or not isinstance(node.target, ast.Name):
            return node
        name = node.target.id
        old = _call("__kf_lookup", _call("locals"), ast.Constant(name))
        out = ast.Assign([ast.Name(name, ast.Store())],
                         _call("__kf_annotate", old, ast.Constant(name), node.annotation))
        return _located(out, node)

    def visit_For(self, node):
        _mark_trailing(node.body, True)  # before the ifs inside are rewritten (see _Jumps)
        breaks = _own_breaks(node.body)
        if breaks:  # a runtime break finds its loop by this key (kernforge.dsl.thread_breaks)
            self.n += 1
            for brk in breaks:
                brk._kf_loop = self.n
        self.generic_visit(node)
        names = _target_names(node.target)
        if names is not None:
            node.iter = _located(_call("__kf_name_loop", node.iter,
                                       ast.Tuple([ast.Constant(n) for n in names], ast.Load())), node)
        if breaks:
            node.iter = _located(_call("__kf_loop_id", node.iter, ast.Constant(breaks[0]._kf_loop)), node)
        return node

    def visit_With(self, node):
        self.generic_visit(node)
        for item in node.items:
            names = _target_names(item.optional_vars) if item.optional_vars is not None else None
            if names is not None:
                unpacked = isinstance(item.optional_vars, ast.Tuple)
                item.context_expr = _located(_call("__kf_name_with", item.context_expr,
                                                   ast.Tuple([ast.Constant(n) for n in names], ast.Load()),
                                                   ast.Constant(unpacked)), node)
        return node


# the fields through which a statement holds statements (an ``except``'s and a ``case``'s
# bodies included): ``break`` and ``continue`` are statements, so no expression can hold one
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


class _Jumps(ast.NodeTransformer):
    """``break`` of an enclosing loop -> ``__kf_jump("break")``, which raises; so does a
    ``continue``, unless nothing of its loop's body follows it (:func:`_mark_trailing`): there
    it skips nothing, and kernels use it so at the end of unrolled ``range`` loops."""

    def visit_Break(self, node):
        key = getattr(node, "_kf_loop", None)  # the loop it ends, when that is a `for` (visit_For)
        return _located(ast.Expr(_call("__kf_jump", ast.Constant("break"), ast.Constant(key))), node)

    def visit_Continue(self, node):
        if getattr(node, "_kf_trailing", False):
            return node
        return _located(ast.Expr(_call("__kf_jump", ast.Constant("continue"))), node)

    def _own(self, node):  # a loop's own body binds its break/continue; nested functions are apart
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            node.orelse = [self.visit(n) for n in node.orelse]
        return node

    visit_For = visit_AsyncFor = visit_While = _own

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef


def _own_breaks(stmts) -> list:
    """The ``break`` statements of the loop whose body is ``stmts`` (not of loops nested in it)."""
    out, stack = [], list(stmts)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Break):
            out.append(n)
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(n.orelse)  # a loop's own body binds its break
        elif not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for f in _BODIES:
                stack.extend(getattr(n, f, ()))
    return out


def _mark_trailing(stmts, trailing: bool) -> None:
    """Mark each ``continue`` of the loop whose body is ``stmts`` with whether it is the last
    thing its iteration runs (only enclosing ``if``/``with`` bodies that end their lists lie
    between it and the end of the body)."""
    for k, st in enumerate(stmts):
        last = trailing and k == len(stmts) - 1
        if isinstance(st, ast.Continue):
            st._kf_trailing = last
        elif isinstance(st, ast.If):
            _mark_trailing(st.body, last)
            _mark_trailing(st.orelse, last)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            _mark_trailing(st.body, last)


def _runtime_jumps(stmts) -> list:
    """The runtime dispatch of an ``if`` whose body jumps out of a loop gets its own copy of the
    body, with each such ``break`` (and each ``continue`` that would skip statements) a call that
    raises a typed error at its line: a runtime condition cannot end a traced loop or iteration
    (Python would leave the loop's trace half built, or silently drop the statements a
    ``continue`` skips).  The static dispatch keeps the real jumps."""
    if not _jumps_out(stmts):
        return stmts
    return [_Jumps().visit(copy.deepcopy(n)) for n in stmts]


def _jumps_out(stmts) -> bool:
    """Whether ``stmts`` hold a ``break``/``continue`` of an enclosing loop (not of their own).
    Only statement lists are searched: every ``if`` asks this of its bodies, and walking their
    expressions as well made the rewrite of a deeply nested kernel slow."""
    stack = list(stmts)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Break, ast.Continue)):
            return True
        if isinstance(n, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(n.orelse)  # a loop's own body binds its break/continue
            continue
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for f in _BODIES:
            stack.extend(getattr(n, f, ()))
    return False


def _located(new, like):
    """``new``, with every node the rewrite created in it (those without a location yet) at
    ``like``'s location: what ``ast.fix_missing_locations`` would give them, since ``like`` is
    the statement they replace, without walking the author's nodes below them."""
    stack = [new]
    while stack:
        n = stack.pop()
        if "lineno" in n._attributes:
            if hasattr(n, "lineno"):
                continue  # the author's node: it and all below it were parsed with locations
            ast.copy_location(n, like)
        stack.extend(ast.iter_child_nodes(n))
    return new


def _logic(e):
    """An ``if`` test with its ``and``/``or``/``not`` made symbolic-safe: ``a and b`` becomes
    ``__kf_and(lambda: a, lambda: b)`` (operands stay lazy, so a static operand still
    short-circuits), ``not a`` becomes ``__kf_not(a)``."""
    if isinstance(e, ast.BoolOp):
        fn = "__kf_and" if isinstance(e.op, ast.And) else "__kf_or"
        thunks = [ast.Lambda(ast.arguments([], [], None, [], [], None, []), _logic(v)) for v in e.values]
        return _located(_call(fn, *thunks), e)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        return _located(_call("__kf_not", _logic(e.operand)), e)
    return e


def _call(fn, *args):
    return ast.Call(ast.Name(fn, ast.Load()), list(args), [])


def _target_names(t):
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts):
        return [e.id for e in t.elts]
    return None


# rewritten code by the original function's code object: the rewrite is purely syntactic, so a
# factory specialised many times (every tunable configuration) parses and compiles its kernel once
_CODE: dict = {}


def rewrite(fn, helpers: dict, eager: bool = False):
    """Return ``fn`` recompiled with the rewrites above, or ``None`` when its source is
    not available (the caller then traces it unchanged: runtime ``if`` raises clearly).
    ``eager`` adds ``@T.jit``'s in-body parameter annotations."""
    key = (fn.__code__, eager)
    if key not in _CODE:
        _CODE[key] = _cached_compile(fn, eager)
    code = _CODE[key]
    if code is None:
        return None
    namespace = dict(fn.__globals__)
    namespace.update(helpers)
    exec(code, namespace)
    cells = [c.cell_contents for c in (fn.__closure__ or ())]
    new = namespace["__kf_factory"](*cells)
    new.__defaults__ = fn.__defaults__
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _cached_compile(fn, eager: bool = False):
    """:func:`_compile_rewritten`, through the disk cache (:mod:`kernforge.runtime.code_cache`):
    parsing, rewriting and compiling a long kernel function is most of a fresh process's first
    trace.  The key holds the whole text of ``fn``'s file (a function's code is a function of it,
    whichever way :func:`_parse_function` cuts it), where ``fn`` starts, and this module's own
    text, so editing either the kernel or the rewrite is a new entry."""
    from kernforge.runtime import code_cache

    try:
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    except (OSError, TypeError):
        return None
    linecache.checkcache(filename)
    lines = linecache.getlines(filename, fn.__globals__)
    own = _own_text()
    if not lines or own is None:
        return _compile_rewritten(fn, eager)
    key = code_cache.key("rewrite", own, filename, fn.__code__.co_firstlineno, fn.__code__.co_name,
                         eager, ",".join(fn.__code__.co_freevars), "".join(lines))
    code = code_cache.load_code("rewrite", key)
    if code is None:
        code = _compile_rewritten(fn, eager)
        if code is not None:
            code_cache.store_code("rewrite", key, code)
    return code


@functools.lru_cache(maxsize=None)
def _own_text():
    """This module's source, which what it produces changes with (None where it cannot be read:
    an install without sources, then nothing is cached)."""
    try:
        with open(__file__, "rb") as f:
            return f.read()
    except OSError:
        return None


def _compile_rewritten(fn, eager: bool = False):
    """The code of a module defining ``__kf_factory(*closure)``, which returns ``fn`` rewritten."""
    try:
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    except (OSError, TypeError):
        return None
    fdef = _parse_function(fn, filename)
    if fdef is None:
        return None
    fdef = _Rewriter(eager).visit(fdef)
    freevars = fn.__code__.co_freevars
    # wrap in a factory taking the closure's variables, so closures keep working
    factory = ast.FunctionDef(
        name="__kf_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(v) for v in freevars], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[fdef, ast.Return(ast.Name(fdef.name, ast.Load()))], decorator_list=[], returns=None)
    if "type_params" in ast.FunctionDef._fields:  # Python >= 3.12
        factory.type_params = []
    module = ast.Module([_located(factory, fdef)], type_ignores=[])
    return compile(module, filename, "exec")


def _parse_function(fn, filename: str):
    """``fn``'s ``def`` as an AST at its lines in ``filename`` (``None`` without source).

    The source is cut from the file's lines where the body's indentation ends (the body's
    first line is the code's first line after the ``def``), which is what
    ``inspect.getsource`` finds by running Python's tokenizer over the function -- the
    slowest step of tracing a long kernel.  A cut that is not the end of the ``def`` leaves
    an unclosed bracket, string or block, so it fails to parse; that case, and any other the
    cut cannot judge, falls back to ``inspect.getsource``.  The parse is padded to the
    function's first line, so its nodes carry the author's line numbers."""
    first = fn.__code__.co_firstlineno
    src = _cut_source(fn, filename, first)
    if src is not None:
        try:
            fdef = ast.parse("\n" * (first - 1) + src).body[0]
        except SyntaxError:
            fdef = None
        if isinstance(fdef, ast.FunctionDef):
            return fdef
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    fdef = ast.parse("\n" * (first - 1) + src).body[0]
    return fdef if isinstance(fdef, ast.FunctionDef) else None


def _cut_source(fn, filename: str, first: int):
    """The dedented lines of ``fn``'s decorators and ``def`` (see :func:`_parse_function`), or
    ``None`` where they cannot be cut from the file by indentation."""
    linecache.checkcache(filename)  # as inspect does: an edited file is read again
    lines = linecache.getlines(filename, fn.__globals__)
    body = [line for _, _, line in fn.__code__.co_lines() if line is not None and line > first]
    if not lines or not body or first > len(lines):
        return None
    head = lines[first - 1]
    indent = len(head) - len(head.lstrip())
    end = len(lines)
    for i in range(min(body) - 1, len(lines)):
        text = lines[i]
        stripped = text.lstrip()
        if stripped and not stripped.startswith("#") and len(text) - len(stripped) <= indent:
            end = i
            break
    return textwrap.dedent("".join(lines[first - 1:end]))
