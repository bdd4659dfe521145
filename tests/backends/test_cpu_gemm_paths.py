"""The CPU tile GEMM on every instruction-set path this machine's compiler targets,
against torch in float64.

Each path (``kernforge.backends.cpu.isa.PATHS``) is its own source and binary; the
ones the compiler does not target are skipped with the reason.  Shapes are drawn by
hypothesis: odd and prime sizes, K not a multiple of the tile, partial edge tiles,
every transpose and every operand dtype the DSL allows; outputs start poisoned (NaN).
The direct micro-kernel (operands already in the compute type, B contiguous along N)
and the packed one must give the same bits: both accumulate k in order and add to C
once.
"""
from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge
import kernforge.dsl as T
from kernforge.backends.cpu import isa
from kernforge.codegen.renderer import Target
from kernforge.backends.cpu.renderer import CpuRenderer

PATHS = [pytest.param(p, marks=pytest.mark.skipif(p not in isa.compiler_paths(),
                                                  reason=f"the C++ compiler does not target {p} on this machine"))
         for p in isa.PATHS]

# operand dtype -> (accumulator, relative tolerance of the float32 accumulation against float64)
DTYPES = {"float32": ("float32", 1e-5), "bfloat16": ("float32", 1e-5), "float16": ("float32", 1e-5),
          "float8_e4m3": ("float32", 1e-5), "int8": ("int32", 0), "float64": ("float64", 1e-12)}


@functools.lru_cache(maxsize=None)
def gemm_kernel(M, N, K, bm, bn, bk, dtype, accum, trans_a, trans_b):
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)

    @T.prim_func
    def gemm(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), accum)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bk, bm) if trans_a else (bm, bk), dtype)
            B_s = T.alloc_shared((bn, bk) if trans_b else (bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), accum)
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[k * bk, by * bm] if trans_a else A[by * bm, k * bk], A_s)
                T.copy(B[bx * bn, k * bk] if trans_b else B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l, transpose_A=trans_a, transpose_B=trans_b)
            T.copy(C_l, C[by * bm, bx * bn])
    return gemm


def operand(shape, dtype, g):
    if dtype == "int8":
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if dtype == "float8_e4m3":
        return x.float().to(torch.float8_e4m3fn)
    return x.to(getattr(torch, dtype))


def check(path, M, N, K, bm, bn, bk, dtype, trans_a, trans_b, seed):
    accum, rtol = DTYPES[dtype]
    g = torch.Generator().manual_seed(seed)
    a = operand((K, M) if trans_a else (M, K), dtype, g)
    b = operand((N, K) if trans_b else (K, N), dtype, g)
    c = torch.full((M, N), -7, dtype=getattr(torch, accum)) if accum == "int32" else \
        torch.full((M, N), float("nan"), dtype=getattr(torch, accum))
    kern = kernforge.compile(gemm_kernel(M, N, K, bm, bn, bk, dtype, accum, trans_a, trans_b),
                             backend="cpu", arch=path)
    kern(a, b, c)
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    a64, b64 = (a64.T if trans_a else a64), (b64.T if trans_b else b64)
    want = a64 @ b64
    if accum == "int32":
        assert torch.equal(c.to(torch.int64), want.to(torch.int64))
        return
    got = c.to(torch.float64)
    bound = rtol * (a64.abs() @ b64.abs()) * K + 1e-30
    err = (got - want).abs()
    assert not torch.isnan(got).any(), "an output element was never written"
    assert (err <= bound).all(), f"max error {float(err.max())} vs bound {float(bound.max())} ({path}, {dtype})"


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(1, 29), N=st.sampled_from([1, 7, 8, 13, 16, 24, 31, 40]), K=st.integers(1, 37),
       tiles=st.sampled_from([(8, 8, 8), (6, 16, 16), (16, 24, 8), (13, 16, 7), (32, 32, 32)]),
       dtype=st.sampled_from(sorted(DTYPES)), trans=st.sampled_from([(False, False), (False, True),
                                                                      (True, False), (True, True)]),
       seed=st.integers(0, 2**16))
