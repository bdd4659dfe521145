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

Only clusters along grid x, of 2 CTAs by default, on sm_90a and sm_100a (the cuda-emu emulator
runs x clusters only).  Where the shape does not allow it the plan is a cluster of 1.

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

ATTR = "cluster"  # kernel attribute: the requested cluster size (a factory's ``cluster`` parameter)
MAX_BOX_ROWS = 256  # TMA's largest box extent


@dataclass(frozen=True)
class ClusterPlan:
    """``size`` CTAs per cluster along grid x (1: no cluster); each loads ``slice_rows`` rows of the
    ``shared_rows``-row shared tile and multicasts them with ``cta_mask``."""

    size: int
    launch_grid: tuple[int, ...]
    shared_rows: int
    slice_rows: int
    reason: str = ""  # why the plan fell back to a cluster of 1

    @property
    def cta_mask(self) -> int:
        return (1 << self.size) - 1

    @property
    def dims(self) -> tuple[int, int, int]:
        """The launch's cluster dimensions (``cuLaunchKernelEx``'s attribute / ``__cluster_dims__``)."""
        return (self.size, 1, 1)

    @property
    def attribute(self) -> str:
        """The kernel attribute that fixes the cluster at compile time ("" without a cluster)."""
        return f"__cluster_dims__({self.size}, 1, 1)" if self.size > 1 else ""

    def slice_offset(self, rank: int) -> int:
        """First row of the shared tile that CTA ``rank`` loads and multicasts."""
        if not 0 <= rank < self.size:
            raise ValueError(f"cluster rank {rank} outside 0..{self.size - 1}")
        return rank * self.slice_rows

    def expect_tx(self, shared_tile_bytes: int, own_bytes: int) -> int:
        """Bytes one CTA's full barrier must expect per stage: the whole shared tile (every CTA's
        slice lands in every CTA) plus the boxes it loads for itself alone."""
        return int(shared_tile_bytes) + int(own_bytes)


def plan_multicast(arch: str, grid: Sequence[int], shared_rows: int, row_bytes: int, *, swizzle: int = 0,
                   size: int = 2) -> ClusterPlan:
    """The cluster for a grid whose CTAs along x share a ``shared_rows`` x ``row_bytes`` tile.

    Falls back to a cluster of 1 (``reason`` says why) when the arch has no clusters, the grid has
    one CTA along x (nothing to share), the tile's rows do not split evenly, or a slice would not
    start at TMA's shared-memory alignment (128 bytes, 1024 with a swizzle)."""
    from kernforge.backends.cuda.renderer import arch_info  # the renderer imports this module

    return _plan(arch, arch_info(arch).sm, grid, shared_rows, row_bytes, swizzle, size)


