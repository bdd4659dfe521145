"""Block allocator of the paged KV cache: a free list with reference counts.

Why reference counts: a forked sequence (prefix sharing) points at the same
physical blocks as its parent; a block returns to the free list only when
the last table naming it lets go, and a write into a block with more than
one reference first copies it (copy-on-write, done by `cache.PagedKVCache`).

Every mutating call checks everything first and changes nothing when it
raises, so a failed allocation never leaves a half-updated pool behind.
"""

from __future__ import annotations


class CacheFullError(RuntimeError):
    """Not enough free blocks in one cache pool; the cache is unchanged.

    `kind` names the pool (e.g. "window", "compressed4"), `needed` the blocks
    the request asked for and `free` what was left.
    """

    def __init__(self, kind: str, needed: int, free: int):
        self.kind, self.needed, self.free = kind, needed, free
        super().__init__(f"KV cache pool {kind!r} is full: {needed} blocks needed, {free} free")


class BlockAllocator:
    """Hands out physical block ids in [0, num_blocks) and counts the tables that use each."""

    def __init__(self, num_blocks: int, kind: str = "blocks"):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks, self.kind = num_blocks, kind
        # LIFO: the most recently freed block is reused first (it is warm in cache).
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def refcount(self, block: int) -> int:
        self._check_id(block)
        return self._refs[block]

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks, each with one reference; CacheFullError (and no change) if short."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if n > len(self._free):
            raise CacheFullError(self.kind, n, len(self._free))
        out = [self._free.pop() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def share(self, blocks: list[int]) -> None:
        """One more reference to each (live) block: a forked table now names them too."""
        for b in blocks:
            self._check_live(b)
        for b in blocks:
            self._refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference per listed block; blocks reaching 0 go back to the free list."""
        counts: dict[int, int] = {}
        for b in blocks:
            self._check_live(b)
            counts[b] = counts.get(b, 0) + 1
        for b, k in counts.items():
            if k > self._refs[b]:
                raise ValueError(f"{self.kind}: block {b} released {k} times but has {self._refs[b]} references")
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)

    def _check_id(self, block: int) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"{self.kind}: block id {block!r} outside [0, {self.num_blocks})")

    def _check_live(self, block: int) -> None:
        self._check_id(block)
        if self._refs[block] == 0:
            raise ValueError(f"{self.kind}: block {block} is not allocated")