def test_tile_gemm_matches_float64_on_every_path(path, M, N, K, tiles, dtype, trans, seed):
    check(path, M, N, K, *tiles, dtype, *trans, seed)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("M,N,K,tiles,dtype,trans_b", [
    (1, 4096, 64, (1, 128, 64), "float32", False),     # a decode row: the widest register block
    (8, 256, 96, (8, 128, 32), "bfloat16", True),      # decode rows against an nt weight
    (61, 67, 71, (24, 32, 16), "bfloat16", False),     # primes: partial tiles on every edge
    (96, 128, 256, (48, 64, 128), "float32", True),
])
def test_tile_gemm_decode_and_prime_shapes(path, M, N, K, tiles, dtype, trans_b):
    check(path, M, N, K, *tiles, dtype, False, trans_b, seed=M + N + K)


def _source(path, dtype, trans_b):
    kern = gemm_kernel(16, 32, 16, 16, 32, 16, dtype, "float32", False, trans_b)
    return CpuRenderer().render(kern.ir, Target("cpu", path)).source


@pytest.mark.parametrize("path", isa.PATHS)
def test_every_path_renders_its_own_source(path):
    """Paths differ in text (``KF_ISA``), so each is its own cache entry and binary."""
    sources = {p: _source(p, "float32", True) for p in isa.PATHS}
    assert f"#define KF_ISA {isa.level(path)}" in sources[path]
    assert len(set(sources.values())) == len(isa.PATHS)


def test_a_path_the_compiler_does_not_target_is_a_typed_error(monkeypatch):
    missing = [p for p in isa.PATHS if p not in isa.compiler_paths()]
    monkeypatch.setenv(isa.ENV, "avx9000")
    with pytest.raises(isa.IsaError, match="unknown CPU instruction-set path 'avx9000'"):
        kernforge.compile(gemm_kernel(8, 8, 8, 8, 8, 8, "float32", "float32", False, False), backend="cpu")
    if not missing:
        pytest.skip("this machine's compiler targets every path")
    kern = gemm_kernel(8, 8, 8, 8, 8, 8, "float32", "float32", False, False)
    # rendering any path is fine (kernforge emit --arch); building one the compiler lacks is not
    from kernforge import backends
    assert f"#define KF_ISA {isa.level(missing[0])}" in backends.get("cpu").source(kern.ir, missing[0])
    monkeypatch.delenv(isa.ENV)
    with pytest.raises(isa.IsaError, match=f"arch='{missing[0]}'.*does not target it"):
        kernforge.compile(kern, backend="cpu", arch=missing[0])
    monkeypatch.setenv(isa.ENV, missing[0])
    with pytest.raises(isa.IsaError, match=f"KERNFORGE_CPU_ISA='{missing[0]}'.*does not target it"):
        kernforge.compile(kern, backend="cpu")


def test_the_environment_switch_forces_a_lower_path(monkeypatch):
    monkeypatch.setenv(isa.ENV, "generic")
    kern = kernforge.compile(gemm_kernel(8, 16, 8, 8, 16, 8, "float32", "float32", False, False), backend="cpu")
    assert "#define KF_ISA 0" in kern.get_kernel_source()


def test_supported_paths_follow_the_resolved_compiler_flags():
    assert isa.supported_paths([]) == ("generic",)
    assert isa.supported_paths(["-mavx2", "-mfma", "-mno-avx512f"]) == ("generic", "avx2")
    assert isa.supported_paths(["-mavx2", "-mfma", "-mavx512f", "-mno-avx512bf16"]) == ("generic", "avx2", "avx512")
    assert isa.supported_paths(["-mavx2", "-mfma", "-mavx512f", "-mavx512bf16"])[-1] == "avx512bf16"
    assert isa.supported_paths(["-mavx2"]) == ("generic",)  # AVX2 without FMA is not the AVX2 path


