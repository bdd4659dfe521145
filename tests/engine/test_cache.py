"""The paged KV cache against a plain model of what each sequence holds.

The model is a dict per sequence of the values written at every entry of
every kind; the cache must read back exactly those values for every entry a
query may still see, keep its reference counts equal to the number of tables
naming each block, and leave everything unchanged when an allocation fails.
"""

import random

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernforge.engine import BlockAllocator, CacheFullError, CacheKind, Fp8KVLayout, PagedKVCache

BS = 4  # small blocks, so a few tokens cross block boundaries
W = 6


def kinds():
    return [CacheKind("window", 1, 3, (0, 1), window=W, pool="kv"),
            CacheKind("compressed2", 2, 3, (1,), pool="kv"),
            CacheKind("index4", 4, 2, (1,), kv=False, pool="index")]


# Allocator ------------------------------------------------------------------------------

def test_allocator_counts_frees_and_reuses():
    a = BlockAllocator(3)
    got = a.allocate(2)
    assert len(set(got)) == 2 and a.num_free == 1 and all(a.refcount(b) == 1 for b in got)
    a.share([got[0]])
    a.release([got[0]])
    assert a.refcount(got[0]) == 1 and a.num_free == 1  # still named by one table
    a.release(got)
    assert a.num_free == 3
    again = a.allocate(3)
    assert sorted(again) == [0, 1, 2]


def test_allocator_failure_changes_nothing():
    a = BlockAllocator(2, "kv")
    held = a.allocate(1)
    with pytest.raises(CacheFullError, match="'kv' is full: 2 blocks needed, 1 free") as info:
        a.allocate(2)
    assert (info.value.needed, info.value.free) == (2, 1)
    assert a.num_free == 1 and a.refcount(held[0]) == 1
    with pytest.raises(ValueError, match="released 2 times"):
        a.release([held[0], held[0]])
    assert a.refcount(held[0]) == 1  # the bad release touched nothing
    with pytest.raises(ValueError, match="not allocated"):
        a.share([1 - held[0]])
    with pytest.raises(ValueError, match="outside"):
        a.release([5])
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(0)


# Paged cache against a model -------------------------------------------------------------

class Model:
    """Per sequence: length and {kind: {entry: value tuple}} for the entries written."""

    def __init__(self):
        self.seqs: dict[int, tuple[int, dict]] = {}


def value_for(counter: int, width: int) -> torch.Tensor:
    # small integers: exact in bf16 storage
    return torch.tensor([float((counter * 7 + j) % 200 - 100) for j in range(width)])


def check(cache: PagedKVCache, model: Model) -> None:
    assert set(cache.sequences) == set(model.seqs)
    named: dict[str, dict[int, int]] = {p: {} for p in cache.allocators}
    for seq_id, (length, entries) in model.seqs.items():
        assert cache.length(seq_id) == length
        for name, kind in cache.kinds.items():
            table = cache.table(seq_id, name)
            for b in table:
                if b >= 0:
                    named[kind.pool_name][b] = named[kind.pool_name].get(b, 0) + 1
            n = kind.entries(length)
            first = max(0, length - (W - 1)) if kind.window else 0
            want = list(range(first, n))
            if not want:
                continue
            slots = cache.slots(seq_id, name, torch.tensor(want))
            for layer in kind.layers:
                got = cache.read(name, layer, slots).float()
                expect = torch.stack([entries[name][(layer, e)] for e in want])
                assert torch.equal(got, expect), (seq_id, name, layer)
    for pool, alloc in cache.allocators.items():
        for b in range(alloc.num_blocks):
            assert alloc.refcount(b) == named[pool].get(b, 0), (pool, b)
        assert alloc.num_free == alloc.num_blocks - len(named[pool])
    check_batched_slots(cache, model)


def check_batched_slots(cache: PagedKVCache, model: Model) -> None:
    """`slots_of` over every sequence at once equals `slots` per sequence: every live entry
    of each kind, rows in shuffled order, padded with -1 entries (which stay -1)."""
    seqs = list(model.seqs)
    random.Random(len(seqs)).shuffle(seqs)
    for name, kind in cache.kinds.items():
        wants = []
        for seq_id in seqs:
            length = model.seqs[seq_id][0]
            first = max(0, length - (W - 1)) if kind.window else 0
            wants.append(list(range(first, kind.entries(length))))
        width = max(map(len, wants), default=0)
        if width == 0:
            continue
        entries = torch.tensor([w + [-1] * (width - len(w)) for w in wants])
        got = cache.slots_of(cache.block_tables(seqs, name), torch.arange(len(seqs)), entries, name)
        for i, (seq_id, want) in enumerate(zip(seqs, wants)):
            if want:
                assert torch.equal(got[i, :len(want)], cache.slots(seq_id, name, torch.tensor(want)))
            assert (got[i, len(want):] == -1).all()


