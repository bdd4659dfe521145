"""Shared fixtures: one torch thread (as tests/model: the second OpenMP thread spin-waits on
the shared 2-core machine), tiny random models, and the "exact" engine mode.

Exact mode swaps the attention kernel step for a float64 torch attention over
the same flat slot ids and keeps the KV pages in float32. The engine's
bookkeeping (paging, ring eviction, compressor states, indexer picks, ragged
flattening) then has to reproduce the reference to float32 rounding, which a
bf16 kernel's ~1e-2 noise (and the discrete indexer/router picks it flips)
would hide. The kernel path itself is tested with bf16 tolerances.
"""

import pytest
import torch

from kernforge.engine import cache as cache_mod
from kernforge.engine import engine as engine_mod
from kernforge.model import random_model, tiny


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def float64_sparse_mla(q, pages, indices, sink, scale, backend):
    """softmax over the listed slots with the sink in the denominator, in float64."""
    kv = pages.reshape(-1, pages.shape[-1]).double()
    idx = indices[:, 0].long()
    cand = kv[idx.clamp(min=0)]
    logits = torch.einsum("nhd,nkd->nhk", q[:, 0].double(), cand) * scale
    logits = logits.masked_fill((idx < 0)[:, None], float("-inf"))
    s = sink.double()[None, :, None]
    top = torch.maximum(logits.amax(-1, keepdim=True), s)
    e = (logits - top).exp()
    p = e / (e.sum(-1, keepdim=True) + (s - top).exp())
    return torch.einsum("nhk,nkd->nhd", p, cand)[:, None].to(q.dtype)


@pytest.fixture
def exact(monkeypatch):
    monkeypatch.setattr(cache_mod, "KV_DTYPE", torch.float32)
    monkeypatch.setattr(engine_mod, "_sparse_mla", float64_sparse_mla)


@pytest.fixture(scope="module")
def model_noqat(_one_torch_thread):
    """No QAT rounding, and index_topk above the 75 ratio-4 entries of 300 tokens: the indexer
    keeps every visible entry, so no near-tie pick can flip between float32 summation orders
    (one flip moves that query's logits by O(0.1) and, through its KV, later positions too).
    The pick itself is tested at index_topk 8 in test_indexer_picks_match_the_reference."""
    return random_model(tiny(fake_quant=False, index_topk=128), seed=0)


@pytest.fixture(scope="module")
def model_qat(_one_torch_thread):
    return random_model(tiny(index_topk=128), seed=0)


def tokens(length: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 512, (batch, length), generator=torch.Generator().manual_seed(seed))
