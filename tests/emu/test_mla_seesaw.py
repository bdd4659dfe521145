"""MLA decode's two-warpgroup seesaw on sm_90a (kernforge/backends/cuda/seesaw.py) under CUDA host
emulation: the schedule, its results against the float64 reference, and planted protocol bugs.

With 64-token KV tiles (the sm_90a chooser's, and the bench problem's) each math warpgroup takes
alternate tiles whole (``HGMMA.64x64x16`` scores), multiplies its own probabilities from registers
(register-A wgmma), folds the other warpgroup's tiles into its half of the output from shared
memory, and a producer warpgroup fills the two-stage ring.  The cases
cover every ownership pattern of the last tile (0, 1, 2, 3, 5 tiles, a partial tail tile, an
empty request), causal MTP rows, two latent heads, split-KV partials and the balanced schedule's
cut requests.  Outputs start poisoned (NaN)."""
import re

import pytest

from kernforge.backends.cuda.renderer import CudaRenderer, render_cuda
from kernforge.codegen.renderer import Target
from kernforge.kernels.mla_decode import kernel as K
from kernforge.kernels.registry import all_specs

from tests.emu import planted

SPECS = all_specs()
# d = 128 + 64 RoPE dims: whole 128-byte swizzled rows for KV and K_pe (the TMA ring the seesaw needs)
SMALL = dict(dim=192, dim_v=128, page_size=64, block_N=64, block_H=64)

CASES = {
    # tiles per request: 5 (partial tail), 1, 0, 2, 3 (partial tail), 1 (partial)
    "dense": ("mla_decode", dict(batch=6, seqlens=[300, 64, 0, 128, 150, 5], heads=8, seq_q=1, **SMALL)),
    # MTP: 2 tokens x 64 heads = two row blocks, causal across the tokens
    "mtp_causal": ("mla_decode", dict(batch=3, seqlens=[130, 2, 257], heads=64, seq_q=2, causal=True, **SMALL)),
    # V4's cache row: the value is the whole key (no RoPE tail, one score gemm)
    "no_rope": ("mla_decode", dict(batch=3, seqlens=[250, 64, 1], heads=8, seq_q=1, **dict(SMALL, dim=128))),
    "two_latent_heads": ("mla_decode", dict(batch=2, seqlens=[200, 70], heads=16, heads_kv=2, seq_q=1, **SMALL)),
    "splitkv": ("mla_decode_splitkv", dict(batch=2, pages=5, heads=8, seq_q=1, num_splits=2, **SMALL)),
    "scheduled": ("mla_decode_scheduled", dict(batch=3, seqlens=[300, 5, 0], num_sm_parts=2, heads=8, seq_q=1,
                                               **SMALL)),
}


def _kernel(name, params):
    spec = SPECS[name]
    kp = {k: v for k, v in params.items() if k not in spec.runtime_sizes}
    return (K.mla_decode(**kp) if name == "mla_decode_splitkv" else spec.factory(**kp)).ir


def _facts(ir, arch):
    return CudaRenderer().lower(ir, Target("cuda", arch))[1]


def test_bench_shape_runs_the_seesaw():
    """FlashMLA's shape (d 576, d_v 512, 64-token tiles): the plan, the producer warpgroup, one
    warpgroup's whole 64 x 64 scores per wgmma, and the two output halves (N = 256 each)."""
    ir = K.mla_decode(heads=128, dim=576, dim_v=512, page_size=64, block_N=64, block_H=64).ir
    facts = _facts(ir, "sm_90a")
    assert facts["seesaw"] is not None and facts["warpspec"].threads == 384
    prog = render_cuda(ir, "sm_90a")
    src = prog.source
    assert prog.threads == 384 and prog.dynamic_smem <= 227 * 1024
    assert src.count("kf::wgmma_m64nNk16_f32_bf16<64, 0, 0>(*reinterpret_cast<float(*)[32]>(&kf_ss[") == 2
    assert src.count("kf::wgmma_m64nNk16_f32_bf16<256, 0, 1>") == 2   # the folds (in the loop, the last tile)
    assert src.count("kf::wgmma_m64nNk16_f32_bf16_rs<256, 1>(") == 1   # the own tile, P from registers
    assert "kf::online_softmax_step<1, 8, 4, 1, 4>(kf_ss, m, l, rescale, " in src
    # the output's 64 KB TMA-store staging lives in the drained KV stages (no room beside them)
    ring = re.search(r"KV_shared_ring = reinterpret_cast<kf_bf16\*>\(kf_smem \+ (\d+)\)", src).group(1)
    assert f"kf::epilogue_tma_store<256, 128, 2>(&kf_tmap_store_Out_0, (kf_smem + {ring}) + 0," in src
    assert "kf_softmax_scratch" not in src and "__syncthreads" not in src.split("kf_seesaw_x")[1].split("for (int32_t t")[1]


@pytest.mark.parametrize("arch, block_N", [("sm_90a", 32), ("sm_100a", 64), ("sm_80", 64)])
def test_other_shapes_and_arches_keep_the_loop(arch, block_N):
    """32-token tiles (N = 16 per warpgroup), tcgen05 and mma.sync keep the loop as written."""
    params = dict(SMALL, block_N=block_N, page_size=64)
    ir = K.mla_decode(heads=8, **params).ir
    assert _facts(ir, arch)["seesaw"] is None
    assert "kf_seesaw_x" not in render_cuda(ir, arch).source


