"""While a CUDA graph is being captured, the ops skip the data checks that read device memory on
the host (kernforge/ops/_capture.py).  No GPU here: `capturing` is forced true on CPU tensors
and every aten op the call dispatches is recorded; the calls that would synchronise with the
device (a tensor's value read on the host) must not appear, and the results stay the same."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernforge.ops as kops
import importlib

from tests.ops.test_torch_library import ALIGN, CASES, _clone, _plain, small_alignment  # noqa: F401

# aten ops that read a tensor's data on the host (item(), bool(), tolist(), nonzero, boolean masks)
HOST_READS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default",
              "aten.nonzero.default", "aten.index.Tensor", "aten.masked_select.default"}


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _run(name, args, kwargs):
    with _Record() as rec:
        out = _plain(name, args, kwargs)
    return out, {op for op in rec.ops if op in HOST_READS}


@pytest.mark.parametrize("case", ["topk", "bf16_contiguous", "bf16_masked", "mla"])
def test_a_captured_call_reads_nothing_on_the_host_and_computes_the_same(case, monkeypatch):
    name, args, kwargs, _ = CASES[case](3)
    eager, eager_reads = _run(name, _clone(args), kwargs)
    assert eager_reads, "the recorder must see the data checks of an ordinary call"
    for module in (importlib.import_module(f"kernforge.ops.{m}") for m in ("topk", "mla", "grouped_gemm")):
        monkeypatch.setattr(module, "capturing", lambda t: True)
    captured, reads = _run(name, _clone(args), kwargs)
    assert reads == set()
    for x, y in zip(torch.utils._pytree.tree_leaves(eager), torch.utils._pytree.tree_leaves(captured)):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, equal_nan=True, rtol=0, atol=0)


def test_outside_a_capture_bad_ids_are_still_errors():
    name, (q, kv, table, lens, dv), kwargs, _ = CASES["mla"](4)
    table = table.clone()
    table[0, 0] = kv.shape[0] + 5
    with pytest.raises(ValueError, match="page ids outside"):
        kops.flash_mla_with_kvcache(q, kv, table, lens, dv, **kwargs)


def _psum_reference(ends, m, alignment):
    """The PSUM layout written out row by row: group g holds [align(end[g-1]), end[g])."""
    ids, start = [-1] * m, 0
    for g, end in enumerate(ends):
        for r in range(start, end):
            ids[r] = g
        start = -(-end // alignment) * alignment
    return ids


@pytest.mark.parametrize("seed", range(6))
def test_psum_layout_rows_match_the_row_by_row_definition_and_read_nothing_on_the_host(seed, monkeypatch):
    gm = importlib.import_module("kernforge.ops.grouped_gemm")
    g = torch.Generator().manual_seed(seed)
    groups = int(torch.randint(1, 6, (1,), generator=g))
    ends, start = [], 0
    for _ in range(groups):
        end = start + int(torch.randint(0, 3 * ALIGN, (1,), generator=g))
        ends.append(end)
        start = -(-end // ALIGN) * ALIGN
    m = ends[-1] + int(torch.randint(0, ALIGN, (1,), generator=g))
    t = torch.tensor(ends, dtype=torch.int32)
    assert gm._psum_to_indices(t, m, groups).tolist() == _psum_reference(ends, m, ALIGN)
    monkeypatch.setattr(gm, "capturing", lambda x: True)
    with _Record() as rec:
        got = gm._psum_to_indices(t, m, groups)
    assert not {op for op in rec.ops if op in HOST_READS}
    assert got.tolist() == _psum_reference(ends, m, ALIGN)
