"""V4 attention (spec §2.4): low-rank q, one shared latent KV vector, sliding
window plus compressed entries, an attention sink, grouped low-rank output.

Each query at position t attends to a candidate list with a fixed layout:
`sliding_window` window slots (positions t-W+1..t, oldest first) followed by
the compressed slots (ratio 4: the indexer's `index_topk` picks; other ratios:
every entry slot of the cache). Invalid slots are masked. The layout depends
only on t, so prefill, chunked prefill and decode compute the same thing.

Window cache: a ring `kv_ring` [B, W, head_dim] with token t in slot t mod W
and `ring_pos` [W] naming the position each slot holds (-1 = empty). A slot
counts only while it holds the position asked for, so a ring cleared for a
tail replay simply looks shorter.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.compressor import Compressor, Indexer
from kernforge.model.config import ModelConfig
from kernforge.model.primitives import Linear, RMSNorm, RopeTable, rms_normalize
from kernforge.model.quant import fake_quant_fp8


class WindowBand:
    """The sliding-window candidates without a [b, s, W, d] copy: query i sees rows i..i+W-1 of `seq`.

    seq [b, s + W - 1, d] holds the W-1 positions before the first query (any
    values where invalid) followed by the new tokens. A per-query gather would
    write W copies of every key; instead queries go in blocks of W, each block
    does one dense product with the 2W rows it can touch, and the band is
    picked out of (or scattered into) that block. The extra entries only ever
    meet exact zeros, so the result is the per-query dot products. The 2W key
    rows of every block are laid out once, for both the scores and the weighting.
    """

    def __init__(self, seq: torch.Tensor, width: int):
        self.seq, self.width = seq, width
        w = width
        self.n_queries = seq.shape[1] - (w - 1)
        self.n_blocks = -(-self.n_queries // w)  # queries padded to n_blocks * W

    @functools.cached_property
    def keys(self) -> torch.Tensor:
        """[b, n_blocks, 2W, d]: block j's queries jW..jW+W-1 reach key rows jW..jW+2W-1."""
        w = self.width
        padded = nn.functional.pad(self.seq, (0, 0, 0, (self.n_blocks + 1) * w - self.seq.shape[1]))
        return padded.unfold(1, 2 * w, w)[:, :self.n_blocks].transpose(-1, -2).contiguous()

    def per_query(self) -> torch.Tensor:
        """The materialised [b, s, W, d] candidates (deterministic mode's tree sums need them)."""
        return self.seq.unfold(1, self.width, 1).transpose(-1, -2)

    def _band_index(self, b: int, h: int) -> torch.Tensor:
        """Column of key j for block row i: i + j, expanded to [b, n_blocks, W, h, W]."""
        w = self.width
        band = torch.arange(w, device=self.seq.device)[:, None] + torch.arange(w, device=self.seq.device)
        return band[None, None, :, None, :].expand(b, self.n_blocks, w, h, w)

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        """q [b, s, h, d] -> q.key for each window slot [b, s, h, W]."""
        b, s, h, d = q.shape
        w, n_blocks = self.width, self.n_blocks
        qb = nn.functional.pad(q, (0, 0, 0, 0, 0, n_blocks * w - s)).reshape(b, n_blocks, w * h, d)
        dense = torch.matmul(qb, self.keys.transpose(-1, -2)).view(b, n_blocks, w, h, 2 * w)
        picked = dense.gather(-1, self._band_index(b, h))
        return picked.reshape(b, n_blocks * w, h, w)[:, :s]

    def weighted(self, p: torch.Tensor) -> torch.Tensor:
        """p [b, s, h, W] -> sum over window slots of p * key, [b, s, h, d]."""
        b, s, h, _ = p.shape
        w, n_blocks = self.width, self.n_blocks
        pb = nn.functional.pad(p, (0, 0, 0, 0, 0, n_blocks * w - s)).view(b, n_blocks, w, h, w)
        dense = p.new_zeros(b, n_blocks, w, h, 2 * w).scatter_(-1, self._band_index(b, h), pb)
        out = torch.matmul(dense.view(b, n_blocks, w * h, 2 * w), self.keys)
        return out.view(b, n_blocks * w, h, -1)[:, :s]


Candidates = torch.Tensor | WindowBand