@pytest.mark.parametrize("path", [p for p in isa.PATHS if p != "generic"])
def test_every_path_compiles_even_where_it_cannot_run(path, tmp_path):
    """A path this machine cannot run is still compiled (to an object, never loaded) for a CPU
    that has it, so its micro-kernels are at least valid code for g++ on every machine."""
    import shutil
    import subprocess

    from kernforge.backends.cpu.backend import CpuBackend

    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not on PATH")
    march = {"avx2": "haswell", "avx512": "skylake-avx512", "avx512bf16": "sapphirerapids",
             "amx": "sapphirerapids"}[path]
    for dtype, trans_b in (("float32", True), ("bfloat16", False), ("bfloat16", True), ("int8", True)):
        accum = "int32" if dtype == "int8" else "float32"
        src = CpuRenderer().render(gemm_kernel(13, 48, 40, 13, 48, 16, dtype, accum, False, trans_b).ir,
                                   Target("cpu", path)).source
        (tmp_path / "k.cpp").write_text(src)
        run = subprocess.run([cxx, "-std=c++17", "-O1", "-fopenmp", f"-march={march}", "-c", str(tmp_path / "k.cpp"),
                              "-o", str(tmp_path / "k.o"), "-I", CpuBackend.include_dir],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]


@functools.lru_cache(maxsize=None)
def attention_kernel(M, N, D):
    """MLA's shape: one K tile read transposed by Q K^T and straight by P K, P rounded to bf16
    by a copy. The layout pass can orient K for one GEMM only, so on a float path Q K^T packs K
    alone (Q is read in place) and P K widens P once and reads K in place."""
    @T.prim_func
    def attn(Q: T.Tensor((M, D), "bfloat16"), K: T.Tensor((N, D), "bfloat16"), O: T.Tensor((M, D), "float32")):
        with T.Kernel(1, threads=128) as bx:
            Q_s = T.alloc_shared((M, D), "bfloat16")
            K_s = T.alloc_shared((N, D), "bfloat16")
            S = T.alloc_fragment((M, N), "float32")
            P = T.alloc_shared((M, N), "bfloat16")
            O_l = T.alloc_fragment((M, D), "float32")
            T.copy(Q[0, 0], Q_s)
            T.copy(K[0, 0], K_s)
            T.gemm(Q_s, K_s, S, transpose_B=True, clear_accum=True)
            T.copy(S, P)
            T.gemm(P, K_s, O_l, clear_accum=True)
            T.copy(O_l, O[0, 0])
    return attn


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("M,N,D", [(16, 24, 40), (7, 13, 48), (64, 64, 128)])
def test_gemms_sharing_a_tile_in_two_orientations(path, M, N, D):
    g = torch.Generator().manual_seed(M * N)
    q = torch.randn(M, D, generator=g).bfloat16()
    k = torch.randn(N, D, generator=g).bfloat16()
    o = torch.full((M, D), float("nan"))
    kernforge.compile(attention_kernel(M, N, D), backend="cpu", arch=path)(q, k, o)
    s = q.double() @ k.double().T
    p = s.float().bfloat16().double()  # the kernel rounds S (float32 sums) to bf16
    want = p @ k.double()
    # S's float32 sums may round to a neighbouring bf16: one bf16 ulp of |S| per term of P K
    bound = (2 ** -8 * s.abs()) @ k.double().abs() + 1e-5 * (p.abs() @ k.double().abs()) * N
    assert ((o.double() - want).abs() <= bound + 1e-30).all()
    src = CpuRenderer().render(attention_kernel(M, N, D).ir, Target("cpu", path)).source
    assert ("float* __restrict__ K_s" in src) == (path not in isa.NATIVE_BF16)


