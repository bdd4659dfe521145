"""MoE grouped GEMM, DeepGEMM's M-grouped contiguous layout: ``D[r] = A[r] @ B[m_indices[r]]^T``.

After token dispatch, the rows routed to each expert sit together in one tall
matrix ``A [M_sum, K]``; expert ``g``'s weight is ``B[g] [N, K]`` (DeepGEMM's "NT":
both operands K-major).  Each expert's segment starts on a multiple of the layout
alignment (128 in DeepGEMM) and is padded with rows whose index is ``-1``, so a
``block_M``-row tile (``block_M`` divides the alignment) belongs to exactly one
expert, read from its first row.  A tile whose first row is padding is skipped and
stored as zeros; inside a tile, padding rows are stored as zeros too, whatever A
holds there (DeepGEMM leaves that to the caller zeroing A; here it is guaranteed).

The program is a plain tiled GEMM per ``(N tile, M tile)`` block: pipelined
global->shared copies of A and of the expert's B tile, ``T.gemm`` into a float32
fragment, one store.  N and K are compile-time (DeepGEMM's ``compiled_dims="nk"``),
M_sum is symbolic, and ragged N/K edges rely on the copy semantics (reads past the
end give 0, writes past the end are skipped).

The fp8 variant (``m_grouped_fp8_gemm_nt_contiguous``) takes e4m3 operands with
DeepGEMM's default SM90 recipe: per-token 1x128 scales for A (``[M_sum, ceil(K/128)]``)
and per-block 128x128 scales for B (``[G, ceil(N/128), ceil(K/128)]``), applied to
each 128-wide K slice's partial product before it is added to the accumulator.
"""
# no `from __future__ import annotations`: T.Tensor annotations must see the factory's
# parameters as values when the prim_func is traced
import torch

import kernforge.dsl as T
from kernforge.kernels.registry import KernelSpec, Problem, register


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], block_K=[32, 64, 128, 256],
           num_stages=[1, 2, 3])
