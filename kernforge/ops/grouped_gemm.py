"""DeepGEMM's M-grouped contiguous GEMMs on kernforge kernels.

``m_grouped_bf16_gemm_nt_contiguous``, ``m_grouped_fp8_gemm_nt_contiguous`` and
``m_grouped_bf16_gemm_nt_masked`` take DeepGEMM's arguments
(DeepGEMM's public API, as the upstream spec ``deepgemm-grouped.md`` describes it; not
shipped) and write ``d`` in place; ``backend=`` picks the kernforge backend (default: the
one ``kernforge.backends.for_tensor`` gives the tensors' device).  ``grouped_layout`` is the per-row expert index (``-1`` =
padding; legacy name ``m_indices``) or, with ``use_psum_layout=True``, each
group's cumulative end row.  The alignment rule (each expert's segment starts on a
multiple of ``get_mk_alignment_for_contiguous_layout()``, ids constant inside an
aligned block) is checked on the host before anything runs.

Behaviour on padding is defined rather than left to the caller: ``d`` rows whose
index is ``-1`` (and PSUM gap rows) are written as zeros, whatever ``a`` holds there;
NaN elsewhere propagates to the ``d`` elements it reaches, as torch's matmul (docs/ops.md).
FP8 contiguous takes 1x128 per-token ``a`` scales and ``b`` scales per 128x128 block (DeepGEMM's
SM90 recipe, the default for float32) or per row (``(1, 1, 128)``, its SM100 1D1D recipe, the
default for packed scales), float32 or UE8M0 packed four per int32 along K, as the dense ops
(:mod:`kernforge.ops.gemm`): on CUDA backends packed scales go to the kernel as they are (sm_100a
applies them in block-scaled ``tcgen05.mma``), host backends unpack them into float32.

``m_grouped_fp8_fp4_gemm_nt_contiguous`` (the same op; DeepGEMM's HEAD name) also takes an
FP4 ``b`` (int8, two e2m1 codes per byte, low nibble first, one scale per 1x32), and
``m_grouped_fp8_fp4_gemm_nt_masked`` (aliases ``m_grouped_fp8_gemm_nt_masked``,
``fp8_m_grouped_gemm_nt_masked``, ``m_grouped_gemm_fp8_fp8_bf16_nt_masked``) is the masked
layout with an FP8 or FP4 ``b``.  These FP4/masked paths share the dense ops' scale handling
(:mod:`kernforge.ops.gemm`): float32 or packed-UE8M0 int32 scales, ``sfa`` in DeepGEMM's
MN-major TMA-aligned layout passed to the kernel without a copy (other layouts converted).
``arch`` (keyword-only, CUDA backends): the arch to build for, as the dense ops'
(:func:`kernforge.ops.arch.target_arch`).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from kernforge.ops._capture import capturing

import kernforge
from kernforge import backends
from kernforge.kernels import grouped_gemm as kernels
from kernforge.kernels.grouped_gemm import config
from kernforge.kernels.grouped_gemm import kernel as kernel_defs
from kernforge.ops.arch import built_for, target_arch
from kernforge.ops.gemm import check_flags, keep_packed, mn_major, pair, resolve_recipe, scales

_alignment = 128


def get_mk_alignment_for_contiguous_layout() -> int:
    """Row alignment of each expert's segment in the contiguous layout (DeepGEMM: 128)."""
    return _alignment


def set_mk_alignment_for_contiguous_layout(value: int) -> None:
    """Process-wide, as in DeepGEMM."""
    global _alignment
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"alignment must be a positive int, got {value!r}")
    _alignment = value


get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      grouped_layout: torch.Tensor, compiled_dims: str = "nk",
                                      use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                                      expected_m_for_psum_layout: Optional[int] = None, *,
                                      backend: Optional[str] = None) -> None:
    """``d[r] = a[r] @ b[g(r)]^T`` for bf16 ``a [M, K]``, ``b [G, N, K]``, ``d [M, N]``."""
    _check_psum_hint(use_psum_layout, expected_m_for_psum_layout)
    for name, t in (("a", a), ("b", b)):
        _check_tensor(name, t, torch.bfloat16)
    m, n, k, groups = _check_shapes(a, b, d)
    if m == 0:
        return
    m_indices = _row_experts(grouped_layout, m, groups, use_psum_layout)
    backend = backends.for_tensor(a, backend)
    kernel = _kernel(kernels.m_grouped_gemm_nt_contiguous, backend,
                     **config.choose(backend, groups, n, k, alignment=_alignment))
    kernel(a, b, m_indices, d)