def test_without_a_compiler_sources_still_render_for_the_generic_path(monkeypatch):
    from kernforge import runtime

    class Missing:
        def compiler(self, backend):
            raise runtime.ToolchainNotFoundError("no C++ compiler (test)")

    monkeypatch.setattr(runtime, "get_runtime", lambda: Missing())
    monkeypatch.delenv(isa.ENV, raising=False)
    isa.compiler_paths.cache_clear()
    try:
        assert isa.compiler_paths() == ("generic",)
        src = CpuRenderer().render(gemm_kernel(8, 8, 8, 8, 8, 8, "float32", "float32", False, False).ir,
                                   Target("cpu")).source
        assert "#define KF_ISA 0" in src
    finally:
        isa.compiler_paths.cache_clear()


@pytest.mark.skipif("avx512bf16" not in isa.compiler_paths(),
                    reason="the C++ compiler does not target avx512bf16 on this machine")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(1, 40), tiles=st.sampled_from([(1, 128, 8), (8, 16, 7), (9, 48, 16), (16, 32, 5),
                                                     (24, 80, 12), (3, 64, 33), (13, 112, 2)]),
       K=st.integers(1, 70), n_tiles=st.integers(1, 2), trans=st.sampled_from([(False, False), (False, True),
                                                                                (True, False), (True, True)]),
       seed=st.integers(0, 2**16))
def test_bf16_tiles_read_in_place_as_k_pairs(M, tiles, K, n_tiles, trans, seed):
    """avx512bf16's bf16 x bf16 GEMM on tiles that are N-contiguous in whole 16-column vectors
    (the layout pass orients a transposed B so) reads them in place: B's rows k and k+1 are
    interleaved into (k, k+1) pairs in registers and A's pair is one 32-bit word (two loads when
    A is transposed). Odd K tiles (a last k without a partner), a lone 16-column vector, odd
    panel widths and partial row blocks are each their own code."""
    bm, bn, bk = tiles
    check("avx512bf16", M, bn * n_tiles, K, bm, bn, bk, "bfloat16", *trans, seed)


@pytest.mark.skipif("avx512bf16" not in isa.compiler_paths(),
                    reason="the AMX emulation builds on the avx512bf16 kernels this compiler must target")
