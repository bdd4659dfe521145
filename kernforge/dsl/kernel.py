"""``with T.Kernel(*grid, threads=N) as (bx, by):`` -- the launch grid of a kernel."""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.dsl import builder as B

_BLOCK_NAMES = ("bx", "by", "bz")


class Kernel:
    """``with T.Kernel(*grid, threads=N) as (bx, by, ...)``: opens the kernel body.

    ``grid`` is 1 to 3 integer extents (ints or expressions of ``T.symbolic`` sizes, e.g.
    ``T.ceildiv(N, BN)``); the kernel runs one block per grid point, ``bx`` indexing the
    first dimension.  ``threads`` (an int, or a tuple whose product is used) is the CUDA
    block size, at most 1024; the CPU and the interpreter run a block as one thread, so
    there it only matters for the kernels' lowering choices.  It yields one block index per
    grid dimension (a single index for a 1-D grid), as TileLang does; binding a number of
    names that differs from the number of grid dimensions is an error at the ``with`` line.

    A function may hold several ``with T.Kernel`` blocks one after the other (a split-K
    partial pass, then its combine): each becomes its own IR kernel over the same global
    parameters, launched in order (``T.jit`` and ``kernforge.tilelang.compile`` run them).
    Blocks do not nest."""

    def __init__(self, *grid, threads: int = 128):
        if not 1 <= len(grid) <= 3:
            raise B.error(f"T.Kernel takes 1 to 3 grid dimensions, got {len(grid)}")
        # (x, y, z) thread blocks: the block is ``x * y * z`` threads; thread-level code reads
        # its indices from the linear thread id as CUDA numbers them (x fastest, compat.py)
        self.thread_dims = (threads,)
        if isinstance(threads, (tuple, list)):
            if not 1 <= len(threads) <= 3 or any(int(t) < 1 for t in threads):
                raise B.error(f"T.Kernel threads must be 1 to 3 positive extents, got {threads!r}")
            self.thread_dims = tuple(int(t) for t in threads)
            n = 1
            for t in self.thread_dims:
                n *= t
            threads = n
        if not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise B.error(f"T.Kernel threads must be an int in [1, 1024], got {threads!r}")
        self.grid = tuple(ir.as_expr(g) for g in grid)
        for g in self.grid:
            if not g.dtype.is_int:
                raise B.error(f"grid dimension {g} is not an integer")
        self.threads = threads
        self.loc = B.user_loc(2)
        self._frame = None
        self._names = None  # (names, unpacked) the author binds, from the tracer's rewrite

    def _check_names(self) -> None:
        names, unpacked = self._names
        n = len(self.grid)
        if (len(names) if unpacked else 1) == n:
            return
        target = f"({', '.join(names)})" if unpacked else names[0]
        want = _BLOCK_NAMES[0] if n == 1 else f"({', '.join(_BLOCK_NAMES[:n])})"
        grid = ", ".join(map(str, self.grid))
        raise B.error(f"T.Kernel({grid}) has {n} grid dimension{'s' * (n != 1)} but `as {target}` "
                      f"binds {len(names) if unpacked else 1} name{'s' * (unpacked and len(names) != 1)}: "
                      f"bind one per dimension, e.g. `as {want}`", self.loc)

    def __enter__(self):
        b = B.current()
        if b.inside("kernel"):
            raise B.error("nested `with T.Kernel(...)`: kernel blocks follow one another (each "
                          "is one launch), they do not nest", self.loc)
        if self._names is not None:
            self._check_names()
        self.vars = tuple(b.new_var(n) for n in _BLOCK_NAMES[: len(self.grid)])
        b.kernel = {"grid": self.grid, "threads": self.threads, "thread_dims": self.thread_dims, "vars": self.vars,
                    "loc": self.loc}
        self._cm = b.frame("kernel")
        self._frame = self._cm.__enter__()
        if self._names is not None and self._names[1]:
            return self.vars  # `as (bx,)` unpacks a tuple, even for a 1-D grid
        return self.vars[0] if len(self.vars) == 1 else self.vars

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            return False
        b = B.current()
        if b.thread_region is not None:  # thread-level code ends with the block
            from kernforge.dsl.compat import close_thread_region

            close_thread_region(b)
        self._cm.__exit__(None, None, None)
        b.kernel["body"] = ir.seq(self._frame.stmts, self.loc)
        b.blocks.append(b.kernel)
        return False


def persistent(l2_group: int = 16, live_rows=None, block_rows: int = 0) -> None:
    """``T.persistent(l2_group=16, live_rows=masked_m, block_rows=BM)`` inside a ``T.Kernel`` block:
    a scheduling request that changes no result.  The CUDA backend then launches at most one CTA
    per SM, each looping over the grid's blocks (DeepGEMM's persistent scheduler) in an
    L2-grouped order: runs of ``l2_group`` consecutive ``by`` blocks per ``bx`` (CTAs that run at
    the same time share the ``bx`` operand tile in L2).  ``live_rows`` (a 1-D int32 parameter
    indexed by ``bz``) with ``block_rows`` promises that a block with ``by * block_rows >=
    live_rows[bz]`` does nothing, so the scheduler walks only each ``bz``'s first
    ``ceil(live_rows[bz] / block_rows)`` row blocks (the masked grouped GEMM's experts).

    Recorded in the kernel's ``attrs["persistent_schedule"]`` (so in its artifact name and cache key);
    the interpreter and the host backends run every block as before, which is the same result
    because the promise holds; ``kernforge.backends.cuda.persistent`` renders it."""
    b = B.current()
    loc = B.user_loc(2)
    if b.kernel is None or b.top.kind != "kernel":
        raise B.error("T.persistent must be called directly inside a `with T.Kernel(...)` block", loc)
    if isinstance(l2_group, bool) or not isinstance(l2_group, int) or l2_group < 1:
        raise B.error(f"T.persistent l2_group must be a positive int, got {l2_group!r}", loc)
    spec = f"l2_group={l2_group}"
    if live_rows is not None:
        buf = getattr(live_rows, "buffer", None)
        if (buf is None or buf.scope != ir.Scope.GLOBAL or len(buf.shape) != 1 or buf.dtype.name != "int32"
                or len(b.kernel["grid"]) != 3):
            raise B.error("T.persistent live_rows must be a 1-D int32 kernel parameter indexed by bz "
                          f"of a 3-D grid, got {live_rows!r}", loc)
        rows, nz = buf.shape[0], b.kernel["grid"][2]
        if isinstance(rows, ir.Const) and isinstance(nz, ir.Const) and rows.value < nz.value:
            raise B.error(f"T.persistent live_rows has {rows.value} entries for a grid of {nz.value} along bz", loc)
        if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
            raise B.error(f"T.persistent block_rows must be a positive int with live_rows, got {block_rows!r}", loc)
        spec += f",live={buf.name}/{block_rows}"
    b.kernel["persistent"] = spec


def name_with(obj, names: tuple, unpacked: bool):
    """Called by the tracer's source rewrite on ``with obj as <names>``: tells a
    :class:`Kernel` what the author binds (other context managers pass through)."""
    if isinstance(obj, Kernel):
        obj._names = (names, unpacked)
    return obj
