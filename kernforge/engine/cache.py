"""The engine's paged KV cache: block tables over fixed-size blocks, shared by the layers.

Why paged: sequences of different lengths decode together, finish and free
their blocks for others, and a common prefix can be shared by reference
(copy-on-write) instead of copied. The reference model's dense per-batch
caches (`kernforge.model`) can do none of this.

Layout. A `CacheKind` is one family of entries with its own positions:

| kind | entry | entries for a sequence of L tokens | width |
|---|---|---|---|
| `window` | one token's KV | positions L-W+1..L-1 are kept, older blocks are freed | head_dim |
| `compressed4` / `compressed128` | one pooled KV entry per r tokens | L // r | head_dim |
| `index4` | one indexer key per 4 tokens | L // 4 | index_head_dim |

Every kind has one `BlockAllocator` and, per sequence, one block table (a list
of physical block ids; -1 marks a window block that fell out of the window).
All layers of a kind use the same table: layer l's storage for the kind is its
own tensor indexed by the same block ids (as in vLLM). Entry e of a sequence
lives at flat slot `table[e // 64] * 64 + e % 64`, which is exactly the
"flat token id" that FlashMLA's sparse path takes in `indices`.

The window is a ring of blocks rather than a ring of slots: a step writes its
tokens at their positions (a prefill chunk longer than the window needs its
own keys while its queries run) and, after the step, every block wholly older
than the next query's window returns to the pool. Between steps a sequence
holds at most ceil((W - 1) / 64) + 1 window blocks.

KV storage (window and compressed kinds) is bf16 `[num_blocks, 64, 1, head_dim]`,
the page layout `flash_mla_with_kvcache` reads. With `is_fp8_kvcache=True` it
is FlashMLA's V4 ("MODEL1") FP8 page instead (flashmla-decode.md §3): per page,
64 x (nope e4m3 bytes + rope bf16 bytes), then 64 x `scale_bytes` bytes of
E8M0 scales, one per 64 nope values, zero-padded to a multiple of 8 bytes
(V4-Flash: 448 + 128 and 7 + 1, 584 bytes per token). The nope dims the model
writes are already rounded to e4m3 with power-of-two block-64 scales (QAT), so
this layout loses nothing against the bf16 one.

Failure is atomic: `prepare` counts every block a step needs (new blocks and
copy-on-write copies) for every sequence before it takes any, and raises
`CacheFullError` with the cache unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernforge.engine import kernel_steps as ks
from kernforge.engine.allocator import BlockAllocator, CacheFullError

BLOCK_SIZE = 64
KV_DTYPE = torch.bfloat16  # what flash_mla_with_kvcache reads; tests swap it to check the bookkeeping exactly

__all__ = ["BLOCK_SIZE", "CacheFullError", "CacheKind", "Fp8KVLayout", "PagedKVCache"]


@dataclass(frozen=True)
class CacheKind:
    """One entry family: `ratio` tokens per entry, `width` values per entry, used by `layers`.

    `window` (window kind only) keeps just the entries a query within the next
    `window` positions can see. `kv` entries are attention keys/values (bf16 or FP8
    pages); the others (indexer keys) are stored in `dtype`.
    """

    name: str
    ratio: int
    width: int
    layers: tuple[int, ...]
    window: int | None = None
    kv: bool = True
    rope_dim: int = 0
    pool: str = ""  # kinds naming the same pool share its blocks and storage ("" = own pool)

    @property
    def pool_name(self) -> str:
        return self.pool or self.name

    def entries(self, length: int) -> int:
        """Entries a sequence of `length` tokens has written."""
        return length // self.ratio


@dataclass(frozen=True)
class Fp8KVLayout:
    """Byte layout of one FP8 KV page (FlashMLA MODEL1, generalised to any nope/rope split)."""

    nope: int
    rope: int
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        if self.nope <= 0 or self.nope % 64:
            raise ValueError(f"FP8 KV layout needs nope dims that are a positive multiple of 64, got {self.nope}")

    @property
    def token_bytes(self) -> int:
        return self.nope + 2 * self.rope

    @property
    def scale_bytes(self) -> int:
        n = self.nope // 64
        return -(-n // 8) * 8

    @property
    def page_bytes(self) -> int:
        return self.block_size * (self.token_bytes + self.scale_bytes)

    def bytes_per_token(self) -> int:
        return self.token_bytes + self.scale_bytes


@dataclass
class _Sequence:
    length: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)


class PagedKVCache:
    """Block tables, allocators and per-layer storage for every `CacheKind`.

    Kinds that name one `pool` draw block ids from one allocator and live in one
    storage tensor per layer: the engine puts the window and the compressed KV
    of a layer in one pool, so that a single `flash_mla_with_kvcache` call can
    attend to both through flat slot ids. `num_blocks` is one int for every
    pool or a dict by pool name. `backend` is where the FP8 page kernels run (None: the
    storage's device decides), the engine's own backend.
    """

    def __init__(self, kinds: list[CacheKind], num_blocks: int | dict[str, int], *,
                 block_size: int = BLOCK_SIZE, is_fp8_kvcache: bool = False,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 backend: str | None = None):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        names = [k.name for k in kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"cache kind names must be distinct, got {names}")
        self.kinds = {k.name: k for k in kinds}
        self.block_size, self.is_fp8_kvcache, self.dtype, self.device = block_size, bool(is_fp8_kvcache), dtype, device
        self.backend = backend
        pools: dict[str, list[CacheKind]] = {}
        for k in kinds:
            pools.setdefault(k.pool_name, []).append(k)
        counts = num_blocks if isinstance(num_blocks, dict) else {p: num_blocks for p in pools}
        missing = sorted(set(pools) - set(counts))
        if missing:
            raise ValueError(f"num_blocks has no entry for cache pools {missing}")
        self.allocators = {p: BlockAllocator(counts[p], p) for p in pools}
        self.fp8_layouts: dict[str, Fp8KVLayout] = {}
        self._storage: dict[tuple[str, int], torch.Tensor] = {}
        for p, members in pools.items():
            first = members[0]
            if any((m.width, m.kv, m.rope_dim) != (first.width, first.kv, first.rope_dim) for m in members):
                raise ValueError(f"kinds of pool {p!r} must agree on width, kv and rope_dim")
            nb = counts[p]
            if first.kv and self.is_fp8_kvcache:
                lay = self.fp8_layouts[p] = Fp8KVLayout(first.width - first.rope_dim, first.rope_dim, block_size)
                shape, sdtype = (nb, lay.page_bytes), torch.uint8
            elif first.kv:
                shape, sdtype = (nb, block_size, 1, first.width), KV_DTYPE
            else:
                shape, sdtype = (nb, block_size, first.width), dtype
            for layer in sorted({layer for m in members for layer in m.layers}):
                self._storage[(p, layer)] = torch.zeros(shape, dtype=sdtype, device=device)
        self.sequences: dict[object, _Sequence] = {}

    # Sequences ------------------------------------------------------------------
    def add_sequence(self, seq_id) -> None:
        if seq_id in self.sequences:
            raise ValueError(f"sequence {seq_id!r} already exists")
        self.sequences[seq_id] = _Sequence(0, {n: [] for n in self.kinds})

    def length(self, seq_id) -> int:
        return self._seq(seq_id).length

    def table(self, seq_id, kind: str) -> list[int]:
        """A copy of the sequence's block table for `kind` (-1 = freed window block)."""
        return list(self._seq(seq_id).tables[self._kind(kind).name])

    def free(self, seq_id) -> None:
        """Drop the sequence; its blocks return to the pools once no fork names them."""
        seq = self._seq(seq_id)
        for name, table in seq.tables.items():
            self._alloc(name).release([b for b in table if b >= 0])
        del self.sequences[seq_id]

    def fork(self, src, dst) -> None:
        """`dst` starts as `src` (same length and entries), sharing its blocks copy-on-write."""
        seq = self._seq(src)
        if dst in self.sequences:
            raise ValueError(f"sequence {dst!r} already exists")
        for name, table in seq.tables.items():
            self._alloc(name).share([b for b in table if b >= 0])
        self.sequences[dst] = _Sequence(seq.length, {n: list(t) for n, t in seq.tables.items()})

    def rewind(self, seq_id, length: int) -> None:
        """Set the sequence back to `length` tokens with an empty window: every window block
        returns to the pool, every other kind keeps its entries.

        Why: the sliding-window recovery (`Engine.rebuild_cache` with a tail) keeps the
        persisted compressed KV and indexer keys and replays only the last tokens, so the
        window is rebuilt from nothing while the compressed entries stay where they are
        (the replay adds only the entries past them)."""
        seq = self._seq(seq_id)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= seq.length:
            raise ValueError(f"length must be an int in [0, {seq.length}] for sequence {seq_id!r}, got {length!r}")
        for name, kind in self.kinds.items():
            if kind.window is not None:
                table = seq.tables[name]
                self._alloc(name).release([b for b in table if b >= 0])
                table[:] = [-1] * len(table)
        seq.length = length

    # Steps -----------------------------------------------------------------------
    def prepare(self, new_tokens: dict) -> None:
        """Make every block that `new_tokens` {seq_id: count} will write exclusive to its sequence.

        Allocates missing blocks and copies shared ones (copy-on-write). Counts
        first, per pool, and raises CacheFullError before changing anything.
        """
        for seq_id, n in new_tokens.items():
            self._seq(seq_id)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"new token count for sequence {seq_id!r} must be a non-negative int, got {n!r}")
        plans: dict[str, list[tuple[object, str, int, int]]] = {p: [] for p in self.allocators}
        sim_refs: dict[str, dict[int, int]] = {p: {} for p in self.allocators}
        for name, kind in self.kinds.items():
            pool = kind.pool_name
            alloc, plan, refs_of = self.allocators[pool], plans[pool], sim_refs[pool]
            for seq_id, n in new_tokens.items():
                seq = self.sequences[seq_id]
                table = seq.tables[name]
                lo, hi = kind.entries(seq.length), kind.entries(seq.length + n)
                if hi <= lo:
                    continue
                for j in range(lo // self.block_size, (hi - 1) // self.block_size + 1):
                    old = table[j] if j < len(table) else -1
                    if old < 0:
                        plan.append((seq_id, name, j, -1))
                        continue
                    refs = refs_of.setdefault(old, alloc.refcount(old))
                    if refs > 1:  # shared: this sequence gets its own copy
                        plan.append((seq_id, name, j, old))
                        refs_of[old] = refs - 1
        for pool, plan in plans.items():
            if len(plan) > self.allocators[pool].num_free:
                kinds = sorted({name for _, name, _, _ in plan})
                raise CacheFullError(f"{pool} ({', '.join(kinds)})", len(plan), self.allocators[pool].num_free)
        for pool, plan in plans.items():
            alloc = self.allocators[pool]
            fresh = alloc.allocate(len(plan))
            for (seq_id, name, j, old), new in zip(plan, fresh):
                table = self.sequences[seq_id].tables[name]
                table.extend([-1] * (j + 1 - len(table)))
                if old >= 0:
                    for layer in self.kinds[name].layers:
                        buf = self._storage[(pool, layer)]
                        buf[new] = buf[old]
                    alloc.release([old])
                table[j] = new

    def commit(self, new_tokens: dict) -> None:
        """Advance the lengths by `new_tokens` and return window blocks no later query can see."""
        for seq_id, n in new_tokens.items():
            seq = self._seq(seq_id)
            seq.length += n
            for name, kind in self.kinds.items():
                if kind.window is None:
                    continue
                keep_from = seq.length - (kind.window - 1)  # oldest position the next query sees
                table = seq.tables[name]
                gone = [j for j, b in enumerate(table) if b >= 0 and (j + 1) * self.block_size <= keep_from]
                self._alloc(name).release([table[j] for j in gone])
                for j in gone:
                    table[j] = -1

    # Addressing ------------------------------------------------------------------
    def slots(self, seq_id, kind: str, entries: torch.Tensor) -> torch.Tensor:
        """Flat slot ids (block * block_size + offset) of entry indices; negative entries give -1.

        An entry in a freed or never allocated block is a caller bug and raises.
        """
        table = self._seq(seq_id).tables[self._kind(kind).name]
        entries = entries.long()
        valid = entries >= 0
        j = torch.where(valid, entries, 0) // self.block_size
        if valid.any() and int(j[valid].max()) >= len(table):
            raise ValueError(f"sequence {seq_id!r} has no {kind} block for entry {int(entries[valid].max())}")
        t = torch.tensor(table + [-1], dtype=torch.long, device=entries.device)
        blocks = t[torch.where(valid, j, len(table))]
        if bool((valid & (blocks < 0)).any()):
            raise ValueError(f"sequence {seq_id!r}: a requested {kind} entry lies in a freed block")
        out = blocks * self.block_size + entries % self.block_size
        return torch.where(valid, out, -1)

    def block_tables(self, seq_ids: list, kind: str) -> torch.Tensor:
        """The block tables of `seq_ids` for `kind` as one int64 tensor [len(seq_ids), B + 1]
        (B the longest table), padded with -1: the operand of `slots_of`, built once per step."""
        name = self._kind(kind).name
        tables = [self._seq(s).tables[name] for s in seq_ids]
        width = max(map(len, tables), default=0) + 1
        return torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.long)

    def slots_of(self, tables: torch.Tensor, rows: torch.Tensor, entries: torch.Tensor, kind: str = "") -> torch.Tensor:
        """`slots` for many sequences at once: entry `entries[i, ...]` of the sequence whose
        `block_tables` row is `rows[i]` (rows [n], entries [n] or [n, k]); negative entries
        give -1. An entry in a freed or never allocated block raises, as in `slots`."""
        entries = entries.long()
        rows = rows.long().view(-1, *([1] * (entries.dim() - 1)))
        valid = entries >= 0
        last = tables.shape[1] - 1  # the -1 column: entries past a table land there
        j = torch.where(valid, entries // self.block_size, last).clamp_max(last)
        blocks = tables[rows, j]
        if bool((valid & (blocks < 0)).any()):
            raise ValueError(f"a requested {kind} entry lies in a freed or unallocated block")
        return torch.where(valid, blocks * self.block_size + entries % self.block_size, -1)

    def storage(self, kind: str, layer: int) -> torch.Tensor:
        """The raw pool of one layer: bf16 [nb, bs, 1, d], FP8 pages uint8 [nb, page_bytes], or [nb, bs, d]."""
        return self._storage[(self._kind(kind).pool_name, layer)]

    def kv_pages(self, kind: str, layer: int) -> torch.Tensor:
        """bf16 [nb, bs, 1, d] pages for the attention op (dequantized from FP8 pages when needed)."""
        buf = self.storage(kind, layer)
        lay = self.fp8_layouts.get(self._kind(kind).pool_name)
        return buf if lay is None else ks.fp8_kv_dequantize(buf, lay, self.backend)

    def write(self, kind: str, layer: int, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Store `values` [n, width] at flat `slots` [n] (all >= 0)."""
        k = self._kind(kind)
        if values.dim() != 2 or values.shape[0] != slots.numel() or values.shape[1] != k.width:
            raise ValueError(f"values must be [{slots.numel()}, {k.width}], got {tuple(values.shape)}")
        slots = slots.long()
        page, off = slots // self.block_size, slots % self.block_size
        buf = self.storage(kind, layer)
        lay = self.fp8_layouts.get(k.pool_name)
        if lay is not None:
            data, scales = ks.fp8_kv_quantize(values, lay, self.backend)
            buf[:, :lay.block_size * lay.token_bytes].view(-1, lay.block_size, lay.token_bytes)[page, off] = data
            buf[:, lay.block_size * lay.token_bytes:].view(-1, lay.block_size, lay.scale_bytes)[page, off] = scales
        elif k.kv:
            buf[page, off, 0] = values.to(buf.dtype)
        else:
            buf[page, off] = values.to(buf.dtype)

    def read(self, kind: str, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Entries at flat `slots` [n] as [n, width] (bf16 for KV kinds, `dtype` otherwise)."""
        k = self._kind(kind)
        buf = self.kv_pages(kind, layer) if k.kv else self.storage(kind, layer)
        return buf.reshape(-1, k.width).index_select(0, slots.long())  # slot s is row s of the flat pool

    # Checks ----------------------------------------------------------------------
    def _alloc(self, kind: str) -> BlockAllocator:
        return self.allocators[self.kinds[kind].pool_name]

    def _seq(self, seq_id) -> _Sequence:
        try:
            return self.sequences[seq_id]
        except (KeyError, TypeError):
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def _kind(self, kind: str) -> CacheKind:
        try:
            return self.kinds[kind]
        except KeyError:
            raise KeyError(f"unknown cache kind {kind!r}; this cache has {sorted(self.kinds)}") from None
