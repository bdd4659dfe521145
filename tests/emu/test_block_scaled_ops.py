"""DeepGEMM's SM100 scales through the ops (issue 21 item 6): ``fp8_gemm_nt`` and the grouped FP8
ops given packed UE8M0 scales (four exponent bytes per int32 along K; ``b`` per row, the 1D1D
recipe) hand them to the ``sf_format="ue8m0"`` kernels unchanged on CUDA backends, and on sm_100a
(``arch="sm_100a"`` on cuda-emu) the choosers give those kernels the 128-row tiles that block-scaled
``tcgen05.mma`` needs -- for decode-sized ``m``/``expected_m`` and for ``c`` too, which took 64-row
tiles (and so the float32 promotion in registers) before.  Each emulated result must match a
float64 product of the unpacked scales; host backends unpack and match it too.  "CUDA semantics
verified on host emulation", never GPU verified.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from kernforge.kernels.gemm import unpack_ue8m0_from_int
from kernforge.ops import gemm as gemm_ops
from kernforge.ops import grouped_gemm as grouped_ops

N, K = 64, 576  # five 128-K scale blocks in two packed words, the last K block 64 deep


@contextlib.contextmanager
def _alignment(rows: int):
    """DeepGEMM's contiguous-layout alignment set to ``rows`` for the block, then restored."""
    old = grouped_ops.get_mk_alignment_for_contiguous_layout()
    grouped_ops.set_mk_alignment_for_contiguous_layout(rows)
    try:
        yield
    finally:
        grouped_ops.set_mk_alignment_for_contiguous_layout(old)


def _exponents(g, *shape):
    """UE8M0 bytes spread over 2^-9..2^9 (every K block a different factor; no float32 overflow)."""
    return torch.randint(118, 137, shape, generator=g)


def _pack(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes ``[..., kb]`` -> int32 ``[..., ceil(kb / 4)]``, byte j of word p = block 4p + j."""
    e = torch.nn.functional.pad(e.to(torch.int64), (0, (-e.shape[-1]) % 4), value=127).unflatten(-1, (-1, 4))
    word = e[..., 0] | (e[..., 1] << 8) | (e[..., 2] << 16) | (e[..., 3] << 24)
    return (word - ((word >> 31) << 32)).to(torch.int32)


def _scaled(data: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """float64 ``data`` with K block s of row r scaled by 2^(e[r, s] - 127)."""
    factor = torch.pow(2.0, (e.double() - 127)).repeat_interleave(128, dim=-1)[..., :data.shape[-1]]
    return data.double() * factor


def _reference(a, ea, b, eb):
    """float64 ``(a * sa) @ (b * sb)^T`` and a bound: a float32 rounding per 32-deep MMA and K tile."""
    sa, sb = _scaled(a, ea), _scaled(b, eb)
    return sa @ sb.transpose(-1, -2), (sa.abs() @ sb.abs().transpose(-1, -2)) * (K // 32 + 8) * 2.0 ** -24


def _assert_within(got, want, bound):
    err = (got.double() - want).abs()
    bad = ~(err <= bound)
    assert not bad.any(), f"{int(bad.sum())} elements off, first at {bad.nonzero()[:3].tolist()}"


def _record(monkeypatch, module):
    """Replace ``module._kernel`` by a recorder of (params, arguments) that launches nothing."""
    seen = []
    monkeypatch.setattr(module, "_kernel", lambda factory, backend, **p: (lambda *args: seen.append((p, args))))
    return seen


def _dense_operands(seed: int, m: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, K, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, generator=g) * 4).to(torch.float8_e4m3fn)
    return a, b, _exponents(g, m, 5), _exponents(g, N, 5)


def _masked_operands(seed: int, groups: int, max_m: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(groups, max_m, K, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(groups, N, K, generator=g) * 4).to(torch.float8_e4m3fn)
    return a, b, _exponents(g, groups, max_m, 5), _exponents(g, groups, N, 5)


# ---- routing: what the ops hand the kernels (no launch) ------------------------------------------

def test_packed_scales_reach_the_block_scaled_configuration_only_on_sm100a(monkeypatch):
    """Decode-sized ``m`` with ``c``: 128-row tiles and the int32 words as given on sm_100a; sm_90a
    (the emulator's default) keeps 64-row tiles with the packed words; float32 scales keep 64 rows."""
    seen = _record(monkeypatch, gemm_ops)
    a, b, ea, eb = _dense_operands(0, 20)
    sfa, sfb = _pack(ea), _pack(eb)
    c = torch.zeros(20, N)
    for arch in ("sm_100a", None):
        gemm_ops.fp8_gemm_nt((a, sfa), (b, sfb), torch.zeros(20, N), c, backend="cuda-emu", arch=arch)
    fa, fb = unpack_ue8m0_from_int(sfa, 5), unpack_ue8m0_from_int(sfb, 5)
    gemm_ops.fp8_gemm_nt((a, fa), (b, fb), torch.zeros(20, N), c, recipe=(1, 1, 128), backend="cuda-emu",
                         arch="sm_100a")
    (p100, args100), (p90, args90), (p32, _) = seen
    assert p100["arch"] == "sm_100a" and p100["block_M"] == 128 and p100["sf_format"] == "ue8m0"
    assert p100["gran_n"] == 1 and p100["accumulate"]
    assert torch.equal(args100[1], sfa) and args100[1].stride(0) == 1 and torch.equal(args100[3], sfb)
    assert "arch" not in p90 and p90["block_M"] == 64 and p90["sf_format"] == "ue8m0"
    assert args90[1].dtype == torch.int32
    assert p32["block_M"] == 64 and "sf_format" not in p32


def test_grouped_ops_pass_packed_scales_through_on_cuda_backends_and_unpack_on_hosts(monkeypatch):
    seen = _record(monkeypatch, grouped_ops)
    a, b, ea, eb = _masked_operands(1, 2, 48)
    sfa, sfb = _pack(ea), _pack(eb)
    masked = torch.tensor([40, 0], dtype=torch.int32)
    for backend, arch in (("cuda-emu", "sm_100a"), ("cuda-emu", None), ("interp", None)):
        grouped_ops.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), torch.zeros(2, 48, N, dtype=torch.bfloat16),
                                                 masked, 20, backend=backend, arch=arch)
    (p100, args100), (p90, _), (host, host_args) = seen
    assert (p100["block_M"], p100["sf_format"], p100["gran_n"], p100["arch"]) == (128, "ue8m0", 1, "sm_100a")
    assert torch.equal(args100[1], sfa) and args100[1].stride(1) == 1 and torch.equal(args100[3], sfb)
    assert p90["block_M"] == 64 and p90["sf_format"] == "ue8m0"
    assert "sf_format" not in host and host["gran_n"] == 1 and host_args[1].dtype == torch.float32
    assert torch.equal(host_args[1], unpack_ue8m0_from_int(sfa, 5))

    with _alignment(128):
        layout = torch.tensor([0] * 100 + [-1] * 28 + [1] * 128, dtype=torch.int32)
        g = torch.Generator().manual_seed(2)
        a2 = (torch.randn(256, K, generator=g) * 4).to(torch.float8_e4m3fn)
        sfa2 = _pack(_exponents(g, 256, 5))
        grouped_ops.m_grouped_fp8_gemm_nt_contiguous((a2, sfa2), (b, sfb), torch.zeros(256, N, dtype=torch.bfloat16),
                                                     layout, backend="cuda-emu", arch="sm_100a")
    p, args = seen[-1]
    assert (p["block_M"], p["sf_format"], p["gran_n"]) == (128, "ue8m0", 1)
    assert torch.equal(args[1], sfa2) and torch.equal(args[3], sfb)


