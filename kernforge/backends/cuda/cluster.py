"""Thread-block clusters with TMA multicast: when two CTAs share an operand tile, and how the
launch grid, the TMA boxes and the mbarrier byte counts change (device side: kf/cluster.cuh).

Why: in a GEMM grid ``(N blocks, M blocks)`` the CTAs of one grid row compute adjacent N blocks
of the same ``BM`` rows, so each of them loads the same A tile from L2 for every K step.  A
cluster of ``size`` such CTAs (along grid x, ``__cluster_dims__(size, 1, 1)``) loads that tile
once: CTA ``r`` loads rows ``[r * BM / size, (r + 1) * BM / size)`` and multicasts them into the
same offset of every CTA's stage (``ctaMask`` = all CTAs), as DeepGEMM does.  Consequences the
kernel must honour, which :class:`ClusterPlan` spells out:

* every CTA's full barrier receives the whole shared tile (its own slice and the peers'), so its
  expect-tx is ``shared_tile_bytes + own_bytes`` (:meth:`ClusterPlan.expect_tx`);
* a stage is free only once *every* CTA of the cluster has consumed it (a peer's multicast writes
  it): the empty barrier counts one release per CTA, sent with a remote mbarrier arrive;
* cluster barriers after the mbarrier init and before exit;
* the grid's x extent is rounded up to whole clusters (:attr:`ClusterPlan.launch_grid`): a CTA
  past the last N block still loads and multicasts its slice (its own B box is zero-filled by
  TMA) and takes part in every barrier; only its stores are masked.

The same holds along grid y with the operands' roles swapped (DeepGEMM's multicast on B): the
CTAs of adjacent M blocks (``__cluster_dims__(1, size, 1)``) need the same B tile, so each loads
rows ``[r * BN / size, (r + 1) * BN / size)`` of it and multicasts them; the grid's y extent is
rounded up (a padded CTA past the last M block gets a zero-filled A box and stores nothing).  A
kernel picks one axis (``attrs["multicast"]``: ``"a"``, the default, along x; ``"b"`` along y),
as DeepGEMM picks one of A/B multicast per shape.  Clusters of 2 CTAs by default, on sm_90a and
sm_100a.  Where the shape does not allow it the plan is a cluster of 1.

Generated kernels ask with ``attrs["cluster"]`` (a factory's ``cluster`` parameter;
:func:`config_request` for the configurations); the renderer's ``cluster`` analysis
(:func:`plan_kernel`) decides, :func:`apply` narrows the shared tile's map to one slice, and
``warp_specialize`` / ``tma.render_issue`` / ``persistent`` / ``CudaRenderer.release`` render the
protocol above; both launchers round the grid (:func:`launch_grid`, ``persistent.launch_grid``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from kernforge.codegen import ir
from kernforge.backends.cuda.arch import arch_info

ATTR = "cluster"  # kernel attribute: the requested cluster size (a factory's ``cluster`` parameter)
OPERAND_ATTR = "multicast"  # the shared operand: "a" (cluster along grid x, the default) or "b" (along y)
AXES = {"a": 0, "b": 1}  # the grid axis along which a cluster's CTAs share each operand's tile
MAX_BOX_ROWS = 256  # TMA's largest box extent


@dataclass(frozen=True)
class ClusterPlan:
    """``size`` CTAs per cluster along grid axis ``axis`` (0: x, 1: y; size 1: no cluster); each
    loads ``slice_rows`` rows of the ``shared_rows``-row shared tile and multicasts them with
    ``cta_mask``."""

    size: int
    launch_grid: tuple[int, ...]
    shared_rows: int
    slice_rows: int
    reason: str = ""  # why the plan fell back to a cluster of 1
    axis: int = 0
    # the launch axis the cluster spans: ``axis``, but x for a persistent kernel's 1-D launch (its
    # scheduler hands the cluster's CTAs adjacent blocks along ``axis``, ``cuda.persistent``)
    launch_axis: int = 0
    # a 2-CTA MMA pair (``cuda.tcgen05_pair``): CTA r loads its slice into the start of its own stage,
    # not multicast, and the pair's tcgen05.mma reads both CTAs' slices
    pair: bool = False

    @property
    def cta_mask(self) -> int:
        return (1 << self.size) - 1

    @property
    def dims(self) -> tuple[int, int, int]:
        """The launch's cluster dimensions (``cuLaunchKernelEx``'s attribute / ``__cluster_dims__``)."""
        return tuple(self.size if i == self.launch_axis else 1 for i in range(3))

    @property
    def attribute(self) -> str:
        """The kernel attribute that fixes the cluster at compile time ("" without a cluster)."""
        return f"__cluster_dims__({', '.join(map(str, self.dims))})" if self.size > 1 else ""

    def slice_offset(self, rank: int) -> int:
        """First row of the shared tile that CTA ``rank`` loads and multicasts."""
        if not 0 <= rank < self.size:
            raise ValueError(f"cluster rank {rank} outside 0..{self.size - 1}")
        return rank * self.slice_rows

    def expect_tx(self, shared_tile_bytes: int, own_bytes: int) -> int:
        """Bytes one CTA's full barrier must expect per stage: the whole shared tile (every CTA's
        slice lands in every CTA) plus the boxes it loads for itself alone; a pair's CTA receives
        only its own slice."""
        return int(shared_tile_bytes) // (self.size if self.pair else 1) + int(own_bytes)


def plan_multicast(arch: str, grid: Sequence[int], shared_rows: int, row_bytes: int, *, swizzle: int = 0,
                   size: int = 2, axis: int = 0) -> ClusterPlan:
    """The cluster for a grid whose CTAs along ``axis`` (0: x, 1: y) share a ``shared_rows`` x
    ``row_bytes`` tile.

    Falls back to a cluster of 1 (``reason`` says why) when the arch has no clusters, the grid has
    one CTA along the axis (nothing to share), the tile's rows do not split evenly, or a slice would
    not start at TMA's shared-memory alignment (128 bytes, 1024 with a swizzle)."""

    return _plan(arch, arch_info(arch).sm, grid, shared_rows, row_bytes, swizzle, size, axis)