def _plan(arch: str, sm: int, grid: Sequence[int], shared_rows: int, row_bytes: int, swizzle: int,
          size: int) -> ClusterPlan:
    grid = tuple(int(g) for g in grid)
    if not grid or any(g < 1 for g in grid):
        raise ValueError(f"grid must have positive extents, got {grid}")
    if size < 1 or size & (size - 1) or size > 8:
        raise ValueError(f"cluster size must be a power of two in 1..8, got {size}")
    if shared_rows < 1 or row_bytes < 1:
        raise ValueError(f"shared tile must be non-empty, got {shared_rows} rows of {row_bytes} bytes")

    def single(reason: str) -> ClusterPlan:
        return ClusterPlan(1, grid, shared_rows, shared_rows, reason)

    if size == 1:
        return single("cluster size 1 requested")
    if sm < 90:
        return single(f"{arch} has no thread-block clusters")
    if grid[0] < 2:
        return single("one CTA along grid x: no tile to share")
    if shared_rows % size:
        return single(f"{shared_rows} shared rows do not split into {size} slices")
    slice_rows = shared_rows // size
    align = 1024 if swizzle else 128
    if (slice_rows * row_bytes) % align:
        return single(f"a {slice_rows}-row slice ({slice_rows * row_bytes} bytes) is not a multiple of the "
                      f"{align}-byte TMA destination alignment")
    if slice_rows > MAX_BOX_ROWS:
        return single(f"a {slice_rows}-row slice exceeds TMA's {MAX_BOX_ROWS}-row box")
    launch = (-(-grid[0] // size) * size,) + grid[1:]
    return ClusterPlan(size, launch, shared_rows, slice_rows)


def config_request(n_blocks: int, shared_rows: int, row_bytes: int, size: int = 2) -> dict:
    """A kernel family's configuration entry: ``{"cluster": size}`` when ``n_blocks`` x blocks
    sharing a ``shared_rows`` x ``row_bytes`` 128-byte-swizzled tile can form clusters (judged as
    on sm_90a: the renderer falls back, with the same code, where the target cannot), else ``{}``."""
    # sm_90a's facts without the renderer: configuration choosers run when kernel problems are
    # imported, which must not load Jinja and the CUDA renderer
    plan = _plan("sm_90a", 90, (max(1, int(n_blocks)), 1), shared_rows, row_bytes, 128, size)
    return {"cluster": plan.size} if plan.size > 1 else {}


def launch_grid(grid: Sequence[int], size: int) -> tuple[int, ...]:
    """A cluster kernel's launch: the grid's x extent rounded up to whole clusters of ``size``
    (the padded CTAs load and multicast their slices and take part in every barrier)."""
    grid = tuple(int(g) for g in grid)
    if size <= 1 or not grid:
        return grid
    return (-(-grid[0] // size) * size,) + grid[1:]


@dataclass(frozen=True)
class KernelCluster:
    """A generated kernel's cluster (the renderer's ``cluster`` analysis): ``ring``'s tile
    ``shared`` (index into its TMA tiles) is the one the cluster's CTAs split and multicast."""

    plan: ClusterPlan
    ring: ir.For
    shared: int


def _uses(e: ir.Expr, v: ir.Var) -> bool:
    return any(n is v for n in ir.nodes(e))


def _control(s: ir.Stmt, target: ir.For) -> list:
    """The branch conditions and loop bounds that decide whether and how often ``target`` runs
    (those on the path from ``s`` to it, and its own bounds); [] when ``s`` does not hold it."""
    if s is target:
        return [s.start, s.extent]
    if isinstance(s, ir.Seq):
        return next((found for x in s.body if (found := _control(x, target))), [])
    if isinstance(s, ir.If):
        for branch in (s.then, s.orelse):
            if branch is not None and (found := _control(branch, target)):
                return [s.cond] + found
        return []
    if isinstance(s, ir.For):
        found = _control(s.body, target)
        return [s.start, s.extent] + found if found else []
    body = getattr(s, "body", None)
    return _control(body, target) if isinstance(body, ir.Stmt) else []


def plan_kernel(kernel: ir.Kernel, arch: str, tma_loops: dict, warp_spec, persistent
                ) -> tuple[Optional[KernelCluster], str]:
    """The cluster of a kernel that asks for one (``attrs[ATTR]`` = size), or None and why not.

    Rendered only for a warp-specialized kernel with one TMA ring (persistent or not: the
    persistent scheduler hands a cluster's CTAs adjacent x blocks of the same row block,
    ``cuda.persistent``), a constant grid x extent, a ring that every CTA of a cluster runs for
    the same iterations (no branch or loop bound on the way to it, nor its own bounds, depends on
    ``bx``: each CTA takes part in every barrier and multicast), and a ring tile whose source
    position does not depend on ``bx`` (the x block index: a GEMM's A across N blocks), loaded in
    one row box (swizzled or row-major, at most 256 rows), whose slices ``plan_multicast`` accepts."""
    size = int(kernel.attrs.get(ATTR, 0) or 0)
    if size <= 1:
        return None, ""
    if warp_spec is None or len(warp_spec.rings) != 1:
        return None, "clusters need a warp-specialized kernel with one TMA ring"
    gx = kernel.grid[0]
    if not isinstance(gx, ir.Const):
        return None, "the grid's x extent is not a compile-time constant"
    (ring,) = warp_spec.rings
    bx = kernel.block_vars[0]
    if any(_uses(e, bx) for e in _control(kernel.body, ring)):
        return None, "the ring's iterations depend on bx: a cluster's CTAs would not meet at every barrier"
    specs = [t.spec for tiles in tma_loops.values() for t in tiles]
    for i, t in enumerate(tma_loops[ring]):
        if (t.layout == "core" or t.rows != t.box_rows or len(t.spec.box) not in (2, 3) or specs.count(t.spec) != 1
                or any(_uses(s, bx) for s in t.copy.src.starts)):
            continue
        row_bytes = t.box_cols * t.spec.elem_bytes
        plan = plan_multicast(arch, (int(gx.value), 1), t.rows, row_bytes, swizzle=t.spec.swizzle, size=size)
        if plan.size == 1:
            return None, plan.reason
        return KernelCluster(plan, ring, i), ""
    return None, "no ring tile is shared along grid x in one row box"


def apply(cluster: KernelCluster, tma_loops: dict, tensor_maps: list) -> tuple[dict, list]:
    """The renderer's TMA tiles and tensor maps with the shared tile's map boxing one slice
    (``slice_rows`` rows; the map keeps its name and place among the kernel's parameters)."""
    tiles = list(tma_loops[cluster.ring])
    t = tiles[cluster.shared]
    box = tuple(cluster.plan.slice_rows if i == t.row_axis else b for i, b in enumerate(t.spec.box))
    spec = replace(t.spec, box=box)
    tiles[cluster.shared] = replace(t, spec=spec)
    return {**tma_loops, cluster.ring: tiles}, [spec if m is t.spec else m for m in tensor_maps]