@pytest.mark.parametrize("M,N,K,tiles,trans", [
    (13, 48, 40, (13, 48, 16), (False, False)),   # partial 16-row / 16-column tiles, K steps of 16 < 32
    (40, 33, 70, (24, 33, 35), (False, True)),    # odd K tail, nt B, two row tiles
    (17, 64, 64, (17, 32, 64), (True, True)),     # transposed A
])
def test_amx_path_runs_emulated_against_float64(M, N, K, tiles, trans, tmp_path):
    """This CPU has no AMX, so the amx path cannot run here; compiled with KF_AMX_EMULATE, its
    three tile instructions become scalar code with their semantics, and everything around them
    (packing into zero-padded 16 x 32 / (k, k+1) tiles, edges, the store into C) runs and is
    checked against float64. What remains untested is the instructions themselves, the tile
    configuration and the arch_prctl permission request (test_every_path_compiles_... builds
    them for sapphirerapids)."""
    import ctypes
    import shutil
    import subprocess

    from kernforge.backends.cpu.backend import CpuBackend

    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not on PATH")
    trans_a, trans_b = trans
    kern = gemm_kernel(M, N, K, *tiles, "bfloat16", "float32", trans_a, trans_b).ir
    program = CpuRenderer().render(kern, Target("cpu", "amx"))
    assert "#define KF_ISA 4" in program.source
    (tmp_path / "k.cpp").write_text(program.source)
    run = subprocess.run([cxx, "-std=c++17", "-O2", "-fopenmp", "-march=native", "-ffp-contract=off", "-DKF_AMX_EMULATE",
                          "-shared", "-fPIC", str(tmp_path / "k.cpp"), "-o", str(tmp_path / "k.so"),
                          "-I", CpuBackend.include_dir], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    g = torch.Generator().manual_seed(M * N + K)
    a = operand((K, M) if trans_a else (M, K), "bfloat16", g)
    b = operand((N, K) if trans_b else (K, N), "bfloat16", g)
    c = torch.full((M, N), float("nan"))
    fn = getattr(ctypes.CDLL(str(tmp_path / "k.so")), program.entry)
    fn.restype = ctypes.c_int
    args = (ctypes.c_void_p * 3)(a.data_ptr(), b.data_ptr(), c.data_ptr())
    dims = (ctypes.c_int64 * 1)(0)
    assert fn(args, dims) == 0
    a64, b64 = a.double(), b.double()
    a64, b64 = (a64.T if trans_a else a64), (b64.T if trans_b else b64)
    want = a64 @ b64
    assert not torch.isnan(c).any(), "an output element was never written"
    assert ((c.double() - want).abs() <= 1e-5 * (a64.abs() @ b64.abs()) * K + 1e-30).all()


@pytest.mark.parametrize("path", isa.PATHS)
def test_fp8_tiles_are_stored_as_bf16_where_the_path_multiplies_bf16(path):
    """The layout pass stores an fp8 operand tile as bf16 on the paths whose GEMM multiplies bf16
    (converted once, by the copy, then the bf16 kernels), as float32 elsewhere; an nt B tile stays
    K-major where it becomes bf16 (the bf16 nt kernel's layout), N-major where it is widened."""
    src = _source(path, "float8_e4m3", True)
    if path in isa.NATIVE_BF16:
        assert "kf_bf16* __restrict__ A_s" in src and "kf_bf16* __restrict__ B_s" in src
        assert "kf_fp8_to_bf16(" in src
        assert "kf::gemm<float, 16, 32, 16, 16, 1, 1, 16," in src  # B (k, n) at n * 16 + k
    else:
        assert "float* __restrict__ A_s" in src and "float* __restrict__ B_s" in src
        assert "kf_fp8_to_bf16(" not in src
        assert "kf::gemm<float, 16, 32, 16, 16, 1, 32, 1," in src  # B (k, n) at k * 32 + n


@pytest.mark.parametrize("path", [p for p in PATHS if p.values[0] in ("generic", "avx512bf16")])
def test_fp8_to_bf16_is_exact_for_every_code(path):
    """``kf_fp8_to_bf16`` (the vectorised conversion of those copies) against torch for all 256 e4m3
    codes, bit for bit (NaN: a NaN of the code's sign), subnormals and the largest values included."""
    @T.prim_func
    def widen(X: T.Tensor((256,), "float8_e4m3"), Y: T.Tensor((256,), "bfloat16")):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(256):
                Y[i] = T.cast(X[i], "bfloat16")

    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    y = torch.full((256,), float("nan"), dtype=torch.bfloat16)
    kernforge.compile(widen, backend="cpu", arch=path)(x, y)
    want = x.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan].view(torch.int16), want[~nan].view(torch.int16))
    # kernforge keeps a NaN's sign (the backend's narrowing rule; torch drops it)
    assert torch.equal(torch.signbit(y[nan]), torch.arange(256)[nan] >= 128)


def _branchy_gemm(read_tile_elsewhere: bool):
    """C = A @ B^T with the GEMM chosen per block by a runtime test (a row ladder in miniature);
    ``read_tile_elsewhere``: a branch also loads an element of B's tile."""
    M = T.symbolic("M")

    @T.prim_func
    def branchy(A: T.Tensor((M, 32), "bfloat16"), B: T.Tensor((32, 32), "bfloat16"),
                C: T.Tensor((M, 32), "float32")):
        with T.Kernel(1, T.ceildiv(M, 16), threads=128) as (bx, by):
            A_s = T.alloc_shared((16, 32), "bfloat16")
            B_s = T.alloc_shared((32, 32), "bfloat16")
            C_f = T.alloc_fragment((16, 32), "float32")
            T.clear(C_f)
            T.copy(A[by * 16, 0], A_s)
            T.copy(B[0, 0], B_s)
            if by * 16 + 8 >= M:
                T.gemm(A_s[0:8, :], B_s, C_f[0:8, :], transpose_B=True)
            else:
                T.gemm(A_s, B_s, C_f, transpose_B=True)
                if read_tile_elsewhere:
                    C_f[0, 0] = C_f[0, 0] + B_s[0, 0]
            T.copy(C_f, C[by * 16, 0])
    return branchy


