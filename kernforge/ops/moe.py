"""TileKernels' MoE permutation ops and the SwiGLU expert activation on kernforge kernels.

``get_fused_mapping``, ``expand_to_fused``, ``expand_to_fused_with_sf`` and
``reduce_fused`` take TileKernels' arguments and return what it returns (upstream spec
``deepgemm-grouped.md`` §6); ``swiglu`` is the expert activation between the two grouped
GEMMs.  ``backend=`` picks the kernforge backend (default: the one
:func:`kernforge.backends.for_tensor` gives the input's device).

Defined where TileKernels leaves things open:

* inside an expert's segment, valid rows come in flat slot order (token, then slot), so
  the mapping is deterministic on every backend (TileKernels: unspecified order);
* ``reduce_fused`` adds a token's terms in slot order, in float32;
* index values are checked on the host before launch (ids in ``[-1, E)``, positions in
  ``[-1, N)``), except while a CUDA graph is being captured
  (:mod:`kernforge.ops._capture`); the kernels skip out-of-range values as well, so
  nothing is read or written out of bounds even then.  A caller's
  ``num_expanded_tokens`` too small for the routing drops the rows past it
  (``token_topk_to_pos = -1`` for them) instead of writing past the buffers;
* ``expand_to_fused`` zeroes padding rows (and their scales) whatever the token count.
"""
from __future__ import annotations

import functools
import threading
from typing import Optional, Union

import torch

import kernforge
from kernforge import backends
from kernforge.kernels.moe_permute import config as permute_config
from kernforge.kernels.moe_permute import kernel as permute
from kernforge.kernels.swiglu import config as swiglu_config
from kernforge.kernels.swiglu import kernel as swiglu_kernel
from kernforge.ops._capture import capturing
from kernforge.ops._launch import Bound, chosen, launch
from kernforge.tune import consult

#: the segment alignments TileKernels' tests and DeepGEMM's SM90 grouped GEMMs use
ALIGNMENTS = (64, 128)
#: the scan runs one block over all experts (a fragment of E counters)
MAX_EXPERTS = 1024
_INT32_MAX = 2 ** 31 - 1
#: up to this many values a CPU range check reads them to the host (1 us at T = 1, k = 6)
#: rather than reducing on the device (aminmax + stack + read: 3.3 us)
_HOST_SCAN = 64
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
                torch.float8_e4m3fn: "float8_e4m3"}
_DTYPES = tuple(_DTYPE_NAMES)


