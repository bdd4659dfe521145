"""DeepGEMM's dense block-scaled GEMMs: ``D = [D +] A @ B^T`` with FP8 (or FP4) operands.

``A [M, K]`` is e4m3 with one float32 scale per 1x128 slice of a row (per token);
``B [N, K]`` is e4m3 with one scale per 128x128 block (``gran_n=128``, DeepGEMM's
SM90 "1D2D" recipe) or per 1x128 slice of a row (``gran_n=1``, the "1D1D" recipe),
or e2m1 FP4, two codes per int8 (element ``2i`` in the low nibble), with one scale
per 1x32 slice.  Dequantisation happens inside the kernel: each K slice of the
scale's width is multiplied on the tensor cores from the raw codes into a float32
partial product, scaled by ``sfa[row] * sfb[col]`` and added to a float32
accumulator ("promotion"), so the result equals the float64 dequantise-then-matmul
up to float32 accumulation rounding.  FP4 codes are decoded to e4m3 in shared
memory first (every e2m1 value is exactly an e4m3 value).

Layouts ("majors") are compile-time: ``a_major="k"`` reads ``A [M, K]``,
``a_major="mn"`` reads ``A [K, M]`` (DeepGEMM's ``tn``/``tt``: the tensor is the
transpose of the logical operand); likewise ``b_major`` for ``B [N, K]`` / ``[K, N]``.
The A scales are read in DeepGEMM's required layout: logical ``[M, ceil(K/128)]``,
MN-major (``stride = (1, sfa_ld)``, ``sfa_ld >= M``, TMA-aligned when ``sfa_ld`` is
``M`` rounded up to 4), so :func:`get_mn_major_tma_aligned_tensor`'s output goes in
without a copy.

N and K are compile-time (DeepGEMM's ``compiled_dims="nk"``), M is symbolic; ragged
edges rely on the copy semantics (reads past the end give 0, writes are skipped).
With ``accumulate`` the kernel reads ``D`` before writing it (DeepGEMM's ``c``).
"""
# no `from __future__ import annotations`: T.Tensor annotations must see the factory's
# parameters as values when the prim_func is traced
import kernforge.dsl as T

GRAN_K = 128      # K width of an FP8 scale (both operands)
FP4_GRAN_K = 32   # K width of an FP4 scale
FP8 = "float8_e4m3"


def fp4_value(code):
    """The e2m1 value of a 4-bit code (int32 in [0, 16)): bit 3 the sign, bits 2-1 the
    exponent ``e``, bit 0 the mantissa ``m``; ``m/2`` when ``e == 0``, else
    ``(1 + m/2) 2^(e-1) = (2 + m) 2^e / 4`` (exact in float32)."""
    e = (code >> 1) & 3
    m = code & 1
    mag = T.if_then_else(e == 0, T.cast(m, "float32") * 0.5, T.cast((m + 2) << e, "float32") * 0.25)
    return T.if_then_else(code >= 8, -mag, mag)


def ue8m0_value(word, index):
    """The float32 value of UE8M0 byte ``index`` of the int32 ``word`` (DeepGEMM's SM100 scales,
    four per word, byte ``j`` the exponent of scale ``4p + j``): ``2^(e - 127)`` exactly --
    ``e = 0`` is the subnormal ``2^-127`` and ``e = 255`` NaN, as the tensor cores read them.
    Built as the float's bit pattern, so the sm_100a backend can recognise it and hand the byte
    to ``tcgen05.mma ... block_scale`` instead (``backends/cuda/tcgen05.match_ue8m0``)."""
    e = (word >> (index * 8)) & 255
    return T.reinterpret("float32", T.if_then_else(e == 0, 1 << 22, T.if_then_else(e == 255, 0x7FC00000, e << 23)))


