"""What the kernel author holds: tensors/tiles (indexable) and scalar variables.

Handles wrap IR buffers so that ``A[i, j]`` reads an element (an ``ir.Load``),
``A[i, j] = v`` records an ``ir.Store``, and ``A[r0:r1, :]`` names a tile
(an ``ir.Region``) for tile ops such as ``T.copy``.
"""
from __future__ import annotations

from kernforge.codegen import ir
from kernforge.dsl import builder as B
from kernforge.dsl import slices


def _is_scalar_index(x) -> bool:
    return isinstance(x, (int, ir.Expr)) or hasattr(x, "__kf_expr__")


class TensorHandle:
    """A buffer as the author sees it: ``.shape``, ``.dtype``, indexing and slicing."""

    __slots__ = ("buffer", "auto_named")

    def __init__(self, buffer: ir.Buffer, auto_named: bool = False):
        self.buffer = buffer
        self.auto_named = auto_named  # an allocation not yet named after its Python variable

    @property
    def shape(self) -> tuple:
        return tuple(int(s.value) if isinstance(s, ir.Const) else s for s in self.buffer.shape)

    @property
    def dtype(self):
        return self.buffer.dtype

    @property
    def scope(self) -> ir.Scope:
        return self.buffer.scope

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def ndim(self) -> int:
        return self.buffer.ndim

    def _indices(self, key) -> tuple:
        key = key if isinstance(key, tuple) else (key,)
        if len(key) > self.ndim:
            raise B.error(f"{self.name} has {self.ndim} dimensions, indexed with {len(key)}")
        return key

    def __getitem__(self, key):
        loc = B.user_loc(2)
        B.current().check_live(self.buffer, loc)
        key = self._indices(key)
        if len(key) == self.ndim and all(_is_scalar_index(k) for k in key):
            return ir.Load(self.buffer, tuple(ir.as_expr(k) for k in key))
        return self.region(key, loc)

    def __setitem__(self, key, value):
        loc = B.user_loc(2)
        b = B.current()
        b.check_live(self.buffer, loc)
        key = self._indices(key)
        if len(key) != self.ndim or not all(_is_scalar_index(k) for k in key):
            raise B.error(f"tile assignment to {self.name}[...]: use T.copy or T.fill for tiles, "
                          "or index every dimension inside T.Parallel", loc)
        if isinstance(value, TensorHandle) and not isinstance(value, VarHandle):
            raise B.error(f"cannot store tile {value.name} into one element of {self.name}", loc)
        if self.buffer.scope == ir.Scope.LOCAL and b.inside("parallel"):
            raise B.error(f"store to local {self.name} inside T.Parallel: every iteration would "
                          "write the same variable (a race); use a fragment indexed by the loop vars",
                          loc)
        idx = tuple(ir.as_expr(k) for k in key)
        b.emit(ir.Store(self.buffer, idx, ir.cast(value, self.buffer.dtype), loc))

    def region(self, key, loc=None) -> ir.Region:
        """The tile named by ``key``: scalar indices give extent 1, slices their length,
        missing trailing dimensions the whole dimension."""
        starts, extents = [], []
        for d in range(self.ndim):
            k = key[d] if d < len(key) else slice(None)
            dim = self.buffer.shape[d]
            if isinstance(k, slice):
                if k.step not in (None, 1):
                    raise B.error(f"strided slice of {self.name} is not supported", loc)
                start = ir.as_expr(0 if k.start is None else k.start)
                stop = dim if k.stop is None else ir.as_expr(k.stop)
                ext = slices.length(stop, start)
                if ext is None or ext <= 0:
                    raise B.error(f"slice {d} of {self.name} must have a positive compile-time "
                                  f"length, got {stop} - {start}", loc)
                starts.append(start)
                extents.append(ext)
            else:
                starts.append(ir.as_expr(k))
                extents.append(1)
        return ir.Region(self.buffer, tuple(starts), tuple(extents))

    def __repr__(self) -> str:
        return f"Tensor({self.buffer!r})"

    def __bool__(self):
        raise B.error(f"the tensor {self.name} has no truth value")


