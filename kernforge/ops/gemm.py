"""DeepGEMM's dense block-scaled GEMMs on kernforge kernels: ``d = [c +] a @ b^T``.

``fp8_fp4_gemm_{nt,nn,tn,tt}`` (aliases ``fp8_gemm_*``, legacy ``gemm_fp8_fp8_bf16_nt``) take
DeepGEMM's arguments (the upstream spec ``deepgemm-grouped.md`` §1-§2) and write ``d`` in
place; ``backend=`` picks the kernforge backend (default: by the tensors' device).

* ``a``, ``b`` are ``(data, scale_factor)`` pairs.  Data: e4m3, or for ``b`` int8 holding two
  e2m1 FP4 codes (element ``2i`` in the low nibble, K halved).  ``nt`` takes ``a [M, K]``,
  ``b [N, K]``, each K-major (contiguous) or MN-major (its transpose contiguous, a
  ``.T`` view: what ``nn``/``tn``/``tt`` pass on, as DeepGEMM's do; FP4 ``b`` K-major only).
* Scales, DeepGEMM's recipes: ``a`` per token 1x128 (``sfa [M, ceil(K/128)]``); FP8 ``b``
  per 128x128 block (``sfb [ceil(N/128), ceil(K/128)]``, recipe ``(1, 128, 128)``, the
  default for float32 scales) or per row 1x128 (``[N, ceil(K/128)]``, recipe ``(1, 1, 128)``,
  the default for packed int scales); FP4 ``b`` per 1x32 (``[N, ceil(K/32)]``).  Each may be
  float32 or UE8M0 packed four per int32 along K (DeepGEMM's SM100 form, byte ``j`` of word
  ``p`` = exponent of scale ``4p + j``), which is unpacked on the host into float32 powers of
  two (exact; byte ``e`` is ``2^(e - 127)`` and 255 is NaN, as the tensor cores read it) -- except on CUDA backends when both FP8 scales are packed: the kernel then
  takes them as they are (``fp8_gemm(sf_format="ue8m0")``, byte ``e`` read as ``2^(e - 127)``,
  255 as NaN, as DeepGEMM's tensor cores read it), which on sm_100a runs block-scaled
  ``tcgen05.mma`` with the factors in tensor memory (on 128-row tiles whatever M or ``c``: the
  only block-scaled MMA shape).  ``sfa`` in DeepGEMM's required layout
  (MN-major: ``stride(-2) == 1``, ``stride(-1) >= M``, e.g. TMA-aligned ``align(M, 4)``) goes to
  the kernel without a copy;
  any other layout is converted per call, as DeepGEMM does.  ``sfb`` is made contiguous.
* ``disable_ue8m0_cast``: float32 scales are always used as they are, which is DeepGEMM's
  SM90 behaviour; its SM100 cast requires powers of two, for which it is exact, so results
  agree wherever DeepGEMM runs.  ``compiled_dims`` is checked and otherwise informational:
  kernforge always compiles N and K (and the majors) and keeps M symbolic.
* ``d`` bf16 or float32, row-major; ``c`` optional, same dtype and shape; ``c is d``
  accumulates in place, otherwise ``d`` is copied from ``c`` first (DeepGEMM's rule).  Both
  dtypes work with every recipe (a superset of DeepGEMM's per-kernel restrictions).
* ``m == 0`` or ``n == 0``: no-op; ``k == 0``: ``d = c`` or 0.  FP4 ``a`` is not supported.
* ``arch`` (kernforge's, keyword-only, CUDA backends only): the CUDA arch to build for; default the
  GPU's on ``cuda`` and the emulator's sm_90a on ``cuda-emu`` (``arch="sm_100a"`` emulates B200's
  block-scaled path).  See :func:`target_arch`.

``bf16_gemm_{nt,nn,tn,tt}`` (DeepGEMM's names) take plain bf16 ``a``, ``b`` (no scales) and
``fp32_gemm_*`` float32 ones (the float32 model's linears; DeepGEMM has none): same majors,
``d``/``c`` rules and trivial sizes, on the unscaled ``dense_gemm`` kernel.

Every check runs before anything is launched or written, with a typed error naming the
argument.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

import kernforge
from kernforge import backends
from kernforge.kernels import gemm as kernels
from kernforge.kernels.gemm import config
from kernforge.kernels.gemm.reference import get_mn_major_tma_aligned_tensor, unpack_ue8m0_from_int
from kernforge.ops.arch import built_for, target_arch
from kernforge.tune import consult

__all__ = ["bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn", "bf16_gemm_tt", "fp32_gemm_nn", "fp32_gemm_nt",
           "fp32_gemm_tn", "fp32_gemm_tt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_nt", "fp8_fp4_gemm_tn",
           "fp8_fp4_gemm_tt", "fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_tn", "fp8_gemm_tt", "gemm_fp8_fp8_bf16_nt"]

FP8 = torch.float8_e4m3fn
FP4 = torch.int8


def fp8_fp4_gemm_nt(a: tuple, b: tuple, d: torch.Tensor, c: Optional[torch.Tensor] = None, recipe=None,
                    recipe_a=None, recipe_b=None, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False, *,
                    backend: Optional[str] = None, arch: Optional[str] = None) -> None:
    """``d = [c +] a @ b^T`` for ``a = (data [M, K], sfa)``, ``b = (data [N, K], sfb)``."""
    (a_data, sfa), (b_data, sfb) = pair("a", a), pair("b", b)
    check_flags(compiled_dims, disable_ue8m0_cast)
    if not isinstance(a_data, torch.Tensor) or a_data.dtype != FP8:
        if isinstance(a_data, torch.Tensor) and a_data.dtype == FP4:
            raise NotImplementedError("a: FP4 activations are not supported (only b may be FP4)")
        raise TypeError(f"a must be {FP8}, got {_dtype(a_data)}")
    if not isinstance(b_data, torch.Tensor) or b_data.dtype not in (FP8, FP4):
        raise TypeError(f"b must be {FP8} or int8 (packed FP4), got {_dtype(b_data)}")
    fp4 = b_data.dtype == FP4
    a_major, b_major = _major("a", a_data), _major("b", b_data)
    if fp4 and b_major != "k":
        raise NotImplementedError("b: FP4 operands must be K-major (MN-major FP4 is not supported)")
    m, k = a_data.shape
    n, kb = b_data.shape
    if kb * (2 if fp4 else 1) != k:
        raise ValueError(f"K mismatch: a has {k}, b has {kb}{' bytes (two FP4 codes each)' if fp4 else ''}")
    _check_out("d", d, (m, n))
    if c is not None:
        _check_out("c", c, (m, n))
        if c.dtype != d.dtype:
            raise TypeError(f"c must have d's dtype {d.dtype}, got {c.dtype}")
    gran_a, (gran_n, gran_k) = resolve_recipe(recipe, recipe_a, recipe_b, fp4, sfb)
    backend = backends.for_tensor(a_data, backend)
    # DeepGEMM's SM100 form straight to the kernel: no host unpacking, block-scaled MMAs on sm_100a
    packed = not fp4 and keep_packed(backend, sfa, sfb)
    # the arch the chooser keys on (resolved only where packed scales make it matter); a bad arch
    # fails here, with the other checks
    config_arch = target_arch(backend, arch, resolve=packed)
    sfa = scales("sfa", sfa, (m, -(-k // 128)), keep_packed=packed)
    sfb = scales("sfb", sfb, (-(-n // gran_n), -(-k // gran_k)), keep_packed=packed).contiguous()
    sfa = mn_major(sfa)
    tensors = [a_data, sfa, b_data, sfb, d] + ([c] if c is not None else [])
    if len({t.device for t in tensors}) != 1:
        raise ValueError("a, b, their scales, d and c must be on one device")
    if m == 0 or n == 0:
        return
    if k == 0:
        if c is None:
            d.zero_()
        else:
            d.copy_(c)
        return
    accumulate = c is not None
    if accumulate and not _same_storage(c, d):
        d.copy_(c)
    variant = dict(accumulate=accumulate, out_dtype=_DTYPE_NAMES[d.dtype])
    if packed:
        variant["sf_format"] = "ue8m0"
    if fp4:
        kernel = _kernel(kernels.fp8_fp4_gemm, backend, **built_for(arch), **config.choose(backend, n, k, m, **variant))
    else:
        variant.update(a_major=a_major, b_major=b_major, gran_n=gran_n)
        kernel = _kernel(kernels.fp8_gemm, backend, **built_for(arch),
                         **config.choose(backend, n, k, m, arch=config_arch, **variant))
    kernel(a_data if a_major == "k" else a_data.t(), sfa, b_data if b_major == "k" else b_data.t(), sfb, d)


def fp8_fp4_gemm_nn(a: tuple, b: tuple, d: torch.Tensor, c: Optional[torch.Tensor] = None, recipe=None,
                    recipe_a=None, recipe_b=None, compiled_dims: str = "nk", disable_ue8m0_cast: bool = False, *,
                    backend: Optional[str] = None, arch: Optional[str] = None) -> None:
    """``b = (data [K, N], sfb)`` given transposed (scales too): ``nt`` on ``b``'s transpose."""
    fp8_fp4_gemm_nt(a, _transposed("b", b), d, c, recipe, recipe_a, recipe_b, compiled_dims,
                    disable_ue8m0_cast, backend=backend, arch=arch)


