"""sm_100a: a K loop's tcgen05 accumulator stays in tensor memory (issue 21, item 6).

The layout plan keeps an accumulating tcgen05 gemm's partial sum in TMEM across its loop when
nothing else in the loop touches the accumulator (``tcgen05.plan_resident``); the generated code
then reads TMEM back once, after the loop.  Checked here on cuda-emu: which gemms the plan picks,
the shape of the source, results against float64 torch (zero-trip loops and a loop entered twice
in one CTA included), and planted bugs (the accumulate flag ignored, always set, never recorded,
kept across loop entries; the MMA-completion wait dropped, or skipped for the last K tile only)
that must be caught.  "CUDA
semantics verified on host emulation", never GPU verified.
"""
import re

import pytest
import torch

import kernforge
import kernforge.dsl as T
from kernforge.backends.cuda.renderer import render_cuda
from kernforge.backends.cuda_emu.backend import CudaEmuBackend, EmulatedModule
from kernforge.codegen.renderer import Target
from kernforge.kernels.registry import all_specs
from tests.emu.planted import assert_caught, agree, plant, run

SPECS = all_specs()
GEMM = "m_grouped_gemm_nt_contiguous"
GEMM_CASE = dict(group_rows=[5, 0, 70], alignment=64, num_groups=3, N=64, K=192, block_M=64, block_N=32,
                 block_K=64)


def _plan(ir):
    return CudaEmuBackend().renderer.lower(ir, Target("cuda-emu", "sm_100a"))[1]["layouts"]


@pytest.mark.parametrize("name, params, resident", [
    (GEMM, GEMM_CASE, 1),
    ("m_grouped_gemm_nt_masked", dict(masked_rows=[20, 0, 64], max_m=64, num_groups=3, N=64, K=64, block_M=64,
                                      block_N=32, block_K=64), 1),
    # the scaled fp8 gemms clear their partial product every K block (scales applied in registers)
    ("fp8_gemm_nt", dict(M=70, N=64, K=264, block_M=64, block_N=64), 0),
    # MLA rescales its output accumulator and reads its scores every KV block
    ("mla_decode", dict(batch=2, seqlens=[37, 5], heads=64, heads_kv=1, seq_q=1, dim=96, dim_v=64,
                        page_size=16, causal=False, block_N=16, block_H=64), 0),
])
def test_plan_keeps_only_undisturbed_accumulators_in_tmem(name, params, resident):
    plan = _plan(SPECS[name].factory(**params).ir)
    assert "tcgen05" in plan.gemm_kind.values()
    assert len(plan.tmem_resident) == resident
    for g, loop in plan.tmem_resident.items():
        assert plan.gemm_kind[g] == "tcgen05" and not g.clear_accum and g in loop.body.body


def test_resident_source_reads_tensor_memory_once_after_the_loop():
    src = CudaEmuBackend().source(SPECS[GEMM].factory(**GEMM_CASE).ir, "sm_100a")
    live = re.search(r"int (kf_tmem_live\d+) = 0;", src).group(1)
    assert src.count("kf::tmem_ld_16x256b<") == 1
    mma, flag_set, read_back = (src.index(f"{live} | (kf_kk > 0)"), src.index(f"{live} = 1;"),
                                src.index(f"if ({live})"))
    loop_end = src.index("kf::mbarrier_inval")  # the ring's teardown after the K loop
    assert mma < flag_set < loop_end < read_back < src.index("kf::tmem_ld_16x256b<")


def _passes_gemm(N: int, K: int, num_stages: int):
    """Two passes of one CTA over the same 64 x N tile: pass p sums the first ``tiles[p]`` 64-wide
    K tiles of ``A @ B^T`` into ``D[p]``.  The K loop is entered twice (its flag must start over)
    and may run no iteration (the TMEM columns then hold nothing to read back)."""
    M = 64

    @T.prim_func(name=f"tmem_passes_n{N}_k{K}_s{num_stages}")
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((N, K), "bfloat16"), tiles: T.Tensor((2,), "int32"),
             D: T.Tensor((2, M, N), "float32")):
        with T.Kernel(1, threads=128) as _:
            A_s = T.alloc_shared((M, 64), "bfloat16")
            B_s = T.alloc_shared((N, 64), "bfloat16")
            C = T.alloc_fragment((M, N), "float32")
            for p in T.serial(2):
                T.clear(C)
                for k in (T.Pipelined(tiles[p], num_stages=num_stages) if num_stages else T.serial(tiles[p])):
                    T.copy(A[0, k * 64], A_s)
                    T.copy(B[0, k * 64], B_s)
                    T.gemm(A_s, B_s, C, transpose_B=True)
                T.copy(C, D[p, 0, 0])

    return main


def _passes_inputs(N: int, K: int, tiles, seed: int):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(64, K, generator=g).bfloat16()
    B = torch.randn(N, K, generator=g).bfloat16()
    D = torch.full((2, 64, N), float("nan"))  # poisoned: every element must be written
    return A, B, torch.tensor(tiles, dtype=torch.int32), D


def _passes_reference(A, B, tiles):
    return [A[:, :64 * t].double() @ B[:, :64 * t].double().T for t in tiles.tolist()]


@pytest.mark.parametrize("num_stages", [0, 2, 3])  # 0: a plain serial loop, no ring
def test_resident_accumulator_over_reentered_and_empty_loops(num_stages):
    N, K = 32, 256
    kernel = kernforge.compile(_passes_gemm, backend="cuda-emu", arch="sm_100a", N=N, K=K, num_stages=num_stages)
    assert "kf_tmem_live" in kernel.launcher.program.source
    for seed, tiles in enumerate(([4, 0], [0, 3], [1, 4], [3, 2])):
        A, B, t, D = _passes_inputs(N, K, tiles, seed)
        kernel(A, B, t, D)
        for p, want in enumerate(_passes_reference(A, B, t)):
            torch.testing.assert_close(D[p].double(), want, rtol=1e-5, atol=1e-4, msg=f"pass {p}, tiles {tiles}")


