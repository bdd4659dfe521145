"""TopK select (DeepSelect-compatible), written once in the tile DSL.

One block owns one row.  It streams the row in tiles and keeps a *candidate
buffer* in shared memory (keys and indices, always in ascending index order)
plus a running threshold ``thr``:

1. Every element becomes an **ordered key**: its float bits with the sign
   flipped (and the rest inverted for negatives), so that unsigned order is
   float order (``-inf < ... < -0 < +0 < ... < +inf``).  Every NaN maps to the
   largest key, so NaNs are always selected and the row's NaN flag costs
   nothing extra on the stream.
2. A tile's keys are compared with ``thr`` in groups; only groups whose maximum
   beats ``thr`` are compacted into the buffer (append in index order).
3. When the buffer could overflow (and once at the end) a **radix select**
   (8-bit digits) over the buffer finds the k-th key ``K`` and the number of
   keys equal to ``K`` that still fit; the buffer is compacted to exactly k
   entries, ``thr`` becomes ``K`` and later elements must be strictly greater.

Tie policy (identical on every backend, since nothing depends on thread
order): among elements whose keys equal the k-th key, the **lowest indices
win**.  Unsorted output comes out in ascending index order (so
``sorted_index`` costs nothing); ``sorted_values`` sorts the k winners by
value descending, equal values by ascending index (rank sort up to 1024
winners, a bitonic network above; or a stable LSD radix sort, the CPU's choice).

Work is ``O(N)`` streaming plus radix selects over ``O(k log(N/k))``
candidates for a random visit order; the threshold is exact (monotone), never
a guess, so adversarial (ascending) rows only cost more refinements.  With
``prescan`` (the CPU's configuration) a first pass over a chunk of tiles keeps
only group maxima, and the threshold starts at a lower bound taken from them
(see ``topk_select``): about ``k`` survivors on random rows instead of
``k log(N/k)``, and the second pass touches only the groups that beat it.
"""
from __future__ import annotations

import functools

import torch

import kernforge.dsl as T

#: written over a whole row of indices when that row holds a NaN and the caller
#: asked not to abort (DeepSelect's marker)
NAN_ROW_MARKER = 0x3F3F3F3F
MAX_TOPK = 4096
MAX_VOCAB = 1 << 23

_KEY_DTYPE = {"float32": "uint32", "bfloat16": "uint16"}
#: radix digits (shift, width) of the ordered key, most significant first.  The
#: first digit covers sign, exponent and two mantissa bits, so it already splits
#: a row's largest values finely (an 8-bit top digit would see only the exponent).
#: sorted output: rank sort up to this many winners (k^2 compares), bitonic above
_RANK_SORT_MAX = 1024
_RANK_ROWS = 16
_DIGITS = {"float32": ((21, 11), (13, 8), (5, 8), (0, 5)), "bfloat16": ((5, 11), (0, 5))}


def _ordered_key(v, kdt, bits: int):
    """Unsigned key with the order of the float ``v``; NaN -> the largest key.

    Integer operations only (NaN is "magnitude above the infinity pattern"), so the
    CPU backend vectorises it for bfloat16 as well as float32."""
    raw = T.reinterpret(kdt, v)
    sign = 1 << (bits - 1)
    inf_bits = 0x7F800000 if bits == 32 else 0x7F80
    # negative: flip every bit; positive: flip the sign bit
    if bits == 32:
        # the flip mask is the sign spread by an arithmetic shift (all ones for negatives)
        # with the sign bit set: shift, or, xor instead of a compare and a select (5-10%
        # faster fp32 streams on Zen 4; for bf16 keys, measured 3% slower, the select stays)
        spread = T.reinterpret(kdt, T.reinterpret("int32", raw) >> (bits - 1))
        ordered = raw ^ (spread | T.cast(sign, kdt))
    else:
        ordered = T.where(raw >= T.cast(sign, kdt), raw ^ T.cast((1 << bits) - 1, kdt), raw | T.cast(sign, kdt))
    return T.where((raw & T.cast(sign - 1, kdt)) > T.cast(inf_bits, kdt), T.cast((1 << bits) - 1, kdt), ordered)


