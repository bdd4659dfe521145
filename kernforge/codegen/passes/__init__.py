"""Pure ``Kernel -> Kernel`` passes, the runner that names and verifies them, and
the analyses they share (variable ranges, on-chip memory plans).

Each renderer owns its ordered list, e.g. the CPU's ``[simplify, lower_copies,
simplify]`` followed by its analyses (names, non-negative variables, the arena
plan); target differences are extra list entries, never ``if target`` inside a
pass.  Passes that only one backend uses live in that backend's folder.
Shared by every backend that needs them: the edge-mask logic of tile copies
(``masks``: the CPU lowers copies with it, CUDA builds its copy masks with it)
and the barrier analysis (``barriers``: ``ir.Sync`` where shared memory races;
CUDA's placement subclasses it in ``backends/cuda/barriers.py``).
"""
from kernforge.codegen.passes.allocate import MemoryPlan, Slot, buffer_bytes, lifetimes, plan_memory
from kernforge.codegen.passes.barriers import BarrierInsertion, Effect, insert_barriers, syncs
from kernforge.codegen.passes.masks import (ConstBounds, RangeBounds, edge_conditions, element_mask, lower_copies,
                                            tile_mask)
from kernforge.codegen.passes.pipeline import Analysis, PassError, analysis, pass_name, run_pipeline
from kernforge.codegen.passes.ranges import expr_range, nonneg_vars, proves, var_ranges
from kernforge.codegen.passes.simplify import simplify, simplify_expr

__all__ = [
    "Analysis", "analysis", "BarrierInsertion", "ConstBounds", "Effect", "MemoryPlan", "PassError", "RangeBounds",
    "Slot", "buffer_bytes", "edge_conditions", "element_mask", "expr_range", "insert_barriers", "lifetimes",
    "lower_copies", "syncs", "tile_mask", "nonneg_vars", "pass_name", "plan_memory", "proves", "run_pipeline", "simplify",
    "simplify_expr", "var_ranges",
]
