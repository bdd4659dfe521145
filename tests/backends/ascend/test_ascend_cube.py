"""T.gemm on the cube path of ascend-emu: MIX kernels (one AIC + two AIV per group, the three
running as concurrent threads with mode-2 cross-core flags), the tiles handed over through the
GM workspace, GM -> L1 Nz -> L0A Zz / L0B Zn -> Mmad -> Fixpipe with the real fractal layouts.
Results must match float64 references ("verified on the Ascend C CPU shim"); a wrong LoadData
layout in the device library must give wrong numbers, a missing Mmad -> Fixpipe wait and an AIV
that never releases its AIC must stop the launch under their rules; tiles that do not fit
L1/L0 are typed errors naming the buffer."""
from __future__ import annotations

import shutil

import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge import backends, cli
from kernforge.backends.ascend.renderer import AscendCapacityError, AscendRenderError
from kernforge.backends.ascend_emu import backend as emu
from kernforge.kernels.check import get_problem, run_spec
from kernforge.kernels.registry import get

GROUPS = 3  # grid blocks: 2 MIX groups, the second with an idle AIV (it only answers the AIC's rounds)


def two_gemms(dtype: str, ta: bool, tb: bool, m: int, n: int, k: int):
    """D[block] = A0 @ B0 (clear) + A1 @ B1 (accumulate), each operand transposed as asked."""
    a_tile = (k, m) if ta else (m, k)
    b_tile = (n, k) if tb else (k, n)

    @T.prim_func
    def mm(A: T.Tensor((GROUPS * 2 * a_tile[0], a_tile[1]), dtype),
           B: T.Tensor((GROUPS * 2 * b_tile[0], b_tile[1]), dtype),
           D: T.Tensor((GROUPS * m, n), "float32")):
        with T.Kernel(GROUPS, threads=32) as bx:
            a = T.alloc_shared(a_tile, dtype)
            b = T.alloc_shared(b_tile, dtype)
            c = T.alloc_fragment((m, n), "float32")
            T.copy(A[bx * 2 * a_tile[0], 0], a)
            T.copy(B[bx * 2 * b_tile[0], 0], b)
            T.gemm(a, b, c, transpose_A=ta, transpose_B=tb, clear_accum=True)
            T.copy(A[(bx * 2 + 1) * a_tile[0], 0], a)
            T.copy(B[(bx * 2 + 1) * b_tile[0], 0], b)
            T.gemm(a, b, c, transpose_A=ta, transpose_B=tb)
            T.copy(c, D[bx * m, 0])

    return mm


def _inputs(dtype: str, ta: bool, tb: bool, m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tdt = getattr(torch, dtype)
    a = torch.randn(GROUPS * 2, *((k, m) if ta else (m, k)), generator=g).to(tdt)
    b = torch.randn(GROUPS * 2, *((n, k) if tb else (k, n)), generator=g).to(tdt)
    return a, b


def _reference(a, b, ta: bool, tb: bool) -> torch.Tensor:
    a64, b64 = a.double(), b.double()
    a64 = a64.transpose(1, 2) if ta else a64
    b64 = b64.transpose(1, 2) if tb else b64
    prod = a64 @ b64  # [GROUPS * 2, m, n]
    return (prod[0::2] + prod[1::2]).reshape(-1, prod.shape[-1])


def _launch(launcher, a, b, m: int, n: int) -> torch.Tensor:
    d = torch.full((GROUPS * m, n), float("nan"))
    launcher([a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), d], [], [GROUPS])
    return d


def _build(kernel, arch: str = "dav-c220", mutate=None, include_dirs=emu.INCLUDE_DIRS):
    backend = backends.get("ascend-emu")
    program = backend.render(kernel, backend.target(arch))
    source = program.source if mutate is None else mutate(program.source)
    module = emu.ShimModule(f"ascend_emu_cube_{kernel.artifact_name}_{arch}_{abs(hash(source))}", source,
                            program.npu_arch, include_dirs)
    return emu.EmuLauncher(kernel, module, program)