def _key_to_value(key, kdt, dtype, bits: int):
    """The float whose ordered key is ``key`` (exact inverse for non-NaN keys)."""
    flip = T.where((key >> (bits - 1)) == T.cast(1, kdt), T.cast(1 << (bits - 1), kdt),
                   T.cast((1 << bits) - 1, kdt))
    return T.reinterpret(dtype, key ^ flip)


def _count_digit(hist4, i, key, shift: int, mask) -> None:
    """``hist4[i % 4, digit(key)] += 1``: four interleaved histograms (summed afterwards)
    break the store-to-load chain a serial loop has on a hot bucket."""
    d = T.cast((key >> shift) & mask, "int32")
    hist4[i & 3, d] = hist4[i & 3, d] + 1


# ---------------------------------------------------------------- shared steps (macros)


@T.macro
def _tile_keys(keys, xt, x, row, tile_of, length, tile: int, group: int, kdt, bits: int):
    """The ordered keys of tile ``tile_of()`` of the row, into ``keys [tile / group, group]``:
    read straight from ``x`` for a whole tile; the row's last tile is copied to ``xt`` (zero
    beyond the vocab) and keys beyond ``length`` are 0, below every real key.  ``tile_of``
    builds the tile number afresh at each use, as the expression written out would."""
    ngroups = tile // group
    if (tile_of() + 1) * tile <= length:
        for g, j in T.Parallel(ngroups, group):
            keys[g, j] = _ordered_key(x[row, tile_of() * tile + g * group + j], kdt, bits)
    else:
        T.copy(x[row, tile_of() * tile], xt)
        for g, j in T.Parallel(ngroups, group):
            keys[g, j] = T.where(tile_of() * tile + g * group + j < length,
                                 _ordered_key(xt[g * group + j], kdt, bits), T.cast(0, kdt))


@T.macro
def _list_hot(hot, nhot, ngroups: int, is_hot):
    """``hot[:nhot]``: the groups ``g`` with ``is_hot(g)``, ascending; branch-free (always
    write, advance on a hit)."""
    nhot = 0
    for g in T.serial(ngroups):
        hot[nhot] = g
        nhot = nhot + T.cast(is_hot(g), "int32")


@T.macro
def _append_hot(cand_key, cand_idx, cnt, hot, nhot, t, tile: int, group: int, thr, key_of, inside=None):
    """Append the survivors (key ``> thr``, and ``inside(h, j)`` when given) of the hot
    groups of tile ``t`` to the buffer in index order; ``key_of(h, j)`` is the key of
    element ``j`` of hot group ``h``.  Branch-free: always write, advance on a survivor."""
    for h in T.serial(nhot):
        for j in T.serial(group):
            cand_key[cnt] = key_of(h, j)
            cand_idx[cnt] = t * tile + hot[h] * group + j
            if inside is None:
                cnt = cnt + T.cast(key_of(h, j) > thr, "int32")
            else:
                cnt = cnt + T.cast((key_of(h, j) > thr) & inside(h, j), "int32")


@T.macro
def _count_digits(hist4, hist, keys, n, shift: int, width: int, mask, prefix=None):
    """``hist[d]``: how many of ``keys[:n]`` have digit ``d`` (``width`` bits at ``shift``,
    ``mask`` = the key-typed ``2^width - 1``), counted serially into four interleaved
    histograms (:func:`_count_digit`) and summed.  With ``prefix``, only keys whose digits
    above this one equal the prefix's are counted."""
    T.clear(hist4)
    for i in T.serial(n):
        if prefix is None:
            _count_digit(hist4, i, keys[i], shift, mask)
        else:
            if (keys[i] >> (shift + width)) == (prefix >> (shift + width)):
                _count_digit(hist4, i, keys[i], shift, mask)
    T.reduce_sum(hist4, hist, dim=0)


