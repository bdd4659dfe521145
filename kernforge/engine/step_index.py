"""`StepIndex`: the addressing of one engine step, built once and shared by every layer.

Why: a step's tokens come from several sequences, each with its own block tables. Looking
slots up per sequence, per layer and per use (the window write, the window candidates, the
compressed candidates, the indexer's keys and picks) cost ~15 small torch ops a call, 113
calls a decode step at batch 8: half the step. The block tables do not change between
`PagedKVCache.prepare` and `commit`, and every layer of a kind reads the same tables, so this
object turns them into one padded tensor per kind (`PagedKVCache.block_tables`) and answers
every lookup of the step with one vectorised gather (`PagedKVCache.slots_of`); the candidate
lists that do not depend on the layer (window, and every entry of a ratio without indexer)
are made once per step. Integer bookkeeping only: no float math.
"""

from __future__ import annotations

import torch

from kernforge.engine.cache import PagedKVCache


class StepIndex:
    """The step's segments (seq_id, start, lo, hi) over the flat tokens at positions `pos` [N],
    with `floors[i]` the first position segment i's window may show (0, or a tail rebuild's
    start)."""

    def __init__(self, cache: PagedKVCache, segs: list[tuple], pos: torch.Tensor, floors: list[int]):
        self.cache, self.segs, self.pos = cache, segs, pos
        self.seqs = [seq for seq, _, _, _ in segs]
        lengths = torch.tensor([hi - lo for _, _, lo, hi in segs])
        self.row = torch.repeat_interleave(torch.arange(len(segs)), lengths)  # token -> its segment
        self.floor = torch.tensor(floors, dtype=torch.long)[self.row]
        self._tables: dict[str, torch.Tensor] = {}
        self._memo: dict[tuple, torch.Tensor] = {}

    def table(self, kind: str) -> torch.Tensor:
        if kind not in self._tables:
            self._tables[kind] = self.cache.block_tables(self.seqs, kind)
        return self._tables[kind]

    def slots(self, kind: str, rows: torch.Tensor, entries: torch.Tensor) -> torch.Tensor:
        """Flat slots of `entries` [n] / [n, k] of the segments `rows` [n] (-1 for entries < 0)."""
        return self.cache.slots_of(self.table(kind), rows, entries, kind)

    def window_write(self) -> torch.Tensor:
        """[N]: where each token's own window KV goes."""
        key = ("write",)
        if key not in self._memo:
            self._memo[key] = self.slots("window", self.row, self.pos)
        return self._memo[key]

    def candidates(self, window: int, kind: str | None = None, ratio: int = 0, max_len: int = 0) -> torch.Tensor:
        """int32 [N, 1, window (+ max_len // ratio)]: each token's window slots (positions
        t-window+1..t, oldest first, -1 before the floor), then, with `kind`, every entry slot
        of that compressed kind (-1 where not yet visible): the attention's `indices` for a layer
        without indexer. The same for every layer of a step, so made once."""
        key = ("cand", window, kind)
        if key not in self._memo:
            parts = [self.window_candidates(window)]
            if kind is not None:
                k = torch.arange(max_len // ratio)
                picks = torch.where(k[None, :] < ((self.pos + 1) // ratio)[:, None], k[None, :], -1)
                parts.append(self.slots(kind, self.row, picks))
            self._memo[key] = torch.cat(parts, dim=1).to(torch.int32)[:, None].contiguous()
        return self._memo[key]

    def window_candidates(self, window: int) -> torch.Tensor:
        """int64 [N, window]: the window part of `candidates`."""
        key = ("window", window)
        if key not in self._memo:
            cand = self.pos[:, None] - (window - 1) + torch.arange(window)  # oldest first, as the reference
            self._memo[key] = self.slots("window", self.row, torch.where(cand >= self.floor[:, None], cand, -1))
        return self._memo[key]