# (dtype, transpose_A, transpose_B, M, N, K): M and N off the fractal size pad on chip (N = 24:
# the product's rows are whole 32-byte blocks, vector add; N = 4: they are not, scalar add); the
# transposed 16-bit operands take LoadData's transpose, float32 the K-major path
CASES = [("bfloat16", True, False, 8, 32, 48), ("float16", False, False, 20, 24, 32),
         ("float32", False, True, 16, 4, 32)]


@pytest.mark.parametrize("dtype,ta,tb,m,n,k", CASES, ids=["bf16_tn_m8", "f16_nn_m20_n24", "f32_nt_n4"])
def test_gemms_match_float64(shim_cxx, dtype, ta, tb, m, n, k):
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k)
    d = _launch(_build(kernel), a, b, m, n)
    want = _reference(a, b, ta, tb)
    # fp32 accumulation of exact products: |err| <= K * 2^-23 * sum |a b| (two gemms: 2K)
    bound = 2 * k * 2.0 ** -23 * _reference(a.abs(), b.abs(), ta, tb) + 1e-30
    assert not torch.isnan(d).any()
    assert ((d.double() - want).abs() <= bound).all()


def test_the_950_arch_runs_the_same_protocol(shim_cxx):
    dtype, ta, tb, m, n, k = CASES[0]
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k, seed=1)
    d = _launch(_build(kernel, "dav-3510"), a, b, m, n)
    torch.testing.assert_close(d.double(), _reference(a, b, ta, tb), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- planted bugs


def _mutated_library(tmp_path, old: str, new: str):
    lib = tmp_path / "include"
    shutil.copytree(emu.INCLUDE_DIRS[0], lib)
    cube = lib / "kf" / "cube.h"
    text = cube.read_text()
    assert text.count(old) == 1, old
    cube.write_text(text.replace(old, new))
    return (str(lib), emu.SHIM_INCLUDE_DIR)


def test_a_wrong_loaddata_layout_gives_wrong_numbers(shim_cxx, tmp_path):
    # plant: B (K x N) is loaded into L0B without transposing its Nz fractals into Zn
    dtype, ta, tb, m, n, k = CASES[0]
    dirs = _mutated_library(tmp_path, "AscendC::LoadData2DParams(0, NP / 16, K / 16, 0, 0, true, 0)",
                            "AscendC::LoadData2DParams(0, NP / 16, K / 16, 0, 0, false, 0)")
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k)
    d = _launch(_build(kernel, mutate=lambda s: s.replace("Generated by kernforge", "Generated by kernforge (Zn)"),
                       include_dirs=dirs), a, b, m, n)
    assert not torch.allclose(d.double(), _reference(a, b, ta, tb), rtol=1e-3, atol=1e-3)


def test_a_missing_wait_between_mmad_and_fixpipe_is_caught(shim_cxx, tmp_path):
    dirs = _mutated_library(tmp_path, "  sync<AscendC::HardEvent::M_FIX>();\n", "")
    dtype, ta, tb, m, n, k = CASES[2]
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k)
    with pytest.raises(emu.AscendEmuError) as e:
        _launch(_build(kernel, mutate=lambda s: s.replace("Generated by kernforge", "Generated by kernforge (FIX)"),
                       include_dirs=dirs), a, b, m, n)
    assert e.value.rule == "missing SetFlag/WaitFlag" and "pipe FIX reads L0C" in str(e.value)


def test_an_aiv_that_never_releases_its_aic_is_a_deadlock(shim_cxx):
    dtype, ta, tb, m, n, k = CASES[2]
    kernel = two_gemms(dtype, ta, tb, m, n, k).ir
    a, b = _inputs(dtype, ta, tb, m, n, k)
    with pytest.raises(emu.AscendEmuError) as e:
        _launch(_build(kernel, mutate=lambda s: s.replace("  kf::cube_release(kf_group, kf_slot);", "")), a, b, m, n)
    assert e.value.rule == "cross-core deadlock"


# ---------------------------------------------------------------- render-time checks