def _decayed_gemm(N: int, K: int):
    """``C = (C + A_k @ B_k^T) / 2`` per 64-wide K tile: the loop reads its accumulator, so the sum
    must come back to the registers every tile (not TMEM-resident)."""
    M = 64

    @T.prim_func(name=f"tmem_decayed_n{N}_k{K}")
    def main(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((N, K), "bfloat16"), D: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as _:
            A_s = T.alloc_shared((M, 64), "bfloat16")
            B_s = T.alloc_shared((N, 64), "bfloat16")
            C = T.alloc_fragment((M, N), "float32")
            T.clear(C)
            for k in T.Pipelined(K // 64, num_stages=2):
                T.copy(A[0, k * 64], A_s)
                T.copy(B[0, k * 64], B_s)
                T.gemm(A_s, B_s, C, transpose_B=True)
                for i, j in T.Parallel(M, N):
                    C[i, j] = C[i, j] * 0.5
            T.copy(C, D[0, 0])

    return main


def test_accumulator_read_in_the_loop_is_read_back_every_tile():
    N, K = 32, 192
    plan = _plan(_decayed_gemm(N, K).ir)
    assert set(plan.gemm_kind.values()) == {"tcgen05"} and not plan.tmem_resident
    kernel = kernforge.compile(_decayed_gemm, backend="cuda-emu", arch="sm_100a", N=N, K=K)
    A, B, _, D = _passes_inputs(N, K, [0, 0], 3)
    D = D[0].clone()
    kernel(A, B, D)
    want = torch.zeros(64, N, dtype=torch.float64)
    for k in range(K // 64):
        want = (want + A[:, 64 * k:64 * k + 64].double() @ B[:, 64 * k:64 * k + 64].double().T) / 2
    torch.testing.assert_close(D.double(), want, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- planted bugs

def _flag_ignored(src):  # every tile's first MMA overwrites the sum: only the last K tile survives
    return re.sub(r"kf_tmem_live\d+ \| \(kf_kk > 0\)", "(kf_kk > 0)", src, count=1)


def _flag_always_set(src):  # the first MMA accumulates onto unwritten (poisoned) TMEM
    return re.sub(r"kf_tmem_live\d+ \| \(kf_kk > 0\)", "1", src, count=1)


def _flag_never_recorded(src):  # the loop's sum is never read back
    return re.sub(r"\n\s*kf_tmem_live\d+ = 1;", "", src, count=1)


def _drop_mma_wait(src):  # the next tile's commit arrives on a phase nobody completed
    return re.sub(r"\n\s*kf::mbarrier_wait_parity\(kf_mma_bar[^;]*;", "", src, count=1)


def _last_tile_not_waited(src):  # the sum read back before the last tile's MMAs completed
    k, end = re.search(r"for \(int32_t (\w+) = [^;]*; \1 < (kf_end\d+); \+\+\1\)", src).groups()
    return re.sub(r"(kf::mbarrier_wait_parity\(kf_mma_bar)", rf"if ({k} + 1 < {end}) \1", src, count=1)


BUGS = {"accumulate_flag_ignored": (_flag_ignored, None),
        "accumulate_flag_always_set": (_flag_always_set, None),
        "flag_never_recorded": (_flag_never_recorded, None),
        "missing_commit_wait": (_drop_mma_wait, "more arrivals than the count"),
        "last_tile_not_waited": (_last_tile_not_waited, "before the tcgen05.mma writing it completed")}


@pytest.fixture(scope="module")
def planted():
    return plant(SPECS[GEMM], GEMM_CASE, "sm_100a", BUGS, "emu_test_tcgen05_resident_planted", timeout_ms=5_000)


def test_unmutated_copy_passes_the_harness(planted):
    assert agree(run(planted, "clean"))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_resident_accumulator_bug_is_caught(planted, bug):
    assert_caught(planted, bug, BUGS)


def test_flag_kept_across_loop_entries_is_caught():
    """The flag hoisted to the kernel's entry: the second pass accumulates onto the first's sum
    (or, with no tile of its own, reads it back)."""
    N, K = 32, 256
    ir = _passes_gemm(N, K, 2).ir
    src = CudaEmuBackend().source(ir, "sm_100a")
    decl = re.search(r"\n\s*int (kf_tmem_live\d+) = 0;[^\n]*", src)
    hoisted = src.replace(decl.group(0), "").replace("uint32_t kf_mma_phase = 0;",
                                                      f"uint32_t kf_mma_phase = 0;\n  int {decl.group(1)} = 0;")
    module = EmulatedModule("emu_test_tcgen05_resident_hoisted", hoisted, dynamic_smem=render_cuda(ir, "sm_100a")
                            .dynamic_smem, arch="sm_100a")
    kernel = kernforge.compile(_passes_gemm, backend="cuda-emu", arch="sm_100a", N=N, K=K, num_stages=2)
    kernel.launcher.emulated = module.kernel(ir.name, timeout_ms=5_000)
    A, B, t, D = _passes_inputs(N, K, [2, 0], 7)
    kernel(A, B, t, D)
    want = _passes_reference(A, B, t)
    assert torch.allclose(D[0].double(), want[0], rtol=1e-5, atol=1e-4)  # the first pass is still right
    assert not torch.allclose(D[1].double(), want[1], rtol=1e-5, atol=1e-4)