def fp8_fp4_gemm_tn(a: tuple, b: tuple, d: torch.Tensor, c: Optional[torch.Tensor] = None, recipe=None,
                    recipe_a=None, recipe_b=None, compiled_dims: str = "mn", disable_ue8m0_cast: bool = False, *,
                    backend: Optional[str] = None, arch: Optional[str] = None) -> None:
    """``a = (data [K, M], sfa [ceil(K/128), M])`` and ``b = (data [K, N], sfb)`` transposed."""
    fp8_fp4_gemm_nt(_transposed("a", a), _transposed("b", b), d, c, recipe, recipe_a, recipe_b, compiled_dims,
                    disable_ue8m0_cast, backend=backend, arch=arch)


def fp8_fp4_gemm_tt(a: tuple, b: tuple, d: torch.Tensor, c: Optional[torch.Tensor] = None, recipe=None,
                    recipe_a=None, recipe_b=None, compiled_dims: str = "mn", disable_ue8m0_cast: bool = False, *,
                    backend: Optional[str] = None, arch: Optional[str] = None) -> None:
    """``a = (data [K, M], sfa [ceil(K/128), M])`` transposed, ``b`` as in ``nt``."""
    fp8_fp4_gemm_nt(_transposed("a", a), b, d, c, recipe, recipe_a, recipe_b, compiled_dims,
                    disable_ue8m0_cast, backend=backend, arch=arch)