def _one_gemm(dtype: str, m: int, n: int, k: int, tb: bool = True):
    @T.prim_func
    def mm(A: T.Tensor((m, k), dtype), B: T.Tensor((n, k) if tb else (k, n), dtype), D: T.Tensor((m, n), "float32")):
        with T.Kernel(1, threads=32) as bx:
            a = T.alloc_shared((m, k), dtype)
            b = T.alloc_shared((n, k) if tb else (k, n), dtype)
            c = T.alloc_fragment((m, n), "float32")
            T.copy(A[0, 0], a)
            T.copy(B[0, 0], b)
            T.gemm(a, b, c, transpose_B=tb, clear_accum=True)
            T.copy(c, D[0, 0])
    return mm.ir


@pytest.mark.parametrize("m,n,k,memory,buffer", [(64, 16, 1024, "L0A", "a"), (16, 64, 1024, "L0B", "b"),
                                                   (64, 1024, 16, "L0C", "c"), (40, 1000, 16, "L0C", "c")])
def test_tiles_past_l0_are_typed_errors_naming_the_buffer(m, n, k, memory, buffer):
    with pytest.raises(AscendCapacityError) as e:
        backends.get("ascend").render(_one_gemm("bfloat16", m, n, k))
    assert (e.value.memory, e.value.buffer) == (memory, buffer)
    assert e.value.needed > e.value.capacity and e.value.loc is not None


@pytest.mark.parametrize("arch,capacity", [("dav-c220", 131072), ("dav-3510", 262144)])
def test_l0c_capacity_is_per_arch(arch, capacity):
    ascend = backends.get("ascend")
    with pytest.raises(AscendCapacityError) as e:  # C: 80 x 1024 fp32 = 320 KiB
        ascend.render(_one_gemm("bfloat16", 80, 1024, 16), ascend.target(arch))
    assert (e.value.memory, e.value.buffer, e.value.needed, e.value.capacity) == ("L0C", "c", 327680, capacity)


def test_a_transposed_float32_operand_is_a_typed_error():
    with pytest.raises(AscendRenderError, match="16-bit fractals only"):
        backends.get("ascend").render(_one_gemm("float32", 16, 16, 16, tb=False))