# ---------------------------------------------------------------- get_fused_mapping


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int,
                      force_no_sync: bool = False, *, backend: Optional[str] = None):
    """``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
    expert_end, num_tokens_per_expert, num_tokens_per_expert_list)`` for int64
    ``topk_idx [T, k]``: int32 tensors and a list.

    Expert ``e`` owns rows ``[expert_start[e], expert_end[e])`` of the expanded buffer,
    ``num_tokens_per_expert[e]`` (its slot count rounded up to ``alignment``) long; valid
    rows first, in flat slot order, then padding (``-1`` in all three ``pos_to_*``).
    ``pos_to_token_topk = token * k + slot``; ``-1`` slots are skipped.
    ``num_expanded_tokens = 0``: the buffer is sized for the worst case
    ``floor((T*k + (alignment-1)*E) / alignment) * alignment``, then trimmed to the real
    total after a host sync, which also fills the list.  With ``force_no_sync`` give a
    non-zero upper bound instead: nothing is trimmed, rows past the segments stay ``-1``,
    the list is empty."""
    _check_tensor("topk_idx", topk_idx, (torch.int64,), dim=2)
    t, k = topk_idx.shape
    dev = topk_idx.device
    settings = (t, k, num_experts, num_expanded_tokens, alignment, force_no_sync, backend, dev, consult.stamp())
    try:
        plan = _mapping_plan(*settings)
    except TypeError as unhashable:    # an unhashable argument: checked uncached (and rejected there)
        if not str(unhashable).startswith("unhashable"):
            raise
        plan = _mapping_plan.__wrapped__(*settings)
    n, sync, chunks, (scan, scatter) = plan
    if not capturing(topk_idx) and _out_of_range(topk_idx, -1, num_experts):
        bad = topk_idx[(topk_idx < -1) | (topk_idx >= num_experts)][:4].tolist()
        raise ValueError(f"topk_idx values must be in [-1, {num_experts}) (num_experts), got {bad}")
    # separate allocations: the outputs must not alias each other (torch.library's custom ops,
    # kernforge.ops.torch_library, refuse aliased returns).  Sizes as ints, not tuples: a
    # tuple costs torch 0.5 us more per tensor, and a decode step allocates seven here
    i32, e = torch.int32, num_experts
    expert_start, expert_end = torch.empty(e, dtype=i32, device=dev), torch.empty(e, dtype=i32, device=dev)
    per_expert = torch.empty(e, dtype=i32, device=dev)
    pos_to_expert, pos_to_token = torch.empty(n, dtype=i32, device=dev), torch.empty(n, dtype=i32, device=dev)
    pos_to_token_topk, token_topk_to_pos = torch.empty(n, dtype=i32, device=dev), torch.empty(t, k, dtype=i32,
                                                                                                device=dev)
    chunk_offset, expert_count = _mapping_scratch(dev, chunks, e)
    scan((topk_idx, chunk_offset, expert_count, expert_start, expert_end, per_expert))
    scatter((topk_idx, chunk_offset, expert_count, expert_start, expert_end, pos_to_expert, pos_to_token,
             pos_to_token_topk, token_topk_to_pos))
    per_expert_list: list[int] = []
    if sync:
        per_expert_list = per_expert.tolist()
        total = sum(per_expert_list)
        for v in (pos_to_expert, pos_to_token, pos_to_token_topk):   # shrink in place: a view costs 2x more
            v.resize_(total)
    return (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
            per_expert, per_expert_list)


@functools.lru_cache(maxsize=1024, typed=True)
def _mapping_plan(t: int, k: int, num_experts, num_expanded_tokens, alignment, force_no_sync, backend,
                  device: torch.device, stamp: tuple) -> tuple:
    """:func:`get_fused_mapping`'s scalar arguments checked, and what follows from them alone:
    ``(rows, sync, chunks, ((scan key, scan factory), (scatter key, scatter factory)))``.
    Memoised (types in the key: ``True`` is not ``1`` here) because a decode step maps the
    same shapes every layer, and at T = 1 these checks and choices cost more than the kernels.
    ``stamp`` (:func:`kernforge.tune.consult.stamp`) keys the kernel choice to the tuning
    database's state, as :func:`launch` keys its bound launches."""
    num_experts = _positive_int("num_experts", num_experts)
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"num_experts must be at most {MAX_EXPERTS}, got {num_experts}")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
    if isinstance(num_expanded_tokens, bool) or not isinstance(num_expanded_tokens, int) or num_expanded_tokens < 0:
        raise ValueError(f"num_expanded_tokens must be a non-negative int, got {num_expanded_tokens!r}")
    if not isinstance(force_no_sync, bool):
        raise TypeError(f"force_no_sync must be a bool, got {type(force_no_sync).__name__}")
    if force_no_sync and num_expanded_tokens == 0:
        raise ValueError("force_no_sync=True needs a non-zero num_expanded_tokens (an upper bound): "
                         "0 asks for the host sync that sizes the buffer")
    if k == 0:
        raise ValueError("topk_idx must have at least one column (num_topk > 0)")
    bound = (t * k + (alignment - 1) * num_experts) // alignment * alignment
    if max(bound, num_expanded_tokens) > _INT32_MAX:
        raise ValueError(f"the expanded buffer ({max(bound, num_expanded_tokens)} rows) does not fit int32 positions")
    sync = num_expanded_tokens == 0
    n = bound if sync else num_expanded_tokens
    if backend is None:
        name = backends.for_device(device.type)
    else:
        backends.entry(backend)     # an unknown name: BackendError
        name = backend
    choice = (name, k, num_experts, alignment)
    scan, scatter = chosen(("moe_mapping",) + choice, lambda: _mapping_params(*choice))
    chunks = permute_config.num_chunks(t * k, scan["chunk"])
    # the host-synced path trims the rows past the last segment: they need no -1 fill (the
    # scatter's default, so its parameters are the chooser's, as the engine's kernel pack lists them)
    return n, sync, chunks, (Bound(("moe_mapping_scan", device, t) + choice,
                                   lambda: _kernel(permute.moe_mapping_scan, name, **scan)),
                             Bound(("moe_mapping_scatter", device, t, n, sync) + choice,
                                   lambda: _kernel(permute.moe_mapping_scatter, name,
                                                   **(scatter if sync else dict(scatter, fill_tail=True)))))


