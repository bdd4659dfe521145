"""`Engine`: the V4 forward pass over the paged KV cache, on kernforge kernels where they exist.

Why a separate engine: `kernforge.model.Transformer` is the torch oracle, with
dense caches inside the module and every batch row at the same position. The
engine keeps the model's weights but owns its state: a `PagedKVCache` (window,
compressed and indexer-key blocks) and, per sequence, the compressors' small
partial-block states. Sequences of any lengths run in one `step`: their new
tokens are flattened into one [1, N] row, every per-token step runs once on
all of them, and attention reads each token's candidates through flat slot ids.

Kernel steps: `sparse_mla` (attention over window + compressed candidates with
the sink, `kernforge.ops.flash_mla_with_kvcache` sparse path, bf16) and
`indexer_topk` (`kernforge.ops.topk`) here; the layer, GEMM and MoE ops in
`kernel_steps.py`. No step is left in torch (tests/engine/test_dispatch.py holds that);
`steps()` returns the table. The hyper-connection streams are one tensor [1, N, M, D].
"""

from __future__ import annotations

import contextlib
import itertools

import torch

from kernforge import ops
from kernforge.engine import kernel_steps as ks
from kernforge.engine.cache import BLOCK_SIZE, CacheKind, PagedKVCache
from kernforge.engine.step_index import StepIndex
from kernforge.engine.steps import STEPS, step
from kernforge.model import numerics as nx
from kernforge.model.transformer import Transformer, exact_rebuild_tail

BACKENDS = ("cpu", "interp", "cuda-emu", "cuda")
_EARLIER = torch.ones(64, 64, dtype=torch.bool).tril(-1)  # [i, j]: slot j comes before slot i
# queries per indexer_scores call of a prefill chunk (each call scores only the keys its last query sees)
_SCORE_ROWS = 128
# key of a sequence's state ({(layer, compressor): tensors}, cloned by fork) that holds, after a
# tail rebuild (rebuild_cache), the first position its window has and the persisted length
_WINDOW_FLOOR = "window_floor"


@step("sparse_mla", "kernel", "sparse MLA with sink (flash_mla_with_kvcache, indices path)")
def _sparse_mla(q, pages, indices, sink, scale, backend):
    from kernforge.ops import flash_mla_with_kvcache

    out, _ = flash_mla_with_kvcache(q, pages, None, None, q.shape[-1], indices=indices, attn_sink=sink,
                                    softmax_scale=scale, backend=backend)
    return out


@step("indexer_topk", "kernel", "top-k of the indexer scores (kernforge.ops.topk)")
def _indexer_topk(scores, k, end, backend):
    from kernforge.ops import topk

    _, idx = topk(scores, k, end=end, indices_type=torch.int64, idx_oob_fill_value=-1,
                  return_value=False, backend=backend)
    return idx


def _compact(idx, p2e, p2tk, t2p, start, n_experts: int):
    """`get_fused_mapping`'s expert-major layout without its padding: (pos_to_expert,
    pos_to_token_topk, token_topk_to_pos, segment starts, segment ends) with expert e's valid
    rows packed at [starts[e], ends[e]).

    Why: the mapping pads each non-empty expert's segment to the alignment (64) for GPU tiles;
    at decode that makes up to E x 64 expanded rows for T x k routed slots (8 x 64 for 16 at
    batch 8), and the expansion, both expert GEMMs and the SwiGLU would touch every one. The
    CPU GEMM takes any segment length, and each row is computed on its own, so the packed rows
    hold the padded layout's values bit for bit. Integer bookkeeping only: valid rows come
    first in each segment, in slot order, so they keep their order."""
    counts = torch.bincount(idx[idx >= 0], minlength=n_experts)
    ends = counts.cumsum(0)
    first = ends - counts
    valid = t2p >= 0
    e = p2e.long()[t2p.long().clamp_min(0)]
    packed = torch.where(valid, t2p - start[e] + first[e].to(t2p.dtype), -1).to(t2p.dtype)
    keep = p2tk >= 0
    return p2e[keep], p2tk[keep], packed, first.tolist(), ends.tolist()