def _plan(arch: str, sm: int, grid: Sequence[int], shared_rows: int, row_bytes: int, swizzle: int,
          size: int, axis: int = 0) -> ClusterPlan:
    grid = tuple(int(g) for g in grid)
    if not grid or any(g < 1 for g in grid):
        raise ValueError(f"grid must have positive extents, got {grid}")
    if size < 1 or size & (size - 1) or size > 8:
        raise ValueError(f"cluster size must be a power of two in 1..8, got {size}")
    if shared_rows < 1 or row_bytes < 1:
        raise ValueError(f"shared tile must be non-empty, got {shared_rows} rows of {row_bytes} bytes")
    if axis not in (0, 1) or axis >= len(grid):
        raise ValueError(f"cluster axis must be 0 (x) or 1 (y) of a {len(grid)}-D grid, got {axis}")

    def single(reason: str) -> ClusterPlan:
        return ClusterPlan(1, grid, shared_rows, shared_rows, reason, axis)

    if size == 1:
        return single("cluster size 1 requested")
    if sm < 90:
        return single(f"{arch} has no thread-block clusters")
    if grid[axis] < 2:
        return single(f"one CTA along grid {'xy'[axis]}: no tile to share")
    if shared_rows % size:
        return single(f"{shared_rows} shared rows do not split into {size} slices")
    slice_rows = shared_rows // size
    align = 1024 if swizzle else 128
    if (slice_rows * row_bytes) % align:
        return single(f"a {slice_rows}-row slice ({slice_rows * row_bytes} bytes) is not a multiple of the "
                      f"{align}-byte TMA destination alignment")
    if slice_rows > MAX_BOX_ROWS:
        return single(f"a {slice_rows}-row slice exceeds TMA's {MAX_BOX_ROWS}-row box")
    return ClusterPlan(size, launch_grid(grid, size, axis), shared_rows, slice_rows, "", axis, axis)


def config_request(n_blocks: int, shared_rows: int, row_bytes: int, size: int = 2) -> dict:
    """A kernel family's configuration entry: ``{"cluster": size}`` when ``n_blocks`` blocks along
    the cluster's axis sharing a ``shared_rows`` x ``row_bytes`` 128-byte-swizzled tile can form
    clusters (judged as on sm_90a: the renderer falls back, with the same code, where the target
    cannot), else ``{}``."""
    # sm_90a's facts without the renderer: configuration choosers run when kernel problems are
    # imported, which must not load Jinja and the CUDA renderer
    plan = _plan("sm_90a", 90, (max(1, int(n_blocks)), 1), shared_rows, row_bytes, 128, size)
    return {"cluster": plan.size} if plan.size > 1 else {}