@T.macro
def _take_digit(hist, above, need, bucket, prefix, shift: int, kdt):
    """The k-th key's digit: the last bucket whose suffix count reaches ``need`` (which
    becomes the count still to take inside it), appended to ``prefix``."""
    T.radix_find_bucket(hist, above, need, bucket)
    prefix = prefix | (T.cast(bucket, kdt) << shift)


@T.macro
def _keep_bucket(sub_key, nsub, keys, n, shift: int, prefix):
    """``sub_key[:nsub]``: the keys of ``keys[:n]`` in the chosen bucket (digits from ``shift``
    up equal the prefix's), which is all the later digits look at."""
    nsub = 0
    for i in T.serial(n):
        sub_key[nsub] = keys[i]
        nsub = nsub + T.cast((keys[i] >> shift) == (prefix >> shift), "int32")


def _sort_digit(key, p: int, kdt, maxkey: int):
    """8-bit digit ``p`` of the inverted key ``key ^ maxkey`` (value descending order) as an
    int32 bucket, for the radix sort of the winners."""
    return T.cast(((key ^ T.cast(maxkey, kdt)) >> (8 * p)) & T.cast(255, kdt), "int32")


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@T.tunable(tile=[512, 1024, 2048], group=[8, 16, 32], slack=[1024, 2048, 4096], bucket_refine=[True, False],
           mask_append=[True, False], prescan=[0, 32, 128], sort=["network", "radix"],
           compaction=["group_serial", "tile_scan"])