class Engine:
    """Serve a `Transformer`'s weights over a paged KV cache.

    Two interfaces share one cache: `forward(input_ids, start_pos)` with the
    reference's contract (batch rows are sequences 0..b-1), and the sequence
    level `add_sequence` / `fork` / `step({seq_id: tokens})` / `free` that a
    serving scheduler drives (chunked prefill and decode of different
    sequences in one step).
    """

    def __init__(self, model: Transformer, backend: str = "cpu", *, num_blocks: int | dict[str, int] | None = None,
                 is_fp8_kvcache: bool = False, block_size: int = BLOCK_SIZE):
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a kernforge.model.Transformer, got {type(model).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.model, self.backend, self.config = model.eval(), backend, model.config
        self.weights = ks.Weights(model, model.embed.weight.dtype)  # every GEMM operand, made once
        self.block_size, self.is_fp8_kvcache = block_size, bool(is_fp8_kvcache)
        c = self.config
        n = c.num_hidden_layers
        if n + len(model.mtp) > c.num_hash_layers and (c.scoring_func == "softmax" or not c.norm_topk_prob):
            # top2_sum_gate renormalises the chosen scores; Gate does not for these settings
            raise NotImplementedError(f"scored routing with scoring_func={c.scoring_func!r}, norm_topk_prob="
                                      f"{c.norm_topk_prob}: the routing kernel step supports renormalised "
                                      "sigmoid/sqrtsoftplus scores only")
        ratios = c.compress_ratios[:n]
        kinds = [CacheKind("window", 1, c.head_dim, tuple(range(n)), window=c.sliding_window,
                           rope_dim=c.qk_rope_head_dim, pool="kv")]
        for r in sorted(set(ratios) - {0}):
            kinds.append(CacheKind(f"compressed{r}", r, c.head_dim, tuple(i for i in range(n) if ratios[i] == r),
                                   rope_dim=c.qk_rope_head_dim, pool="kv"))
        if 4 in ratios:
            kinds.append(CacheKind("index4", 4, c.index_head_dim, tuple(i for i in range(n) if ratios[i] == 4),
                                   kv=False, pool="index"))
        self.kinds = kinds
        # The MTP block keeps its own window cache (own positions, as the reference's mtp_next_pos).
        self.mtp_kinds = [CacheKind("window", 1, c.head_dim, tuple(range(n, n + len(model.mtp))),
                                    window=c.sliding_window, rope_dim=c.qk_rope_head_dim, pool="kv")]
        self._mtp_blocks = c.max_batch_size * -(-c.max_seq_len // block_size)
        if num_blocks is None:
            per_seq = {p: 0 for p in ("kv", "index")}
            for k in kinds:
                per_seq[k.pool_name] += -(-k.entries(c.max_seq_len) // block_size)
            num_blocks = {p: c.max_batch_size * v for p, v in per_seq.items() if v}
        self._num_blocks = num_blocks
        self._ids = itertools.count()
        self._cos_sin: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.reset_cache()

    # Introspection ---------------------------------------------------------------
    @staticmethod
    def steps() -> dict[str, str]:
        """{step name: "kernel" | "torch"} for every compute step of the engine."""
        return {name: s.kind for name, s in sorted(STEPS.items())}

    # Cache -------------------------------------------------------------------------
    def reset_cache(self) -> None:
        """Drop every sequence and start from empty pools."""
        self.cache = PagedKVCache(self.kinds, self._num_blocks, block_size=self.block_size,
                                  is_fp8_kvcache=self.is_fp8_kvcache, dtype=self.model.embed.weight.dtype,
                                  backend=self.backend)
        self._states: dict[object, dict] = {}
        self._rows: list[object] = []  # forward()'s batch rows
        self.next_pos = 0
        self._reset_mtp()

    def _reset_mtp(self) -> None:
        self.mtp_cache = PagedKVCache(self.mtp_kinds, self._mtp_blocks, block_size=self.block_size,
                                      is_fp8_kvcache=self.is_fp8_kvcache, dtype=self.model.embed.weight.dtype,
                                      backend=self.backend)
        self.mtp_next_pos = 0

    def exact_rebuild_tail(self, length: int) -> int:
        """Fewest replayed tokens for which `rebuild_cache(tokens, tail)` is exact (spec §5)."""
        return exact_rebuild_tail(self.config, length)

    @torch.no_grad()
    def rebuild_cache(self, tokens: torch.Tensor, tail: int | None = None) -> None:
        """Rebuild the caches of `forward`'s batch rows from `tokens` [b, P], as
        `Transformer.rebuild_cache` (sliding-window cache recovery, spec §5).

        tail=None (or >= P) replays all P tokens: a fresh prefill. tail=N keeps each row's
        persisted compressed KV entries and indexer keys, drops its window blocks and
        compressor states, and replays only the last N tokens at positions P-N..P-1; queries
        among them see no window key before P-N (the reference's emptied ring). Exact for
        N >= `exact_rebuild_tail(P)`, approximate below. The MTP cache is not rebuilt.
        Afterwards `forward(next_ids, P)` continues the rows.
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError("tokens must be an int tensor [batch, P] with P >= 1")
        length = tokens.shape[1]
        if tail is None or (not isinstance(tail, bool) and isinstance(tail, int) and tail >= length):
            self._forward_rows(tokens, 0)
            return
        if isinstance(tail, bool) or not isinstance(tail, int) or tail <= 0:
            raise ValueError(f"tail must be a positive int or None, got {tail!r}")
        self._check_rows(tokens, length - tail, length - tail, tokens.shape[0])
        if tokens.shape[0] != len(self._rows):
            raise ValueError(f"cached batch is {len(self._rows)}, tokens have batch {tokens.shape[0]}")
        for seq in self._rows:
            have = self.cache.length(seq)
            for kind in self.kinds:
                if kind.window is None and kind.entries(have) < kind.entries(length):
                    raise ValueError(f"{kind.name} cache of row {self._rows.index(seq)} holds {kind.entries(have)} "
                                     f"entries, the tail rebuild of {length} tokens needs {kind.entries(length)} "
                                     "persisted")
        start = length - tail
        for seq in self._rows:
            persisted = self.cache.length(seq)
            self.cache.rewind(seq, start)
            # the compressor states restart empty; the floor hides the window before the replay
            self._states[seq] = {_WINDOW_FLOOR: (torch.tensor(start), torch.tensor(persisted))}
        self._advance({seq: tokens[i, start:] for i, seq in enumerate(self._rows)})
        self.next_pos = length

    def _window_floor(self, seq, cache: PagedKVCache) -> int:
        """The first position the sequence's window holds (after a tail rebuild; else 0)."""
        floor = self._states[seq].get(_WINDOW_FLOOR) if cache is self.cache else None
        return 0 if floor is None else int(floor[0])

    def _persisted_length(self, seq) -> int:
        """Tokens whose compressed entries a tail rebuild kept: the replay must not rewrite them
        (as the reference's `Compressor._store`), since its early blocks see only part of their rows."""
        floor = self._states[seq].get(_WINDOW_FLOOR)
        return 0 if floor is None else int(floor[1])

    # Sequences -----------------------------------------------------------------------
    def add_sequence(self, seq_id=None):
        """Start an empty sequence; returns its id (a fresh int when none is given)."""
        if seq_id is None:
            seq_id = next(i for i in self._ids if i not in self._states)
        self.cache.add_sequence(seq_id)
        self._states[seq_id] = {}
        return seq_id

    def fork(self, src, dst=None):
        """A new sequence equal to `src` so far, sharing its cache blocks copy-on-write."""
        if dst is None:
            dst = next(i for i in self._ids if i not in self._states)
        self.cache.fork(src, dst)
        self._states[dst] = {key: tuple(t.clone() for t in v) for key, v in self._states[src].items()}
        return dst

    def free(self, seq_id) -> None:
        self.cache.free(seq_id)
        del self._states[seq_id]

    def length(self, seq_id) -> int:
        return self.cache.length(seq_id)

    @property
    def sequences(self) -> list:
        return list(self._states)

    # Forward ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Logits [b, s, vocab] for every new position, as `Transformer.forward`.

        start_pos 0 resets the cache and starts b sequences; a later call must
        continue at the next position with the same batch size.
        """
        segs, xs = self._forward_rows(input_ids, start_pos)
        with self._numerics():
            logits = self._head(xs)[0]
        return logits.view(input_ids.shape[0], input_ids.shape[1], -1)

    __call__ = forward

    @torch.no_grad()
    def forward_hidden(self, input_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """The final hyper-connection streams [b, s, M, D] (input of `mtp_logits`), as the reference's."""
        _, xs = self._forward_rows(input_ids, start_pos)
        return xs.view(input_ids.shape[0], input_ids.shape[1], *xs.shape[2:])

    def _forward_rows(self, input_ids: torch.Tensor, start_pos: int):
        b, s = self._check_rows(input_ids, start_pos, self.next_pos, len(self._rows))
        if start_pos == 0:
            self.reset_cache()
            self._rows = [self.add_sequence() for _ in range(b)]
        out = self._advance({seq: input_ids[i] for i, seq in enumerate(self._rows)})
        self.next_pos = start_pos + s
        return out

    def _check_rows(self, input_ids, start_pos: int, next_pos: int, rows: int) -> tuple[int, int]:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32) \
                or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError("input_ids must be an int64/int32 tensor [batch, seq] with seq >= 1")
        b, s = input_ids.shape
        if start_pos and (start_pos != next_pos or b != rows):
            raise ValueError(f"start_pos={start_pos}, batch={b} does not continue the cached sequences "
                             f"(next position {next_pos}, batch {rows}); start at 0 to reset")
        if not 1 <= b <= self.config.max_batch_size:
            raise ValueError(f"batch {b} outside 1..max_batch_size={self.config.max_batch_size}")
        return b, s

    def _numerics(self):
        return nx.deterministic() if self.config.deterministic else contextlib.nullcontext()

    @torch.no_grad()
    def step(self, tokens: dict) -> dict:
        """Append tokens to several sequences at once: {seq_id: ids [n]} -> {seq_id: logits [n, vocab]}.

        Raises CacheFullError (state unchanged) when the pools cannot hold the step.
        """
        segs, xs = self._advance(tokens)
        with self._numerics():
            logits = self._head(xs)[0]
        return {seq_id: logits[lo:hi] for seq_id, _, lo, hi in segs}

    @torch.no_grad()
    def mtp_logits(self, streams: torch.Tensor, next_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Logits of the MTP head, as `Transformer.mtp_logits`: position t uses the main streams at
        t and token t+1 to predict t+2. Keeps its own window cache; start_pos follows forward's rules."""
        if not self.model.mtp:
            raise ValueError("this config has no MTP layer (num_nextn_predict_layers=0)")
        b, s = self._check_rows(next_ids, start_pos, self.mtp_next_pos, len(self.mtp_cache.sequences))
        if streams.dim() != 4 or streams.shape[:2] != next_ids.shape:
            raise ValueError(f"streams {tuple(streams.shape)} and next_ids {tuple(next_ids.shape)} disagree")
        if start_pos == 0:
            self._reset_mtp()
            for row in range(b):
                self.mtp_cache.add_sequence(row)
        counts = {row: s for row in range(b)}
        self.mtp_cache.prepare(counts)
        ids = next_ids.long().reshape(-1)
        pos = torch.arange(start_pos, start_pos + s).repeat(b)
        segs = [(row, start_pos, row * s, (row + 1) * s) for row in range(b)]
        mtp, n = self.model.mtp[0], self.config.num_hidden_layers
        with self._numerics():
            flat = streams.reshape(1, b * s, *streams.shape[2:]).contiguous()
            e = self._linear(mtp.e_proj, self._norm(mtp.enorm, ks.embedding(self.model.embed.weight, ids[None],
                                                                              self.backend)))
            # e + h_proj(hnorm(x)) per stream: e, copied to every stream, is the GEMM's c
            xs = self._linear(mtp.h_proj, self._norm(mtp.hnorm, flat), add=e[:, :, None].expand_as(flat))
            index = StepIndex(self.mtp_cache, segs, pos, [0] * b)
            xs = self._block(n, mtp, xs, ids, index, {})
            logits = self._head(xs, mtp)[0]
        self.mtp_cache.commit(counts)
        self.mtp_next_pos = start_pos + s
        return logits.view(b, s, -1)

    def _head(self, xs: torch.Tensor, mtp=None) -> torch.Tensor:
        """`Transformer._head`: streams [1, N, M, D] -> logits [1, N, vocab] (the main head, or the MTP
        block's collapse and norm before the shared vocabulary projection)."""
        owner = self.model if mtp is None else mtp
        u = ks.hc_head(xs, owner.hc_head_fn, owner.hc_head_scale, owner.hc_head_base, self.config.rms_norm_eps,
                       self.config.hc_eps, self.backend)
        return self._linear(self.model.head, self._norm(self.model.norm if mtp is None else mtp.norm, u))

    def _linear(self, module, x: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        return ks.linear(self.weights[module], x, self.backend, add)

    def _norm(self, module, x: torch.Tensor) -> torch.Tensor:
        return ks.rms_norm(module, x, None, self.backend)

    def _rope(self, table, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        return ks.rope(self._rope_tables(table), x, positions, self.backend, inverse=inverse)

    def _rope_tables(self, table) -> tuple[torch.Tensor, torch.Tensor]:
        if id(table) not in self._cos_sin:  # float32 cos/sin, built once per table
            self._cos_sin[id(table)] = ops.rope_cos_sin(table)
        return self._cos_sin[id(table)]

    def _advance(self, tokens: dict):
        """Run the main blocks on {seq_id: ids}; returns the segments and the final streams [1, N, M, D]."""
        c = self.config
        if not tokens:
            raise ValueError("step needs at least one sequence")
        segs, ids, pos = [], [], []
        offset = 0
        for seq_id, t in tokens.items():
            if seq_id not in self._states:
                raise KeyError(f"unknown sequence {seq_id!r}; add_sequence first")
            t = torch.as_tensor(t)
            if t.dtype not in (torch.int64, torch.int32) or t.dim() != 1 or t.numel() == 0:
                raise ValueError(f"tokens of sequence {seq_id!r} must be a non-empty 1-d int tensor")
            if int(t.min()) < 0 or int(t.max()) >= c.vocab_size:
                raise ValueError(f"token ids of sequence {seq_id!r} must lie in [0, {c.vocab_size})")
            start = self.cache.length(seq_id)
            if start + t.numel() > c.max_seq_len:
                raise ValueError(f"sequence {seq_id!r}: positions up to {start + t.numel() - 1} exceed "
                                 f"max_seq_len={c.max_seq_len}")
            segs.append((seq_id, start, offset, offset + t.numel()))
            ids.append(t.long())
            pos.append(torch.arange(start, start + t.numel()))
            offset += t.numel()
        counts = {seq_id: hi - lo for seq_id, _, lo, hi in segs}
        self.cache.prepare(counts)
        ids_flat, pos_flat = torch.cat(ids), torch.cat(pos)
        index = StepIndex(self.cache, segs, pos_flat, [self._window_floor(seq, self.cache) for seq, *_ in segs])
        pending: dict = {}
        with self._numerics():
            e = ks.embedding(self.model.embed.weight, ids_flat[None], self.backend)
            xs = e[:, :, None].expand(-1, -1, c.hc_mult, -1).contiguous()  # M equal copies
            for layer_id, block in enumerate(self.model.layers):
                xs = self._block(layer_id, block, xs, ids_flat, index, pending)
        for seq_id, state in pending.items():
            self._states[seq_id].update(state)
        self.cache.commit(counts)
        return segs, xs

    def _block(self, layer_id, block, xs, ids, index: StepIndex, pending):
        u, post, comb = ks.hc_pre(block, xs, "attn", self.backend)
        y = self._attention(layer_id, block.attn, self._norm(block.attn_norm, u), index, pending)
        xs = ks.hc_post(y, xs, post, comb, self.backend)
        u, post, comb = ks.hc_pre(block, xs, "ffn", self.backend)
        y = self._moe(block.ffn, self._norm(block.ffn_norm, u)[0], ids)
        return ks.hc_post(y[None], xs, post, comb, self.backend)

    def _moe(self, ffn, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """`MoE.forward` on x [N, D]: routing, expert-major expansion, the expert GEMMs, SwiGLU with
        the routing weight, and the sum with the shared expert."""
        idx, weights = ks.routing(ffn.gate, ks.router_logits(self.weights, ffn.gate, x, self.backend), token_ids,
                                  self.backend)
        # A hash table row may name one expert twice; the reference adds that expert once, with the
        # first slot's weight (MoE.forward's docstring), so later repeats get no row.
        repeat = ((idx[:, :, None] == idx[:, None, :]) & _EARLIER[:idx.shape[1], :idx.shape[1]]).any(-1)
        idx = idx.masked_fill(repeat, -1)
        p2e, _, p2tk, t2p, start, _, _, _ = ks.moe_mapping(idx, ffn.n_routed_experts, self.backend)
        p2e, p2tk, t2p, starts, ends = _compact(idx, p2e, p2tk, t2p, start, ffn.n_routed_experts)
        rows = ks.moe_expand(x, t2p, p2e, self.backend)
        gate_up = ks.expert_gemm(self.weights, ffn.experts, "w13", rows, starts, ends, self.backend)
        row_w = weights.flatten()[p2tk.long()]  # the routing weight of each expanded row
        limit = ffn.shared_experts.swiglu_limit
        # the routed rows, then the shared expert's row per token: one reduce sums both
        n_rows = rows.shape[0]
        out_rows = torch.empty(n_rows + x.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
        ks.expert_gemm(self.weights, ffn.experts, "w2", ks.swiglu(gate_up, row_w, limit, self.backend), starts,
                       ends, self.backend, out=out_rows[:n_rows])
        sh = ffn.shared_experts
        shared_gate_up = ks.linear(self.weights.gate_up(sh), x, self.backend)
        ks.linear(self.weights[sh.w2], ks.swiglu(shared_gate_up, None, limit, self.backend), self.backend,
                  out=out_rows[n_rows:])
        return ks.moe_reduce(out_rows, t2p, self.backend)

    def _attention(self, layer_id, attn, x, index: StepIndex, pending):
        """x [1, N, D] -> [1, N, D]; writes this layer's window KV and compressed entries into the
        step's cache (`index.cache`)."""
        c, cache, pos = self.config, index.cache, index.pos
        h, d, rd = attn.n_heads, attn.head_dim, attn.rope_dim
        proj = ks.attention_input(self.weights, attn, x, self.backend)  # every projection of x
        qr = self._norm(attn.q_norm, proj["q"])
        q = ks.rms_norm(None, self._linear(attn.wq_b, qr).unflatten(-1, (h, d)), attn.eps, self.backend)
        q = self._rope(attn.rope, q, pos)
        kv = self._rope(attn.rope, self._norm(attn.kv_norm, proj["kv"]), pos)
        if attn.fake_quant:
            kv = ks.kv_fake_quant(kv, rd, self.backend)
        cache.write("window", layer_id, index.window_write(), kv[0])
        w, r = c.sliding_window, attn.compress_ratio
        if not r:
            indices = index.candidates(w)
        elif attn.indexer is None:  # every visible entry of this ratio
            self._compress(layer_id, attn.compressor, "main", f"compressed{r}", proj["main_kv"][0],
                           proj["main_score"][0], index, pending)
            indices = index.candidates(w, f"compressed{r}", r, c.max_seq_len)
        else:  # the indexer's picks: the index keys first (this step's included), then the main entries
            self._compress(layer_id, attn.indexer.compressor, "index", "index4", proj["index_kv"][0],
                           proj["index_score"][0], index, pending)
            picks = self._indexer(layer_id, attn.indexer, proj["head_w"][0],
                                  self._indexer_query(attn.indexer, qr, pos)[0], index)
            self._compress(layer_id, attn.compressor, "main", f"compressed{r}", proj["main_kv"][0],
                           proj["main_score"][0], index, pending)
            chosen = index.slots(f"compressed{r}", index.row, picks)
            indices = torch.cat([index.window_candidates(w), chosen], dim=1).to(torch.int32)[:, None].contiguous()
        pages = cache.kv_pages("window", layer_id)
        o = _sparse_mla(q[0, :, None].to(pages.dtype).contiguous(), pages, indices,
                        attn.attn_sink.float().contiguous(), d ** -0.5, self.backend)
        o = self._rope(attn.rope, o[:, 0].to(x.dtype)[None], pos, inverse=True)
        return self._linear(attn.wo_b, ks.grouped_output(self.weights, attn, o, self.backend))

    def _indexer_query(self, indexer, qr: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The indexer's q [1, N, h, d]: projection, RoPE, Hadamard, then the QAT FP4 rounding."""
        q = self._linear(indexer.wq_b, qr).unflatten(-1, (indexer.n_heads, indexer.head_dim))
        q = ks.hadamard(self._rope(indexer.rope, q, pos), self.backend)
        return ks.indexer_fp4_round(q, self.backend) if indexer.fake_quant else q

    def _state(self, seq, key, comp, pending):
        if key in pending.get(seq, {}):
            return pending[seq][key]
        if key not in self._states[seq]:
            shape = (2 * comp.ratio, comp.width)  # an absent row: score -inf drops out of the softmax
            return (torch.zeros(shape, dtype=comp.ape.dtype),
                    torch.full(shape, float("-inf"), dtype=comp.ape.dtype))
        return self._states[seq][key]

    def _compress(self, layer_id, comp, which, kind, kv, score, index: StepIndex, pending) -> None:
        """Absorb the projections kv, score [N, width] of the step's tokens into each sequence's
        compressor and store the entries they complete.

        The states advance per segment (single-token segments, the decodes, all at once in
        `_advance_decodes`; longer ones in `_advance_one`), each handing back the rows its new
        entries pool from. All of them are pooled and finished by one `compressor_pool` call:
        the rows are stacked piece after piece, whole blocks each, and the pooled entries
        that straddle two pieces are dropped. Each entry is computed from its own rows only,
        so its bits are those of a pooling of its sequence alone."""
        decodes = [i for i, (_, _, lo, hi) in enumerate(index.segs) if hi - lo == 1]
        # (kv rows, score rows: each a list of parts, [pooled entry within the piece], [entry id], [segment])
        pieces = []
        if decodes:
            pieces += self._advance_decodes(layer_id, comp, which, kv, score, index, decodes, pending)
        for i, (seq, start, lo, hi) in enumerate(index.segs):
            if hi - lo > 1:
                pieces += self._advance_one(layer_id, comp, which, kv[lo:hi], score[lo:hi], seq, start, i, pending)
        if not pieces:
            return
        r, chosen, ids, rows, offset = comp.ratio, [], [], [], 0
        for piece_kv, _, within, entry_ids, segs in pieces:
            chosen += [offset + j for j in within]
            ids += entry_ids
            rows += segs
            offset += sum(part.shape[0] for part in piece_kv) // r
        # one copy of every piece's parts (state rows, chunk rows) into the pooling's operands
        entries = ks.compressor_pool(comp, self._rope_tables(comp.rope), torch.cat([t for p in pieces for t in p[0]]),
                                     torch.cat([t for p in pieces for t in p[1]]), offset - 1, torch.tensor(chosen),
                                     torch.tensor(ids), self.backend, self.weights.ape(comp))
        index.cache.write(kind, layer_id, index.slots(kind, torch.tensor(rows), torch.tensor(ids)), entries)

    def _advance_decodes(self, layer_id, comp, which, kv, score, index: StepIndex, decodes: list[int],
                         pending) -> list[tuple]:
        """`_advance_one` for the one token of each segment in `decodes`, all at once.

        The states are stacked to [n, 2r, width] (rows 0..r-1: the previous block, which only
        ratio 4's overlap reads; rows r..2r-1: the current block). The token lands at row
        r + start % r. A sequence whose block it completes pools one entry from its 2r rows
        (one piece for all of them: blocks [P0, O0, P1, O1, ...], entries 0, 2, 4, ...), then
        its current block becomes its previous one (ratio 4) or is dropped."""
        r, key = comp.ratio, (layer_id, which)
        segs = [index.segs[i] for i in decodes]
        states = [self._state(seq, key, comp, pending) for seq, _, _, _ in segs]
        kv_rows, score_rows = torch.stack([st[0] for st in states]), torch.stack([st[1] for st in states])
        starts = torch.tensor([start for _, start, _, _ in segs])
        tok = torch.tensor([lo for _, _, lo, _ in segs])
        n = torch.arange(len(segs))
        kv_rows[n, r + starts % r] = kv[tok].to(kv_rows.dtype)
        score_rows[n, r + starts % r] = score[tok].to(score_rows.dtype)
        full = [i for i, (_, start, _, _) in enumerate(segs) if (start + 1) % r == 0]
        # a tail rebuild keeps its persisted entries: the replay does not rewrite them
        done = [i for i in full if segs[i][1] // r >= self._persisted_length(segs[i][0]) // r]
        pieces = []
        if done:
            sel = torch.tensor(done)
            pieces.append(([kv_rows[sel].flatten(0, 1)], [score_rows[sel].flatten(0, 1)],
                           [2 * j for j in range(len(done))], [segs[i][1] // r for i in done],
                           [decodes[i] for i in done]))
        if full:
            sel = torch.tensor(full)
            if comp.overlap:
                kv_rows[sel, :r], score_rows[sel, :r] = kv_rows[sel, r:], score_rows[sel, r:]
            lo = r if comp.overlap else 0
            kv_rows[sel, lo:] = 0
            score_rows[sel, lo:] = float("-inf")
        for (seq, _, _, _), k_row, s_row in zip(segs, kv_rows.unbind(0), score_rows.unbind(0)):
            pending.setdefault(seq, {})[key] = (k_row, s_row)
        return pieces

    def _advance_one(self, layer_id, comp, which, kv, score, seq, start, seg: int, pending) -> list[tuple]:
        """Absorb the projections kv, score [s, width] of positions start..start+s-1 into the
        sequence's compressor; returns the piece its completed entries pool from (none or one).

        The same block arithmetic as `kernforge.model.compressor.Compressor.forward`, on this
        sequence's own state rows (kept in `pending` until the step completes). The sequence's
        rows are its kept state rows followed by the chunk's; the piece hands them over as those
        two parts (`_compress` copies all pieces' parts once), not as a concatenated copy.
        """
        r, s = comp.ratio, kv.shape[0]
        key = (layer_id, which)
        kv_state, score_state = self._state(seq, key, comp, pending)
        base = (start // r) * r
        kept = r + start - base  # state rows before the chunk (the previous block and this one's start)
        first = base // r
        n_new = (start + s) // r - first
        skip = min(n_new, max(0, self._persisted_length(seq) // r - first))  # kept by a tail rebuild
        pieces = []
        if n_new > skip:
            rows = (n_new + 1) * r  # > kept: n_new >= 1
            pieces.append(([kv_state[:kept], kv[:rows - kept]], [score_state[:kept], score[:rows - kept]],
                           list(range(skip, n_new)), list(range(first + skip, first + n_new)),
                           [seg] * (n_new - skip)))
        keep_from = ((start + s) // r) * r - base  # the sequence's rows from here on stay in the state
        if keep_from >= kept:
            rest_kv, rest_score = kv[keep_from - kept:], score[keep_from - kept:]
        else:
            rest_kv = torch.cat([kv_state[keep_from:kept], kv])
            rest_score = torch.cat([score_state[keep_from:kept], score])
        new_kv, new_score = torch.zeros_like(kv_state), torch.full_like(score_state, float("-inf"))
        lo = 0 if comp.overlap else r  # only ratio 4 reads the previous block again
        new_kv[lo:rest_kv.shape[0]] = rest_kv[lo:]
        new_score[lo:rest_score.shape[0]] = rest_score[lo:]
        pending.setdefault(seq, {})[key] = (new_kv, new_score)
        return pieces

    def _indexer(self, layer_id, indexer, head_w, q, index: StepIndex) -> torch.Tensor:
        """Entry picks [N, index_topk] (-1 = empty) for the step's queries (head weights
        weights_proj(x) [N, h], indexer q [N, h, d]), each against its own sequence's keys
        (already updated with this step's tokens): scores per sequence, then one top-k over
        all of them (rows padded with -inf past each sequence's keys; `end` stops each row
        at its visible entries)."""
        segs, pos = index.segs, index.pos
        visible = [(start + hi - lo) // 4 for _, start, lo, hi in segs]
        width = max(visible)
        if width == 0:
            return torch.full((pos.shape[0], indexer.topk), -1, dtype=torch.long)
        k = torch.arange(width)
        counts = torch.tensor(visible)
        key_slots = index.slots("index4", torch.arange(len(segs)), torch.where(k < counts[:, None], k, -1))
        keys = self.cache.read("index4", layer_id, key_slots.clamp_min(0).flatten()).view(len(segs), width, -1)
        scores = torch.full((pos.shape[0], width), float("-inf"), dtype=torch.float32)
        end = ((pos + 1) // 4).to(torch.int32)
        for i, (_, start, lo, hi) in enumerate(segs):
            # causal: queries see keys < (position + 1) // 4 only, so a long chunk is scored in
            # slices of _SCORE_ROWS queries against the keys the slice's last query sees
            for a in range(lo, hi, _SCORE_ROWS):
                b = min(hi, a + _SCORE_ROWS)
                n = (start + b - lo) // 4
                if n:
                    scores[a:b, :n] = ks.indexer_scores(indexer, head_w[a:b], q[a:b], keys[i, :n], self.backend)
        return _indexer_topk(scores, indexer.topk, end, self.backend)