def m_grouped_gemm_nt_contiguous(num_groups: int, N: int, K: int, block_M: int = 64,
                                 block_N: int = 64, block_K: int = 64, num_stages: int = 2,
                                 dtype: str = "bfloat16", out_dtype: str = "bfloat16",
                                 threads: int = 128):
    """bf16 (or fp16) grouped GEMM.  Kernel parameters: ``A [M, K]``, ``B [num_groups, N, K]``,
    ``m_indices int32 [M]`` (expert of each row, ``-1`` = padding), output ``D [M, N]``."""
    accum = "float32"
    M = T.symbolic("M")
    name = (f"m_grouped_gemm_nt_contiguous_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_K{block_K}_s{num_stages}_{dtype}_{out_dtype}_t{threads}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((num_groups, N, K), dtype),
             m_indices: T.Tensor((M,), "int32"), D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C = T.alloc_fragment((block_M, block_N), accum)
            expert = m_indices[by * block_M]
            T.clear(C)
            if expert >= 0:
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[by * block_M, k * block_K], A_shared)
                    T.copy(B[expert, bx * block_N, k * block_K], B_shared)
                    T.gemm(A_shared, B_shared, C, transpose_B=True)
            for i, j in T.Parallel(block_M, block_N):
                row = T.min(by * block_M + i, M - 1)
                C[i, j] = T.if_then_else(m_indices[row] >= 0, C[i, j], 0.0)
            T.copy(C, D[by * block_M, bx * block_N])

    return main


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3])
def m_grouped_fp8_gemm_nt_contiguous(num_groups: int, N: int, K: int, block_M: int = 64,
                                     block_N: int = 128, num_stages: int = 2,
                                     out_dtype: str = "bfloat16", threads: int = 128):
    """fp8 e4m3 grouped GEMM with 1x128 (A) / 128x128 (B) float32 block scales.
    Kernel parameters: ``A [M, K]`` e4m3, ``SFA [M, ceil(K/128)]``, ``B [num_groups, N, K]``
    e4m3, ``SFB [num_groups, ceil(N/128), ceil(K/128)]``, ``m_indices int32 [M]``,
    output ``D [M, N]``.  ``block_N`` divides 128, so a tile sees one SFB row."""
    if 128 % block_N:
        raise ValueError(f"block_N ({block_N}) must divide the 128-wide B scale block")
    accum = "float32"
    gran = 128
    k_blocks = -(-K // gran)
    n_blocks = -(-N // gran)
    M = T.symbolic("M")
    name = (f"m_grouped_fp8_gemm_nt_contiguous_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_s{num_stages}_{out_dtype}_t{threads}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((M, K), "float8_e4m3"), SFA: T.Tensor((M, k_blocks), accum),
             B: T.Tensor((num_groups, N, K), "float8_e4m3"),
             SFB: T.Tensor((num_groups, n_blocks, k_blocks), accum),
             m_indices: T.Tensor((M,), "int32"), D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, gran), "float8_e4m3")
            B_shared = T.alloc_shared((block_N, gran), "float8_e4m3")
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            expert = m_indices[by * block_M]
            T.clear(C)
            if expert >= 0:
                for k in T.Pipelined(k_blocks, num_stages=num_stages):
                    T.copy(A[by * block_M, k * gran], A_shared)
                    T.copy(B[expert, bx * block_N, k * gran], B_shared)
                    T.gemm(A_shared, B_shared, partial, transpose_B=True, clear_accum=True)
                    for i, j in T.Parallel(block_M, block_N):
                        row = T.min(by * block_M + i, M - 1)
                        C[i, j] = C[i, j] + partial[i, j] * SFA[row, k] * \
                            SFB[expert, (bx * block_N) // gran, k]
            for i, j in T.Parallel(block_M, block_N):
                row = T.min(by * block_M + i, M - 1)
                C[i, j] = T.if_then_else(m_indices[row] >= 0, C[i, j], 0.0)
            T.copy(C, D[by * block_M, bx * block_N])

    return main


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], block_K=[32, 64, 128, 256],
           num_stages=[1, 2, 3])