def _dense_args():
    a, b, ea, eb = _dense_operands(3, 8)
    return dict(a=(a, _pack(ea)), b=(b, _pack(eb)), d=torch.full((8, N), float("nan")), backend="cuda-emu")


def _masked_args():
    a, b, ea, eb = _masked_operands(4, 2, 16)
    return dict(a=(a, _pack(ea)), b=(b, _pack(eb)), d=torch.full((2, 16, N), float("nan"), dtype=torch.bfloat16),
                masked_m=torch.tensor([3, 16], dtype=torch.int32), expected_m=8, backend="cuda-emu")


def _bad(args, which, fix):
    args = dict(args)
    args[which] = fix(args[which])
    return args


@pytest.mark.parametrize("op, args, error, match", [
    ("dense", lambda: dict(_dense_args(), backend="interp", arch="sm_100a"), ValueError, "arch='sm_100a'"),
    ("dense", lambda: dict(_dense_args(), arch="sm_75"), ValueError, "arch must be one of"),
    ("dense", lambda: dict(_dense_args(), arch=100), TypeError, "arch must be"),
    ("dense", lambda: _bad(_dense_args(), "b", lambda x: (x[0], x[1][:, :1])), ValueError, r"sfb \(packed UE8M0"),
    ("dense", lambda: _bad(_dense_args(), "a", lambda x: (x[0], x[1].long())), TypeError, "sfa must be"),
    ("masked", lambda: _bad(_masked_args(), "b", lambda x: (x[0], x[1][:, :8])), ValueError,
     r"sfb \(packed UE8M0, 4 per int32\) must have shape \(2, 64, 2\)"),
    ("masked", lambda: _bad(_masked_args(), "a", lambda x: (x[0], x[1].view(torch.float32))), ValueError,
     "sfa must have shape"),  # the same bits as float32: (2, 16, 2) is not (2, 16, 5)
    ("masked", lambda: dict(_masked_args(), arch="sm_10"), ValueError, "arch must be one of"),
])
def test_bad_scales_and_arch_fail_before_anything_runs(monkeypatch, op, args, error, match):
    """Typed errors naming the argument, raised before a kernel is built or ``d`` written."""
    monkeypatch.setattr(gemm_ops, "_kernel", lambda *a, **k: pytest.fail("a kernel was built"))
    monkeypatch.setattr(grouped_ops, "_kernel", lambda *a, **k: pytest.fail("a kernel was built"))
    kw = args()
    fn = gemm_ops.fp8_gemm_nt if op == "dense" else grouped_ops.m_grouped_fp8_gemm_nt_masked
    with pytest.raises(error, match=match):
        fn(**kw)
    assert torch.isnan(kw["d"].float()).all()


