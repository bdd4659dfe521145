"""KV compression and the lightning indexer (spec §2.4, cache layout §5).

A `Compressor` turns every `compress_ratio` (r) tokens into one KV entry by a
per-channel softmax-gated sum. Ratio 4 overlaps: entry k pools the A halves
of block k-1 and the B halves of block k (8 candidates per channel). Any
other ratio pools its own block only.

Cache state per compressor (all batch rows share positions):
- `kv_cache` [B, max_seq_len // r, d]: entry k, visible once token k*r+r-1 is processed;
- `kv_state`, `score_state` [B, 2r, c*d]: (wkv x, wgate x + ape) of the tokens of the
  previous block (rows 0..r-1, ratio 4 only) and of the open block (rows r..2r-1);
  an absent row has score -inf, so it drops out of the softmax;
- `n_entries`: entries stored. An entry below it is never rewritten, which lets a
  tail replay (`Transformer.rebuild_cache`) keep the persisted entries.

`forward(x, start_pos)` accepts any number of new tokens, so prefill, chunked
prefill and single-token decode are the same code.
"""

from __future__ import annotations

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.primitives import Linear, RMSNorm, RopeTable, hadamard
from kernforge.model.quant import fake_quant_fp4, fake_quant_fp8


class Compressor(nn.Module):
    def __init__(self, hidden_size: int, head_dim: int, qk_rope_head_dim: int, compress_ratio: int,
                 rms_norm_eps: float, max_batch_size: int, max_seq_len: int, rope: RopeTable,
                 rotate: bool, fake_quant: bool):
        super().__init__()
        self.head_dim, self.rope_dim, self.ratio = head_dim, qk_rope_head_dim, compress_ratio
        self.overlap = compress_ratio == 4
        self.width = (2 if self.overlap else 1) * head_dim
        self.rotate, self.fake_quant = rotate, fake_quant
        self.max_batch_size, self.max_entries = max_batch_size, max_seq_len // compress_ratio
        self.ape = nn.Parameter(torch.empty(compress_ratio, self.width))
        self.wkv = Linear(hidden_size, self.width)
        self.wgate = Linear(hidden_size, self.width)
        self.norm = RMSNorm(head_dim, rms_norm_eps)
        self.rope = rope
        self.kv_cache = self.kv_state = self.score_state = None
        self.n_entries = 0

    # Cache management ----------------------------------------------------------
    def reset_cache(self, keep_entries: bool = False) -> None:
        """Clear the partial state; also the entries unless keep_entries (tail rebuild)."""
        ref = self.ape
        shape = (self.max_batch_size, 2 * self.ratio, self.width)
        self.kv_state = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
        self.score_state = torch.full(shape, float("-inf"), dtype=ref.dtype, device=ref.device)
        if not keep_entries:
            self.kv_cache = torch.zeros(self.max_batch_size, self.max_entries, self.head_dim,
                                        dtype=ref.dtype, device=ref.device)
            self.n_entries = 0

    # Forward -----------------------------------------------------------------
    def forward(self, x: torch.Tensor, start_pos: int) -> None:
        """Absorb tokens start_pos..start_pos+s-1 and store every entry they complete."""
        b, s, _ = x.shape
        r, d = self.ratio, self.head_dim
        positions = torch.arange(start_pos, start_pos + s, device=x.device)
        kv = self.wkv(x)
        score = self.wgate(x) + self.ape[positions % r].to(x.dtype)
        base = (start_pos // r) * r  # start of the block open at start_pos
        kept = r + start_pos - base  # state rows in use: previous block + open part
        seq_kv = torch.cat([self.kv_state[:b, :kept].to(x.dtype), kv], dim=1)  # positions base-r ..
        seq_score = torch.cat([self.score_state[:b, :kept].to(x.dtype), score], dim=1)
        first = base // r  # sequence block j holds block first + j - 1
        n_new = (start_pos + s) // r - first
        if n_new > 0:  # blocks 0..n_new of the sequence are complete (block 0: the previous one)
            rows = (n_new + 1) * r
            entries = self._pool(seq_kv[:, :rows].unflatten(1, (n_new + 1, r)),
                                 seq_score[:, :rows].unflatten(1, (n_new + 1, r)), n_new)
            self._store(self._finish(entries, first), first)
        new_base = ((start_pos + s) // r) * r
        keep_from = new_base - base  # sequence row of position new_base - r
        rest_kv, rest_score = seq_kv[:, keep_from:], seq_score[:, keep_from:]
        self.kv_state[:b] = 0
        self.score_state[:b] = float("-inf")
        lo = 0 if self.overlap else r  # only ratio 4 reads the previous block again
        self.kv_state[:b, lo:rest_kv.shape[1]] = rest_kv[:, lo:]
        self.score_state[:b, lo:rest_score.shape[1]] = rest_score[:, lo:]

    def _pool(self, blocks_kv: torch.Tensor, blocks_score: torch.Tensor, n_new: int) -> torch.Tensor:
        """Softmax-gated sum per channel for sequence blocks 1..n_new -> [b, n_new, d]."""
        d = self.head_dim
        cur_kv, cur_score = blocks_kv[:, 1:n_new + 1], blocks_score[:, 1:n_new + 1]
        if self.overlap:
            prev_kv, prev_score = blocks_kv[:, :n_new], blocks_score[:, :n_new]
            cand_kv = torch.cat([prev_kv[..., :d], cur_kv[..., d:]], dim=2)
            cand_score = torch.cat([prev_score[..., :d], cur_score[..., d:]], dim=2)
        else:
            cand_kv, cand_score = cur_kv, cur_score
        weights = nx.softmax(cand_score, dim=2)
        return nx.tree_sum(weights * cand_kv, dim=2)

    def _finish(self, entries: torch.Tensor, first: int) -> torch.Tensor:
        """RMSNorm, RoPE at each entry's block start, then rotation/QAT rounding."""
        n = entries.shape[1]
        positions = (torch.arange(first, first + n, device=entries.device)) * self.ratio
        out = self.rope.rotate(self.norm(entries), positions)
        if self.rotate:  # indexer keys: Hadamard, then FP4 over all dims
            out = hadamard(out)
            return fake_quant_fp4(out) if self.fake_quant else out
        if self.fake_quant:  # main keys: FP8 on the non-rope dims
            out = torch.cat([fake_quant_fp8(out[..., :-self.rope_dim]), out[..., -self.rope_dim:]], dim=-1)
        return out

    def _store(self, entries: torch.Tensor, first: int) -> None:
        b, n = entries.shape[:2]
        skip = max(0, self.n_entries - first)  # persisted entries stay as they are
        if skip < n:
            self.kv_cache[:b, first + skip:first + n] = entries[:, skip:].to(self.kv_cache.dtype)
        self.n_entries = max(self.n_entries, first + n)


class Indexer(nn.Module):
    """Picks, per query, the `index_topk` ratio-4 entries with the highest learned score."""

    def __init__(self, hidden_size: int, q_lora_rank: int, index_n_heads: int, index_head_dim: int,
                 index_topk: int, qk_rope_head_dim: int, rms_norm_eps: float, max_batch_size: int,
                 max_seq_len: int, rope: RopeTable, fake_quant: bool):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = index_n_heads, index_head_dim, index_topk
        self.rope, self.fake_quant = rope, fake_quant
        self.wq_b = Linear(q_lora_rank, index_n_heads * index_head_dim)
        self.weights_proj = Linear(hidden_size, index_n_heads)
        self.compressor = Compressor(hidden_size, index_head_dim, qk_rope_head_dim, 4, rms_norm_eps,
                                     max_batch_size, max_seq_len, rope, rotate=True, fake_quant=fake_quant)
        self.scale = index_head_dim ** -0.5 * index_n_heads ** -0.5

    def forward(self, x: torch.Tensor, qr: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Entry indices [b, s, index_topk] for each new query; -1 marks an empty slot."""
        b, s, _ = x.shape
        positions = torch.arange(start_pos, start_pos + s, device=x.device)
        q = self.rope.rotate(self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim)), positions)
        q = hadamard(q)
        if self.fake_quant:
            q = fake_quant_fp4(q)
        self.compressor(x, start_pos)  # keys are updated before they are read
        n_visible = (start_pos + s) // 4
        keys = self.compressor.kv_cache[:b, :n_visible].to(x.dtype)  # [b, n, d]
        weights = self.weights_proj(x) * self.scale  # [b, s, h]
        # One head at a time: the [b, s, h, n] logits would be one more large temporary per layer.
        scores = nx.sum_terms([_dots(q[:, :, i], keys).relu_().mul_(weights[:, :, i, None])
                               for i in range(self.n_heads)])  # [b, s, n]
        visible = torch.arange(n_visible, device=x.device)[None, :] < ((positions + 1) // 4)[:, None]
        scores.masked_fill_(~visible, float("-inf"))
        if n_visible < self.topk:
            scores = torch.cat([scores, scores.new_full((b, s, self.topk - n_visible), float("-inf"))], -1)
        idx = nx.topk_indices(scores, self.topk)
        valid = torch.gather(scores, -1, idx) > float("-inf")
        return torch.where(valid, idx, torch.full_like(idx, -1))


def _dots(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [b, s, d] . keys [b, n, d] -> [b, s, n] (a fresh tensor)."""
    if nx.is_deterministic():
        return nx.tree_sum(q[:, :, None, :] * keys[:, None], dim=-1)
    return torch.matmul(q, keys.transpose(-1, -2))
