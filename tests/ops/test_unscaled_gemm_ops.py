"""``bf16_gemm_{nt,nn,tn,tt}`` and ``fp32_gemm_*``: DeepGEMM's layouts and ``c`` rules on the
unscaled dense GEMM, against float64 matmuls, trivial sizes, and typed errors raised before
anything runs."""
import pytest
import torch

from kernforge import ops as kops
from kernforge.kernels.gemm import problems as P

M, N, K = 37, 160, 264


def operands(dtype, m=M, n=N, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)


def check(d, a, b, c=None):
    a64, b64 = a.double(), b.double()
    e = a64 @ b64.T + (c.double() if c is not None else 0)
    bound = P.dense_error_bound(a64, b64, e, "bfloat16" if d.dtype == torch.bfloat16 else "float32")
    P.assert_close(d, e, bound + (2.0 ** -24 * (a64 @ b64.T).abs() if c is not None else 0))


@pytest.mark.parametrize("prefix, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_four_majors_agree_with_deepgemm_conventions(prefix, dtype):
    """``nn``/``tn``/``tt`` take the transposed tensors, contiguous; all four give the same bits
    (on the cpu backend: the engine's)."""
    a, b = operands(dtype)
    args = {"nt": (a, b), "nn": (a, b.T.contiguous()), "tn": (a.T.contiguous(), b.T.contiguous()),
            "tt": (a.T.contiguous(), b)}
    out = {}
    for name, (x, y) in args.items():
        out[name] = torch.full((M, N), float("nan"), dtype=dtype)
        getattr(kops, f"{prefix}_gemm_{name}")(x, y, out[name], backend="cpu")
    check(out["nt"], a, b)
    for name, d in out.items():
        assert torch.equal(d, out["nt"]), name


def test_c_is_copied_into_d_first():
    """``c`` distinct from ``d``: DeepGEMM's rule, d = c + a @ b^T, c left unchanged."""
    a, b = operands(torch.bfloat16)
    c = torch.randn(M, N)
    kept = c.clone()
    d = torch.full((M, N), float("nan"))
    kops.bf16_gemm_nt(a, b, d, c, backend="interp")
    assert torch.equal(c, kept)
    check(d, a, b, c)


def test_c_in_place_adds_the_old_d():
    a, b = operands(torch.float32)
    c = torch.randn(M, N)
    d = c.clone()
    kops.fp32_gemm_nt(a, b, d, d, backend="cpu")
    check(d, a, b, c)


def test_trivial_sizes():
    a, b = operands(torch.float32, m=3, n=5, k=0)
    d = torch.full((3, 5), float("nan"))
    kops.fp32_gemm_nt(a, b, d)
    assert torch.equal(d, torch.zeros(3, 5))
    c = torch.randn(3, 5)
    kops.fp32_gemm_nt(a, b, d, c)
    assert torch.equal(d, c)
    a, b = operands(torch.float32, m=0, n=5, k=8)
    kops.fp32_gemm_nt(a, b, torch.empty(0, 5))


def _args(**over):
    a, b = operands(torch.float32)
    args = dict(a=a, b=b, d=torch.full((M, N), float("nan")))
    args.update(over)
    return args


@pytest.mark.parametrize("over, error, match", [
    (dict(a=torch.randn(M, K).bfloat16()), TypeError, "a must be a torch.float32 tensor"),
    (dict(b=[1.0]), TypeError, "b must be a torch.float32 tensor"),
    (dict(a=torch.randn(M, 2 * K)[:, ::2]), ValueError, "a must be K-major"),
    (dict(b=torch.randn(N, K + 1)), ValueError, "K mismatch"),
    (dict(d=torch.full((M, N), float("nan"), dtype=torch.float16)), TypeError,
     "d must be torch.bfloat16 or torch.float32"),
    (dict(d=torch.full((M, N + 1), float("nan"))), ValueError, r"d must have shape \(37, 160\)"),
    (dict(c=torch.zeros(M, N, dtype=torch.bfloat16)), TypeError, "c must have d's dtype"),
    (dict(compiled_dims="xy"), ValueError, "compiled_dims"),
])
def test_bad_arguments_raise_before_anything_runs(over, error, match):
    args = _args(**over)
    with pytest.raises(error, match=match):
        kops.fp32_gemm_nt(**args, backend="interp")
    assert torch.isnan(args["d"].float()).all(), "nothing may run before the checks pass"


def test_transposed_names_check_their_operands():
    with pytest.raises(ValueError, match="b must be a 2-D tensor"):
        kops.bf16_gemm_nn(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16),
                          torch.empty(2, 2))


@pytest.mark.parametrize("over, error, match", [
    (dict(a=torch.randn(M, K).bfloat16()), TypeError, "a must be a torch.float32 tensor"),
    (dict(a=torch.randn(M, 2 * K)[:, ::2]), ValueError, "a must be K-major"),
    (dict(b=torch.randn(N, K + 1)), ValueError, "K mismatch"),
    (dict(d=torch.full((M, N), float("nan"), dtype=torch.float16)), TypeError,
     "d must be torch.bfloat16 or torch.float32"),
    (dict(d=torch.full((M, 2 * N), float("nan"))[:, ::2]), ValueError, "d must be contiguous"),
    (dict(c=torch.zeros(M, N, dtype=torch.bfloat16)), TypeError, "c must have d's dtype"),
    (dict(compiled_dims="xy"), ValueError, "compiled_dims"),
])
def test_the_call_memo_never_skips_a_check(over, error, match):
    """A good call on the cpu backend memoises its kernel by signature; a call that differs
    from it in one argument is checked again, before anything runs."""
    good = _args(c=torch.zeros(M, N))
    kops.fp32_gemm_nt(**good, backend="cpu")
    check(good["d"], good["a"], good["b"], good["c"])
    args = dict(good, d=torch.full((M, N), float("nan")))
    args.update(over)
    with pytest.raises(error, match=match):
        kops.fp32_gemm_nt(**args, backend="cpu")
    assert torch.isnan(args["d"].float()).all(), "nothing may run before the checks pass"


def test_the_call_memo_rereads_whether_c_is_d():
    """``c`` distinct from ``d`` and ``c is d`` have one signature: each call decides again
    whether to copy ``c`` into ``d`` first, and every call reads its own tensors."""
    a, b = operands(torch.float32, m=3, n=64, k=32)
    bt = b.T.contiguous()
    for seed in range(3):
        c = torch.randn(3, 64, generator=torch.Generator().manual_seed(seed))
        d = torch.full((3, 64), float("nan"))
        kops.fp32_gemm_nn(a, bt, d, c, backend="cpu")
        check(d, a, b, c)
        d2 = c.clone()
        kops.fp32_gemm_nn(a, bt, d2, d2, backend="cpu")
        assert torch.equal(d2, d)
