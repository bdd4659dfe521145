"""MoE routing (TileKernels' gating semantics), written once in the DSL.

Every kernel runs one block per token.  Selection is ``k`` passes of an arg-max over
**unique integer keys**: expert ``e``'s float key becomes the int64

    ordered(key[e]) * 2**B + (E - 1 - e)        (B bits hold an expert index),

where ``ordered`` is the float's bit pattern remapped so that integer order is float order
(``-0.0`` first made ``+0.0``: the two compare equal).  Equal floats then differ in the low
bits only, the smaller index being the larger key, so each pass's maximum is one expert: the
next in descending key order with ties to the smaller index.  The winner's index is read
off the maximum's low bits and its key set to ``-1`` (below every real key).  The result
depends on the keys alone (no thread order, no reduction order), identically on every
backend, in ``O(E k)`` per token (a rank sort, which counts the experts beating each one,
is ``O(E^2)``).  Each pass is two tile reductions: the keys as a ``E/W x W`` tile
(``W = gcd(E, 16)``) fold along the first axis into ``W`` lanes (vector lanes on a host,
``W`` threads on a GPU), then those into one.

* :func:`topk_gate`: the ``k`` largest scores of each row (indices only);
* :func:`top2_sum_gate`: scoring (sigmoid, sqrt-softplus or softmax), a bias used for
  ranking only, DeepSeek-V3 group limits (keep the ``num_topk_groups`` groups with the
  largest sum of their top-2 biased scores; the others rank as ``-inf``), weights
  ``score / max(sum, 1e-20) * routed_scaling_factor`` from the unbiased scores, shared
  experts as extra routed slots (logical ids ``E, E+1, ...``, weight 1), fixed routing from
  ``unmapped_topk_idx``, the logical -> physical map with replica
  ``(ep_rank + token * 23333) mod logical_count[e]``, EP/TP masking, and a token mask;
* :func:`normalize_weight`: ``(sum + 1e-20, w / (sum + 1e-20))`` per row;
* :func:`hash_gate`: V4's hash-routed layers: the experts are ``tid2eid[token_id]`` and the
  weights are those of ``kernforge.model.moe.Gate``.

Scores are arithmetic only (no libm calls), so they vectorise on a host: see :func:`_scores`.
"""
from __future__ import annotations

import math

import kernforge.dsl as T
from kernforge.kernels import vexp

SCORING_FUNCS = ("sigmoid", "sqrtsoftplus", "softmax")
#: the multiplier of TileKernels' replica choice ``(ep_rank + token * 23333) mod count``
REPLICA_HASH = 23333
MAX_TOPK = 32
MAX_GROUPS = 32
MAX_EXPERTS_PER_GROUP = 32


def _lanes(n: int) -> int:
    """The width ``W`` of the key tile: the largest of 16, 8, ... that divides ``n``."""
    return math.gcd(n, 16)


def _index_bits(n: int) -> int:
    """``B``: bits for an index below ``n`` (at least one); ``32 + B <= 63`` keeps the keys non-negative."""
    return max(1, (n - 1).bit_length())


def _select_key(v, e, n: int):
    """The unique int64 key of float ``v`` at index ``e`` of ``n``: larger float, or equal
    float and smaller index, is a larger key; every key is ``>= 0`` (a NaN, which the ops
    refuse, would rank above ``+inf``)."""
    raw = T.reinterpret("uint32", T.where(v == 0.0, T.float32(0.0), v))
    # negative: flip every bit; positive: flip the sign bit (the flip mask is the sign spread
    # by an arithmetic shift, with the sign bit set)
    spread = T.reinterpret("uint32", T.reinterpret("int32", raw) >> 31)
    ordered = raw ^ (spread | T.cast(0x80000000, "uint32"))
    return T.cast(ordered, "int64") * (1 << _index_bits(n)) + T.cast(n - 1 - e, "int64")