class VarHandle(TensorHandle):
    """``T.alloc_var``: a block-uniform scalar variable.

    It reads as a value in expressions; ``x = value`` inside a prim_func (rewritten
    by the tracer), ``x += v`` and ``x[0] = v`` store to it."""

    __slots__ = ()

    def __kf_expr__(self) -> ir.Expr:
        B.current().check_live(self.buffer, B.user_loc(2))
        return ir.Load(self.buffer, (ir.const(0),))

    def assign(self, value) -> "VarHandle":
        self[0] = value
        return self

    def __getitem__(self, key):
        if key not in (0, ()):
            raise B.error(f"variable {self.name} holds one value: index it with 0")
        return self.__kf_expr__()

    def __setitem__(self, key, value):
        if key not in (0, ()):
            raise B.error(f"variable {self.name} holds one value: index it with 0")
        super().__setitem__((0,), value)

    @property
    def dtype(self):
        return self.buffer.dtype


def _delegate(name):
    def f(self, *args):
        return getattr(self.__kf_expr__(), name)(*args)
    f.__name__ = name
    return f


def _inplace(op_name):
    def f(self, other):
        value = getattr(self.__kf_expr__(), op_name)(other)
        return self.assign(value)
    return f


for _n in ("__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ "
           "__floordiv__ __rfloordiv__ __mod__ __rmod__ __lt__ __le__ __gt__ __ge__ __eq__ __ne__ "
           "__and__ __rand__ __or__ __ror__ __xor__ __rxor__ __lshift__ __rshift__ __neg__ "
           "__invert__").split():
    setattr(VarHandle, _n, _delegate(_n))
for _n in "add sub mul truediv floordiv mod and or xor lshift rshift".split():
    setattr(VarHandle, f"__i{_n}__", _inplace(f"__{_n}__"))
VarHandle.__hash__ = object.__hash__
VarHandle.astype = lambda self, dtype: self.__kf_expr__().astype(dtype)


def unwrap_expr(x, like=None) -> ir.Expr:
    if isinstance(x, TensorHandle) and not isinstance(x, VarHandle):
        raise B.error(f"tile {x.name} used where a scalar is expected")
    return ir.as_expr(x, like)


def to_region(x, other_shape=None, what="operand") -> ir.Region:
    """A tile-op operand as a Region.  An element reference ``A[i, j]`` is a tile
    start whose extents come from the other operand's shape (TileLang's rule)."""
    if isinstance(x, VarHandle):
        raise B.error(f"variable {x.name} given as a tile {what}")
    if isinstance(x, TensorHandle):
        B.current().check_live(x.buffer, B.user_loc(3))
        if not x.buffer.is_static and other_shape is not None:
            return _point(x.buffer, tuple(ir.const(0) for _ in x.buffer.shape), other_shape, what)
        if not x.buffer.is_static:
            raise B.error(f"{x.name} has symbolic shape: give a tile of it, e.g. {x.name}[i, j]")
        return ir.whole(x.buffer)
    if isinstance(x, ir.Region):
        return x
    if isinstance(x, ir.Load):
        if other_shape is None:
            raise B.error(f"{what} {x.buffer.name}[...] is one element; its tile shape cannot be "
                          "inferred because the other operand is not a tile either")
        return _point(x.buffer, x.indices, other_shape, what)
    raise B.error(f"expected a tile (buffer, slice or element start) as {what}, got {x!r}")


def _point(buffer, starts, other_shape, what) -> ir.Region:
    n = buffer.ndim
    shape = list(other_shape)
    while len(shape) > n and shape[0] == 1:
        shape.pop(0)
    if len(shape) > n:
        shape = [e for e in shape if e != 1]
    if len(shape) > n:
        raise B.error(f"{what} {buffer.name} has {n} dims but the tile is {tuple(other_shape)}")
    extents = (1,) * (n - len(shape)) + tuple(shape)
    return ir.Region(buffer, tuple(starts), extents)
