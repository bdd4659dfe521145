"""TileLang's optional hints (``T.gemm(policy=, k_pack=, wg_wait=)``, ``T.copy(**hints)``,
``T.Pipelined(order=, stage=)``, ``alloc_*(scope=)``): each is honoured, recorded in the
IR, or rejected here at the author's line -- never accepted and ignored.

``docs/tilelang-hints.md`` says, per hint, which of the three and why.
"""
from __future__ import annotations

from typing import Optional

from kernforge.codegen import ir
from kernforge.codegen.ir import GemmWarpPolicy


class HintError(ir.KernelError, ValueError):
    """A TileLang hint kernforge does not support, or a value it cannot honour."""


class UnknownHintError(ir.KernelError, TypeError):
    """A keyword argument that is not one of the call's (TileLang) hints."""


def _name(v) -> str:
    return repr(v) if not isinstance(v, GemmWarpPolicy) else f"T.GemmWarpPolicy.{v.name}"


# ---------------------------------------------------------------- T.gemm


def warp_policy(policy, loc) -> Optional[GemmWarpPolicy]:
    """``T.gemm(policy=...)``: None (kernforge's own choice) or a :class:`GemmWarpPolicy`.
    TileLang's spellings are accepted: the enum member, its name, or its integer value."""
    if policy is None or isinstance(policy, GemmWarpPolicy):
        return policy
    if isinstance(policy, str) and policy in GemmWarpPolicy.__members__:
        return GemmWarpPolicy[policy]
    if isinstance(policy, int) and not isinstance(policy, bool):
        for p in GemmWarpPolicy:
            if p.tilelang_value == policy:
                return p
    names = ", ".join(f"T.GemmWarpPolicy.{p.name}" for p in GemmWarpPolicy)
    raise HintError(f"T.gemm policy={policy!r} is not a warp policy: use one of {names} "
                    "(or leave it out: kernforge then puts as many warps along M as it can)", loc)


def check_k_pack(k_pack, loc) -> None:
    if isinstance(k_pack, int) and not isinstance(k_pack, bool) and k_pack == 1:
        return
    raise HintError(f"T.gemm k_pack={k_pack!r} is not supported: k_pack packs K elements for AMD "
                    "MFMA instructions, and kernforge has no AMD backend; leave it at 1", loc)


def check_wg_wait(wg_wait, loc) -> None:
    if isinstance(wg_wait, int) and not isinstance(wg_wait, bool) and wg_wait == 0:
        return
    raise HintError(f"T.gemm wg_wait={wg_wait!r} is not supported: kernforge waits for every "
                    "T.gemm's wgmma group to complete before the next statement (wgmma_wait<0>) "
                    "and has no T.wait_wgmma to defer the wait to; leave wg_wait at 0", loc)


def check_flag(value, name: str, loc) -> bool:
    """A T.gemm flag; a warp policy here is TileLang's argument order passed positionally."""
    if isinstance(value, bool) or (type(value).__name__ == "bool_") or \
            (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    hint = (" (TileLang's 6th positional argument is policy: pass policy= by keyword)"
            if isinstance(value, GemmWarpPolicy) else "")
    raise HintError(f"T.gemm {name} must be True or False, got {_name(value)}{hint}", loc)


# ---------------------------------------------------------------- T.copy

_EVICTION = ("evict_normal", "evict_first", "evict_last")


def copy_hints(hints: dict, loc) -> dict:
    """``T.copy``'s TileLang keywords -> the :class:`ir.Copy` fields they set.

    ``disable_tma`` is recorded (``ir.Copy.disable_tma``) and honoured by the CUDA backend;
    ``coalesced_width`` and non-default ``eviction_policy`` values are rejected; any other
    keyword is a TypeError naming it."""
    unknown = sorted(set(hints) - {"coalesced_width", "disable_tma", "eviction_policy"})
    if unknown:
        raise UnknownHintError(f"T.copy got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                               "it takes src, dst and TileLang's hints coalesced_width, disable_tma, "
                               "eviction_policy", loc)
    out = {}
    dt = hints.get("disable_tma", False)
    if not isinstance(dt, bool):
        raise HintError(f"T.copy disable_tma must be True or False, got {dt!r}", loc)
    if dt:
        out["disable_tma"] = True
    cw = hints.get("coalesced_width")
    if cw is not None:
        raise HintError(f"T.copy coalesced_width={cw!r} is not supported: kernforge chooses each copy's "
                        "access width itself (16-byte vectors wherever the tile's shape, strides and "
                        "alignment allow); leave it out", loc)
    ev = hints.get("eviction_policy")
    if ev is not None and ev not in _EVICTION:
        raise HintError(f"T.copy eviction_policy={ev!r}: TileLang's values are "
                        f"{', '.join(map(repr, _EVICTION))}", loc)
    if ev not in (None, "evict_normal"):
        raise HintError(f"T.copy eviction_policy={ev!r} is not supported: kernforge emits no L2 cache "
                        "eviction hints (every copy is 'evict_normal'); leave it out", loc)
    return out


# ---------------------------------------------------------------- T.Pipelined


def check_pipeline_schedule(order, stage, loc) -> None:
    given = [n for n, v in (("order", order), ("stage", stage)) if v is not None]
    if given:
        raise HintError(f"T.Pipelined {' and '.join(f'{n}=' for n in given)} is not supported: kernforge's "
                        "pipeline planner chooses the schedule itself (the global->shared copies at the "
                        "top of the body are issued num_stages - 1 iterations ahead, everything else "
                        "runs in order); leave order and stage out and set only num_stages", loc)


# ---------------------------------------------------------------- alloc_*(scope=)

# TileLang scope string -> the allocation that makes a buffer of that scope
_SCOPE_ALLOC = {"shared": "alloc_shared", "shared.dyn": "alloc_shared", "local.fragment": "alloc_fragment",
                "local": "alloc_local", "local.var": "alloc_var", "global": None}


def check_scope(scope, allowed: tuple[str, ...], fn: str, loc) -> None:
    """``alloc_*(scope=)``: a TileLang scope string that means this allocation kind."""
    if isinstance(scope, str) and scope in allowed:
        return
    what = f"T.{fn}(scope={scope!r})"
    ok = " or ".join(repr(s) for s in allowed)
    other = _SCOPE_ALLOC.get(scope) if isinstance(scope, str) else None
    if other is not None:
        raise HintError(f"{what} contradicts the allocation: a {scope!r} buffer is made with "
                        f"T.{other}; T.{fn} takes scope {ok}", loc)
    if scope == "global":
        raise HintError(f"{what}: on-chip allocations cannot be global memory; pass global tensors "
                        f"as T.Tensor parameters. T.{fn} takes scope {ok}", loc)
    raise HintError(f"{what} is not a scope kernforge knows; T.{fn} takes scope {ok}", loc)
