"""The whole V4 model (spec §2.1, §2.6) with its inference caches inside the module.

`forward(input_ids, start_pos)` takes the next tokens of every sequence in
the batch (all at the same positions) and returns logits for each of them:
start_pos 0 starts new sequences (caches reset), any later start_pos must
continue exactly where the previous call stopped. One token per call is
decode; several are prefill or chunked prefill; all run the same code.

Unlike upstream (last position only), logits are returned for every new
position, which is what an oracle for generated kernels needs.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from kernforge.model import numerics as nx
from kernforge.model.block import Block, Streams, hc_head
from kernforge.model.config import ModelConfig
from kernforge.model.primitives import Embedding, Linear, RMSNorm, RopeTable, rope_frequencies


def rope_tables(config: ModelConfig) -> tuple[RopeTable, RopeTable]:
    """Two tables per model: plain base for window-only layers, YaRN + compress base for the rest."""
    c, rs = config, config.rope_scaling
    plain = RopeTable(c.qk_rope_head_dim, c.max_seq_len, rope_frequencies(c.qk_rope_head_dim, c.rope_theta))
    yarn = rope_frequencies(c.qk_rope_head_dim, c.compress_rope_theta, rs.original_max_position_embeddings,
                            rs.factor, rs.beta_fast, rs.beta_slow)
    return plain, RopeTable(c.qk_rope_head_dim, c.max_seq_len, yarn)


def exact_rebuild_tail(config: ModelConfig, length: int) -> int:
    """Fewest replayed tokens that rebuild every main-layer cache exactly (spec §5).

    Layer l's input at t is exact once t >= p0 + (W-1) l; the layer needs it
    from the oldest window position (length-W+1) and from the start of its
    compressor's kept rows (previous block for ratio 4, open block otherwise).
    """
    w = config.sliding_window
    p0 = length
    for layer, r in enumerate(config.compress_ratios[:config.num_hidden_layers]):
        need = max(0, length - w + 1)
        if r:
            base = (length // r) * r
            need = min(need, max(0, base - r) if r == 4 else base)
        p0 = min(p0, need - (w - 1) * layer)
    return length - max(p0, 0)


class MTPBlock(Block):
    """Multi-token prediction: one more block on [embed(next token); final streams]."""

    def __init__(self, layer_id: int, config: ModelConfig, rope: RopeTable):
        super().__init__(layer_id, config, rope)
        d, m = config.hidden_size, config.hc_mult
        self.e_proj = Linear(d, d)
        self.h_proj = Linear(d, d)
        self.enorm = RMSNorm(d, config.rms_norm_eps)
        self.hnorm = RMSNorm(d, config.rms_norm_eps)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.hc_head_fn = nn.Parameter(torch.empty(m, m * d))
        self.hc_head_base = nn.Parameter(torch.empty(m))
        self.hc_head_scale = nn.Parameter(torch.empty(1))

    def forward(self, streams: torch.Tensor, start_pos: int, token_ids: torch.Tensor,
                embed: Embedding) -> torch.Tensor:
        """Final-layer streams [b,s,M,D] and the ids of the NEXT tokens -> MTP output streams (M copies)."""
        e = self.e_proj(self.enorm(embed(token_ids)))
        xs = [e + self.h_proj(self.hnorm(x)) for x in streams.unbind(2)]
        return super().forward(xs, start_pos, token_ids)


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        plain, yarn = rope_tables(c)
        self.rope_plain, self.rope_yarn = plain, yarn
        rope_for = [yarn if r else plain for r in c.compress_ratios]
        self.embed = Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(i, c, rope_for[i]) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.head = Linear(c.hidden_size, c.vocab_size)
        m = c.hc_mult
        self.hc_head_fn = nn.Parameter(torch.empty(m, m * c.hidden_size))
        self.hc_head_base = nn.Parameter(torch.empty(m))
        self.hc_head_scale = nn.Parameter(torch.empty(1))
        n = c.num_hidden_layers
        self.mtp = nn.ModuleList(MTPBlock(n + i, c, rope_for[n + i]) for i in range(c.num_nextn_predict_layers))
        self.next_pos = 0  # first position not yet in the main caches
        self.mtp_next_pos = 0
        self.batch_size = 0
        self.requires_grad_(False)  # an inference reference

    # Forward -------------------------------------------------------------------
    def _numerics(self):
        return nx.deterministic() if self.config.deterministic else contextlib.nullcontext()

    def _check_call(self, input_ids: torch.Tensor, start_pos: int, next_pos: int) -> None:
        c = self.config
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("input_ids must be an int64/int32 tensor [batch, seq]")
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, seq] with seq >= 1, got {tuple(input_ids.shape)}")
        b, s = input_ids.shape
        if not 1 <= b <= c.max_batch_size:
            raise ValueError(f"batch {b} outside 1..max_batch_size={c.max_batch_size}")
        if start_pos < 0 or start_pos + s > c.max_seq_len:
            raise ValueError(f"positions {start_pos}..{start_pos + s - 1} exceed max_seq_len={c.max_seq_len}")
        if start_pos and (start_pos != next_pos or b != self.batch_size):
            raise ValueError(f"start_pos={start_pos}, batch={b} does not continue the cached sequence "
                             f"(next position {next_pos}, batch {self.batch_size}); start at 0 to reset")
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size})")

    @torch.no_grad()
    def forward_hidden(self, input_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Run the main blocks; returns the final hyper-connection streams [b, s, M, D]."""
        return torch.stack(self._run_blocks(input_ids, start_pos), dim=2)

    def _run_blocks(self, input_ids: torch.Tensor, start_pos: int) -> Streams:
        self._check_call(input_ids, start_pos, self.next_pos)
        input_ids = input_ids.long()
        if start_pos == 0:
            self.reset_cache()
            self.batch_size = input_ids.shape[0]
        with self._numerics():
            xs = [self.embed(input_ids)] * self.config.hc_mult  # M equal copies; nothing writes into them
            for layer in self.layers:
                xs = layer(xs, start_pos, input_ids)
        self.next_pos = start_pos + input_ids.shape[1]
        return xs

    @torch.no_grad()
    def logits(self, streams: torch.Tensor, hc_fn=None, hc_scale=None, hc_base=None, norm=None) -> torch.Tensor:
        """Collapse streams [b, s, M, D], normalise, project with the (shared) head -> [b, s, vocab]."""
        return self._head(list(streams.unbind(2)), hc_fn, hc_scale, hc_base, norm)

    def _head(self, xs: Streams, hc_fn=None, hc_scale=None, hc_base=None, norm=None) -> torch.Tensor:
        c = self.config
        hc_fn = self.hc_head_fn if hc_fn is None else hc_fn
        hc_scale = self.hc_head_scale if hc_scale is None else hc_scale
        hc_base = self.hc_head_base if hc_base is None else hc_base
        with self._numerics():
            u = hc_head(xs, hc_fn, hc_scale, hc_base, c.rms_norm_eps, c.hc_eps)
            return self.head((norm or self.norm)(u))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        return self._head(self._run_blocks(input_ids, start_pos))

    @torch.no_grad()
    def mtp_logits(self, streams: torch.Tensor, next_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Logits of the MTP head: position t uses the main streams at t and token t+1 to predict t+2.

        It keeps its own window cache; start_pos follows the same rules as forward.
        """
        if not self.mtp:
            raise ValueError("this config has no MTP layer (num_nextn_predict_layers=0)")
        self._check_call(next_ids, start_pos, self.mtp_next_pos)
        if streams.shape[:2] != next_ids.shape:
            raise ValueError(f"streams {tuple(streams.shape)} and next_ids {tuple(next_ids.shape)} disagree")
        mtp = self.mtp[0]
        if start_pos == 0:
            mtp.attn.reset_cache()
        with self._numerics():
            xs = mtp(streams, start_pos, next_ids.long(), self.embed)
        self.mtp_next_pos = start_pos + next_ids.shape[1]
        return self._head(xs, mtp.hc_head_fn, mtp.hc_head_scale, mtp.hc_head_base, mtp.norm)

    # Caches --------------------------------------------------------------------
    def reset_cache(self, keep_compressed: bool = False) -> None:
        """Empty the window rings and compressor states; also the compressed entries unless kept."""
        for layer in self.layers:
            layer.attn.reset_cache(keep_compressed)
        self.next_pos = 0

    def cache_state(self) -> dict[str, torch.Tensor]:
        """Views of every cache tensor of the main layers, keyed like the checkpoint names."""
        out: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            a = layer.attn
            out[f"layers.{i}.attn.kv_ring"], out[f"layers.{i}.attn.ring_pos"] = a.kv_ring, a.ring_pos
            for name, comp in (("compressor", a.compressor), ("indexer.compressor", a.indexer and a.indexer.compressor)):
                if comp is not None:
                    for field in ("kv_cache", "kv_state", "score_state"):
                        out[f"layers.{i}.attn.{name}.{field}"] = getattr(comp, field)
        return out

    def exact_rebuild_tail(self, length: int) -> int:
        return exact_rebuild_tail(self.config, length)

    @torch.no_grad()
    def rebuild_cache(self, tokens: torch.Tensor, tail: int | None = None) -> None:
        """Rebuild the caches for the sequences `tokens` [b, P] (sliding-window recovery).

        tail=None replays all P tokens. tail=N keeps the persisted compressed
        entries and indexer keys, clears the window rings and compressor states,
        and replays only the last N tokens. It is exact for N >=
        exact_rebuild_tail(P) and approximate below (early replayed tokens see
        truncated windows). The MTP window cache is not rebuilt.
        """
        length = tokens.shape[1]
        if tail is None or tail >= length:
            self._run_blocks(tokens, 0)
            return
        if tail <= 0:
            raise ValueError(f"tail must be positive, got {tail}")
        if self.batch_size != tokens.shape[0]:
            raise ValueError(f"cached batch is {self.batch_size}, tokens have batch {tokens.shape[0]}")
        for layer in self.layers:
            for comp in (layer.attn.compressor, layer.attn.indexer and layer.attn.indexer.compressor):
                if comp is not None and comp.n_entries < length // comp.ratio:
                    raise ValueError(f"compressed cache holds {comp.n_entries} entries, the tail rebuild "
                                     f"of {length} tokens needs {length // comp.ratio} persisted")
        self.reset_cache(keep_compressed=True)
        self.next_pos = length - tail
        self._run_blocks(tokens[:, length - tail:], length - tail)