@T.macro
def _fill_keys(ck, value, n: int):
    """``ck[c, w]`` <- the key of ``value(e)`` for ``e = c * W + w``."""
    W = _lanes(n)
    for c, w in T.Parallel(n // W, W):
        ck[c, w] = _select_key(value(c * W + w), c * W + w, n)


@T.macro
def _select(ck, lane, best, sel, n: int, picks: int):
    """``picks`` arg-max passes over the keys ``ck`` (``n // W x W``, from :func:`_fill_keys`):
    ``sel[j]`` <- the index of the ``j``-th largest key (``sel`` None: not recorded); the
    picked keys become ``-1``, so afterwards ``ck < 0`` marks the winners."""
    W = _lanes(n)
    for j in T.serial(picks):
        T.reduce_max(ck, lane, dim=0)
        T.reduce_max(lane, best, dim=0)
        if sel is not None:
            sel[j] = T.cast(n - 1 - (best[0] & ((1 << _index_bits(n)) - 1)), "int32")
        for c, w in T.Parallel(n // W, W):
            ck[c, w] = T.where(ck[c, w] == best[0], T.cast(-1, "int64"), ck[c, w])


#: ``log1p(z) = 2 atanh(s)``, ``s = z / (2 + z)``: the series' coefficients ``1 / (2n + 1)``.
#: For ``0 <= z <= 1``, ``s <= 1/3``: eleven terms leave ``9**-11 / 23 < 2e-12`` relative.
_ATANH_TERMS = tuple(1.0 / (2 * n + 1) for n in range(11))
#: the bit pattern whose halved difference seeds ``1 / sqrt`` of a float64 within 3.5%
_RSQRT_MAGIC = 0x5FE6EB50C7B537A9


def _exp_arg(x):
    """``x`` clamped to ``[-200, 200]``, where float32 ``exp`` is already 0 or ``inf``, for
    :func:`~kernforge.kernels.vexp.exp_finite`: its split ``x * log2(e)`` would overflow (a
    NaN for ``|x| > 2.3e38``, which finite logits reach; ``vexp.exp`` has the same limit)."""
    return T.min(T.max(x, T.float32(-200.0)), T.float32(200.0))


def _log1p_series(s):
    """``log(1 + z) = 2 atanh(s)`` from ``s = z / (2 + z)`` (float64, ``0 <= z <= 1``): arithmetic
    only, relative error ~1e-12 at every ``z`` (tiny ``z`` too: ``s ~ z / 2``, nothing cancels)."""
    t = s * s
    p = T.float64(_ATANH_TERMS[-1])
    for c in reversed(_ATANH_TERMS[:-1]):
        p = c + t * p
    return 2.0 * s * p


def _rsqrt_seed(y):
    """``1 / sqrt(y)`` within 3.5% for a float64 ``y > 0``: the bit pattern's halved difference
    from a magic constant (integer arithmetic)."""
    return T.reinterpret("float64", T.cast(_RSQRT_MAGIC, "int64") - (T.reinterpret("int64", y) >> 1))


@T.macro
def _sqrt_softplus(lg, ex, scores, n: int):
    """``scores[e] <- sqrt(softplus(lg[0, e]))``, softplus as ``max(x, 0) + log1p(exp(-|x|))``
    (never overflows), the ``log1p`` and the ``sqrt`` in float64, so the only float32 error is
    :func:`~kernforge.kernels.vexp.exp_finite`'s (~2 ulps of ``z``, below that after ``log1p`` and
    ``sqrt``).  The ``sqrt`` is ``y * rsqrt(y)``, four Newton steps from :func:`_rsqrt_seed`
    (3.5% -> 2e-3 -> 5e-6 -> 4e-11 -> 1e-16) taken of ``y`` clamped to ``[1e-300, 1e300]`` so no
    step overflows: ``y = 0`` gives 0, ``+inf`` gives ``+inf``.  Each stage stores its result
    (the DSL inlines expressions: one expression would repeat the series ``3**4`` times)."""
    sd = T.alloc_fragment((1, n), "float64")
    yd = T.alloc_fragment((1, n), "float64")
    rd = T.alloc_fragment((1, n), "float64")
    for i, e in T.Parallel(1, n):
        ex[i, e] = vexp.exp_finite(_exp_arg(-T.abs(lg[i, e])))
    for i, e in T.Parallel(1, n):
        sd[i, e] = T.cast(ex[i, e], "float64") / (2.0 + T.cast(ex[i, e], "float64"))
    for i, e in T.Parallel(1, n):
        # max(x, 0) as (x + |x|) / 2, exact in float64: a float max feeding a float64 sum kept
        # g++ from vectorising the loop
        yd[i, e] = 0.5 * (T.cast(lg[i, e], "float64") + T.abs(T.cast(lg[i, e], "float64"))) + _log1p_series(sd[i, e])
    for i, e in T.Parallel(1, n):
        sd[i, e] = T.min(T.max(yd[i, e], T.float64(1e-300)), T.float64(1e300))
        rd[i, e] = _rsqrt_seed(sd[i, e])
        for _ in range(4):
            rd[i, e] = rd[i, e] * (1.5 - 0.5 * sd[i, e] * rd[i, e] * rd[i, e])
        scores[e] = T.cast(yd[i, e] * rd[i, e], "float32")


@T.macro
def _scores(logits, t, lg, ex, stat, scores, n: int, scoring: str):
    """``scores[:n]`` (shared) <- the scores of token ``t``'s logits; ``lg`` keeps the logits.

    Arithmetic only, so the host loops vectorise (the C library's ``expf``, ``logf`` and
    ``sqrtf`` are calls that keep a loop scalar: the gate spent about a third of routing +
    permutation there at T = 4096): ``exp`` is :func:`kernforge.kernels.vexp.exp_finite` (~2 ulps),
    sqrt-softplus is :func:`_sqrt_softplus`."""
    T.copy(logits[t, 0], lg)
    if scoring == "sigmoid":
        for i, e in T.Parallel(1, n):
            scores[e] = 1.0 / (1.0 + vexp.exp_finite(_exp_arg(-lg[i, e])))
    elif scoring == "sqrtsoftplus":
        _sqrt_softplus(lg, ex, scores, n)
    else:
        T.reduce_max(lg, stat, dim=1)
        for i, e in T.Parallel(1, n):
            ex[i, e] = vexp.exp_finite(_exp_arg(lg[i, e] - stat[0]))
        T.reduce_sum(ex, stat, dim=1)
        for i, e in T.Parallel(1, n):
            scores[e] = ex[i, e] / stat[0]


def _check_scoring(name: str, scoring: str) -> None:
    if scoring not in SCORING_FUNCS:
        raise ValueError(f"{name}: scoring_func must be one of {SCORING_FUNCS}, got {scoring!r}")


@T.tunable(threads=[32, 128])
def topk_gate(num_experts: int, num_topk: int, threads: int = 128):
    """``scores [T, E]`` float32 -> ``topk_idx [T, k]`` int64, descending, ties to the smaller index."""
    E, k = num_experts, num_topk
    if not 1 <= k <= E:
        raise ValueError(f"topk_gate: num_topk must be in [1, num_experts={E}], got {k}")
    W = _lanes(E)
    Tn = T.symbolic("num_tokens")

    @T.prim_func
    def topk_gate_kernel(scores: T.Tensor((Tn, E), "float32"), topk_idx: T.Tensor((Tn, k), "int64")):
        with T.Kernel(Tn, threads=threads) as t:
            ck = T.alloc_shared((E // W, W), "int64")
            lane = T.alloc_shared((W,), "int64")
            best = T.alloc_shared((1,), "int64")
            sel = T.alloc_shared((k,), "int32")
            _fill_keys(ck, lambda e: scores[t, e], E)
            _select(ck, lane, best, sel, E, k)
            for j in T.Parallel(k):
                topk_idx[t, j] = T.cast(sel[j], "int64")

    return topk_gate_kernel


@T.tunable(threads=[32, 128])
def top2_sum_gate(num_experts: int, num_topk: int, num_groups: int = 0, num_topk_groups: int = 0,
                  scoring_func: str = "sigmoid", num_shared: int = 0, has_mask: bool = False,
                  has_fix: bool = False, has_unmapped: bool = False, has_map: bool = False, threads: int = 128):
    """One token per block -> ``topk_idx [T, k + s]`` int64 and ``topk_weights [T, k + s]`` float32.

    Compile-time: ``num_shared`` (``s``, shared experts as routed slots), and which optional
    tensors are read (``has_mask``, ``has_fix``: ``fix_routing_mask``; ``has_unmapped``:
    ``unmapped_topk_idx`` is written (and read for fixed rows); ``has_map``: the physical
    map and ``logical_count``).  Tensors that are not read still take a parameter slot
    (any one-element tensor of the right dtype).  Runtime scalars: the scaling factor,
    ``ep_rank``, ``tp_rank``, ``num_tp_ranks``, and ``experts_per_rank`` /
    ``experts_per_dp`` of the EP/TP masking (the op derives them)."""
    _check_scoring("top2_sum_gate", scoring_func)
    E, k, s = num_experts, num_topk, num_shared
    grouped = num_groups != num_topk_groups
    if E % 4:
        raise ValueError(f"top2_sum_gate: num_experts must be a multiple of 4, got {E}")
    if not 1 <= k <= min(E, MAX_TOPK):
        raise ValueError(f"top2_sum_gate: num_topk must be in [1, {min(E, MAX_TOPK)}], got {k}")
    if grouped:
        if not (0 < num_topk_groups < num_groups <= MAX_GROUPS) or E % num_groups:
            raise ValueError(f"top2_sum_gate: need 0 < num_topk_groups < num_groups <= {MAX_GROUPS} and "
                             f"num_experts % num_groups == 0, got {num_topk_groups}, {num_groups}, {E}")
        if not 2 <= E // num_groups <= MAX_EXPERTS_PER_GROUP:
            raise ValueError(f"top2_sum_gate: experts per group must be in [2, {MAX_EXPERTS_PER_GROUP}], "
                             f"got {E // num_groups}")
    G = num_groups if grouped else 1
    S = E // G
    P = k + s
    W, GW = _lanes(E), _lanes(G)
    Tn = T.symbolic("num_tokens")
    TM = T.symbolic("mask_len")
    TF = T.symbolic("fix_len")
    TU = T.symbolic("unmapped_rows")
    KU = T.symbolic("unmapped_cols")
    SU = T.symbolic("unmapped_stride")
    LE = T.symbolic("logical_experts")
    D = T.symbolic("duplicates")

    @T.prim_func
    def top2_sum_gate_kernel(logits: T.Tensor((Tn, E), "float32"), bias: T.Tensor((E,), "float32"),
                             mask: T.Tensor((TM,), "bool"), fix_routing_mask: T.Tensor((TF,), "bool"),
                             to_physical_map: T.Tensor((LE, D), "int32"), logical_count: T.Tensor((LE,), "int32"),
                             unmapped_topk_idx: T.StridedTensor((TU, KU), (SU, 1), "int64"),
                             topk_idx: T.Tensor((Tn, P), "int64"), topk_weights: T.Tensor((Tn, P), "float32"),
                             routed_scaling_factor: T.float32, ep_rank: T.int32, tp_rank: T.int32,
                             num_tp_ranks: T.int32, experts_per_rank: T.int32, experts_per_dp: T.int32):
        with T.Kernel(Tn, threads=threads) as t:
            lg = T.alloc_fragment((1, E), "float32")
            ex = T.alloc_fragment((1, E), "float32")
            stat = T.alloc_fragment((1,), "float32")
            scores = T.alloc_shared((E,), "float32")
            key = T.alloc_shared((E,), "float32")
            ck = T.alloc_shared((E // W, W), "int64")
            lane = T.alloc_shared((W,), "int64")
            best = T.alloc_shared((1,), "int64")
            sel = T.alloc_shared((k,), "int32")
            w = T.alloc_fragment((k,), "float32")
            wsum = T.alloc_fragment((1,), "float32")
            slot_idx = T.alloc_shared((P,), "int64")
            slot_w = T.alloc_shared((P,), "float32")
            _scores(logits, t, lg, ex, stat, scores, E, scoring_func)
            # ranking keys: biased scores (softmax: biased logits)
            for i, e in T.Parallel(1, E):
                key[e] = (lg[i, e] if scoring_func == "softmax" else scores[e]) + bias[e]
            if grouped:
                gk = T.alloc_fragment((G, S), "float32")
                lower = T.alloc_fragment((G, S), "float32")
                ties = T.alloc_fragment((G, S), "int32")
                top1 = T.alloc_fragment((G,), "float32")
                top2 = T.alloc_fragment((G,), "float32")
                ntop = T.alloc_fragment((G,), "int32")
                gscore = T.alloc_shared((G,), "float32")
                gck = T.alloc_shared((G // GW, GW), "int64")
                glane = T.alloc_shared((GW,), "int64")
                for g, j in T.Parallel(G, S):
                    gk[g, j] = key[g * S + j]
                T.reduce_max(gk, top1, dim=1)
                # the second largest counts the largest again when it occurs twice
                for g, j in T.Parallel(G, S):
                    ties[g, j] = T.cast(gk[g, j] == top1[g], "int32")
                    lower[g, j] = T.where(gk[g, j] < top1[g], gk[g, j], -T.infinity("float32"))
                T.reduce_sum(ties, ntop, dim=1)
                T.reduce_max(lower, top2, dim=1)
                for g in T.Parallel(G):
                    gscore[g] = top1[g] + T.where(ntop[g] >= 2, top1[g], top2[g])
                _fill_keys(gck, lambda g: gscore[g], G)
                _select(gck, glane, best, None, G, num_topk_groups)
                for e in T.Parallel(E):
                    if gck[e // S // GW, e // S % GW] >= 0:  # not a picked group
                        key[e] = -T.infinity("float32")
            _fill_keys(ck, lambda e: key[e], E)
            _select(ck, lane, best, sel, E, k)
            if has_fix and has_unmapped:
                if fix_routing_mask[t]:
                    for j in T.Parallel(k):
                        sel[j] = T.cast(unmapped_topk_idx[t, j], "int32")
            for j in T.Parallel(k):
                w[j] = scores[T.max(sel[j], 0)]
            T.reduce_sum(w, wsum, dim=0)
            for j in T.Parallel(k):
                slot_idx[j] = T.cast(sel[j], "int64")
                slot_w[j] = w[j] / T.max(wsum[0], T.float32(1e-20)) * routed_scaling_factor
            if s:
                for j in T.Parallel(s):
                    slot_idx[k + j] = T.cast(E + j, "int64")
                    slot_w[k + j] = T.float32(1.0)
            active = T.alloc_var("bool", mask[t] if has_mask else True)
            if has_unmapped:
                for j in T.Parallel(k):
                    unmapped_topk_idx[t, j] = T.where(active, slot_idx[j], T.cast(-1, "int64"))
            for j in T.Parallel(P):
                logical = slot_idx[j]
                if has_map:
                    # replica (ep_rank + token * 23333) mod count; -1 (a fixed row's empty slot) stays
                    safe = T.max(logical, T.cast(0, "int64"))
                    replica = (T.cast(ep_rank, "int64") + T.cast(t, "int64") * REPLICA_HASH) % T.cast(
                        logical_count[safe], "int64")
                    logical = T.where(logical >= 0, T.cast(to_physical_map[safe, replica], "int64"), logical)
                # EP/TP masking: keep the ids of this TP rank's experts, renumbered locally
                owned = (logical >= 0) & ((logical // T.cast(experts_per_rank, "int64")) % T.cast(num_tp_ranks, "int64")
                                          == T.cast(tp_rank, "int64"))
                local = logical - T.cast(tp_rank, "int64") * T.cast(experts_per_rank, "int64")
                local = local - (local // T.cast(experts_per_dp, "int64")) * T.cast(
                    experts_per_dp - experts_per_rank, "int64")
                topk_idx[t, j] = T.where(active & owned & (local >= 0), local, T.cast(-1, "int64"))
                topk_weights[t, j] = T.where(active, slot_w[j], T.float32(0.0))

    return top2_sum_gate_kernel


@T.tunable(threads=[32, 128])
def normalize_weight(num_topk: int, threads: int = 32):
    """``w [T, k]`` float32 -> ``(denominator [T] = sum + 1e-20, w / denominator [T, k])``."""
    k = num_topk
    Tn = T.symbolic("num_tokens")

    @T.prim_func
    def normalize_weight_kernel(w: T.Tensor((Tn, k), "float32"), denominator: T.Tensor((Tn,), "float32"),
                                normalized: T.Tensor((Tn, k), "float32")):
        with T.Kernel(Tn, threads=threads) as t:
            wt = T.alloc_fragment((1, k), "float32")
            total = T.alloc_fragment((1,), "float32")
            T.copy(w[t, 0], wt)
            T.reduce_sum(wt, total, dim=1)
            den = T.alloc_var("float32", total[0] + T.float32(1e-20))
            for i, j in T.Parallel(1, k):
                normalized[t, j] = wt[i, j] / den
            denominator[t] = den

    return normalize_weight_kernel


@T.tunable(threads=[32, 128])
def hash_gate(num_experts: int, num_topk: int, scoring_func: str = "sqrtsoftplus", norm_topk_prob: bool = True,
              threads: int = 128):
    """V4's hash routing: ``topk_idx = tid2eid[token_ids]``, weights as ``kernforge.model.moe.Gate``:
    the unbiased scores of those experts, divided by their sum unless the scoring is softmax
    or ``norm_topk_prob`` is off, times ``routed_scaling_factor``."""
    _check_scoring("hash_gate", scoring_func)
    E, k = num_experts, num_topk
    Tn = T.symbolic("num_tokens")
    V = T.symbolic("vocab")
    normalise = scoring_func != "softmax" and norm_topk_prob

    @T.prim_func
    def hash_gate_kernel(logits: T.Tensor((Tn, E), "float32"), token_ids: T.Tensor((Tn,), "int64"),
                         tid2eid: T.Tensor((V, k), "int64"), topk_idx: T.Tensor((Tn, k), "int64"),
                         topk_weights: T.Tensor((Tn, k), "float32"), routed_scaling_factor: T.float32):
        with T.Kernel(Tn, threads=threads) as t:
            lg = T.alloc_fragment((1, E), "float32")
            ex = T.alloc_fragment((1, E), "float32")
            stat = T.alloc_fragment((1,), "float32")
            scores = T.alloc_shared((E,), "float32")
            w = T.alloc_fragment((k,), "float32")
            wsum = T.alloc_fragment((1,), "float32")
            _scores(logits, t, lg, ex, stat, scores, E, scoring_func)
            for j in T.Parallel(k):
                w[j] = scores[tid2eid[token_ids[t], j]]
            T.reduce_sum(w, wsum, dim=0)
            for j in T.Parallel(k):
                topk_idx[t, j] = tid2eid[token_ids[t], j]
                topk_weights[t, j] = (w[j] / wsum[0] if normalise else w[j]) * routed_scaling_factor

    return hash_gate_kernel
