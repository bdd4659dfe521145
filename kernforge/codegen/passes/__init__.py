"""Pure ``Kernel -> Kernel`` passes, the runner that names and verifies them, and
the analyses they share (variable ranges, on-chip memory plans).

Each renderer owns its ordered list, e.g. the CPU's ``[simplify, lower_copies,
simplify]`` followed by its analyses (names, non-negative variables, the arena
plan); target differences are extra list entries, never ``if target`` inside a
pass.  Passes that only one backend uses live in that backend's folder.
"""
from kernforge.codegen.passes.allocate import MemoryPlan, Slot, buffer_bytes, lifetimes, plan_memory
from kernforge.codegen.passes.masks import edge_conditions, lower_copies
from kernforge.codegen.passes.pipeline import Analysis, PassError, analysis, pass_name, run_pipeline
from kernforge.codegen.passes.ranges import expr_range, nonneg_vars, proves, var_ranges
from kernforge.codegen.passes.simplify import simplify, simplify_expr

__all__ = [
    "Analysis", "analysis", "MemoryPlan", "PassError", "Slot", "buffer_bytes", "edge_conditions", "expr_range", "lifetimes",
    "lower_copies", "nonneg_vars", "pass_name", "plan_memory", "proves", "run_pipeline", "simplify",
    "simplify_expr", "var_ranges",
]
