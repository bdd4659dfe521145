"""Source rewrite that lets a traced kernel use Python's own syntax.

Tracing runs the kernel function once.  Three constructs need help, and we get
it by rewriting the function's AST (keeping its file name and line numbers, so
errors still point at the author's lines):

* ``if cond:`` -- when ``cond`` is symbolic, both branches are traced into an
  ``If`` node; when it is a Python value, the branch is chosen at trace time.
* ``x = value`` where ``x`` holds a ``T.alloc_var`` -- a store, not a rebinding;
  and ``x = T.alloc_*(...)`` names the buffer ``x``.
* ``for i, j in T.Parallel(...)`` -- loop variables take the author's names.
* ``with T.Kernel(...) as <names>`` -- the kernel learns the names it is bound to, so a
  grid whose dimension count does not match them is reported at that line (instead of a
  tuple of block indices surfacing later as a confusing "got tuple" error).
"""
from __future__ import annotations

import ast
import inspect
import textwrap


class _Rewriter(ast.NodeTransformer):
    def __init__(self, eager: bool = False):
        self.n = 0
        self.eager = eager

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
        self.n += 1
        if not _jumps_out(node.body + node.orelse):
            taken = f"__kf_taken{self.n}"
            branch = ast.If(ast.Name(taken, ast.Load()), node.body, node.orelse)
            loop = ast.For(ast.Name(taken, ast.Store()),
                           _call("__kf_branches", node.test, ast.Constant(bool(node.orelse))), [branch], [])
            for s in (branch, loop):
                ast.copy_location(s, node)
            return loop
        tmp = f"__kf_cond{self.n}"
        cond_name = ast.Name(tmp, ast.Load())
        assign = ast.Assign([ast.Name(tmp, ast.Store())], node.test)
        static_if = ast.If(_call("__kf_truth", cond_name), node.body, node.orelse or [])
        # both dispatches share the body's nodes: the compiler only reads the tree, and the
        # line numbers were shifted before the rewrite
        runtime = [ast.With([ast.withitem(_call("__kf_then", cond_name))], node.body)]
        if node.orelse:
            runtime.append(ast.With([ast.withitem(_call("__kf_else"))], node.orelse))
        dispatch = ast.If(_call("__kf_is_static", cond_name), [static_if], runtime)
        out = [assign, dispatch]
        for s in out:
            ast.copy_location(s, node)
        return out

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            old = _call("__kf_lookup", _call("locals"), ast.Constant(name))
            node.value = _call("__kf_assign", old, node.value, ast.Constant(name))
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
        return ast.copy_location(out, node)

    def visit_For(self, node):
        self.generic_visit(node)
        names = _target_names(node.target)
        if names is not None:
            node.iter = _call("__kf_name_loop", node.iter,
                              ast.Tuple([ast.Constant(n) for n in names], ast.Load()))
        return node

    def visit_With(self, node):
        self.generic_visit(node)
        for item in node.items:
            names = _target_names(item.optional_vars) if item.optional_vars is not None else None
            if names is not None:
                unpacked = isinstance(item.optional_vars, ast.Tuple)
                item.context_expr = _call("__kf_name_with", item.context_expr,
                                          ast.Tuple([ast.Constant(n) for n in names], ast.Load()),
                                          ast.Constant(unpacked))
        return node


def _jumps_out(stmts) -> bool:
    """Whether ``stmts`` hold a ``break``/``continue`` of an enclosing loop (not of their own)."""
    stack = list(stmts)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Break, ast.Continue)):
            return True
        if isinstance(n, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(n.orelse)  # a loop's own body binds its break/continue
            continue
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return False


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
        _CODE[key] = _compile_rewritten(fn, eager)
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


def _compile_rewritten(fn, eager: bool = False):
    """The code of a module defining ``__kf_factory(*closure)``, which returns ``fn`` rewritten."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    except (OSError, TypeError):
        return None
    tree = ast.parse(src)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        return None
    ast.increment_lineno(fdef, fn.__code__.co_firstlineno - 1)
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
    module = ast.Module([factory], type_ignores=[])
    ast.copy_location(factory, fdef)
    ast.fix_missing_locations(module)
    return compile(module, filename, "exec")
