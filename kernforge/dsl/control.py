"""Runtime branches.  The tracer rewrites ``if c: ... else: ...`` whose condition is
symbolic into ``with then_(c): ... / with else_(): ...``; static conditions stay
plain Python and unroll at trace time."""
from __future__ import annotations

from contextlib import contextmanager

from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl.handles import unwrap_expr


def is_static(cond) -> bool:
    if isinstance(cond, ir.Const):
        return True
    return not (isinstance(cond, ir.Expr) or hasattr(cond, "__kf_expr__"))


def truth(cond) -> bool:
    return bool(cond.value) if isinstance(cond, ir.Const) else bool(cond)


def bool_and(*thunks):
    """``a and b and ...`` in a rewritten ``if`` test (each operand a thunk): static operands
    keep Python's meaning (a false one ends it), symbolic ones are combined with ``&``."""
    return _combine(thunks, stop_when=False, join=lambda a, b: a & b)


def bool_or(*thunks):
    """``a or b or ...``: as :func:`bool_and`, a static true operand ends it, ``|`` joins."""
    return _combine(thunks, stop_when=True, join=lambda a, b: a | b)


def _combine(thunks, stop_when: bool, join):
    acc = v = None
    for t in thunks:
        v = t()
        if is_static(v):
            if truth(v) == stop_when:
                return v
            continue
        acc = v if acc is None else join(acc, v)
    return v if acc is None else acc


def bool_not(cond):
    """``not c`` in a rewritten ``if`` test: Python's ``not`` when static, else ``~c``."""
    return (not truth(cond)) if is_static(cond) else ~cond


def branches(cond, has_else: bool):
    """The rewritten ``if``'s driver: ``for taken in branches(c, has_else): if taken: ...
    else: ...``.  Static: one pass with the condition's truth.  Symbolic: the then-body
    traced inside an ``If`` node, then the else-body (when there is one) in its orelse."""
    if is_static(cond):
        yield truth(cond)
        return
    b = B.current()
    with then_(cond) as f:
        yield True
    subset = b.subset if b.subset is not None and b.subset["frame"] is f else None
    if has_else and f.hoisted:  # the then-side was distributed over barriers (thread_branches)
        with then_(~f.cond):
            yield False
    elif has_else:
        with (_subset_else(b) if subset else else_()):
            yield False
    if subset:  # thread-level code goes on after a thread-subset branch of tile code
        from kernforge.dsl.compat import end_subset

        end_subset(b)


@contextmanager
def then_(cond):
    b = B.current()
    loc = B.user_loc(3)
    c = unwrap_expr(cond)
    if not c.dtype.is_bool:
        c = c != ir.as_expr(0, c.dtype)
    with b.frame("branch") as f:
        f.cond = c
        yield f
        if f.hoisted:  # a partial barrier inside: the branch's last map closes into it ...
            _compat().leave_hoisted_loop(b)
    if f.hoisted:  # ... and the branch is distributed over its maps (kernforge.dsl.thread_branches)
        _compat().distributed_branch(b, f, loc)
        return
    if b.subset is not None and b.subset["frame"] is f:  # tile code of a subset of the threads
        if b.subset["then"] and f.stmts:
            b.emit(ir.seq(f.stmts, loc))
        return
    b.emit(ir.If(c, ir.seq(f.stmts, loc), None, loc))


@contextmanager
def _subset_else(b):
    """The else-branch of a thread-subset branch of tile code: tile code too, run when some
    thread fails the condition (kernforge.dsl.compat.subset_tile_code)."""
    loc = B.user_loc(3)
    with b.frame("branch") as f:
        yield
    if b.subset["else"] and f.stmts:
        b.emit(ir.seq(f.stmts, loc))


@contextmanager
def else_():
    b = B.current()
    last = b.top.stmts[-1] if b.top.stmts else None
    if not isinstance(last, ir.If) or last.orelse is not None:
        raise B.error("internal: else branch without its if")
    with b.frame("branch") as f:
        yield
    b.top.stmts[-1] = ir.If(last.cond, last.then, ir.seq(f.stmts, last.loc), last.loc)


def _compat():
    from kernforge.dsl import compat  # thread-level lowering; it imports the DSL's modules itself

    return compat


def runtime_jump(kind: str, loop_key=None) -> None:
    """A ``break`` or skipping ``continue`` under a runtime condition (see
    kernforge.dsl.rewrite._runtime_jumps).  A ``break`` of a ``T.serial`` loop in thread-level
    code is lowered (:mod:`kernforge.dsl.thread_breaks`); the rest raise."""
    if kind == "break" and loop_key is not None:
        from kernforge.dsl import thread_breaks

        if thread_breaks.lower_break(B.current(), loop_key, B.user_loc(2)):
            return
    raise _compat().UnsupportedError(f"`{kind}` under a runtime `if` is not supported: the condition is only "
                           f"known when the kernel runs, so the traced loop (or iteration) cannot end "
                           f"here; guard the rest of the loop body with the negated condition instead",
                           B.user_loc(2))