_SCRATCH = threading.local()     # per thread: {(chunks, experts): (chunk_offset, expert_count)}


def _mapping_scratch(device: torch.device, chunks: int, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan's working tensors ``chunk_offset [chunks, E]`` and ``expert_count [E]``, which
    the scan writes whole and the scatter reads, and which are not returned.  On the host a
    launch runs to completion in the calling thread before the op returns, so one pair per
    thread and shape is never in use by two calls at once and is reused (two allocations
    less per call at decode); on a device, where launches are queued, fresh tensors each time."""
    if device.type != "cpu":
        return (torch.empty(chunks, experts, dtype=torch.int32, device=device),
                torch.empty(experts, dtype=torch.int32, device=device))
    cache = getattr(_SCRATCH, "pairs", None)
    if cache is None:
        cache = _SCRATCH.pairs = {}
    pair = cache.get((chunks, experts))
    if pair is None:
        if len(cache) >= 64:
            cache.clear()
        pair = cache[chunks, experts] = (torch.empty(chunks, experts, dtype=torch.int32, device=device),
                                         torch.empty(experts, dtype=torch.int32, device=device))
    return pair


def _mapping_params(backend: str, k: int, num_experts: int, alignment: int) -> tuple[dict, dict]:
    """The scan's and the scatter's kernel parameters (the scatter's chunk is the scan's)."""
    scan = permute_config.choose_mapping(backend, k, num_experts, alignment)
    return scan, permute_config.choose_scatter(backend, k, num_experts, alignment, scan["chunk"])


# ---------------------------------------------------------------- expand


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor, *,
                    out: Optional[torch.Tensor] = None, backend: Optional[str] = None) -> torch.Tensor:
    """``[N, hidden]``: row ``token_topk_to_pos[t, j]`` holds ``x[t]``; rows with
    ``pos_to_expert < 0`` are zero.

    ``out`` (an extension of TileKernels' signature): a caller-held contiguous buffer of
    ``x``'s dtype with ``hidden`` columns and at least ``N`` rows.  Its first ``N`` rows are
    written, padding zeroed as always, and returned (a view, or ``out`` itself when it has
    exactly ``N`` rows); rows past ``N`` are left as they are.  Why: the padded buffer is
    mostly padding (T = 64, E = 256, k = 6: 21,632 rows for 384 valid at alignment 128),
    and a fresh allocation of it pays first-touch page faults on every call, while one
    buffer reused across MoE layers does not."""
    _check_tensor("x", x, _DTYPES, dim=2)
    n, _ = _check_routing(x, token_topk_to_pos, pos_to_expert)
    if out is None:
        out = torch.empty(n, x.shape[1], dtype=x.dtype, device=x.device)
    else:
        _check_tensor("out", out, (x.dtype,), dim=2)
        if out.shape[1] != x.shape[1] or out.shape[0] < n:
            raise ValueError(f"out must have shape [>= {n}, {x.shape[1]}] (expanded rows, hidden), "
                             f"got {tuple(out.shape)}")
        if out.device != x.device:
            raise ValueError(f"out is on {out.device}, expected {x.device} (x's device)")
        if _overlap(out, x):
            raise ValueError("out shares storage with x (their memory overlaps): the expansion would overwrite "
                             "its own input")
        if out.shape[0] != n:
            out = out[:n]
    _launch_expand(x, None, token_topk_to_pos, pos_to_expert, out, None, 0, "float32", False, backend)
    return out


def expand_to_fused_with_sf(x, num_per_channels: int, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                            use_tma_aligned_col_major_sf: bool = False, *, backend: Optional[str] = None):
    """``(out [N, hidden], out_sf)`` for ``x = (data [T, hidden], sf)``: the data rows as
    :func:`expand_to_fused`, the scale rows along with them (zero for padding).

    ``sf`` is float32 ``[T, ceil(hidden / num_per_channels)]`` or int32 packed UE8M0
    (four exponents a word, ``[T, ceil(ceil(hidden / num_per_channels) / 4)]``; needs
    ``use_tma_aligned_col_major_sf``).  With ``use_tma_aligned_col_major_sf`` ``out_sf`` is
    an ``[N, S]`` view whose columns are contiguous and TMA-aligned (``stride = (1,
    align(N, 4))``), the SFA layout DeepGEMM's grouped GEMMs read."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError("x must be a (data, sf) pair")
    data, sf = x
    _check_tensor("x[0] (data)", data, tuple(_DTYPE_NAMES), dim=2)
    _check_tensor("x[1] (sf)", sf, (torch.float32, torch.int32), dim=2)
    if isinstance(num_per_channels, bool) or num_per_channels not in (32, 128):
        raise ValueError(f"num_per_channels must be 32 or 128, got {num_per_channels!r}")
    if not isinstance(use_tma_aligned_col_major_sf, bool):
        raise TypeError("use_tma_aligned_col_major_sf must be a bool")
    t, hidden = data.shape
    cols = -(-hidden // num_per_channels)
    if sf.dtype == torch.int32:
        cols = -(-cols // 4)
        if not use_tma_aligned_col_major_sf:
            raise ValueError("packed int32 (UE8M0) scale factors need use_tma_aligned_col_major_sf=True")
    if tuple(sf.shape) != (t, cols):
        raise ValueError(f"x[1] (sf) must have shape {(t, cols)} (tokens, scale columns), got {tuple(sf.shape)}")
    if sf.device != data.device:
        raise ValueError(f"x[1] (sf) is on {sf.device}, expected {data.device}")
    n, _ = _check_routing(data, token_topk_to_pos, pos_to_expert)
    out = torch.empty((n, hidden), dtype=data.dtype, device=data.device)
    if use_tma_aligned_col_major_sf:
        store = torch.empty((cols, -(-n // 4) * 4), dtype=sf.dtype, device=data.device)[:, :n]
    else:
        store = torch.empty((n, cols), dtype=sf.dtype, device=data.device)
    sf_name = "int32" if sf.dtype == torch.int32 else "float32"
    _launch_expand(data, sf, token_topk_to_pos, pos_to_expert, out, store, cols, sf_name,
                   use_tma_aligned_col_major_sf, backend)
    return out, (store.T if use_tma_aligned_col_major_sf else store)


def _launch_expand(x, sf, token_topk_to_pos, pos_to_expert, out, out_sf, cols, sf_dtype, col_major, backend):
    t, hidden = x.shape
    n = pos_to_expert.numel()
    if n == 0 or hidden == 0:
        return
    dev = x.device
    run = _expand_plan(t, n, hidden, token_topk_to_pos.shape[1], x.dtype, dev, cols, sf_dtype, col_major,
                       backend, consult.stamp())
    if sf is None:   # one-element placeholders: the kernel never touches them without scales
        sf = out_sf = _placeholder(dev, (1, 1))
    run((x, sf, token_topk_to_pos, pos_to_expert, out, out_sf))


@functools.lru_cache(maxsize=1024)
def _expand_plan(t: int, n: int, hidden: int, k: int, dtype: torch.dtype, device: torch.device, cols: int,
                 sf_dtype: str, col_major: bool, backend, stamp: tuple) -> tuple:
    """The expansion's launch (a :class:`~kernforge.ops._launch.Bound`) for checked arguments,
    memoised (the backend lookup, the choice and the key cost more than the kernel's copies at T = 1)."""
    name = backends.for_device(device.type) if backend is None else backends.for_tensor(None, backend)
    choice = (name, hidden, k, _DTYPE_NAMES[dtype], cols, sf_dtype, col_major)
    return Bound(("expand_to_fused", device, t, n) + choice,
                 lambda: _kernel(permute.expand_to_fused, name, **permute_config.choose_expand(*choice)))


# ---------------------------------------------------------------- reduce


def reduce_fused(x: Union[torch.Tensor, tuple], topk_weights: Optional[torch.Tensor], token_topk_to_pos: torch.Tensor,
                 fp8_format: str = "", sf: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None, *,
                 backend: Optional[str] = None) -> torch.Tensor:
    """``out[t] = sf * sum_j topk_weights[t, j] * x_sf[p] * x[p]`` over the slots of token
    ``t`` with a row ``p = token_topk_to_pos[t, j] >= 0``, accumulated in float32 in slot
    order.  ``x [N, hidden]`` (any hidden size) or ``(x, x_sf [N] float32)``;
    the output has ``x``'s dtype, or e4m3 with ``fp8_format='e4m3'`` (then ``sf``, a
    one-element float32 tensor, may scale it).  ``out`` is written in place if given."""
    x_sf = None
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise TypeError("x must be a tensor or an (x, x_sf) pair")
        x, x_sf = x
    _check_tensor("x", x, _DTYPES, dim=2)
    n, hidden = x.shape
    _check_tensor("token_topk_to_pos", token_topk_to_pos, (torch.int32,), dim=2)
    t, k = token_topk_to_pos.shape
    dev = x.device
    try:
        run, out_dtype = _reduce_plan(n, t, k, hidden, x.dtype, dev, fp8_format, topk_weights is not None,
                                      x_sf is not None, sf is not None, backend, consult.stamp())
    except TypeError as unhashable:   # an unhashable argument: checked uncached (and rejected there)
        if not str(unhashable).startswith("unhashable"):
            raise
        run, out_dtype = _reduce_plan.__wrapped__(n, t, k, hidden, x.dtype, dev, fp8_format,
                                                  topk_weights is not None, x_sf is not None,
                                                  sf is not None, backend, consult.stamp())
    if topk_weights is not None:
        _check_tensor("topk_weights", topk_weights, (torch.float32,), shape=(t, k))
    if x_sf is not None:
        _check_tensor("x_sf", x_sf, (torch.float32,), shape=(n,))
    if sf is not None:
        _check_tensor("sf", sf, (torch.float32,))
        if sf.numel() != 1:
            raise ValueError(f"sf must hold one float32 value, got shape {tuple(sf.shape)}")
    if out is not None:
        _check_tensor("out", out, (out_dtype,), shape=(t, hidden))
    for name, v in (("token_topk_to_pos", token_topk_to_pos), ("topk_weights", topk_weights), ("x_sf", x_sf),
                    ("sf", sf), ("out", out)):
        if v is not None and v.device != dev:
            raise ValueError(f"{name} is on {v.device}, expected {dev} (x's device)")
    _check_positions(token_topk_to_pos, n)
    if out is None:
        out = torch.empty(t, hidden, dtype=out_dtype, device=dev)
    if t == 0:
        return out
    one = _placeholder(dev)
    run((x, topk_weights if topk_weights is not None else _placeholder(dev, (1, k)), token_topk_to_pos,
         x_sf if x_sf is not None else one, sf.reshape(1) if sf is not None else one, out))
    return out


@functools.lru_cache(maxsize=1024, typed=True)
def _reduce_plan(n: int, t: int, k: int, hidden: int, dtype: torch.dtype, device: torch.device, fp8_format,
                 with_weights: bool, with_x_sf: bool, with_sf: bool, backend, stamp: tuple) -> tuple:
    """:func:`reduce_fused`'s scalar arguments checked, and its launch: ``(launch (a
    :class:`~kernforge.ops._launch.Bound`), output dtype)``.  Memoised (the tensors' own
    checks stay per call) because a decode step reduces the same shapes every layer and
    this costs more than the kernel at T = 1; ``stamp`` keys the kernel choice to the
    tuning database's state, as in :func:`launch`."""
    if k == 0:
        raise ValueError("token_topk_to_pos must have at least one column (num_topk > 0)")
    if fp8_format not in ("", "e4m3"):
        raise ValueError(f"fp8_format must be '' or 'e4m3', got {fp8_format!r}")
    if with_sf and fp8_format != "e4m3":
        raise ValueError("sf is only valid with fp8_format='e4m3' (only FP8 output takes a scale)")
    out_dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else dtype
    name = backends.for_device(device.type) if backend is None else backends.for_tensor(None, backend)
    choice = (name, hidden, k, _DTYPE_NAMES[dtype], _DTYPE_NAMES[out_dtype], with_weights, with_x_sf, with_sf)
    return Bound(("reduce_fused", device, n, t) + choice,
                 lambda: _kernel(permute.reduce_fused, name, **permute_config.choose_reduce(*choice))), out_dtype


# ---------------------------------------------------------------- swiglu


def swiglu(x: torch.Tensor, weights: Optional[torch.Tensor] = None, swiglu_limit: float = 0.0,
           quantize: bool = False, *, backend: Optional[str] = None):
    """The MoE expert activation of ``x [M, 2I]`` (gate ``x[:, :I]``, up ``x[:, I:]``):
    ``silu(min(gate, limit)) * clamp(up, -limit, limit)``, times ``weights[m]`` when given
    (float32 ``[M]`` or ``[M, 1]``), each step rounded to ``x``'s dtype exactly as
    :class:`kernforge.model.moe.Expert` rounds it.  ``swiglu_limit <= 0``: no clamp.

    Returns ``[M, I]`` in ``x``'s dtype, or with ``quantize`` the pair
    ``(e4m3 [M, I], float32 scales [M, I / 128])`` of DeepGEMM's 1x128 per-token recipe,
    bit for bit ``per_token_cast_to_fp8`` of the unquantised result (``I % 128 == 0``)."""
    _check_tensor("x", x, (torch.bfloat16, torch.float16, torch.float32), dim=2)
    m, cols = x.shape
    if cols == 0 or cols % 2:
        raise ValueError(f"x must be [M, 2 * I] with I > 0 (gate and up halves), got {tuple(x.shape)}")
    inter = cols // 2
    if isinstance(swiglu_limit, bool) or not isinstance(swiglu_limit, (int, float)) or swiglu_limit != swiglu_limit:
        raise TypeError(f"swiglu_limit must be a real number, got {swiglu_limit!r}")
    if not isinstance(quantize, bool):
        raise TypeError(f"quantize must be a bool, got {type(quantize).__name__}")
    if quantize and inter % swiglu_kernel.QBLOCK:
        raise ValueError(f"quantize needs I % {swiglu_kernel.QBLOCK} == 0 (1x128 scale blocks), got I = {inter}")
    if weights is not None:
        if isinstance(weights, torch.Tensor) and weights.dim() == 2 and weights.shape[1:] == (1,):
            weights = weights.reshape(-1)
        _check_tensor("weights", weights, (torch.float32,), shape=(m,))
        if weights.device != x.device:
            raise ValueError(f"weights is on {weights.device}, expected {x.device} (x's device)")
    out = torch.empty((m, inter), dtype=torch.float8_e4m3fn if quantize else x.dtype, device=x.device)
    out_sf = torch.empty((m, inter // swiglu_kernel.QBLOCK), dtype=torch.float32, device=x.device) if quantize \
        else None
    if m:
        backend = backends.for_tensor(x, backend)
        choice = (backend, inter, _DTYPE_NAMES[x.dtype], weights is not None, quantize)
        one = functools.partial(torch.zeros, dtype=torch.float32, device=x.device)
        limit = float(swiglu_limit)
        launch(("swiglu", x.device, m, limit) + choice,
               lambda: _kernel(swiglu_kernel.swiglu, backend, **swiglu_config.choose(*choice)),
               (x, weights if weights is not None else one((1,)), limit, out, out_sf if quantize else one((1, 1))))
    return (out, out_sf) if quantize else out


# ---------------------------------------------------------------- shared checks


@functools.lru_cache(maxsize=None)
def _placeholder(device: torch.device, shape: tuple = (1,)) -> torch.Tensor:
    """A float32 zero stand-in, made once per device and shape, for an optional operand that
    is not given: the kernels compiled without it never read it (nor write it)."""
    return torch.zeros(shape, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=None)
def _compiled(factory, backend: str, params: tuple):
    return kernforge.compile(factory, backend=backend, **dict(params))


def _kernel(factory, backend: str, **params):
    return _compiled(factory, backend, tuple(sorted(params.items())))


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def _check_tensor(name: str, t, dtypes: tuple, dim: Optional[int] = None, shape: Optional[tuple] = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if t.requires_grad:
        raise ValueError(f"{name} requires grad: these ops are inference only")


def _check_routing(x, token_topk_to_pos, pos_to_expert) -> tuple[int, int]:
    _check_tensor("token_topk_to_pos", token_topk_to_pos, (torch.int32,), dim=2)
    _check_tensor("pos_to_expert", pos_to_expert, (torch.int32,), dim=1)
    t, k = token_topk_to_pos.shape
    if t != x.shape[0]:
        raise ValueError(f"token_topk_to_pos has {t} rows, x has {x.shape[0]} tokens")
    if k == 0:
        raise ValueError("token_topk_to_pos must have at least one column (num_topk > 0)")
    for name, v in (("token_topk_to_pos", token_topk_to_pos), ("pos_to_expert", pos_to_expert)):
        if v.device != x.device:
            raise ValueError(f"{name} is on {v.device}, expected {x.device} (x's device)")
    n = pos_to_expert.numel()
    _check_positions(token_topk_to_pos, n)
    return n, k


def _out_of_range(t: torch.Tensor, lo: int, hi: int) -> bool:
    """Whether any value of ``t`` lies outside ``[lo, hi)``: one reduction and one host read
    (the extremes), cheaper than an elementwise mask; up to :data:`_HOST_SCAN` CPU values,
    one host read of the values themselves, cheaper still.  False when empty."""
    size = t.numel()
    if size == 0:
        return False
    if size <= _HOST_SCAN and t.device.type == "cpu" and t.dim() <= 2:   # decode sizes: the values themselves
        rows = t.tolist() if t.dim() == 2 else [t.tolist()]
        return min(map(min, rows)) < lo or max(map(max, rows)) >= hi
    least, most = torch.stack(torch.aminmax(t)).tolist()
    return least < lo or most >= hi


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors' bytes overlap (addresses only: no storage objects
    are made, which costs two dispatches per call at decode)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _check_positions(token_topk_to_pos: torch.Tensor, n: int) -> None:
    if capturing(token_topk_to_pos) or token_topk_to_pos.numel() == 0:
        return
    if _out_of_range(token_topk_to_pos, -1, n):
        bad = (token_topk_to_pos < -1) | (token_topk_to_pos >= n)
        raise ValueError(f"token_topk_to_pos values must be in [-1, {n}) (expanded rows), "
                         f"got {token_topk_to_pos[bad][:4].tolist()}")