fp8_gemm_nt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt = fp8_fp4_gemm_nt, fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt


# ---- unscaled dense GEMMs: DeepGEMM's bf16_gemm_*, and float32 ones for a float32 model -----------

def _dense_gemm(operand_dtype: torch.dtype, a, b, d, c, compiled_dims: str, backend: Optional[str],
                a_t: bool = False, b_t: bool = False) -> None:
    """``d = [c +] A @ B^T`` for ``A [M, K]``, ``B [N, K]`` of ``operand_dtype`` (each K-major
    or an MN-major ``.T`` view), on :func:`~kernforge.kernels.gemm.dense_gemm`; ``A`` is
    ``a``, or ``a``'s transpose when ``a_t`` (the ``tn``/``tt`` forms), likewise ``B``.

    A call whose signature (every operand's dtype, shape, strides and device, the flags, the
    backend, and the tuning database's :func:`~kernforge.tune.consult.stamp`) passed the
    checks before reuses the launch bound then (:meth:`CompiledKernel.bind`): each check
    depends on nothing else, so only ``c``'s aliasing of ``d`` is looked at again.  Why: at
    decode (M = 1-8) the checks, the chooser and the kernel object's argument plan cost more
    than the kernel (benchmarks/bench_launch_overhead.py); a new signature, and so any bad
    argument, still goes through every check before anything is written."""
    try:
        key = (operand_dtype, _sig(a), _sig(b), _sig(d), None if c is None else _sig(c), compiled_dims, backend,
               a_t, b_t, consult.stamp())
        hit = _DENSE_CALLS.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable flag: the checks name it
        key, hit = None, None
    if hit is None:
        hit = _dense_gemm_checked(operand_dtype, _t("a", a) if a_t else a, _t("b", b) if b_t else b, d, c,
                                  compiled_dims, backend)
        if hit is None:
            return
        kernel, a_mn, b_mn = hit
        flip_a, flip_b = a_t != a_mn, b_t != b_mn  # the kernel reads a itself when a_t and A is MN-major
        run = kernel.bind(a.t() if flip_a else a, b.t() if flip_b else b, d)
        hit = (run or kernel, flip_a, flip_b, run is not None)
        if key is not None:
            if len(_DENSE_CALLS) >= _DENSE_CALLS_SIZE:
                _DENSE_CALLS.clear()
            _DENSE_CALLS[key] = hit
    launch, flip_a, flip_b, bound = hit
    if c is not None and not _same_storage(c, d):
        d.copy_(c)
    args = (a.t() if flip_a else a, b.t() if flip_b else b, d)
    if bound:
        launch(args)
    else:
        launch(*args)