def m_grouped_fp8_gemm_nt_contiguous(a: tuple, b: tuple, d: torch.Tensor,
                                     grouped_layout: torch.Tensor, recipe=None, recipe_a=None,
                                     recipe_b=None, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True,
                                     expected_m_for_psum_layout: Optional[int] = None, *,
                                     backend: Optional[str] = None, arch: Optional[str] = None) -> None:
    """FP8 e4m3 ``a = (data [M, K], sfa [M, ceil(K/128)])``, ``b = (data [G, N, K], sfb)`` with
    ``sfb [G, ceil(N/128), ceil(K/128)]`` (per 128x128 block) or ``[G, N, ceil(K/128)]`` (per
    row, recipe ``(1, 1, 128)``); bf16 ``d``.  Scales float32 or packed UE8M0 (``[..., ceil(K/512)]``
    int32, the default recipe then per row), see the module's docstring.
    An int8 ``b`` is FP4 (``m_grouped_fp8_fp4_gemm_nt_contiguous``, this op's DeepGEMM name):
    ``b = (codes [G, N, K/2], sfb [G, N, ceil(K/32)])``, see :func:`_fp8_fp4_contiguous`."""
    _check_psum_hint(use_psum_layout, expected_m_for_psum_layout)
    if _is_fp4(b):
        _fp8_fp4_contiguous(a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                            disable_ue8m0_cast, use_psum_layout, backend, arch)
        return
    (a_data, sfa), (b_data, sfb) = pair("a", a), pair("b", b)
    check_flags(compiled_dims, disable_ue8m0_cast)
    for name, t in (("a", a_data), ("b", b_data)):
        _check_tensor(name, t, torch.float8_e4m3fn)
    m, n, k, groups = _check_shapes(a_data, b_data, d)
    _, (gran_n, gran_k) = resolve_recipe(recipe, recipe_a, recipe_b, False, sfb)
    backend = backends.for_tensor(a_data, backend)
    packed = keep_packed(backend, sfa, sfb)
    target_arch(backend, arch, resolve=False)  # a bad arch fails here, with the other checks
    # DeepGEMM wants MN-major, TMA-aligned scales and converts other layouts per call;
    # the kernel reads row-major scales, so any layout is made contiguous here
    sfa = scales("sfa", sfa, (m, -(-k // 128)), keep_packed=packed).contiguous()
    sfb = scales("sfb", sfb, (groups, -(-n // gran_n), -(-k // gran_k)), keep_packed=packed).contiguous()
    if len({t.device for t in (a_data, sfa, b_data, sfb, d)}) != 1:
        raise ValueError("a, b, their scales and d must be on one device")
    if m == 0:
        return
    m_indices = _row_experts(grouped_layout, m, groups, use_psum_layout)
    variant = _fp8_variant(packed, gran_n)
    kernel = _kernel(kernels.m_grouped_fp8_gemm_nt_contiguous, backend, **built_for(arch),
                     **config.choose_fp8(backend, groups, n, k, alignment=_alignment, **variant))
    kernel(a_data, sfa, b_data, sfb, m_indices, d)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                  masked_m: torch.Tensor, expected_m: int,
                                  compiled_dims: str = "nk", *, backend: Optional[str] = None) -> None:
    """Masked layout: ``d[g, r] = a[g, r] @ b[g]^T`` for ``r < masked_m[g]`` with bf16
    ``a [G, M_max, K]``, ``b [G, N, K]``, ``d [G, M_max, N]``.  Rows at or past
    ``masked_m[g]`` are left untouched.  ``expected_m`` (typical rows per group) picks
    the row tile."""
    for name, t in (("a", a), ("b", b)):
        _check_tensor(name, t, torch.bfloat16)
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"a must be [G, M_max, K] and b [G, N, K], got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    groups, max_m, k = a.shape
    n = b.shape[1]
    if n == 0 or k == 0:
        raise ValueError(f"n and k must be positive, got n={n}, k={k}")
    _check_tensor("d", d, torch.bfloat16, (groups, max_m, n))
    _check_masked_m(masked_m, groups, max_m, expected_m)
    if len({a.device, b.device, d.device, masked_m.device}) != 1:
        raise ValueError("a, b, d and masked_m must be on one device")
    if groups == 0 or max_m == 0:        # an empty batch: d is empty too, nothing to launch
        return
    backend = backends.for_tensor(a, backend)
    # one run of N tiles per thread (``n_splits``) when the first guided chunk, the first groups, would
    # take over 3% more than its share of the rows: the runs balance any layout but cost ~2% locality
    # (G 4 x [200, 9, 128, 0], N = K = 2048, 2 threads: busiest thread 10.8 -> 8.9 ms, torch's loop 9.0).
    # The contiguous op keeps one run: there the runs cost 10% (G 4 x 256 rows, N = K = 4096: 159 ->
    # 180 ms at one thread), as much as they gained on G 4 x [512, 0, 77, 300] at 2 threads.
    threads = _workers(backend)
    skewed = threads > 1 and not capturing(masked_m) and _first_share(masked_m.long(), threads) > 1.03 / threads
    cfg = config.choose_masked(backend, groups, n, k, expected_m, threads=threads if skewed else 1)
    _kernel(kernels.m_grouped_gemm_nt_masked, backend, **cfg)(a, b, masked_m, d)


def m_grouped_fp8_fp4_gemm_nt_masked(a: tuple, b: tuple, d: torch.Tensor, masked_m: torch.Tensor,
                                     expected_m: int, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims: str = "nk", disable_ue8m0_cast: bool = False, *,
                                     backend: Optional[str] = None, arch: Optional[str] = None) -> None:
    """Masked layout, FP8 ``a = (data [G, M_max, K], sfa [G, M_max, ceil(K/128)])`` and FP8
    ``b = (data [G, N, K], sfb [G, ceil(N/128), ceil(K/128)])`` (or per row ``[G, N, ...]``,
    recipe ``(1, 1, 128)``) or FP4 ``b = (int8 codes [G, N, K/2], sfb [G, N, ceil(K/32)])``;
    bf16 ``d [G, M_max, N]``.  Rows at or past ``masked_m[g]`` are left untouched.  Scales:
    float32 or packed UE8M0 (as :mod:`kernforge.ops.gemm`: an FP8 ``b``'s packed scales go to the
    kernel as they are on CUDA backends, sm_100a on 128-row tiles whatever ``expected_m``);
    ``sfa`` in DeepGEMM's per-group MN-major layout goes in without a copy."""
    (a_data, sfa), (b_data, sfb) = pair("a", a), pair("b", b)
    check_flags(compiled_dims, disable_ue8m0_cast)
    fp4 = _is_fp4(b)
    _check_tensor("a", a_data, torch.float8_e4m3fn)
    _check_tensor("b", b_data, torch.int8 if fp4 else torch.float8_e4m3fn)
    if a_data.dim() != 3 or b_data.dim() != 3 or a_data.shape[0] != b_data.shape[0] \
            or a_data.shape[2] != b_data.shape[2] * (2 if fp4 else 1):
        raise ValueError(f"a must be [G, M_max, K] and b [G, N, K{'/2' if fp4 else ''}], got "
                         f"{tuple(a_data.shape)} and {tuple(b_data.shape)}")
    groups, max_m, k = a_data.shape
    n = b_data.shape[1]
    if n == 0 or k == 0:
        raise ValueError(f"n and k must be positive, got n={n}, k={k}")
    _check_tensor("d", d, torch.bfloat16, (groups, max_m, n))
    _check_masked_m(masked_m, groups, max_m, expected_m)
    _, (gran_n, gran_k) = resolve_recipe(recipe, recipe_a, recipe_b, fp4, sfb)
    backend = backends.for_tensor(a_data, backend)
    packed = not fp4 and keep_packed(backend, sfa, sfb)
    # the arch the chooser keys on (resolved only where packed scales make it matter); a bad arch
    # fails here, with the other checks
    config_arch = target_arch(backend, arch, resolve=packed)
    sfa = mn_major(scales("sfa", sfa, (groups, max_m, -(-k // 128)), keep_packed=packed))
    sfb = scales("sfb", sfb, (groups, -(-n // gran_n), -(-k // gran_k)), keep_packed=packed).contiguous()
    if len({t.device for t in (a_data, sfa, b_data, sfb, d, masked_m)}) != 1:
        raise ValueError("a, b, their scales, d and masked_m must be on one device")
    if groups == 0 or max_m == 0:
        return
    if fp4:
        factory, cfg = kernel_defs.m_grouped_fp8_fp4_gemm_nt_masked, config.choose_fp8_fp4_masked(
            backend, groups, n, k, expected_m)
    else:
        factory, cfg = kernel_defs.m_grouped_fp8_gemm_nt_masked, config.choose_fp8_masked(
            backend, groups, n, k, expected_m, arch=config_arch, **_fp8_variant(packed, gran_n))
    _kernel(factory, backend, **built_for(arch), **cfg)(a_data, sfa, b_data, sfb, masked_m, d)


m_grouped_gemm_fp8_fp8_bf16_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous  # legacy v1 name
m_grouped_fp8_fp4_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous      # DeepGEMM's HEAD name
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked               # its FP8 alias
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked               # legacy alias
m_grouped_gemm_fp8_fp8_bf16_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked      # legacy v1 name


def choose_config(backend: str, groups: int, n: int, k: int, fp8: bool = False) -> dict:
    """The tile sizes these ops compile with at the current alignment: the family's
    choosers (:mod:`kernforge.kernels.grouped_gemm.config`)."""
    chooser = config.choose_fp8 if fp8 else config.choose
    return chooser(backend, groups, n, k, alignment=_alignment)


@functools.lru_cache(maxsize=None)
def _compiled(factory, backend: str, arch: Optional[str], params: tuple):
    return kernforge.compile(factory, backend=backend, arch=arch, **dict(params))


def _first_share(work: torch.Tensor, threads: int) -> float:
    """The share of ``work`` (per group of the masked layout: the grid's outer order, the row and N
    tiles inside) in its first ``1 / threads``, the CPU's first guided chunk; a group it takes part
    of counts in proportion."""
    total = float(work.sum())
    whole, part = divmod(work.numel() / threads, 1)
    first = float(work[:int(whole)].sum()) + (part * float(work[int(whole)]) if part else 0.0)
    return first / total if total else 0.0


def _workers(backend: str) -> int:
    """The host team size the bf16 choosers split the N tiles over (1 where blocks do not run in
    parallel on the host: oracles, emulators, GPUs)."""
    return backends.get(backend).workers() or 1


def _kernel(factory, backend: str, arch: Optional[str] = None, **params):
    return _compiled(factory, backend, arch, tuple(sorted(params.items())))


def _fp8_variant(packed: bool, gran_n: int) -> dict:
    """The FP8 x FP8 kernels' scale parameters where they differ from the defaults (float32, 128x128
    B blocks): packed UE8M0 words (``sf_format``), per-row B scales (``gran_n``)."""
    return {**({"sf_format": "ue8m0"} if packed else {}), **({"gran_n": gran_n} if gran_n != 128 else {})}


def _check_psum_hint(use_psum_layout: bool, expected_m) -> None:
    if expected_m is not None and not use_psum_layout:
        raise ValueError("expected_m_for_psum_layout is only valid with use_psum_layout=True")


def _is_fp4(b) -> bool:
    """An FP4 ``b`` pair: int8 data holding two e2m1 codes per byte."""
    return isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[0], torch.Tensor) \
        and b[0].dtype == torch.int8


def _check_masked_m(masked_m, groups: int, max_m: int, expected_m) -> None:
    if not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32 \
            or tuple(masked_m.shape) != (groups,) or not masked_m.is_contiguous():
        raise TypeError(f"masked_m must be a contiguous int32 [{groups}] tensor")
    if not capturing(masked_m) and ((masked_m < 0) | (masked_m > max_m)).any():
        raise ValueError(f"masked_m values must be in [0, {max_m}] (M_max), got {masked_m.tolist()}")
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"expected_m must be a positive int, got {expected_m!r}")


def _fp8_fp4_contiguous(a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                        disable_ue8m0_cast, use_psum_layout, backend, arch) -> None:
    """FP8 ``a = (data [M, K], sfa [M, ceil(K/128)])`` x FP4 ``b = (int8 codes [G, N, K/2],
    sfb [G, N, ceil(K/32)])``, bf16 ``d``; scales float32 or packed UE8M0, ``sfa`` MN-major
    without a copy (as :mod:`kernforge.ops.gemm`)."""
    (a_data, sfa), (b_data, sfb) = pair("a", a), pair("b", b)
    check_flags(compiled_dims, disable_ue8m0_cast)
    _check_tensor("a", a_data, torch.float8_e4m3fn)
    _check_tensor("b", b_data, torch.int8)
    if a_data.dim() != 2 or b_data.dim() != 3:
        raise ValueError(f"a must be [M, K] and b [G, N, K/2], got {tuple(a_data.shape)} and "
                         f"{tuple(b_data.shape)}")
    m, k = a_data.shape
    groups, n, half_k = b_data.shape
    if 2 * half_k != k:
        raise ValueError(f"K mismatch: a has {k}, b has {half_k} bytes (two FP4 codes each)")
    if n == 0 or k == 0 or groups == 0:
        raise ValueError(f"n, k and the group count must be positive, got n={n}, k={k}, G={groups}")
    _check_tensor("d", d, torch.bfloat16, (m, n))
    resolve_recipe(recipe, recipe_a, recipe_b, True, sfb)
    backend = backends.for_tensor(a_data, backend)
    target_arch(backend, arch, resolve=False)
    sfa = mn_major(scales("sfa", sfa, (m, -(-k // 128))))
    sfb = scales("sfb", sfb, (groups, n, -(-k // kernel_defs.FP4_GRAN_K))).contiguous()
    if len({t.device for t in (a_data, sfa, b_data, sfb, d)}) != 1:
        raise ValueError("a, b, their scales and d must be on one device")
    if m == 0:
        return
    m_indices = _row_experts(grouped_layout, m, groups, use_psum_layout)
    # the fp8 kernel's tiles: the FP4 kernel's K steps are fixed at 128, A's scale width
    kernel = _kernel(kernel_defs.m_grouped_fp8_fp4_gemm_nt_contiguous, backend, **built_for(arch),
                     **config.choose_fp8_fp4(backend, groups, n, k, alignment=_alignment))
    kernel(a_data, sfa, b_data, sfb, m_indices, d)


def _check_tensor(name: str, t, dtype, shape=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (K-major)")


def _check_shapes(a, b, d) -> tuple[int, int, int, int]:
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(f"a must be [M, K] and b [G, N, K], got {tuple(a.shape)} and {tuple(b.shape)}")
    m, k = a.shape
    groups, n, kb = b.shape
    if kb != k:
        raise ValueError(f"K mismatch: a has {k}, b has {kb}")
    if n == 0 or k == 0 or groups == 0:
        raise ValueError(f"n, k and the group count must be positive, got n={n}, k={k}, G={groups}")
    _check_tensor("d", d, torch.bfloat16, (m, n))
    if len({a.device, b.device, d.device}) != 1:
        raise ValueError("a, b and d must be on one device")
    return m, n, k, groups


def _row_experts(layout, m: int, groups: int, use_psum_layout: bool) -> torch.Tensor:
    """The per-row expert index the kernel reads, checked against the alignment rules."""
    if not isinstance(layout, torch.Tensor) or layout.dtype != torch.int32 or not layout.is_contiguous():
        raise TypeError("grouped_layout must be a contiguous int32 tensor")
    if use_psum_layout:
        return _psum_to_indices(layout, m, groups)
    if tuple(layout.shape) != (m,):
        raise ValueError(f"grouped_layout must have shape ({m},) (one expert id per row), got "
                         f"{tuple(layout.shape)}")
    if capturing(layout):
        return layout
    ids = layout.long()
    if ((ids < -1) | (ids >= groups)).any():
        raise ValueError(f"grouped_layout ids must be -1 (padding) or in [0, {groups})")
    pad = (-m) % _alignment
    blocks = torch.nn.functional.pad(ids, (0, pad), value=-1).view(-1, _alignment)
    first = blocks[:, :1]
    bad = ((blocks != first) & (blocks != -1)).any(dim=1) | ((first[:, 0] == -1) & (blocks != -1).any(dim=1))
    if bad.any():
        row = int(bad.nonzero()[0]) * _alignment
        raise ValueError(f"grouped_layout rows {row}..{row + _alignment - 1}: each aligned block of "
                         f"{_alignment} rows must hold one expert id (its first row), then only -1 "
                         "padding; every expert segment must start on a multiple of the alignment")
    return layout


def _psum_to_indices(ends: torch.Tensor, m: int, groups: int) -> torch.Tensor:
    """PSUM layout -> per-row ids: group g spans ``[align(end[g-1]), end[g])``, gaps are -1.
    Computed on the ends' device without reading them on the host (a CUDA graph can capture
    it); only the range check reads them, and it is skipped while capturing."""
    if tuple(ends.shape) != (groups,):
        raise ValueError(f"with use_psum_layout, grouped_layout must be [{groups}] cumulative ends")
    e = ends.long()
    starts = torch.cat([torch.zeros(1, dtype=torch.long, device=e.device),
                        (e[:-1] + _alignment - 1) // _alignment * _alignment])
    if not capturing(ends) and ((e < starts).any() or (e > m).any()):
        raise ValueError(f"psum grouped_layout must be non-decreasing cumulative ends within [0, {m}]"
                         f" with each group starting at the aligned end of the previous one, got "
                         f"{ends.tolist()}")
    rows = torch.arange(m, device=e.device)
    group = torch.searchsorted(e, rows, right=True)  # the first group whose end lies past the row
    inside = group < groups
    inside &= rows >= starts.index_select(0, group.clamp(max=max(groups - 1, 0)))
    return torch.where(inside, group, torch.full_like(group, -1)).to(torch.int32)