def topk_select(k: int, dtype: str = "float32", index_dtype: str = "int64",
                sorted_values: bool = False, return_value: bool = True, tile: int = 1024,
                group: int = 16, slack: int = 2048, compaction: str = "group_serial",
                bucket_refine: bool = True, mask_append: bool = False, prescan: int = 0, sort: str = "network",
                threads: int = 256):
    """Top-``k`` of every row of ``x[:, :end[row]]``.

    ``compaction`` chooses how a tile's survivors are appended to the buffer;
    both keep index order, so results are identical bit for bit:
    ``"group_serial"`` walks only the groups whose maximum beats the threshold,
    one element at a time (cheap on a CPU, where survivors are rare);
    ``"tile_scan"`` computes every survivor's slot with a two-level prefix sum
    over the tile and scatters in parallel (the data-parallel form for GPUs and
    the vectorised interpreter).

    ``prescan`` (group_serial without mask append only; 0 = off) streams the row in
    chunks of that many tiles: a first pass over a chunk keeps only its group maxima,
    a second recomputes the keys of the groups that beat the threshold and appends
    their survivors.  Before the first chunk's appends the threshold starts just
    below the k-th largest maximum of disjoint sets of the chunk's groups (k sets
    each hold an element at least that large, so it is a lower bound of the row's
    k-th key whatever the data): random rows that fit one chunk then send about
    1.2 k survivors to the buffer, longer ones about k log(N / (prescan * tile)) + k,
    instead of k log(N / cap) plus the slack.

    ``sort`` orders the winners for ``sorted_values``: ``"network"`` (rank sort up to
    1024 winners, bitonic above; data-parallel, for GPUs and the interpreter) or
    ``"radix"`` (a stable LSD radix sort, 8-bit digits: O(k) serial work, for a CPU)."""
    if sort not in ("network", "radix"):
        raise ValueError(f"topk_select: unknown sort {sort!r}")
    if dtype not in _KEY_DTYPE:
        raise ValueError(f"topk_select: dtype must be float32 or bfloat16, got {dtype!r}")
    if compaction not in ("group_serial", "tile_scan"):
        raise ValueError(f"topk_select: unknown compaction {compaction!r}")
    if compaction == "group_serial" and mask_append and group != 8:
        raise ValueError(f"topk_select: group_serial compaction uses 8-bit group masks, got group {group}")
    if prescan and (compaction != "group_serial" or mask_append or prescan * (tile // group) < k):
        raise ValueError(f"topk_select: prescan needs group_serial compaction without mask append and "
                         f"at least k group maxima per chunk (prescan * tile / group >= {k})")
    if tile % group:
        raise ValueError(f"topk_select: tile {tile} is not a multiple of group {group}")
    kdt = _KEY_DTYPE[dtype]
    bits = 16 if dtype == "bfloat16" else 32
    maxkey = (1 << bits) - 1
    ngroups = tile // group
    pow2 = max(2, _next_pow2(k))
    cap = max(k + tile + slack + group, pow2)  # + group: a mask append writes whole groups
    cap = -(-cap // 64) * 64
    digits = _DIGITS[dtype]
    serial = compaction == "group_serial"
    # the start threshold selects over maxima of `fold` groups each: still >= 4k of them, so
    # it stays close to the row's k-th key, at 1/fold of the histogram work
    fold = 1
    while fold < 16 and prescan * ngroups // (2 * fold) >= 4 * k:
        fold *= 2
    nsets = prescan * ngroups // fold

    B = T.symbolic("batch")
    V = T.symbolic("vocab")
    S = T.symbolic("row_stride")
    SI = T.symbolic("idx_stride")
    BV = T.symbolic("val_rows")
    KV = T.symbolic("val_cols")
    SV = T.symbolic("val_stride")

    @T.prim_func
    def topk_select_kernel(x: T.StridedTensor((B, V), (S, 1), dtype),
                           end: T.Tensor((B,), "int32"),
                           offset: T.Tensor((B,), "int32"),
                           idx_fill: T.int32,
                           val_fill: T.float32,
                           nan_rows: T.Tensor((B,), "int32"),
                           out_idx: T.StridedTensor((B, k), (SI, 1), index_dtype),
                           out_val: T.StridedTensor((BV, KV), (SV, 1), dtype),
                           bit_pos: T.Tensor((256, 8), "int32"),
                           bit_count: T.Tensor((256,), "int32")):
        with T.Kernel(B, threads=threads) as row:
            cand_key = T.alloc_shared((cap,), kdt)
            cand_idx = T.alloc_shared((cap,), "int32")
            xt = T.alloc_fragment((tile,), dtype)
            keys = T.alloc_fragment((ngroups, group), kdt)
            nan_flag = T.alloc_fragment((k,), "int32")
            nan_any = T.alloc_fragment((1,), "int32")
            length = T.alloc_var("int32", end[row])
            cnt = T.alloc_var("int32", 0)
            thr = T.alloc_var(kdt, 0)
            prefix = T.alloc_var(kdt, 0)
            need = T.alloc_var("int32", k)
            bucket = T.alloc_var("int32", 0)
            ntiles = T.alloc_var("int32", (length + (tile - 1)) // tile)
            exact = T.alloc_var("int32", 1)
            if serial:
                # (also takes the start threshold's candidate group maxima)
                sub_key = T.alloc_shared((max(cap, nsets),), kdt)
                hot = T.alloc_shared((ngroups,), "int32")
                gmax = T.alloc_fragment((ngroups,), kdt)
                bits_ = T.alloc_fragment((ngroups, group), "int32")
                gmask = T.alloc_fragment((ngroups,), "int32")
                nhot = T.alloc_var("int32", 0)
                nsub = T.alloc_var("int32", 0)
                kept = T.alloc_var("int32", 0)
                equal = T.alloc_var("int32", 0)
                if prescan:
                    # one chunk's group maxima: group g of the chunk's tile u at u * ngroups + g
                    gmax_c = T.alloc_shared((prescan * ngroups,), kdt)
                    ctiles = T.alloc_var("int32", 0)
                    smax = T.alloc_shared((nsets,), kdt)
                    nvalid = T.alloc_var("int32", 0)
                    cbase = T.alloc_var("int32", 0)
            else:
                old_key = T.alloc_shared((cap,), kdt)
                old_idx = T.alloc_shared((cap,), "int32")
                rank = T.alloc_shared((cap,), "int32")
                slot = T.alloc_shared((cap,), "int32")
                flags = T.alloc_fragment((ngroups, group), "int32")
                gcount = T.alloc_fragment((ngroups,), "int32")
                gstart = T.alloc_shared((ngroups,), "int32")

            for t in T.serial(ntiles + 1):
                if prescan:
                    if (t % prescan == 0) & (t < ntiles):
                        # ---- chunk pass: group maxima of tiles t .. t + prescan - 1 (keys are
                        # not kept: the append pass recomputes them for the few hot groups)
                        ctiles = T.min(ntiles - t, prescan)
                        for u in T.serial(ctiles):
                            # (the row's last tile stays in `xt` for the append pass)
                            _tile_keys(keys, xt, x, row, lambda: t + u, length, tile, group, kdt, bits)
                            T.reduce_max(keys, gmax, dim=1)
                            for g in T.Parallel(ngroups):
                                gmax_c[u * ngroups + g] = gmax[g]
                        if (t == 0) & (ctiles * ngroups >= k):
                            # start threshold: just below the k-th largest maximum of `nsets`
                            # disjoint sets of `fold` groups each (group i, i + nsets, ...; groups
                            # beyond the row count as empty, maximum 0), radix-selected on the top
                            # digit over all maxima, then the second over its bucket
                            for i in T.Parallel(nsets):
                                smax[i] = T.where(i < ctiles * ngroups, gmax_c[i], T.cast(0, kdt))
                            for r in T.serial(fold - 1):
                                for i in T.Parallel(nsets):
                                    smax[i] = T.max(smax[i], T.where((r + 1) * nsets + i < ctiles * ngroups,
                                                                     gmax_c[(r + 1) * nsets + i], T.cast(0, kdt)))
                            # sets from nvalid on hold only groups beyond the row (maximum 0): skipped
                            nvalid = T.min(ctiles * ngroups, nsets)
                            prefix = T.cast(0, kdt)
                            need = k
                            for p, (shift, width) in enumerate(digits[:2]):
                                nb = 1 << width
                                mask = T.cast(nb - 1, kdt)
                                ghist4 = T.alloc_shared((4, nb), "int32")
                                ghist = T.alloc_shared((nb,), "int32")
                                gabove = T.alloc_shared((nb,), "int32")
                                if p == 0:
                                    _count_digits(ghist4, ghist, smax, nvalid, shift, width, mask)
                                else:
                                    _count_digits(ghist4, ghist, sub_key, nsub, shift, width, mask)
                                _take_digit(ghist, gabove, need, bucket, prefix, shift, kdt)
                                if p == 0:
                                    _keep_bucket(sub_key, nsub, smax, nvalid, shift, prefix)
                            # at least k disjoint sets have a maximum >= prefix, so the row's k-th key is too
                            thr = T.where(prefix == T.cast(0, kdt), T.cast(0, kdt), prefix - T.cast(1, kdt))
                    cbase = (t % prescan) * ngroups
                # ---- refine: radix-select the k-th key of the buffer, keep exactly k
                if (cnt > cap - tile) | ((t == ntiles) & (cnt > k)):
                    prefix = T.cast(0, kdt)
                    need = k
                    exact = 1
                    for p, (shift, width) in enumerate(digits):
                        if p == 0 or exact:
                            nb = 1 << width
                            mask = T.cast(nb - 1, kdt)
                            hist = T.alloc_shared((nb,), "int32")
                            above = T.alloc_shared((nb,), "int32")
                            if serial:
                                hist4 = T.alloc_shared((4, nb), "int32")
                                if p == 0:
                                    _count_digits(hist4, hist, cand_key, cnt, shift, width, mask)
                                else:
                                    # only keys whose higher digits match the prefix chosen so far
                                    _count_digits(hist4, hist, sub_key, nsub, shift, width, mask, prefix)
                            else:
                                T.clear(hist)
                                for i in T.Parallel(cap):
                                    counted = i < cnt
                                    if p > 0:
                                        counted = counted & ((cand_key[i] >> (shift + width)) == (prefix >> (shift + width)))
                                    if counted:
                                        T.atomic_add(hist[T.cast((cand_key[i] >> shift) & mask, "int32")], 1)
                            _take_digit(hist, above, need, bucket, prefix, shift, kdt)
                            if serial and p == 0:
                                if bucket_refine and t < ntiles:
                                    # cheap refinement: keep the whole bucket of the k-th key (valid
                                    # threshold, no tie work); the exact select runs only when that
                                    # leaves the buffer too full, and always at the end of the row
                                    kept = 0
                                    for i in T.serial(cnt):
                                        cand_key[kept] = cand_key[i]
                                        cand_idx[kept] = cand_idx[i]
                                        kept = kept + T.cast((cand_key[i] >> shift) >= (prefix >> shift), "int32")
                                    cnt = kept
                                    thr = T.where((prefix >> shift) == T.cast(0, kdt), T.cast(0, kdt),
                                                  ((prefix >> shift) << shift) - T.cast(1, kdt))
                                    exact = T.cast(cnt > k + slack // 2, "int32")
                                if exact:
                                    # later digits only look at the keys in the chosen top bucket
                                    _keep_bucket(sub_key, nsub, cand_key, cnt, shift, prefix)
                    if exact:
                        # `prefix` is now the k-th key; the first `need` keys equal to it are kept
                        if serial:
                            kept = 0
                            equal = 0
                            for i in T.serial(cnt):
                                cand_key[kept] = cand_key[i]
                                cand_idx[kept] = cand_idx[i]
                                # integer | and & (not C's || and &&) keep the loop free of branches
                                kept = kept + (T.cast(cand_key[i] > prefix, "int32")
                                               | (T.cast(cand_key[i] == prefix, "int32") & T.cast(equal < need, "int32")))
                                equal = equal + T.cast(cand_key[i] == prefix, "int32")
                        else:
                            for i in T.Parallel(cap):
                                rank[i] = T.where((i < cnt) & (cand_key[i] == prefix), 1, 0)
                                old_key[i] = cand_key[i]
                                old_idx[i] = cand_idx[i]
                            T.cumsum(rank)
                            for i in T.Parallel(cap):
                                slot[i] = T.where((i < cnt) & ((old_key[i] > prefix) | ((old_key[i] == prefix) & (rank[i] <= need))), 1, 0)
                            T.cumsum(slot)
                            for i in T.Parallel(cap):
                                if (i < cnt) & ((old_key[i] > prefix) | ((old_key[i] == prefix) & (rank[i] <= need))):
                                    cand_key[slot[i] - 1] = old_key[i]
                                    cand_idx[slot[i] - 1] = old_idx[i]
                        cnt = k
                        thr = prefix

                # ---- stream one tile: keys, group maxima, append survivors in index order
                if prescan:
                    if t < ntiles:
                        # maxima from the chunk pass; keys recomputed for the hot groups only
                        _list_hot(hot, nhot, ngroups, lambda g: gmax_c[cbase + g] > thr)
                        if (t + 1) * tile <= length:
                            _append_hot(cand_key, cand_idx, cnt, hot, nhot, t, tile, group, thr,
                                        lambda h, j: _ordered_key(x[row, t * tile + hot[h] * group + j], kdt, bits))
                        else:
                            _append_hot(cand_key, cand_idx, cnt, hot, nhot, t, tile, group, thr,
                                        lambda h, j: _ordered_key(xt[hot[h] * group + j], kdt, bits),
                                        lambda h, j: t * tile + hot[h] * group + j < length)
                elif t < ntiles:
                    _tile_keys(keys, xt, x, row, lambda: t, length, tile, group, kdt, bits)
                    if serial and not mask_append:
                        # list the groups holding survivors, then append from those only;
                        # both loops are branch-free (always write, advance on a hit)
                        T.reduce_max(keys, gmax, dim=1)
                        _list_hot(hot, nhot, ngroups, lambda g: gmax[g] > thr)
                        _append_hot(cand_key, cand_idx, cnt, hot, nhot, t, tile, group, thr,
                                    lambda h, j: keys[hot[h], j])
                    elif serial:
                        # one bit per survivor, one 8-bit mask per group; the groups with
                        # survivors are listed, then each appends its survivors with one
                        # 8-lane gather/store driven by tables of set-bit positions
                        for g, j in T.Parallel(ngroups, group):
                            bits_[g, j] = T.cast(keys[g, j] > thr, "int32") << j
                        T.reduce_sum(bits_, gmask, dim=1)
                        _list_hot(hot, nhot, ngroups, lambda g: gmask[g] != 0)
                        for h in T.serial(nhot):
                            for j in T.Parallel(group):
                                cand_key[cnt + j] = keys[hot[h], bit_pos[gmask[hot[h]], j]]
                                cand_idx[cnt + j] = t * tile + hot[h] * group + bit_pos[gmask[hot[h]], j]
                            cnt = cnt + bit_count[gmask[hot[h]]]
                    else:
                        for g, j in T.Parallel(ngroups, group):
                            flags[g, j] = T.where(keys[g, j] > thr, 1, 0)
                        T.reduce_sum(flags, gcount, dim=1)
                        T.cumsum(flags, dim=1)
                        T.cumsum(gcount, gstart)
                        for g, j in T.Parallel(ngroups, group):
                            if keys[g, j] > thr:
                                cand_key[cnt + gstart[g] - gcount[g] + flags[g, j] - 1] = keys[g, j]
                                cand_idx[cnt + gstart[g] - gcount[g] + flags[g, j] - 1] = t * tile + g * group + j
                        cnt = cnt + gstart[ngroups - 1]

            # ---- epilogue: the buffer holds min(length, k) winners in index order
            if sorted_values and sort == "radix":
                # stable LSD radix sort of the cnt winners on the inverted key (value descending);
                # the buffer is in index order, so equal values stay in ascending index order.
                # An even number of 8-bit passes ping-pongs back into cand_key / cand_idx.
                rs_key = T.alloc_shared((k,), kdt)
                rs_idx = T.alloc_shared((k,), "int32")
                rhist = T.alloc_shared((256,), "int32")
                rpos = T.alloc_shared((256,), "int32")
                for p in range(bits // 8):
                    src_key, src_idx, dst_key, dst_idx = ((cand_key, cand_idx, rs_key, rs_idx) if p % 2 == 0
                                                          else (rs_key, rs_idx, cand_key, cand_idx))
                    T.clear(rhist)
                    for i in T.serial(cnt):
                        rhist[_sort_digit(src_key[i], p, kdt, maxkey)] = rhist[_sort_digit(src_key[i], p, kdt, maxkey)] + 1
                    T.cumsum(rhist, rpos)
                    for b in T.Parallel(256):
                        rpos[b] = rpos[b] - rhist[b]
                    for i in T.serial(cnt):
                        dst_key[rpos[_sort_digit(src_key[i], p, kdt, maxkey)]] = src_key[i]
                        dst_idx[rpos[_sort_digit(src_key[i], p, kdt, maxkey)]] = src_idx[i]
                        rpos[_sort_digit(src_key[i], p, kdt, maxkey)] = rpos[_sort_digit(src_key[i], p, kdt, maxkey)] + 1
            elif sorted_values:
                # padding ranks last: key 0 is below every real key, and the indices differ
                for i in T.Parallel(pow2):
                    if i >= cnt:
                        cand_key[i] = T.cast(0, kdt)
                        cand_idx[i] = 2 ** 31 - 1 - pow2 + i
                if pow2 <= _RANK_SORT_MAX:
                    rank_rows = min(_RANK_ROWS, pow2)
                    # rank sort: each winner's slot is the number of winners that beat it
                    # (k^2 vectorised compares; cheaper than a network at these sizes)
                    better = T.alloc_fragment((rank_rows, pow2), "int32")
                    rank_c = T.alloc_fragment((rank_rows,), "int32")
                    rank_all = T.alloc_shared((pow2,), "int32")
                    sorted_key = T.alloc_shared((pow2,), kdt)
                    sorted_idx = T.alloc_shared((pow2,), "int32")
                    for c in T.serial(pow2 // rank_rows):
                        for r, j in T.Parallel(rank_rows, pow2):
                            better[r, j] = T.cast(cand_key[j] > cand_key[c * rank_rows + r], "int32") | (
                                T.cast(cand_key[j] == cand_key[c * rank_rows + r], "int32")
                                & T.cast(cand_idx[j] < cand_idx[c * rank_rows + r], "int32"))
                        T.reduce_sum(better, rank_c, dim=1)
                        for r in T.Parallel(rank_rows):
                            rank_all[c * rank_rows + r] = rank_c[r]
                    for i in T.Parallel(pow2):
                        sorted_key[rank_all[i]] = cand_key[i]
                        sorted_idx[rank_all[i]] = cand_idx[i]
                    for i in T.Parallel(pow2):
                        cand_key[i] = sorted_key[i]
                        cand_idx[i] = sorted_idx[i]
                else:
                    # bitonic network over (value desc, index asc)
                    lo_key = T.alloc_fragment((pow2 // 2,), kdt)
                    hi_key = T.alloc_fragment((pow2 // 2,), kdt)
                    lo_idx = T.alloc_fragment((pow2 // 2,), "int32")
                    hi_idx = T.alloc_fragment((pow2 // 2,), "int32")
                    size = 2
                    while size <= pow2:
                        stride = size // 2
                        while stride >= 1:
                            # compare-exchange pairs (a, a + stride): read everything, then write
                            for q in T.Parallel(pow2 // 2):
                                a = (q // stride) * (2 * stride) + q % stride
                                a_first = (cand_key[a] > cand_key[a + stride]) | (
                                    (cand_key[a] == cand_key[a + stride]) & (cand_idx[a] < cand_idx[a + stride]))
                                keep = T.where((a & size) == 0, a_first, ~a_first)
                                lo_key[q] = T.where(keep, cand_key[a], cand_key[a + stride])
                                hi_key[q] = T.where(keep, cand_key[a + stride], cand_key[a])
                                lo_idx[q] = T.where(keep, cand_idx[a], cand_idx[a + stride])
                                hi_idx[q] = T.where(keep, cand_idx[a + stride], cand_idx[a])
                            for q in T.Parallel(pow2 // 2):
                                a = (q // stride) * (2 * stride) + q % stride
                                cand_key[a] = lo_key[q]
                                cand_key[a + stride] = hi_key[q]
                                cand_idx[a] = lo_idx[q]
                                cand_idx[a + stride] = hi_idx[q]
                            stride //= 2
                        size *= 2
            for j in T.Parallel(k):
                nan_flag[j] = T.where((j < cnt) & (cand_key[j] == T.cast(maxkey, kdt)), 1, 0)
            T.reduce_max(nan_flag, nan_any)
            nan_rows[row] = nan_any[0]
            for j in T.Parallel(k):
                out_idx[row, j] = T.where(
                    nan_any[0] > 0, T.cast(NAN_ROW_MARKER, index_dtype),
                    T.where(j < cnt, T.cast(cand_idx[j], index_dtype) + T.cast(offset[row], index_dtype),
                            T.cast(idx_fill, index_dtype)))
                if return_value:
                    out_val[row, j] = T.where(j < cnt, _key_to_value(cand_key[j], kdt, dtype, bits),
                                              T.cast(val_fill, dtype))

    return topk_select_kernel


def bit_tables(device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's last two inputs: for every 8-bit mask, the positions of its set
    bits in ascending order (padded with 0) and how many there are."""
    return _bit_tables(str(device))


@functools.lru_cache(maxsize=None)
def _bit_tables(device: str):
    pos = torch.zeros((256, 8), dtype=torch.int32)
    count = torch.zeros(256, dtype=torch.int32)
    for m in range(256):
        ones = [j for j in range(8) if m >> j & 1]
        pos[m, :len(ones)] = torch.tensor(ones, dtype=torch.int32)
        count[m] = len(ones)
    return pos.to(device), count.to(device)