def snapshot(cache: PagedKVCache):
    return ({s: (q.length, {k: list(t) for k, t in q.tables.items()}) for s, q in cache.sequences.items()},
            {p: (list(a._free), list(a._refs)) for p, a in cache.allocators.items()},
            {k: v.clone() for k, v in cache._storage.items()})


def same_snapshot(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def do_step(cache: PagedKVCache, model: Model, counts: dict, counter: list) -> None:
    """prepare + write every new entry of every kind and layer + commit, mirrored in the model."""
    cache.prepare(counts)
    for seq_id, n in counts.items():
        length, entries = model.seqs[seq_id]
        for name, kind in cache.kinds.items():
            new = list(range(kind.entries(length), kind.entries(length + n)))
            if not new:
                continue
            slots = cache.slots(seq_id, name, torch.tensor(new))
            for layer in kind.layers:
                vals = []
                for e in new:
                    counter[0] += 1
                    v = value_for(counter[0], kind.width)
                    entries[name][(layer, e)] = v
                    vals.append(v)
                cache.write(name, layer, slots, torch.stack(vals))
        model.seqs[seq_id] = (length + n, entries)
    cache.commit(counts)


def run_ops(ops: list, num_blocks: dict) -> dict:
    """Apply the ops to a cache and the model, checking after each; returns event counts."""
    cache = PagedKVCache(kinds(), num_blocks, block_size=BS)
    model = Model()
    counter, next_id = [0], 0
    events = {"full": 0, "shared_writes": 0}
    for op, arg in ops:
        live = sorted(model.seqs)
        if op == "add" or not live:
            cache.add_sequence(next_id)
            model.seqs[next_id] = (0, {k: {} for k in cache.kinds})
            next_id += 1
        elif op == "fork":
            src = live[arg % len(live)]
            cache.fork(src, next_id)
            length, entries = model.seqs[src]
            model.seqs[next_id] = (length, {k: dict(v) for k, v in entries.items()})
            next_id += 1
        elif op == "free":
            victim = live[arg % len(live)]
            cache.free(victim)
            del model.seqs[victim]
        else:  # step: a ragged batch of 1..3 sequences, 1..9 tokens each
            rng = random.Random(arg)
            chosen = rng.sample(live, min(len(live), rng.randint(1, 3)))
            counts = {s: rng.randint(1, 9) for s in chosen}
            if any(model.seqs[s][0] + n > 64 for s, n in counts.items()):
                continue
            before = snapshot(cache)
            shared = any(cache.allocators["kv"].refcount(b) > 1 for s in chosen
                         for b in cache.table(s, "window") if b >= 0)
            try:
                do_step(cache, model, counts, counter)
                events["shared_writes"] += shared
            except CacheFullError:
                events["full"] += 1
                assert same_snapshot(before, snapshot(cache)), "a failed allocation changed the cache"
        check(cache, model)
    return events


OPS = st.lists(st.tuples(st.sampled_from(["add", "fork", "free", "step", "step", "step"]),
                         st.integers(0, 10_000)), min_size=1, max_size=40)


@settings(max_examples=30)
@given(OPS)
def test_random_operations_match_the_model(ops):
    run_ops(ops, {"kv": 14, "index": 3})  # small pools: allocation failures happen


def test_seeded_long_run_with_failures():
    """A fixed long run that is known to hit CacheFullError, COW copies and window eviction."""
    rng = random.Random(5)
    ops = [(rng.choice(["add", "fork", "free", "step", "step", "step", "step"]), rng.randrange(10_000))
           for _ in range(150)]
    events = run_ops(ops, {"kv": 12, "index": 2})
    assert events["full"] >= 3 and events["shared_writes"] >= 3, events


def test_copy_on_write_shares_then_copies():
    cache = PagedKVCache(kinds(), {"kv": 10, "index": 4}, block_size=BS)
    model, counter = Model(), [0]
    cache.add_sequence("a")
    model.seqs["a"] = (0, {k: {} for k in cache.kinds})
    do_step(cache, model, {"a": 6}, counter)
    free_before = cache.allocators["kv"].num_free
    cache.fork("a", "b")
    model.seqs["b"] = (6, {k: dict(v) for k, v in model.seqs["a"][1].items()})
    assert cache.table("a", "window") == cache.table("b", "window")  # shared, nothing copied
    assert cache.allocators["kv"].num_free == free_before
    shared_tail = cache.table("a", "window")[1]
    assert cache.allocators["kv"].refcount(shared_tail) == 2
    do_step(cache, model, {"b": 1}, counter)  # writes position 6 into the shared block 1
    assert cache.table("b", "window")[1] != shared_tail and cache.table("a", "window")[1] == shared_tail
    assert cache.allocators["kv"].refcount(shared_tail) == 1
    check(cache, model)
    cache.free("a")
    del model.seqs["a"]
    check(cache, model)


def test_window_blocks_are_returned():
    cache = PagedKVCache(kinds(), {"kv": 20, "index": 4}, block_size=BS)
    model, counter = Model(), [0]
    cache.add_sequence(0)
    model.seqs[0] = (0, {k: {} for k in cache.kinds})
    do_step(cache, model, {0: 30}, counter)  # a prefill much longer than the window
    live = [b for b in cache.table(0, "window") if b >= 0]
    assert len(live) <= -(-(W - 1) // BS) + 1  # only the blocks the next query can see
    check(cache, model)
    with pytest.raises(ValueError, match="freed or unallocated"):  # position 0's block went back
        cache.slots_of(cache.block_tables([0], "window"), torch.tensor([0]), torch.tensor([[0, 29]]), "window")


def test_cache_errors_name_the_argument():
    cache = PagedKVCache(kinds(), {"kv": 4, "index": 1}, block_size=BS)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match="already exists"):
        cache.add_sequence(0)
    with pytest.raises(KeyError, match="unknown sequence 7"):
        cache.prepare({7: 1})
    with pytest.raises(ValueError, match="non-negative int"):
        cache.prepare({0: -1})
    with pytest.raises(KeyError, match="unknown cache kind 'nope'"):
        cache.slots(0, "nope", torch.tensor([0]))
    with pytest.raises(ValueError, match="no window block"):
        cache.slots(0, "window", torch.tensor([0]))
    tables = cache.block_tables([0], "window")
    with pytest.raises(ValueError, match="freed or unallocated"):  # batched lookup: no block yet
        cache.slots_of(tables, torch.tensor([0]), torch.tensor([0]), "window")
    with pytest.raises(ValueError, match="num_blocks has no entry"):
        PagedKVCache(kinds(), {"kv": 4}, block_size=BS)
    with pytest.raises(CacheFullError, match="is full"):
        cache.prepare({0: 20})  # 5 window blocks > 4
    assert cache.length(0) == 0 and cache.table(0, "window") == [] and cache.allocators["kv"].num_free == 4


# FP8 (MODEL1) pages --------------------------------------------------------------------

def test_fp8_layout_sizes_match_flashmla_model1():
    lay = Fp8KVLayout(448, 64)
    assert (lay.token_bytes, lay.scale_bytes, lay.bytes_per_token()) == (576, 8, 584)
    assert Fp8KVLayout(64, 32).bytes_per_token() == 64 + 64 + 8
    with pytest.raises(ValueError, match="multiple of 64"):
        Fp8KVLayout(100, 28)


def fp8_grid_values(n: int, nope: int, rope: int, seed: int) -> torch.Tensor:
    """Rows whose nope blocks are exactly e4m3 codes times a power-of-two scale (what QAT writes)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(n, nope // 64, 64, generator=g) * 3
    scale = 2.0 ** torch.randint(-6, 3, (n, nope // 64, 1), generator=g).float()
    codes = (raw * 100).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    nope_v = (codes * scale).flatten(1)  # exact: a power-of-two scale
    rope_v = torch.randn(n, rope, generator=g).bfloat16().float()
    return torch.cat([nope_v, rope_v], dim=1)


def test_fp8_pages_bytes_and_round_trip():
    """V4-Flash dims: each token's bytes against an independent numpy/ml_dtypes encoder."""
    nope, rope = 448, 64
    kind = CacheKind("window", 1, nope + rope, (0,), window=None, rope_dim=rope, pool="kv")
    cache = PagedKVCache([kind], 3, is_fp8_kvcache=True)
    cache.add_sequence(0)
    cache.prepare({0: 70})
    values = fp8_grid_values(70, nope, rope, seed=3)
    slots = cache.slots(0, "window", torch.arange(70))
    cache.write("window", 0, slots, values)
    buf = cache.storage("window", 0).numpy()
    lay = cache.fp8_layouts["kv"]
    for i in (0, 1, 63, 64, 69):
        page, off = divmod(int(slots[i]), 64)
        v = values[i].numpy()
        blocks = v[:nope].reshape(-1, 64)
        amax = np.maximum(np.abs(blocks).max(1), 1e-4) / 448.0
        exps = np.ceil(np.log2(amax)).astype(np.int64)
        codes = (blocks / np.exp2(exps)[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).ravel()
        rope_bytes = v[nope:].astype(ml_dtypes.bfloat16).view(np.uint8)
        token = buf[page, off * 576:(off + 1) * 576]
        assert np.array_equal(token[:nope], codes) and np.array_equal(token[nope:], rope_bytes)
        scale = buf[page, 64 * 576 + off * 8:64 * 576 + (off + 1) * 8]
        assert np.array_equal(scale, np.append(exps + 127, 0).astype(np.uint8))
    got = cache.read("window", 0, slots).float()
    assert torch.equal(got, values)  # lossless for QAT-rounded values
    assert lay.page_bytes == 64 * 584