def test_build_reports_the_cube_pools(capsys, monkeypatch):
    monkeypatch.setenv("KERNFORGE_JIT_BISHENG", "/nonexistent/bisheng")
    assert cli.main(["build", "bf16_gemm_nt", "--backend", "ascend", "--problem", "small", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["kernel type"] == "MIX (1 AIC + 2 AIV per group)"
    # block 32 x 64 x 64 bf16: A 4 KiB, B 8 KiB (L1 B after A), C 8 KiB fp32
    assert report["L0A used"] == "4096 / 65536 bytes" and report["L0B used"] == "8192 / 65536 bytes"
    assert report["L0C used"] == "8192 / 131072 bytes" and report["L1 used"] == "12288 / 524160 bytes"
    assert any(k.startswith("L0A A_shared (T.gemm #1") for k in report)


# ---------------------------------------------------------------- the library kernels


GEMM_KERNELS = ["bf16_gemm_nt", "fp32_gemm_nt", "m_grouped_gemm_nt_contiguous", "m_grouped_gemm_nt_masked",
                "mla_decode", "mla_decode_sparse", "mla_decode_splitkv", "hc_pre", "hc_head"]


@pytest.mark.parametrize("name", GEMM_KERNELS)
def test_library_gemm_kernels_verify_on_the_shim(shim_cxx, name):
    res = run_spec(get(name), "ascend-emu", "small", repeat=1, seed=5)
    assert res.verified, res.error
    assert res.label == "verified on the Ascend C CPU shim"


# ---------------------------------------------------------------- fp8 (dav-3510)


def fp8_roundtrip(fp8_buffer: bool):
    """Y = X rounded to fp8 (an fp8 buffer: dav-3510 only), Z = X / 2 rounded to fp8 and back
    (fp8 only inside the expression: both archs)."""
    if fp8_buffer:
        @T.prim_func
        def rt(X: T.Tensor((256,), "float32"), Y: T.Tensor((256,), "float8_e4m3"), Z: T.Tensor((256,), "float32")):
            with T.Kernel(4, threads=64) as bx:
                for i in T.Parallel(64):
                    Y[bx * 64 + i] = T.cast(X[bx * 64 + i], "float8_e4m3")
                    Z[bx * 64 + i] = T.cast(T.cast(X[bx * 64 + i] * 0.5, "float8_e4m3"), "float32")
        return rt

    @T.prim_func
    def rt2(X: T.Tensor((256,), "float32"), Z: T.Tensor((256,), "float32")):
        with T.Kernel(4, threads=64) as bx:
            for i in T.Parallel(64):
                Z[bx * 64 + i] = T.cast(T.cast(X[bx * 64 + i] * 0.5, "float8_e4m3"), "float32")
    return rt2


@pytest.mark.parametrize("arch,fp8_buffer", [("950", True), ("dav-c220", False)])
def test_fp8_conversions_match_the_interpreter_bit_for_bit(shim_cxx, arch, fp8_buffer):
    g = torch.Generator().manual_seed(4)
    special = torch.tensor([0.0, -0.0, 448.0, 449.0, 464.0, 464.00003, 465.0, -1e6, float("inf"), float("-inf"),
                            float("nan"), 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9, 2.0 ** -6,
                            -(2.0 ** -6) * 0.999, 1e-30, 0.1, 1 / 3])
    x = torch.cat([special, torch.randn(120, generator=g) * 100, torch.randn(256 - 120 - len(special), generator=g)])
    outs = {}
    for backend, a in (("interp", None), ("ascend-emu", arch)):
        kernel = kernforge.compile(fp8_roundtrip(fp8_buffer), backend=backend, arch=a)
        y = torch.full((256,), float("nan")).to(torch.float8_e4m3fn)
        z = torch.full((256,), float("nan"))
        kernel(*((x, y, z) if fp8_buffer else (x, z)))
        outs[backend] = (y.view(torch.uint8), z.view(torch.int32))
    assert torch.equal(outs["interp"][0], outs["ascend-emu"][0])
    assert torch.equal(outs["interp"][1], outs["ascend-emu"][1])


@pytest.mark.parametrize("name", ["per_token_cast_to_fp8", "fp8_gemm_nt", "m_grouped_fp8_gemm_nt_masked",
                                  "expand_to_fused"])
def test_fp8_library_kernels_verify_on_the_950_shim(shim_cxx, name):
    res = run_spec(get(name), "ascend-emu", "small", repeat=1, seed=7, arch="dav-3510")
    assert res.verified, res.error


def test_fp8_inside_expressions_runs_on_910b(shim_cxx):
    # fake quantization: fp8 only as a rounding step in scalar code, no fp8 buffer
    res = run_spec(get("fake_quant_fp8"), "ascend-emu", "small", repeat=1, seed=7, arch="dav-c220")
    assert res.verified, res.error


def test_fp8_on_910b_is_a_typed_error_naming_the_buffer():
    spec = get("fp8_gemm_nt")
    kernel = spec.factory(**get_problem(spec, "small").params).ir
    with pytest.raises(AscendRenderError, match=r"buffer 'A' is float8_e4m3: 910B/A3 \(dav-c220\) has no fp8"):
        backends.get("ascend").render(kernel)
    assert "has no fp8" in backends.get("ascend-emu").unsupported(kernel)
    with pytest.raises(AscendRenderError, match="'A_shared' is float8_e4m3"):  # a tile, at the author's line
        backends.get("ascend").render(_fp8_tile_only())


def _fp8_tile_only():
    @T.prim_func
    def f(X: T.Tensor((32,), "float32"), Y: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            A_shared = T.alloc_shared((32,), "float8_e4m3")
            for i in T.Parallel(32):
                A_shared[i] = T.cast(X[i], "float8_e4m3")
            for i in T.Parallel(32):
                Y[i] = T.cast(A_shared[i], "float32")
    return f.ir


# ---------------------------------------------------------------- T.Pipelined: double-buffered TQue stages


def pipelined_sum():
    """Y[block] = sum over 5 column tiles of X (the last one ragged: zero-filled), the tiles
    double-buffered."""
    @T.prim_func
    def f(X: T.Tensor((64, 150), "float32"), Y: T.Tensor((64, 32), "float32")):
        with T.Kernel(4, threads=32) as bx:
            x = T.alloc_shared((16, 32), "float32")
            acc = T.alloc_fragment((16, 32), "float32")
            T.clear(acc)
            for k in T.Pipelined(5, num_stages=3):
                T.copy(X[bx * 16, k * 32], x)
                for i, j in T.Parallel(16, 32):
                    acc[i, j] = acc[i, j] + x[i, j]
            T.copy(acc, Y[bx * 16, 0])
    return f.ir


def _run_pipelined(mutate=None):
    kernel = pipelined_sum()
    x = torch.randn(64, 150, generator=torch.Generator().manual_seed(8))
    y = torch.full((64, 32), float("nan"))
    _build(kernel, mutate=mutate)([x, y], [], [4])
    return x, y


def test_pipelined_copies_become_double_buffered_queues(shim_cxx):
    src = backends.get("ascend").render(pipelined_sum()).source
    assert "AscendC::TQue<AscendC::TPosition::VECIN, 1> kf_q0;" in src and "kf_pipe.InitBuffer(kf_q0, 2, 2048);" in src
    # DeQue k, then the copy of k + 1 into the other buffer (not waited for), then the body, FreeTensor
    body = src[src.index("double-buffered TQue stages for x"):]
    order = ["kf_q0.AllocTensor", "kf_q0.EnQue", "for (int32_t k", "x = kf_q0.DeQue", "if (k + 1 < kf_end_k)",
             "(k + 1) * 32", ", false);", "kf_q0.EnQue", "AscendC::Add(acc, acc, x, 512);", "kf_q0.FreeTensor(x);"]
    at = [body.index(s) for s in order[:1]]
    for s in order[1:]:
        at.append(body.index(s, at[-1]))
    x, y = _run_pipelined()
    want = torch.nn.functional.pad(x, (0, 10)).reshape(64, 5, 32).double().sum(1)
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("plant,rule", [
    (lambda s: s.replace("kf_q0.FreeTensor(x);", ""), "queue: AllocTensor with no free buffer"),
    # the copy of k + 1 enqueued before k is dequeued: two tensors in a depth-1 queue
    (lambda s: s.replace("      AscendC::LocalTensor<float> x = kf_q0.DeQue<float>();\n", "").replace(
        "      AscendC::Add(acc, acc, x, 512);", "      AscendC::LocalTensor<float> x = kf_q0.DeQue<float>();\n"
        "      AscendC::Add(acc, acc, x, 512);"), "queue: EnQue over depth"),
], ids=["never_freed", "enqueued_before_dequeue"])
def test_a_broken_stage_protocol_is_caught(shim_cxx, plant, rule):
    with pytest.raises(emu.AscendEmuError) as e:
        _run_pipelined(mutate=plant)
    assert e.value.rule == rule


def _gathered_b_gemm(M=64, N=32, K=96, G=3, bm=32, bn=32, bk=32):
    """A grouped-GEMM-shaped loop whose B tile starts at an expert index read from memory
    and not clamped: not provably in bounds, so B's copy is an element loop."""

    @T.prim_func
    def gathered_b(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((G, N, K), "bfloat16"),
                   idx: T.Tensor((M,), "int32"), D: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=64) as (bx, by):
            A_shared = T.alloc_shared((bm, bk), "bfloat16")
            B_shared = T.alloc_shared((bn, bk), "bfloat16")
            C = T.alloc_fragment((bm, bn), "float32")
            expert = idx[by * bm]
            T.clear(C)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, k * bk], A_shared)
                T.copy(B[expert, bx * bn, k * bk], B_shared)
                T.gemm(A_shared, B_shared, C, transpose_B=True)
            T.copy(C, D[by * bm, bx * bn])
    return gathered_b


def test_a_copy_that_is_not_a_dma_copy_is_not_staged():
    # B's copy starts at the expert index the kernel loads (not provably >= 0), so it is an
    # element loop: only A is staged, B's loop stays in the body
    src = backends.get("ascend").render(_gathered_b_gemm().ir).source
    assert "double-buffered TQue stages for A_shared\n" in src and "kf_q1" not in src
    loop = src[src.index("A_shared = kf_q0.DeQue"):src.index("kf_q0.FreeTensor(A_shared);")]
    assert "B_shared.SetValue(" in loop and "kf::gemm<" in loop