def m_grouped_gemm_nt_masked(num_groups: int, N: int, K: int, block_M: int = 64,
                             block_N: int = 64, block_K: int = 64, num_stages: int = 2,
                             dtype: str = "bfloat16", out_dtype: str = "bfloat16",
                             threads: int = 128):
    """DeepGEMM's masked layout (decode, CUDA-graph friendly): ``D[g, r] = A[g, r] @ B[g]^T``
    for ``r < masked_m[g]``.  Kernel parameters: ``A [num_groups, max_m, K]``,
    ``B [num_groups, N, K]``, ``masked_m int32 [num_groups]``, ``D [num_groups, max_m, N]``.
    Rows at or past ``masked_m[g]`` are neither computed nor written."""
    accum = "float32"
    max_m = T.symbolic("max_m")
    name = (f"m_grouped_gemm_nt_masked_g{num_groups}_n{N}_k{K}_M{block_M}_N{block_N}"
            f"_K{block_K}_s{num_stages}_{dtype}_{out_dtype}_t{threads}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((num_groups, max_m, K), dtype), B: T.Tensor((num_groups, N, K), dtype),
             masked_m: T.Tensor((num_groups,), "int32"),
             D: T.Tensor((num_groups, max_m, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(max_m, block_M), num_groups,
                      threads=threads) as (bx, by, bz):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C = T.alloc_fragment((block_M, block_N), accum)
            rows = masked_m[bz]
            if by * block_M < rows:
                T.clear(C)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[bz, by * block_M, k * block_K], A_shared)
                    T.copy(B[bz, bx * block_N, k * block_K], B_shared)
                    T.gemm(A_shared, B_shared, C, transpose_B=True)
                for i, j in T.Parallel(block_M, block_N):
                    if (by * block_M + i < rows) & (bx * block_N + j < N):
                        D[bz, by * block_M + i, bx * block_N + j] = C[i, j]

    return main


# ---------------------------------------------------------------- reference


def reference(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """``D[r] = A[r] @ B[m_indices[r]]^T`` in float64; padding rows (``-1``) are 0."""
    d = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    idx = m_indices.long()
    for g in idx[idx >= 0].unique().tolist():
        rows = idx == g
        d[rows] = a[rows].double() @ b[g].double().T
    return d


def reference_masked(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """float64 ``D[g, :masked_m[g]]``; rows past ``masked_m[g]`` are NaN (not defined)."""
    d = torch.full((a.shape[0], a.shape[1], b.shape[1]), float("nan"), dtype=torch.float64,
                   device=a.device)
    for g, rows in enumerate(masked_m.tolist()):
        d[g, :rows] = a[g, :rows].double() @ b[g].double().T
    return d


def _scale(amax: torch.Tensor, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(min=1e-4) / 448.0
    return torch.exp2(torch.ceil(torch.log2(sf))) if use_ue8m0 else sf


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's activation recipe: one float32 scale per 1x128 slice of a row
    (``amax / 448``, rounded up to a power of two with ``use_ue8m0``); data = x / scale."""
    k = x.shape[-1]
    kb = -(-k // 128)
    v = torch.nn.functional.pad(x.float(), (0, kb * 128 - k)).view(*x.shape[:-1], kb, 128)
    sf = _scale(v.abs().amax(-1), use_ue8m0)
    data = (v / sf[..., None]).view(*x.shape[:-1], kb * 128)[..., :k]
    return data.to(torch.float8_e4m3fn).contiguous(), sf.float().contiguous()


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's weight recipe: one float32 scale per 128x128 block of ``[..., N, K]``."""
    n, k = x.shape[-2:]
    nb, kb = -(-n // 128), -(-k // 128)
    v = torch.nn.functional.pad(x.float(), (0, kb * 128 - k, 0, nb * 128 - n))
    v = v.view(*x.shape[:-2], nb, 128, kb, 128)
    sf = _scale(v.abs().amax(dim=(-3, -1)), use_ue8m0)
    data = (v / sf[..., :, None, :, None]).view(*x.shape[:-2], nb * 128, kb * 128)[..., :n, :k]
    return data.to(torch.float8_e4m3fn).contiguous(), sf.float().contiguous()


def dequantize(data: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float64 ``data * scale`` with one scale per ``block`` (rows, cols) of the last two dims."""
    s = scale.double()
    s = s.repeat_interleave(block[0], dim=-2)[..., :data.shape[-2], :]
    s = s.repeat_interleave(block[1], dim=-1)[..., :data.shape[-1]]
    return data.double() * s


# ---------------------------------------------------------------- library entry

_RUNTIME_SIZES = ("group_rows", "alignment")


def contiguous_layout(group_rows: list[int], alignment: int, device="cpu") -> torch.Tensor:
    """``m_indices`` for experts with ``group_rows`` rows: each segment padded with ``-1``
    up to a multiple of ``alignment`` (DeepGEMM's contiguous layout)."""
    ids: list[int] = []
    for g, n in enumerate(group_rows):
        ids += [g] * n + [-1] * (-(-n // alignment) * alignment - n)
    return torch.tensor(ids, dtype=torch.int32, device=device)


def make_inputs(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    m_indices = contiguous_layout(params["group_rows"], params.get("alignment", 128), device)
    m, n, k = m_indices.numel(), params["N"], params["K"]
    a = torch.randn(m, k, generator=g)
    a[m_indices.cpu() < 0] = torch.randn(int((m_indices < 0).sum()), k, generator=g) * 1e3  # padding: garbage
    b = torch.randn(params["num_groups"], n, k, generator=g)
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    return [a.bfloat16().to(device), b.bfloat16().to(device), m_indices, d.to(device)]


def _reference(inputs: list, params: dict) -> list:
    a, b, m_indices = inputs[:3]
    return [reference(a, b, m_indices)]


def error_bound(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor,
                expected: torch.Tensor, rounding_steps: int = 1) -> torch.Tensor:
    """Elementwise bound on ``|D - reference|`` for float32 accumulation and a bf16 store.

    Products of bf16 (or e4m3) values are exact in float32; summing K of them errs by at
    most ``K * 2^-24 * sum|a_i b_i|`` (``rounding_steps`` more roundings per term for
    scaled partial sums), and the bf16 store adds ``2^-8 |d|``."""
    absprod = reference(a.abs(), b.abs(), m_indices)
    k = a.shape[1]
    return 2.0 ** -8 * expected.abs() + (k + rounding_steps + 1) * 2.0 ** -24 * absprod + 1e-30


def assert_close(d: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    got = d.cpu().double()
    assert not torch.isnan(got).any(), "D has NaN (unwritten or poisoned elements)"
    if got.numel() == 0:
        return
    excess = (got - expected.cpu()).abs() - bound.cpu()
    worst = excess.max().item()
    where = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    assert worst <= 0, f"D exceeds its error bound by {worst:.3g} at {where}"


def _check(outputs: list, expected: list, inputs: list, params: dict) -> None:
    a, b, m_indices = inputs[:3]
    assert_close(outputs[0], expected[0], error_bound(a, b, m_indices, expected[0]))


def _flops(p: dict) -> float:
    return 2.0 * sum(p["group_rows"]) * p["N"] * p["K"]


def _bytes(p: dict) -> float:
    m = sum(p["group_rows"])
    return 2.0 * (m * p["K"] + p["num_groups"] * p["N"] * p["K"] + m * p["N"])


SPEC = register(KernelSpec(
    name="m_grouped_gemm_nt_contiguous",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, contiguous layout (m_indices), bf16 in, fp32 accum",
    factory=m_grouped_gemm_nt_contiguous,
    runtime_sizes=_RUNTIME_SIZES,
    problems={
        # an expert with no rows, unaligned row counts, N/K not multiples of the tiles
        "small": Problem("small", dict(group_rows=[5, 0, 70, 32], alignment=32, num_groups=4,
                                       N=40, K=72, block_M=32, block_N=32, block_K=32)),
        "demo": Problem("demo", dict(group_rows=[200, 77, 0, 310], alignment=128, num_groups=4,
                                     N=256, K=512, block_M=64, block_N=64, block_K=64)),
        # DeepGEMM's contiguous test shape (G=4, 8192 rows each, N=4096, K=2048: V4 MoE dims)
        "bench": Problem("bench", dict(group_rows=[8192] * 4, alignment=128, num_groups=4,
                                       N=4096, K=2048, block_M=128, block_N=128, block_K=64,
                                       num_stages=3)),
    },
    make_inputs=make_inputs,
    outputs=(3,),
    reference=_reference,
    check=_check,
    flops=_flops,
    bytes=_bytes,
    tags=("moe", "gemm"),
))


def make_inputs_fp8(params: dict, seed: int, device: str = "cpu") -> list:
    a, b, m_indices, d = make_inputs(params, seed, "cpu")
    a = a.float().masked_fill((m_indices < 0)[:, None], 0.0)   # amax of garbage rows would be inf in e4m3
    (a8, sfa), (b8, sfb) = per_token_cast_to_fp8(a), per_block_cast_to_fp8(b.float())
    return [t.to(device) for t in (a8, sfa, b8, sfb, m_indices, d)]


def _dequantized(inputs: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a8, sfa, b8, sfb, m_indices = inputs[:5]
    return dequantize(a8, sfa, (1, 128)), dequantize(b8, sfb, (128, 128)), m_indices


def _reference_fp8(inputs: list, params: dict) -> list:
    return [reference(*_dequantized(inputs))]


def _check_fp8(outputs: list, expected: list, inputs: list, params: dict) -> None:
    assert_close(outputs[0], expected[0], error_bound(*_dequantized(inputs), expected[0],
                                                      rounding_steps=3))


SPEC_FP8 = register(KernelSpec(
    name="m_grouped_fp8_gemm_nt_contiguous",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, fp8 e4m3 with 1x128 / 128x128 float32 scales",
    factory=m_grouped_fp8_gemm_nt_contiguous,
    runtime_sizes=_RUNTIME_SIZES,
    problems={
        "small": Problem("small", dict(group_rows=[40, 0, 9], alignment=32, num_groups=3,
                                       N=160, K=200, block_M=32, block_N=64)),
        "demo": Problem("demo", dict(group_rows=[200, 77, 0, 310], alignment=128, num_groups=4,
                                     N=256, K=256, block_M=64, block_N=64)),
        "bench": Problem("bench", dict(group_rows=[8192] * 4, alignment=128, num_groups=4,
                                       N=4096, K=2048, block_M=128, block_N=128, num_stages=3,
                                       threads=256)),
    },
    make_inputs=make_inputs_fp8,
    outputs=(5,),
    reference=_reference_fp8,
    check=_check_fp8,
    flops=_flops,
    bytes=lambda p: _bytes(p) / 2 + 2.0 * sum(p["group_rows"]) * p["N"],
    tags=("moe", "gemm", "fp8"),
))


_MASKED_RUNTIME_SIZES = ("masked_rows", "max_m")


def make_inputs_masked(params: dict, seed: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(seed)
    groups, max_m, n, k = params["num_groups"], params["max_m"], params["N"], params["K"]
    a = torch.randn(groups, max_m, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    masked_m = torch.tensor(params["masked_rows"], dtype=torch.int32)
    d = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    return [t.to(device) for t in (a, b, masked_m, d)]


def _check_masked(outputs: list, expected: list, inputs: list, params: dict) -> None:
    """Rows below ``masked_m[g]`` within their bound; rows past it still hold the poison."""
    a, b, masked_m = inputs[:3]
    d, e = outputs[0], expected[0]
    for grp, rows in enumerate(masked_m.tolist()):
        assert_close(d[grp, :rows], e[grp, :rows],
                     error_bound(a[grp, :rows], b[grp:grp + 1],
                                 torch.zeros(rows, dtype=torch.int32, device=a.device), e[grp, :rows]))
        assert torch.isnan(d[grp, rows:].float()).all(), f"group {grp}: rows past masked_m were written"


SPEC_MASKED = register(KernelSpec(
    name="m_grouped_gemm_nt_masked",
    family="grouped_gemm",
    description="DeepGEMM-style MoE grouped GEMM, masked layout (decode): rows < masked_m[g]",
    factory=m_grouped_gemm_nt_masked,
    runtime_sizes=_MASKED_RUNTIME_SIZES,
    problems={
        "small": Problem("small", dict(masked_rows=[70, 0, 33], max_m=72, num_groups=3, N=36,
                                       K=40, block_M=32, block_N=32, block_K=32)),
        "demo": Problem("demo", dict(masked_rows=[20, 0, 64, 7, 33, 50], max_m=64, num_groups=6,
                                     N=512, K=512, block_M=64, block_N=128, block_K=128)),
        # DeepGEMM's masked test shape: 32 groups, expected_m 192, M_max 4096 (V4 MoE dims)
        "bench": Problem("bench", dict(masked_rows=[192] * 32, max_m=256, num_groups=32,
                                       N=4096, K=2048, block_M=128, block_N=128, block_K=64,
                                       num_stages=3)),
    },
    make_inputs=make_inputs_masked,
    outputs=(3,),
    reference=lambda inputs, params: [reference_masked(*inputs[:3])],
    check=_check_masked,
    flops=lambda p: 2.0 * sum(p["masked_rows"]) * p["N"] * p["K"],
    tags=("moe", "gemm", "decode"),
))