_DENSE_CALLS: dict = {}  # call signature -> (bound launch or kernel, flip a, flip b, bound?)
_DENSE_CALLS_SIZE = 1024


def _sig(t: torch.Tensor) -> tuple:
    return t.dtype, t.shape, t.stride(), t.device


def _dense_gemm_checked(operand_dtype: torch.dtype, a, b, d, c, compiled_dims: str, backend: Optional[str]):
    """Every check of :func:`_dense_gemm`, then its kernel and the operands' majors; None when
    the call is trivial (``m``, ``n`` or ``k`` zero), which is done here."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != operand_dtype:
            raise TypeError(f"{name} must be a {operand_dtype} tensor, got {_dtype(t)}")
    check_flags(compiled_dims, False)
    a_major, b_major = _major("a", a), _major("b", b)
    m, k = a.shape
    n, kb = b.shape
    if kb != k:
        raise ValueError(f"K mismatch: a has {k}, b has {kb}")
    _check_out("d", d, (m, n))
    if c is not None:
        _check_out("c", c, (m, n))
        if c.dtype != d.dtype:
            raise TypeError(f"c must have d's dtype {d.dtype}, got {c.dtype}")
    if len({t.device for t in (a, b, d) + ((c,) if c is not None else ())}) != 1:
        raise ValueError("a, b, d and c must be on one device")
    if m == 0 or n == 0:
        return None
    if k == 0:
        if c is None:
            d.zero_()
        else:
            d.copy_(c)
        return None
    backend = backends.for_tensor(a, backend)
    kernel = _kernel(kernels.dense_gemm, backend,
                     **config.choose_dense(backend, n, k, m, a_major=a_major, b_major=b_major, accumulate=c is not None,
                                           dtype=_DTYPE_NAMES[operand_dtype], out_dtype=_DTYPE_NAMES[d.dtype]))
    return kernel, a_major == "mn", b_major == "mn"


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: Optional[torch.Tensor] = None,
                 compiled_dims: str = "nk", *, backend: Optional[str] = None) -> None:
    """DeepGEMM's ``bf16_gemm_nt``: ``d = [c +] a @ b^T``, ``a [M, K]``, ``b [N, K]`` bf16,
    ``d`` (and ``c``) bf16 or float32, accumulated in float32."""
    _dense_gemm(torch.bfloat16, a, b, d, c, compiled_dims, backend)


def bf16_gemm_nn(a, b, d, c=None, compiled_dims: str = "nk", *, backend: Optional[str] = None) -> None:
    """``b [K, N]``: ``nt`` on ``b``'s transpose."""
    _dense_gemm(torch.bfloat16, a, b, d, c, compiled_dims, backend, b_t=True)


def bf16_gemm_tn(a, b, d, c=None, compiled_dims: str = "mn", *, backend: Optional[str] = None) -> None:
    """``a [K, M]``, ``b [K, N]``: ``nt`` on both transposes."""
    _dense_gemm(torch.bfloat16, a, b, d, c, compiled_dims, backend, a_t=True, b_t=True)