@pytest.mark.parametrize("elsewhere", [False, True])
def test_direct_operand_read_by_gemms_inside_branches(elsewhere):
    """The layout pass lets GEMMs inside an If's branches read a tile's global source in place (the
    grouped GEMMs' row ladder), but only when nothing else in them touches the tile."""
    src = CpuRenderer().render(_branchy_gemm(elsewhere).ir, Target("cpu", "avx512bf16")).source
    gemms = [line for line in src.splitlines() if "kf::gemm<" in line]
    assert len(gemms) == 2
    assert all(("B_s" in g) == elsewhere for g in gemms), gemms
    assert ("B_s[" in src) == elsewhere


@pytest.mark.parametrize("path", PATHS)
def test_gemms_inside_branches_match_float64(path):
    g = torch.Generator().manual_seed(5)
    for m in (5, 16, 29):  # a short last block (the 8-row GEMM), full blocks (the 16-row one)
        a = torch.randn(m, 32, generator=g).bfloat16()
        b = torch.randn(32, 32, generator=g).bfloat16()
        c = torch.full((m, 32), float("nan"))
        kernforge.compile(_branchy_gemm(False), backend="cpu", arch=path)(a, b, c)
        want = a.double() @ b.double().T
        rows = torch.arange(m)
        # rows a block's 8-row GEMM leaves out stay as T.clear left them (0)
        computed = ~((rows // 16 * 16 + 8 >= m) & (rows % 16 >= 8))
        assert torch.allclose(c[computed].double(), want[computed], rtol=1e-5, atol=1e-4)
        assert torch.all(c[~computed] == 0)


def _paired_gemm(unpaired_read: bool):
    """Two 8-row rungs copy their part of an A tile and multiply it (guarded pairs, M symbolic);
    with ``unpaired_read`` a third GEMM reads the first rung's rows again without a copy of its own,
    so it depends on that copy and no pair of the tile may skip it."""
    M = T.symbolic("M")

    @T.prim_func
    def paired(A: T.Tensor((M, 32), "float32"), B: T.Tensor((32, 16), "float32"), C: T.Tensor((M, 16), "float32")):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            a_s = T.alloc_shared((16, 32), "float32")
            b_s = T.alloc_shared((32, 16), "float32")
            c = T.alloc_fragment((16, 16), "float32")
            T.copy(B, b_s)
            T.clear(c)
            T.copy(A[bx * 16, 0], a_s[0:8, :])
            T.gemm(a_s[0:8, :], b_s, c[0:8, :])
            if unpaired_read:
                T.gemm(a_s[0:8, :], b_s, c[8:16, :])
            else:
                T.copy(A[bx * 16 + 8, 0], a_s[8:16, :])
                T.gemm(a_s[8:16, :], b_s, c[8:16, :])
            T.copy(c, C[bx * 16, 0])
    return paired


@pytest.mark.parametrize("unpaired_read", [False, True])
def test_guarded_pairs_read_in_place_only_when_every_read_is_paired(unpaired_read):
    """Each rung's GEMM reads A in place where its rows lie inside A (else the copy runs), unless
    another GEMM reads the tile without its own copy: then every copy stays.  The numbers match
    float64 for M cutting the last block anywhere, outputs poisoned."""
    kern = _paired_gemm(unpaired_read)
    src = CpuRenderer().render(kern.ir, Target("cpu", "avx512")).source
    in_place = [line for line in src.splitlines() if "kf::gemm<" in line and "(A + " in line]
    assert len(in_place) == (0 if unpaired_read else 2)
    g = torch.Generator().manual_seed(9)
    for m in (3, 8, 13, 16, 40):
        a, b = torch.randn(m, 32, generator=g), torch.randn(32, 16, generator=g)
        c = torch.full((m, 16), float("nan"))
        kernforge.compile(kern, backend="cpu")(a, b, c)
        want = a.double() @ b.double()
        if unpaired_read:  # rows 8-15 of a block repeat rows 0-7
            want = torch.cat([torch.cat([blk[:8], blk[:8]])[:blk.shape[0]] for blk in want.split(16)])
        assert torch.allclose(c.double(), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- bf16 B packed from its source
BF16_NATIVE = pytest.mark.skipif("avx512bf16" not in isa.compiler_paths(),
                                 reason="the C++ compiler does not target avx512bf16 on this machine")


@pytest.mark.parametrize("path", isa.PATHS)
def test_many_row_bf16_gemm_reads_b_from_its_source_only_where_it_packs_b(path):
    """On the paths that multiply bf16 natively the layout pass drops an N-major bf16 B tile's copy
    for any number of rows: ``kf::gemm_bf16_nn`` packs B into (k, k+1) pairs from the global rows
    itself (the copy was a second pass over the same bytes).  Elsewhere the copy stays (it widens
    B to float32 once), and a tile that two GEMMs read keeps it on every path."""
    src = CpuRenderer().render(gemm_kernel(64, 256, 128, 64, 128, 64, "bfloat16", "float32", False, False).ir,
                               Target("cpu", path)).source
    gemm = next(line for line in src.splitlines() if "kf::gemm<" in line)
    assert ("(B + " in gemm) == (path in isa.NATIVE_BF16), gemm
    assert ("B_s[" in src) == (path not in isa.NATIVE_BF16)
    shared = CpuRenderer().render(attention_kernel(64, 64, 128).ir, Target("cpu", path)).source
    assert "K_s[" in shared


@BF16_NATIVE
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(17, 60), tiles=st.sampled_from([(24, 40, 13), (17, 16, 8), (20, 96, 7), (32, 33, 10),
                                                      (18, 128, 31), (40, 80, 2)]),
       n_tiles=st.integers(1, 3), k_tiles=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_bf16_b_packed_from_its_source_matches_float64(M, tiles, n_tiles, k_tiles, seed):
    """``kf::gemm_bf16_nn`` (more than 16 rows, B read in place from a wider matrix, or N not whole
    16-column vectors): 32-column groups interleaved by VPERMT2W, a column tail word by word, columns
    past N zero, odd K (a last k without a partner), panels of 64 columns and a narrower last one,
    partial 6-row blocks; global N and K are whole tiles, so B's copies are all in bounds and
    dropped, while a ragged M keeps A's."""
    bm, bn, bk = tiles
    check("avx512bf16", M, bn * n_tiles, bk * k_tiles, bm, bn, bk, "bfloat16", False, False, seed)


@BF16_NATIVE
def test_bf16_b_packed_gives_the_bits_of_b_read_in_place():
    """Packed (24-row tile: gemm_bf16_nn) and in place (8-row tile: gemm_bf16_direct), a row sums the
    same (k, k+1) pair products in the same order and adds them to C once: equal bits, so a row's
    result does not depend on how many rows its tile has (the engine's deterministic mode)."""
    g = torch.Generator().manual_seed(11)
    M, N, K = 24, 96, 70
    a, b = torch.randn(M, K, generator=g).bfloat16(), torch.randn(K, N, generator=g).bfloat16()
    out = {}
    for bm in (8, 24):
        out[bm] = torch.full((M, N), float("nan"))
        kern = gemm_kernel(M, N, K, bm, 32, 35, "bfloat16", "float32", False, False)
        kernforge.compile(kern, backend="cpu", arch="avx512bf16")(a, b, out[bm])
    assert torch.equal(out[8], out[24])
    want = a.double() @ b.double()
    assert (out[24].double() - want).abs().max() <= 1e-5 * (a.double().abs() @ b.double().abs()).max() * K