@pytest.mark.parametrize("case", list(CASES))
def test_seesaw_matches_reference(case):
    name, params = CASES[case]
    spec = SPECS[name]
    assert "kf_seesaw_x" in render_cuda(_kernel(name, params), "sm_90a").source  # the schedule under test
    inputs = spec.make_inputs(params, 5, "cpu")
    for i in spec.outputs:
        inputs[i].fill_(float("nan"))
    spec.compile("cuda-emu", arch="sm_90a", **params)(*inputs)
    outputs = [inputs[i] for i in spec.outputs]
    spec.check(outputs, spec.reference(inputs, params), inputs, params)


# ---------------------------------------------------------------- planted protocol bugs

PLANT = dict(batch=2, seqlens=[300, 130], heads=8, seq_q=1, **SMALL)  # 5 and 3 tiles

# Races are decided by a schedule: "owner_late" delays warpgroup 0 before its softmax, so the
# other warpgroup folds stale data unless it waits for the publication.  usleep: host emulation only.
SCHEDULES = {
    "owner_late": (re.compile(r"(\n(\s*)kf::online_softmax_step<)"), r"\n\2if (kf_wg == 0) usleep(30000);\1"),
}


def _perturbed(src: str, schedule: str) -> str:
    pattern, repl = SCHEDULES[schedule]
    out, n = pattern.subn(repl, "#include <unistd.h>\n" + src)
    assert n == 1, f"schedule {schedule} matched {n} times: the generated code moved"
    return out


def _sub(pattern: str, repl: str, expect: int = 1):
    """A mutation replacing the ``expect`` matches of ``pattern`` (another count: the code moved)."""
    def mutate(src: str) -> str:
        out, n = re.subn(pattern, repl, src)
        assert n == expect, f"{pattern!r} matched {n} times: the generated code moved"
        return out
    return mutate


def _both(*mutations):
    def mutate(src: str) -> str:
        for m in mutations:
            src = m(src)
        return src
    return mutate


BUGS = {
    # the folds do not rescale the partial sum by the other's tile factor
    "fold_keeps_sum": ("owner_late", _sub(r" l\[(kf_s\d+)\] \*= rescale\[\1\];", "", expect=2)),
    # the partial sums are not added: each half is normalised by its own warpgroup's tiles only
    "sums_not_added": ("owner_late", _sub(r"kf_seesaw_x\[128 \+ (\(.*?\))\] \+ kf_seesaw_x\[192 \+ .*?\];",
                                                 r"kf_seesaw_x[128 + kf_wg * 64 + \1];")),
    # the last tile is never folded by the warpgroup that does not own it
    "last_tile_not_folded": ("owner_late", _sub(r"if \((kf_n\d+) > 0 && ", r"if (\1 < 0 && ")),
    # the fold multiplies by the stage of its own tile instead of the other's
    "fold_wrong_stage": ("owner_late", _sub(r"KV_shared_ring \+ \(\((kf_j\d+) - 1\) % 2\)",
                                                   r"KV_shared_ring + ((\1) % 2)")),
    # the fold does not wait for the other warpgroup's publication
    "no_publication_wait": ("owner_late", _sub(r"kf::mbarrier_wait_parity\(kf_bars0 \+ 4 \+ \(1 - kf_wg\), \(uint32_t\)\(\(\(kf_j[^\n]*\n", "")),
    # the own product takes one K step's probabilities for every step
    "own_product_one_fragment": ("owner_late", _sub(r"kf_pa\[kf_kk\], kf_db", "kf_pa[0], kf_db")),
    # the fold's product (left in flight during the softmax) is not waited for before P is overwritten
    "fold_product_not_waited": ("owner_late", _sub(r"\n\s*kf::wgmma_wait<0>\(\);\n\s*kf::wgmma_fence_operand\(acc_o\);\n"
                                                   r"\s*kf::named_barrier_sync\(2 \+ kf_wg, 128\);", "")),
    # the publication is signalled before P, the max and the factor are written (here: before the
    # softmax, which warpgroup 0 reaches 30 ms late)
    "publish_before_p": ("owner_late", _both(
        _sub(r"kf::fence_proxy_async\(\);\n\s*kf::mbarrier_arrive\(kf_bars0 \+ 4 \+ kf_wg\);", "kf::fence_proxy_async();"),
        _sub(r"if \(kf_wg == 0\) usleep\(30000\);", "kf::mbarrier_arrive(kf_bars0 + 4 + kf_wg); if (kf_wg == 0) usleep(30000);"))),
}


@pytest.fixture(scope="module")
def seesaw_planted():
    from kernforge.backends.cuda_emu.backend import CudaEmuBackend
    import kernforge

    spec = SPECS["mla_decode"]
    kp = {k: v for k, v in PLANT.items() if k not in spec.runtime_sizes}
    ir = spec.factory(**kp).ir
    source = CudaEmuBackend().source(ir, "sm_90a")
    copies = {f"clean_{s}": _perturbed(source, s) for s in SCHEDULES}
    for bug, (sched, mutate) in BUGS.items():
        copies.update(planted.mutants(copies[f"clean_{sched}"], {bug: mutate}))
    module = planted.copies_module("emu_test_mla_seesaw_planted", ir.name, copies, "sm_90a",
                                   render_cuda(ir, "sm_90a").dynamic_smem)
    emu = kernforge.compile(spec.factory, backend="cuda-emu", arch="sm_90a", **kp)
    ref = kernforge.compile(spec.factory, backend="interp", **kp)
    return planted.Planted(spec, PLANT, module, emu, ref, timeout_ms=5_000)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_clean_seesaw_agrees_under_every_schedule(seesaw_planted, schedule):
    assert planted.agree(planted.run(seesaw_planted, f"clean_{schedule}"))


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_seesaw_bug_is_caught(seesaw_planted, bug):
    planted.assert_caught(seesaw_planted, bug, {b: (None, None) for b in BUGS})

