"""``with T.Kernel(*grid, threads=N) as (bx, by):`` -- the launch grid of a kernel."""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.dsl import builder as B

_BLOCK_NAMES = ("bx", "by", "bz")


class Kernel:
    """Opens the kernel body.  Yields one block index per grid dimension (a single
    var for a 1-D grid), as TileLang does."""

    def __init__(self, *grid, threads: int = 128):
        if not 1 <= len(grid) <= 3:
            raise B.error(f"T.Kernel takes 1 to 3 grid dimensions, got {len(grid)}")
        if isinstance(threads, (tuple, list)):
            n = 1
            for t in threads:
                n *= int(t)
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

    def __enter__(self):
        b = B.current()
        if b.kernel is not None:
            raise B.error("a prim_func has exactly one `with T.Kernel(...)` block", self.loc)
        self.vars = tuple(b.new_var(n) for n in _BLOCK_NAMES[: len(self.grid)])
        b.kernel = {"grid": self.grid, "threads": self.threads, "vars": self.vars, "loc": self.loc}
        self._cm = b.frame("kernel")
        self._frame = self._cm.__enter__()
        return self.vars[0] if len(self.vars) == 1 else self.vars

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            return False
        b = B.current()
        self._cm.__exit__(None, None, None)
        b.kernel["body"] = ir.seq(self._frame.stmts, self.loc)
        return False