# ---- emulated: the block-scaled kernels the ops build on sm_100a match float64 ------------------

def _built(monkeypatch, module) -> list:
    """The kernels ``module``'s op builds (or reuses), recorded as it asks for them."""
    built, real = [], module._kernel
    monkeypatch.setattr(module, "_kernel", lambda factory, backend, **p: built.append(real(factory, backend, **p))
                        or built[-1])
    return built


def _block_scaled(kernel) -> bool:
    source = kernel.launcher.program.source
    return "kf::tcgen05_mma_mxf8f6f4_block_scale(" in source and "tcgen05_cp_32x128b_warpx4(" in source


def test_dense_op_decode_with_c_runs_block_scaled_mmas_and_matches_float64(monkeypatch):
    """``m = 40`` (one ragged 128-row tile) with ``c``: block-scaled MMAs, and
    ``d = c + (a sa) @ (b sb)^T`` in float32 within float64's bound."""
    built = _built(monkeypatch, gemm_ops)
    m = 40
    a, b, ea, eb = _dense_operands(5, m)
    c = torch.randn(m, N, generator=torch.Generator().manual_seed(6)) * 8
    d = torch.full((m, N), float("nan"))
    gemm_ops.fp8_gemm_nt((a, _pack(ea)), (b, _pack(eb)), d, c, backend="cuda-emu", arch="sm_100a")
    want, bound = _reference(a, ea, b, eb)
    _assert_within(d, want + c.double(), bound + c.double().abs() * 2.0 ** -23)
    assert len(built) == 1 and built[0].arch == "sm_100a" and _block_scaled(built[0])


def test_masked_op_small_expected_m_runs_block_scaled_mmas_and_matches_float64(monkeypatch):
    """``expected_m = 20``: 128-row tiles on sm_100a; rows past ``masked_m`` stay untouched."""
    built = _built(monkeypatch, grouped_ops)
    groups, max_m = 2, 48
    a, b, ea, eb = _masked_operands(7, groups, max_m)
    masked = torch.tensor([40, 0], dtype=torch.int32)
    d = torch.full((groups, max_m, N), float("nan"), dtype=torch.bfloat16)
    grouped_ops.m_grouped_fp8_gemm_nt_masked((a, _pack(ea)), (b, _pack(eb)), d, masked, 20, backend="cuda-emu",
                                             arch="sm_100a")
    want, bound = _reference(a[0, :40], ea[0, :40], b[0], eb[0])
    _assert_within(d[0, :40], want, bound + want.abs() * 2.0 ** -8)  # bf16 d
    assert torch.isnan(d[0, 40:].float()).all() and torch.isnan(d[1].float()).all()
    assert len(built) == 1 and "_M128_" in built[0].ir.name and _block_scaled(built[0])


def test_contiguous_op_per_row_b_scales_run_block_scaled_mmas_and_match_float64(monkeypatch):
    """The contiguous layout at DeepGEMM's 128-row alignment: expert 0's 100 rows and padding, then
    expert 1's 128; per-row B scales (``gran_n=1``), padding rows written as zeros."""
    built = _built(monkeypatch, grouped_ops)
    with _alignment(128):
        layout = torch.tensor([0] * 100 + [-1] * 28 + [1] * 128, dtype=torch.int32)
        g = torch.Generator().manual_seed(8)
        a = (torch.randn(256, K, generator=g) * 4).to(torch.float8_e4m3fn)
        b = (torch.randn(2, N, K, generator=g) * 4).to(torch.float8_e4m3fn)
        ea, eb = _exponents(g, 256, 5), _exponents(g, 2, N, 5)
        d = torch.full((256, N), float("nan"), dtype=torch.bfloat16)
        grouped_ops.m_grouped_fp8_gemm_nt_contiguous((a, _pack(ea)), (b, _pack(eb)), d, layout, backend="cuda-emu",
                                                     arch="sm_100a")
    for expert, rows in ((0, slice(0, 100)), (1, slice(128, 256))):
        want, bound = _reference(a[rows], ea[rows], b[expert], eb[expert])
        _assert_within(d[rows], want, bound + want.abs() * 2.0 ** -8)
    assert torch.equal(d[100:128].float(), torch.zeros(28, N))
    assert len(built) == 1 and "_g1" in built[0].ir.name and _block_scaled(built[0])