def sparse_attention(q: torch.Tensor, parts: list[tuple[Candidates, torch.Tensor]], sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """o = sum_j p_j v_j with p_j = e^{l_j} / (sum e^{l} + e^{sink_h}), l_j = q.v_j * scale.

    q [b, s, h, d]; sink [h]. The candidates come in parts (kv, valid): kv is
    [b, s, c, d] (per query) or [b, c, d] (shared by every query), key = value;
    valid broadcasts to [b, s, c]; or a WindowBand (c = W). The sink logit is not scaled; it only
    enlarges the denominator. Invalid candidates get probability 0.
    """
    logits = torch.cat([_scores(q, kv).masked_fill(~valid[:, :, None], float("-inf")) for kv, valid in parts],
                       dim=-1) * scale
    sink = sink.to(q.dtype)[None, None, :, None]
    top = torch.maximum(logits.amax(-1, keepdim=True), sink)
    e = nx.exp(logits - top)
    p = e / (nx.tree_sum(e, -1, keepdim=True) + nx.exp(sink - top))
    outs, start = [], 0
    for kv, _ in parts:
        count = kv.width if isinstance(kv, WindowBand) else kv.shape[-2]
        outs.append(_weighted(p[..., start:start + count], kv))
        start += count
    return nx.sum_terms(outs)


def _scores(q: torch.Tensor, kv: Candidates) -> torch.Tensor:
    """q.kv for each head and candidate -> [b, s, h, c]."""
    if isinstance(kv, WindowBand):
        if not nx.is_deterministic():
            return kv.scores(q)
        kv = kv.per_query()
    if nx.is_deterministic():
        kv = kv[:, :, None] if kv.dim() == 4 else kv[:, None, None]
        return nx.tree_sum(q[:, :, :, None, :] * kv, dim=-1)
    return torch.einsum("bshd,bscd->bshc" if kv.dim() == 4 else "bshd,bcd->bshc", q, kv)


def _weighted(p: torch.Tensor, kv: Candidates) -> torch.Tensor:
    """sum_c p[b, s, h, c] kv[..., c, :] -> [b, s, h, d]."""
    if isinstance(kv, WindowBand):
        if not nx.is_deterministic():
            return kv.weighted(p)
        kv = kv.per_query()
    if nx.is_deterministic():
        kv = kv[:, :, None] if kv.dim() == 4 else kv[:, None, None]
        return nx.tree_sum(p[..., None] * kv, dim=3)
    return torch.einsum("bshc,bscd->bshd" if kv.dim() == 4 else "bshc,bcd->bshd", p, kv)


class Attention(nn.Module):
    def __init__(self, layer_id: int, config: ModelConfig, rope: RopeTable):
        super().__init__()
        c = config
        self.n_heads, self.head_dim, self.rope_dim = c.num_attention_heads, c.head_dim, c.qk_rope_head_dim
        self.window, self.eps, self.fake_quant = c.sliding_window, c.rms_norm_eps, c.fake_quant
        self.o_groups, self.o_lora_rank = c.o_groups, c.o_lora_rank
        self.compress_ratio = c.compress_ratios[layer_id]
        self.max_batch_size = c.max_batch_size
        self.rope = rope
        self.attn_sink = nn.Parameter(torch.empty(self.n_heads))
        self.wq_a = Linear(c.hidden_size, c.q_lora_rank)
        self.q_norm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.wq_b = Linear(c.q_lora_rank, self.n_heads * self.head_dim)
        self.wkv = Linear(c.hidden_size, self.head_dim)
        self.kv_norm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.wo_a = Linear(self.n_heads * self.head_dim // self.o_groups, self.o_groups * self.o_lora_rank)
        self.wo_b = Linear(self.o_groups * self.o_lora_rank, c.hidden_size)
        self.compressor = self.indexer = None
        if self.compress_ratio:
            self.compressor = Compressor(c.hidden_size, self.head_dim, self.rope_dim, self.compress_ratio,
                                         c.rms_norm_eps, c.max_batch_size, c.max_seq_len, rope,
                                         rotate=False, fake_quant=c.fake_quant)
        if self.compress_ratio == 4:
            self.indexer = Indexer(c.hidden_size, c.q_lora_rank, c.index_n_heads, c.index_head_dim,
                                   c.index_topk, self.rope_dim, c.rms_norm_eps, c.max_batch_size,
                                   c.max_seq_len, rope, c.fake_quant)
        self.kv_ring = self.ring_pos = None

    def reset_cache(self, keep_compressed: bool = False) -> None:
        ref = self.attn_sink
        self.kv_ring = torch.zeros(self.max_batch_size, self.window, self.head_dim, dtype=ref.dtype,
                                   device=ref.device)
        self.ring_pos = torch.full((self.window,), -1, dtype=torch.int64, device=ref.device)
        for comp in (self.compressor, self.indexer and self.indexer.compressor):
            if comp is not None:
                comp.reset_cache(keep_entries=keep_compressed)

    def forward(self, x: torch.Tensor, start_pos: int) -> torch.Tensor:
        b, s, _ = x.shape
        positions = torch.arange(start_pos, start_pos + s, device=x.device)
        qr = self.q_norm(self.wq_a(x))
        q = rms_normalize(self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim)), self.eps)
        q = self.rope.rotate(q, positions)
        kv = self.rope.rotate(self.kv_norm(self.wkv(x)), positions)
        if self.fake_quant:  # QAT: the nope dims are stored as FP8, the rope dims stay exact
            kv = torch.cat([fake_quant_fp8(kv[..., :-self.rope_dim]), kv[..., -self.rope_dim:]], dim=-1)
        parts = [self._window_candidates(kv, start_pos)]
        if self.compressor is not None:
            picks = self.indexer(x, qr, start_pos) if self.indexer is not None else None
            self.compressor(x, start_pos)
            parts.append(self._compressed_candidates(picks, positions, b))
        self._write_ring(kv, start_pos)
        o = sparse_attention(q, parts, self.attn_sink, self.head_dim ** -0.5)
        o = self.rope.rotate(o, positions, inverse=True)
        return self.wo_b(self._grouped_wo_a(o))

    def _window_candidates(self, kv: torch.Tensor, start_pos: int) -> tuple[WindowBand, torch.Tensor]:
        """The window KV of each new query (oldest first) as a band, and its validity [1, s, W]."""
        b, s, _ = kv.shape
        w = self.window
        back = min(start_pos, w - 1)  # earlier positions that still fall in some window
        old_pos = torch.arange(start_pos - back, start_pos, device=kv.device)
        old_kv = self.kv_ring[:b, old_pos % w].to(kv.dtype)
        old_ok = self.ring_pos[old_pos % w] == old_pos
        seq_kv = torch.cat([old_kv, kv], dim=1)
        seq_ok = torch.cat([old_ok, torch.ones(s, dtype=torch.bool, device=kv.device)])
        idx = back + torch.arange(s, device=kv.device)[:, None] - (w - 1) + torch.arange(w, device=kv.device)
        ok = (idx >= 0) & seq_ok[idx.clamp(min=0)]
        front = seq_kv.new_zeros(b, w - 1 - back, seq_kv.shape[-1])  # slots before position 0: invalid
        return WindowBand(torch.cat([front, seq_kv], dim=1), w), ok[None]

    def _compressed_candidates(self, picks: torch.Tensor | None, positions: torch.Tensor,
                               b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ratio 4: the indexer's picks per query. Other ratios: every entry slot, shared by all
        queries; entry k is visible once token k*r+r-1 is in."""
        cache = self.compressor.kv_cache[:b].to(self.attn_sink.dtype)  # [b, n_max, d]
        if picks is None:
            k = torch.arange(cache.shape[1], device=cache.device)
            return cache, (k[None, :] < ((positions + 1) // self.compress_ratio)[:, None])[None]
        # Row index into the batch-flattened cache: one plain row gather (a torch.gather over the
        # cache expanded to every query is ~5x slower).
        n_max = cache.shape[1]
        rows = picks.clamp(min=0) + n_max * torch.arange(b, device=picks.device)[:, None, None]
        return cache.reshape(b * n_max, -1)[rows], picks >= 0

    def _write_ring(self, kv: torch.Tensor, start_pos: int) -> None:
        b, s, _ = kv.shape
        keep = min(s, self.window)
        pos = torch.arange(start_pos + s - keep, start_pos + s, device=kv.device)
        self.kv_ring[:b, pos % self.window] = kv[:, s - keep:].to(self.kv_ring.dtype)
        self.ring_pos[pos % self.window] = pos

    def _grouped_wo_a(self, o: torch.Tensor) -> torch.Tensor:
        """o [b, s, h, d] -> groups of h/G heads -> per-group projection to o_lora_rank -> [b, s, G*R]."""
        groups = o.flatten(2).unflatten(-1, (self.o_groups, -1))  # [b, s, G, h*d/G]
        w = self.wo_a.dense_weight(o.dtype).unflatten(0, (self.o_groups, self.o_lora_rank))
        return torch.cat([nx.linear(groups[:, :, g], w[g]) for g in range(self.o_groups)], dim=-1)