def bf16_gemm_tt(a, b, d, c=None, compiled_dims: str = "mn", *, backend: Optional[str] = None) -> None:
    """``a [K, M]``, ``b [N, K]``: ``nt`` on ``a``'s transpose."""
    _dense_gemm(torch.bfloat16, a, b, d, c, compiled_dims, backend, a_t=True)


def fp32_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: Optional[torch.Tensor] = None,
                 compiled_dims: str = "nk", *, backend: Optional[str] = None) -> None:
    """``bf16_gemm_nt`` with float32 ``a`` and ``b`` (not in DeepGEMM; the float32 reference
    model's linears need it): float32 products summed in float32."""
    _dense_gemm(torch.float32, a, b, d, c, compiled_dims, backend)


def fp32_gemm_nn(a, b, d, c=None, compiled_dims: str = "nk", *, backend: Optional[str] = None) -> None:
    _dense_gemm(torch.float32, a, b, d, c, compiled_dims, backend, b_t=True)


def fp32_gemm_tn(a, b, d, c=None, compiled_dims: str = "mn", *, backend: Optional[str] = None) -> None:
    _dense_gemm(torch.float32, a, b, d, c, compiled_dims, backend, a_t=True, b_t=True)


def fp32_gemm_tt(a, b, d, c=None, compiled_dims: str = "mn", *, backend: Optional[str] = None) -> None:
    _dense_gemm(torch.float32, a, b, d, c, compiled_dims, backend, a_t=True)