def decode_fp4_tile(packed, out, rows: int, width: int):
    """``out[r, c]`` (e4m3, ``width`` codes per row) from ``packed[r, c // 2]`` (int8):
    the low nibble holds the even element, the high nibble the odd one."""
    for r, c in T.Parallel(rows, width):
        byte = T.cast(packed[r, c // 2], "int32")
        out[r, c] = fp4_value((byte >> ((c % 2) * 4)) & 15)


def _operand_shape(major: str, mn, K):
    if major not in ("k", "mn"):
        raise ValueError(f"major must be 'k' or 'mn', got {major!r}")
    return (mn, K) if major == "k" else (K, mn)


def _tile_origin(major: str, mn0, k0):
    return (mn0, k0) if major == "k" else (k0, mn0)


def _check_multicast(multicast: str) -> None:
    if multicast not in ("a", "b"):
        raise ValueError(f"multicast must be 'a' or 'b' (the operand a cluster shares), got {multicast!r}")


def sf_block(bx, block_N: int, gran: int, N: int, cluster: int):
    """The ``gran``-wide B scale block of N tile ``bx``.  Clamped where a cluster along N (A
    multicast) has an N tile count that is not a multiple of its size: the launch (or persistent
    walk) then pads the N tiles to whole clusters, and the padded CTA runs a tile past the end
    whose result is never stored (``kernforge.backends.cuda.cluster``), so its scale read must stay
    in bounds; a real tile's block always is, so elsewhere the index is as before."""
    block = (bx * block_N) // gran
    return T.min(block, -(-N // gran) - 1) if cluster > 1 and -(-N // block_N) % cluster else block


def _persistent(l2_group: int) -> None:
    """``persistent = G > 0`` (a GPU configuration's choice): ``T.persistent`` with L2 groups of
    ``G`` row tiles per N tile, so CUDA launches one CTA per SM (or per tile, when fewer), each
    looping over the output tiles, and the CTAs running together share B tiles and ``G`` A row
    tiles in L2 (``kernforge.backends.cuda.persistent``).  A scheduling request that changes no
    result: the interpreter and host backends run every tile as before."""
    if l2_group:
        T.persistent(l2_group)


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3])
def fp8_gemm(N: int, K: int, a_major: str = "k", b_major: str = "k", gran_n: int = 128,
             accumulate: bool = False, block_M: int = 64, block_N: int = 128, num_stages: int = 2,
             out_dtype: str = "bfloat16", threads: int = 128, sf_format: str = "float32", persistent: int = 0,
             cluster: int = 0, multicast: str = "a", cta_pair: bool = False):
    """FP8 x FP8.  Kernel parameters: ``A`` e4m3 (``[M, K]`` or ``[K, M]``),
    ``SFA float32 [M, ceil(K/128)]`` (MN-major, leading dimension ``sfa_ld``), ``B`` e4m3
    (``[N, K]`` or ``[K, N]``), ``SFB float32 [ceil(N/gran_n), ceil(K/128)]``, ``D [M, N]``.
    With ``gran_n == 128``, ``block_N`` divides 128 so a tile sees one SFB row; ``persistent``:
    :func:`_persistent`.
    ``sf_format="ue8m0"``: both scales are DeepGEMM's SM100 form instead, UE8M0 packed four per
    int32 along K (``SFA int32 [M, ceil(K/512)]`` MN-major, ``SFB int32 [ceil(N/gran_n),
    ceil(K/512)]``), decoded by :func:`ue8m0_value`.  The product is the same; on sm_100a with
    K-major operands and 128-row tiles the backend then folds the promotion into the tensor
    cores (``tcgen05.mma ... kind::mxf8f6f4.block_scale``, the scales copied into tensor
    memory), keeping the sum in tensor memory across the K loop.  ``cluster``, ``multicast``: as
    :func:`dense_gemm`'s (adjacent N blocks share each A tile, or with ``"b"`` adjacent M blocks
    each B tile, by TMA multicast on sm_90a); ``cta_pair``: as :func:`dense_gemm`'s (sm_100a, K-major
    operands, float32 scales: each 128-K block's partial product is one 2-CTA MMA per 32 K)."""
    if gran_n not in (1, GRAN_K):
        raise ValueError(f"gran_n must be 1 or {GRAN_K}, got {gran_n}")
    if sf_format not in ("float32", "ue8m0"):
        raise ValueError(f"sf_format must be 'float32' or 'ue8m0', got {sf_format!r}")
    _check_multicast(multicast)
    ue8m0 = sf_format == "ue8m0"
    if gran_n == GRAN_K and GRAN_K % block_N:
        raise ValueError(f"block_N ({block_N}) must divide the 128-wide B scale block")
    accum = "float32"
    k_blocks = -(-K // GRAN_K)
    M = T.symbolic("M")
    sfa_ld = T.symbolic("sfa_ld")
    sf_cols, sf_dtype = (-(-k_blocks // 4), "int32") if ue8m0 else (k_blocks, accum)
    name = (f"fp8_gemm_{a_major}{b_major}_n{N}_k{K}_g{gran_n}{'_acc' if accumulate else ''}"
            f"_M{block_M}_N{block_N}_s{num_stages}_{out_dtype}_t{threads}{'_ue8m0' if ue8m0 else ''}"
            f"{f'_p{persistent}' if persistent else ''}{f'_c{cluster}' if cluster > 1 else ''}"
            f"{'b' if cluster > 1 and multicast == 'b' else ''}{'_pair' if cta_pair else ''}")
    a_tile = (block_M, GRAN_K) if a_major == "k" else (GRAN_K, block_M)
    b_tile = (block_N, GRAN_K) if b_major == "k" else (GRAN_K, block_N)

    @T.prim_func(name=name)
    def main(A: T.Tensor(_operand_shape(a_major, M, K), FP8),
             SFA: T.StridedTensor((M, sf_cols), (1, sfa_ld), sf_dtype),
             B: T.Tensor(_operand_shape(b_major, N, K), FP8),
             SFB: T.Tensor((-(-N // gran_n), sf_cols), sf_dtype),
             D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            _persistent(persistent)
            A_shared = T.alloc_shared(a_tile, FP8)
            B_shared = T.alloc_shared(b_tile, FP8)
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            T.clear(C)
            for k in T.Pipelined(k_blocks, num_stages=num_stages):
                T.copy(A[_tile_origin(a_major, by * block_M, k * GRAN_K)], A_shared)
                T.copy(B[_tile_origin(b_major, bx * block_N, k * GRAN_K)], B_shared)
                T.gemm(A_shared, B_shared, partial, transpose_A=a_major == "mn",
                       transpose_B=b_major == "k", clear_accum=True)
                for i, j in T.Parallel(block_M, block_N):
                    row = T.min(by * block_M + i, M - 1)
                    # 128-wide B scale blocks: block_N divides 128, so one scale serves the whole tile
                    # (a loop-invariant load; per column, the CPU's vectorised loop gathered it)
                    col = (sf_block(bx, block_N, gran_n, N, cluster if multicast == "a" else 0) if gran_n == GRAN_K
                           else T.min(bx * block_N + j, N - 1))
                    if ue8m0:
                        sa, sb = ue8m0_value(SFA[row, k // 4], k % 4), ue8m0_value(SFB[col, k // 4], k % 4)
                    else:
                        sa, sb = SFA[row, k], SFB[col, k]
                    C[i, j] = C[i, j] + partial[i, j] * sa * sb
            if accumulate:
                for i, j in T.Parallel(block_M, block_N):
                    row = T.min(by * block_M + i, M - 1)
                    col = T.min(bx * block_N + j, N - 1)
                    C[i, j] = C[i, j] + D[row, col]
            T.copy(C, D[by * block_M, bx * block_N])

    return main


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], num_stages=[1, 2, 3])
def fp8_fp4_gemm(N: int, K: int, accumulate: bool = False, block_M: int = 64, block_N: int = 128,
                 num_stages: int = 2, out_dtype: str = "bfloat16", threads: int = 128, persistent: int = 0):
    """FP8 A x FP4 B (both K-major).  Kernel parameters: ``A [M, K]`` e4m3,
    ``SFA float32 [M, ceil(K/128)]`` (MN-major, as :func:`fp8_gemm`), ``B int8 [N, K/2]``
    (two e2m1 codes per byte), ``SFB float32 [N, ceil(K/32)]``, ``D [M, N]``.  The K loop
    steps by 32 (the FP4 scale's width); each step decodes B's codes to e4m3 in shared
    memory, multiplies, and promotes with ``sfa[row, k/128] * sfb[col, k/32]``.  ``persistent``:
    :func:`_persistent`."""
    if K % 2:
        raise ValueError(f"K ({K}) must be even: FP4 packs two codes per byte")
    accum = "float32"
    step = FP4_GRAN_K
    M = T.symbolic("M")
    sfa_ld = T.symbolic("sfa_ld")
    name = (f"fp8_fp4_gemm_n{N}_k{K}{'_acc' if accumulate else ''}_M{block_M}_N{block_N}"
            f"_s{num_stages}_{out_dtype}_t{threads}{f'_p{persistent}' if persistent else ''}")

    @T.prim_func(name=name)
    def main(A: T.Tensor((M, K), FP8), SFA: T.StridedTensor((M, -(-K // GRAN_K)), (1, sfa_ld), accum),
             B: T.Tensor((N, K // 2), "int8"), SFB: T.Tensor((N, -(-K // step)), accum),
             D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            _persistent(persistent)
            A_shared = T.alloc_shared((block_M, step), FP8)
            B_packed = T.alloc_shared((block_N, step // 2), "int8")
            B_shared = T.alloc_shared((block_N, step), FP8)
            partial = T.alloc_fragment((block_M, block_N), accum)
            C = T.alloc_fragment((block_M, block_N), accum)
            T.clear(C)
            for k in T.Pipelined(T.ceildiv(K, step), num_stages=num_stages):
                T.copy(A[by * block_M, k * step], A_shared)
                T.copy(B[bx * block_N, k * (step // 2)], B_packed)
                decode_fp4_tile(B_packed, B_shared, block_N, step)
                T.gemm(A_shared, B_shared, partial, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(block_M, block_N):
                    row = T.min(by * block_M + i, M - 1)
                    col = T.min(bx * block_N + j, N - 1)
                    C[i, j] = C[i, j] + partial[i, j] * SFA[row, k // (GRAN_K // step)] * SFB[col, k]
            if accumulate:
                for i, j in T.Parallel(block_M, block_N):
                    row = T.min(by * block_M + i, M - 1)
                    col = T.min(bx * block_N + j, N - 1)
                    C[i, j] = C[i, j] + D[row, col]
            T.copy(C, D[by * block_M, bx * block_N])

    return main


@T.tunable(block_M=[32, 64, 128], block_N=[32, 64, 128], block_K=[32, 64, 128, 256], num_stages=[1, 2, 3])
def dense_gemm(N: int, K: int, a_major: str = "k", b_major: str = "k", accumulate: bool = False,
               dtype: str = "bfloat16", out_dtype: str = "bfloat16", block_M: int = 64, block_N: int = 64,
               block_K: int = 64, num_stages: int = 2, threads: int = 128, persistent: int = 0,
               cluster: int = 0, multicast: str = "a", cta_pair: bool = False):
    """Unscaled ``D = [D +] A @ B^T`` (DeepGEMM's ``bf16_gemm_*``; ``dtype="float32"`` for
    float32 operands, which DeepGEMM lacks and the float32 reference model needs).  Kernel
    parameters: ``A`` (``[M, K]`` or ``[K, M]``), ``B`` (``[N, K]`` or ``[K, N]``), ``D [M, N]``.
    The float32 accumulator sums the K tiles in order; with ``accumulate`` the old ``D`` is
    added after the whole product, so ``d = c + a @ b^T`` rounds as ``(a @ b^T) + c``.
    ``persistent``: :func:`_persistent`.
    ``cluster`` (> 1): a scheduling request that changes no result -- on sm_90a the CTAs of adjacent
    N blocks form clusters of that size and share each A tile by TMA multicast
    (``kernforge.backends.cuda.cluster`` reads the factory's ``attrs["cluster"]``; other targets
    ignore it); ``multicast="b"``: adjacent M blocks instead, sharing each B tile (DeepGEMM picks
    one of A/B multicast per shape: ``config.choose_dense``).
    ``cta_pair``: another scheduling request -- on sm_100a the CTAs of adjacent M blocks run one
    2-CTA ``tcgen05.mma.cta_group::2`` (``M = 256`` over the pair, each CTA loading half of the B
    tile; ``kernforge.backends.cuda.tcgen05_pair`` says where it applies); other targets ignore it."""
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    _check_multicast(multicast)
    accum = "float32"
    M = T.symbolic("M")
    name = (f"dense_gemm_{a_major}{b_major}_n{N}_k{K}{'_acc' if accumulate else ''}_M{block_M}_N{block_N}"
            f"_K{block_K}_s{num_stages}_{dtype}_{out_dtype}_t{threads}"
            f"{f'_p{persistent}' if persistent else ''}{f'_c{cluster}' if cluster > 1 else ''}"
            f"{'b' if cluster > 1 and multicast == 'b' else ''}{'_pair' if cta_pair else ''}")
    a_tile = (block_M, block_K) if a_major == "k" else (block_K, block_M)
    b_tile = (block_N, block_K) if b_major == "k" else (block_K, block_N)

    @T.prim_func(name=name)
    def main(A: T.Tensor(_operand_shape(a_major, M, K), dtype),
             B: T.Tensor(_operand_shape(b_major, N, K), dtype),
             D: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            _persistent(persistent)
            A_shared = T.alloc_shared(a_tile, dtype)
            B_shared = T.alloc_shared(b_tile, dtype)
            C = T.alloc_fragment((block_M, block_N), accum)
            T.clear(C)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[_tile_origin(a_major, by * block_M, k * block_K)], A_shared)
                T.copy(B[_tile_origin(b_major, bx * block_N, k * block_K)], B_shared)
                T.gemm(A_shared, B_shared, C, transpose_A=a_major == "mn", transpose_B=b_major == "k")
            if accumulate:
                for i, j in T.Parallel(block_M, block_N):
                    row = T.min(by * block_M + i, M - 1)
                    col = T.min(bx * block_N + j, N - 1)
                    C[i, j] = C[i, j] + D[row, col]
            T.copy(C, D[by * block_M, bx * block_N])

    return main