def launch_grid(grid: Sequence[int], size: int, axis: int = 0) -> tuple[int, ...]:
    """A cluster kernel's launch: the grid's extent along ``axis`` rounded up to whole clusters of
    ``size`` (the padded CTAs load and multicast their slices and take part in every barrier)."""
    grid = tuple(int(g) for g in grid)
    if size <= 1 or len(grid) <= axis:
        return grid
    return grid[:axis] + (-(-grid[axis] // size) * size,) + grid[axis + 1:]


@dataclass(frozen=True)
class KernelCluster:
    """A generated kernel's cluster (the renderer's ``cluster`` analysis): ``ring``'s tile
    ``shared`` (index into its TMA tiles) is the one the cluster's CTAs split and multicast."""

    plan: ClusterPlan
    ring: ir.For
    shared: int


def uses(e: ir.Expr, v: ir.Var) -> bool:
    """Whether expression ``e`` mentions variable ``v`` (also the 2-CTA MMA plan's test)."""
    return any(n is v for n in ir.nodes(e))


def control(s: ir.Stmt, target: ir.For) -> list:
    """The branch conditions and loop bounds that decide whether and how often ``target`` runs
    (those on the path from ``s`` to it, and its own bounds); [] when ``s`` does not hold it."""
    if s is target:
        return [s.start, s.extent]
    if isinstance(s, ir.Seq):
        return next((found for x in s.body if (found := control(x, target))), [])
    if isinstance(s, ir.If):
        for branch in (s.then, s.orelse):
            if branch is not None and (found := control(branch, target)):
                return [s.cond] + found
        return []
    if isinstance(s, ir.For):
        found = control(s.body, target)
        return [s.start, s.extent] + found if found else []
    body = getattr(s, "body", None)
    return control(body, target) if isinstance(body, ir.Stmt) else []


def plan_kernel(kernel: ir.Kernel, arch: str, tma_loops: dict, warp_spec, persistent
                ) -> tuple[Optional[KernelCluster], str]:
    """The cluster of a kernel that asks for one (``attrs[ATTR]`` = size, along the axis of
    ``attrs[OPERAND_ATTR]``), or None and why not.

    Rendered only for a warp-specialized kernel with one TMA ring (persistent or not: the
    persistent scheduler hands a cluster's CTAs adjacent blocks along the axis, ``cuda.persistent``;
    not a live-rows walk along y), a ring that every CTA of a cluster runs for the same iterations
    (no branch or loop bound on the way to it, nor its own bounds, depends on the axis's block
    index: each CTA takes part in every barrier and multicast), and a ring tile whose source
    position does not depend on that index (``bx``: a GEMM's A across N blocks; ``by``: its B
    across M blocks), loaded in one row box (swizzled or row-major, at most 256 rows), whose
    slices ``plan_multicast`` accepts.  Along x the grid's extent must be a compile-time constant
    (N); along y it may be symbolic (M): the launch pads it, and a single M block then runs one
    padded CTA beside it."""
    size = int(kernel.attrs.get(ATTR, 0) or 0)
    if size <= 1:
        return None, ""
    operand = kernel.attrs.get(OPERAND_ATTR, "a") or "a"
    if operand not in AXES:
        raise ir.KernelError(f"multicast must be one of {sorted(AXES)}, got {operand!r}", kernel.loc)
    axis = AXES[operand]
    if warp_spec is None or len(warp_spec.rings) != 1:
        return None, "clusters need a warp-specialized kernel with one TMA ring"
    if len(kernel.grid) <= axis:
        return None, f"a {len(kernel.grid)}-D grid has no {'xy'[axis]} axis to cluster along"
    extent = kernel.grid[axis]
    if isinstance(extent, ir.Const):
        extent = int(extent.value)
    elif axis == 0:
        return None, "the grid's x extent is not a compile-time constant"
    else:
        extent = size  # a runtime extent: the launch rounds it up to whole clusters
    if axis == 1 and persistent is not None and persistent.live is not None:
        return None, "a persistent walk over live row blocks does not pair M blocks"
    (ring,) = warp_spec.rings
    block = kernel.block_vars[axis]
    if any(uses(e, block) for e in control(kernel.body, ring)):
        return None, f"the ring's iterations depend on b{'xy'[axis]}: a cluster's CTAs would not meet at every barrier"
    specs = [t.spec for tiles in tma_loops.values() for t in tiles]
    for i, t in enumerate(tma_loops[ring]):
        if (t.layout == "core" or t.rows != t.box_rows or len(t.spec.box) not in (2, 3) or specs.count(t.spec) != 1
                or any(uses(s, block) for s in t.copy.src.starts)):
            continue
        row_bytes = t.box_cols * t.spec.elem_bytes
        grid = (extent, 1) if axis == 0 else (1, extent)
        plan = plan_multicast(arch, grid, t.rows, row_bytes, swizzle=t.spec.swizzle, size=size, axis=axis)
        if plan.size == 1:
            return None, plan.reason
        if persistent is not None:
            plan = replace(plan, launch_axis=0)
        return KernelCluster(plan, ring, i), ""
    return None, f"no ring tile is shared along grid {'xy'[axis]} in one row box"


def apply(cluster: KernelCluster, tma_loops: dict, tensor_maps: list) -> tuple[dict, list]:
    """The renderer's TMA tiles and tensor maps with the shared tile's map boxing one slice
    (``slice_rows`` rows; the map keeps its name and place among the kernel's parameters)."""
    tiles = list(tma_loops[cluster.ring])
    t = tiles[cluster.shared]
    box = tuple(cluster.plan.slice_rows if i == t.row_axis else b for i, b in enumerate(t.spec.box))
    spec = replace(t.spec, box=box)
    tiles[cluster.shared] = replace(t, spec=spec)
    return {**tma_loops, cluster.ring: tiles}, [spec if m is t.spec else m for m in tensor_maps]