def _t(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
    return t.t()


def gemm_fp8_fp8_bf16_nt(lhs: tuple, rhs: tuple, out: torch.Tensor, *, backend: Optional[str] = None) -> None:
    """DeepGEMM v1's name: ``fp8_gemm_nt`` with the default recipe."""
    fp8_fp4_gemm_nt(lhs, rhs, out, backend=backend)


# ---- checks and conversions shared with kernforge.ops.grouped_gemm --------------------------------

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _dtype(x) -> str:
    return str(x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__


def pair(name: str, x):
    """``x`` as a ``(data, scale_factor)`` pair (DeepGEMM's FP8/FP4 operand form)."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name} must be a (data, scale_factor) pair for FP8/FP4")
    return x


def check_flags(compiled_dims, disable_ue8m0_cast) -> None:
    if not isinstance(compiled_dims, str) or not set(compiled_dims) <= set("mnk"):
        raise ValueError(f"compiled_dims must be a string of the letters m, n, k, got {compiled_dims!r}")
    if not isinstance(disable_ue8m0_cast, bool):
        raise TypeError(f"disable_ue8m0_cast must be a bool, got {type(disable_ue8m0_cast).__name__}")


def _major(name: str, t: torch.Tensor) -> str:
    """'k' for a contiguous ``[MN, K]`` operand, 'mn' for the transpose view of a contiguous
    ``[K, MN]`` one; anything else has no layout a kernel reads."""
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [MN, K], got shape {tuple(t.shape)}")
    if t.is_contiguous():
        return "k"
    if t.t().is_contiguous():
        return "mn"
    raise ValueError(f"{name} must be K-major (contiguous) or MN-major (its transpose contiguous), "
                     f"got strides {t.stride()}")


def _check_out(name: str, t, shape: tuple) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPE_NAMES:
        raise TypeError(f"{name} must be torch.bfloat16 or torch.float32, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (row-major, N contiguous)")


def _same_storage(c: torch.Tensor, d: torch.Tensor) -> bool:
    return c.data_ptr() == d.data_ptr() and c.stride() == d.stride()


def _transposed(name: str, x) -> tuple:
    data, sf = pair(name, x)
    for what, t in ((name, data), (f"{name}'s scale factor", sf)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{what} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
    return data.t(), sf.t()


def resolve_recipe(recipe, recipe_a, recipe_b, fp4: bool, sfb) -> tuple[tuple, tuple]:
    """``((gran_m, gran_k) of a, (gran_n, gran_k) of b)`` from DeepGEMM's ``recipe`` or
    ``recipe_a``/``recipe_b``, with its defaults: a 1x128; FP8 b 128x128 for float32 scales,
    1x128 for packed ones; FP4 b 1x32."""
    if recipe is not None and (recipe_a is not None or recipe_b is not None):
        raise ValueError("give recipe or recipe_a/recipe_b, not both")
    if (recipe_a is None) != (recipe_b is None):
        raise ValueError("recipe_a and recipe_b go together")
    packed = isinstance(sfb, torch.Tensor) and sfb.dtype == torch.int32
    want_b = (1, 32) if fp4 else ((1, 128) if packed else (128, 128))
    given_a, given_b = (1, 128), want_b
    if recipe is not None:
        if not isinstance(recipe, (tuple, list)) or len(recipe) != 3:
            raise ValueError(f"recipe must be (gran_m, gran_n, gran_k), got {recipe!r}")
        given_a, given_b = (recipe[0], recipe[2]), (recipe[1], recipe[2])
    elif recipe_a is not None:
        if any(not isinstance(r, (tuple, list)) or len(r) != 2 for r in (recipe_a, recipe_b)):
            raise ValueError(f"recipe_a and recipe_b must be (gran_mn, gran_k), got {recipe_a!r}, {recipe_b!r}")
        given_a, given_b = tuple(recipe_a), tuple(recipe_b)
    supported_b = {(1, 32)} if fp4 else ({(1, 128)} if packed else {(128, 128), (1, 128)})
    if tuple(given_a) != (1, 128) or tuple(given_b) not in supported_b:
        raise NotImplementedError(
            f"recipe a={tuple(given_a)}, b={tuple(given_b)} is not supported for {'FP4' if fp4 else 'FP8'} b "
            f"with {'packed UE8M0' if packed else 'float32'} scales: a must be (1, 128), b one of "
            f"{sorted(supported_b)}")
    return tuple(given_a), tuple(given_b)


def scales(name: str, sf, shape: tuple, keep_packed: bool = False) -> torch.Tensor:
    """Scale factors of logical ``shape`` as float32: float32 of that shape, or UE8M0 packed
    four per int32 along the last dim (``shape[:-1] + (ceil(shape[-1] / 4),)``), unpacked
    (``keep_packed``: checked and returned packed)."""
    if not isinstance(sf, torch.Tensor) or sf.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"{name} must be a float32 or packed-UE8M0 int32 tensor, got {_dtype(sf)}")
    if sf.dtype == torch.float32:
        if tuple(sf.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(sf.shape)}")
        return sf
    packed = shape[:-1] + (-(-shape[-1] // 4),)
    if tuple(sf.shape) != packed:
        raise ValueError(f"{name} (packed UE8M0, 4 per int32) must have shape {packed}, got {tuple(sf.shape)}")
    return sf if keep_packed else unpack_ue8m0_from_int(sf, shape[-1])


def keep_packed(backend: str, sfa, sfb) -> bool:
    """Whether packed UE8M0 scales go to the kernel as they are (``sf_format="ue8m0"``): both
    int32, on a backend that generates CUDA.  There the kernel reads DeepGEMM's words itself (sm_100a
    in the tensor cores, other archs in its promotion), so nothing is unpacked on the host; host
    backends take the float32 powers of two (their kernels promote in float32 anyway)."""
    return backends.lang(backend) == "cuda" and all(
        isinstance(sf, torch.Tensor) and sf.dtype == torch.int32 for sf in (sfa, sfb))


def mn_major(sf: torch.Tensor) -> torch.Tensor:
    """``sf [..., MN, k]`` in the layout the kernels read, DeepGEMM's required one
    (``stride(-2) == 1``; the other strides are bound at launch, so a TMA-aligned
    ``stride(-1) == align(MN, 4)`` and any group stride work): passed through when it
    already is (no copy), converted otherwise, as DeepGEMM converts other layouts per call."""
    return sf if sf.stride(-2) == 1 or sf.shape[-2] <= 1 else get_mn_major_tma_aligned_tensor(sf)


@functools.lru_cache(maxsize=None)
def _compiled(factory, backend: str, arch: Optional[str], params: tuple):
    return kernforge.compile(factory, backend=backend, arch=arch, **dict(params))


def _kernel(factory, backend: str, arch: Optional[str] = None, **params):
    """``factory`` compiled for ``backend`` (and ``arch``, where the call named one) with ``params``,
    once per process."""
    return _compiled(factory, backend, arch, tuple(sorted(params.items())))
