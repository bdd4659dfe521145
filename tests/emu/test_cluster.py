"""Thread-block clusters under host emulation (kf/cluster.cuh, kf/emu/cluster.h): a 2-CTA cluster
GEMM whose A tile is shared by TMA multicast, against float64 numpy; distributed shared memory
through mapa; per-CTA named barriers; and planted bugs, in the kernel (missing cluster barriers, a
release that skips the peer, an expect-tx that leaves out the peer's half, a multicast to the
issuer only, a padded CTA that leaves early) and in the emulator itself (a multicast that writes
only the issuing CTA, a mapa that ignores the rank, a cluster wait that does not wait, named
barriers shared by the cluster), each of which must fail.  "CUDA semantics verified on host
emulation", never "GPU verified"."""
from __future__ import annotations

import re
import shutil
from typing import Callable, Optional

import ml_dtypes
import numpy as np
import pytest

from kernforge.backends.cuda_emu import backend as emu_backend
from kernforge.backends.cuda_emu.backend import (EmulatedModule, EmulationError, HostParam, cluster_smem_bytes,
                                                 emu_source)

from .cluster_kernels import (CLUSTER_GEMM, DSMEM_EXCHANGE, GEMM_CLUSTER, GEMM_PARAMS, GEMM_SMEM, NAMED_BARRIER,
                              gemm_args, gemm_plan)

BF16 = ml_dtypes.bfloat16
INCLUDE = '#include "kf/cluster.cuh"\n'
SMEM = cluster_smem_bytes(GEMM_SMEM, GEMM_CLUSTER)
DEADLOCK_MS = 1500

# kernel bug -> (mutation of CLUSTER_GEMM, text the emulator's error must contain; None: a wrong
# result or any emulation error)
KERNEL_BUGS: dict[str, tuple[Callable[[str], str], Optional[str]]] = {
    # a CTA-local barrier where the cluster barrier belongs: the own CTA's barriers are ready, the peer's may not be
    "no_start_barrier": (lambda s: s.replace("kf::cluster_sync();  // KF_PLANT_START", "__syncthreads();"),
                         "before any cluster barrier"),
    "no_exit_barrier": (lambda s: s.replace("kf::cluster_sync();  // KF_PLANT_EXIT", ""),
                        "since the last cluster barrier"),
    "release_own_cta_only": (lambda s: s.replace("kf::mbarrier_arrive_cluster(empty + s, r);",
                                                 "kf::mbarrier_arrive_cluster(empty + s, rank);"), None),
    "expect_tx_own_half_only": (lambda s: s.replace("(BM * BK + BK * BN) * 2;  // KF_PLANT_EXPECT",
                                                    "(BM / CL * BK + BK * BN) * 2;"), None),
    # the CTA past the last N block leaves at once: its peer waits for its half of A and its releases
    "padded_cta_returns_early": (lambda s: s.replace("// KF_PLANT_PADDED", "\n  if (bx * BN >= N) return;"),
                                 None),
    "multicast_to_issuer_only": (lambda s: s.replace("full + k, (1u << CL) - 1)", "full + k, 1u << rank)"), None),
}

# emulator bug -> (header under kf/emu, its mutation); the clean kernels must notice
EMULATOR_BUGS: dict[str, tuple[str, Callable[[str], str]]] = {
    "multicast_writes_issuer_only": ("cluster.h", lambda s: s.replace("if (!((mask >> r) & 1u)) continue;",
                                                                       "if (r != ctx().cta_rank) continue;")),
    "mapa_ignores_rank": ("cluster.h", lambda s: s.replace("return addr - me * stride + r * stride;",
                                                           "return addr;")),
    "cluster_wait_does_not_wait": ("cluster.h", lambda s: s.replace(
        'wait_changed(g_cluster.gen, t.arrive_gen, "barrier.cluster.wait', '(void)("')),
    "named_barriers_shared_by_the_cluster": ("warpgroup.h", lambda s: s.replace(
        "return g_warpgroups[ctx().cta_rank];", "return g_warpgroups[0];")),
}


def _variant(src: str, tag: str, fn: str) -> str:
    """`src` with its kernel renamed `<fn>_<tag>` inside its own namespace (one module, many copies)."""
    body = re.sub(rf"\b{fn}\(", f"{fn}_{tag}(", src.replace(INCLUDE, ""))
    return f"namespace v_{tag} {{\n{body}\n}}  // namespace v_{tag}\n"


def _module(tag: str, gemm_sources: dict[str, str], timeout_ms: int = 20_000) -> dict:
    parts = [INCLUDE]
    for name, src in gemm_sources.items():
        parts.append(emu_source(_variant(src, name, "cgemm"), name=f"cgemm_{name}", entry=f"v_{name}::cgemm_{name}",
                                params=GEMM_PARAMS, threads=128, grid_rank=2, cluster=GEMM_CLUSTER))
    for fn, src in (("dsmem", DSMEM_EXCHANGE), ("nbar", NAMED_BARRIER)):
        parts.append(emu_source(_variant(src, "x", fn), name=fn, entry=f"v_x::{fn}_x",
                                params=[HostParam("int*", "buffer")], threads=64, grid_rank=1, cluster=2))
    module = EmulatedModule(tag, "\n".join(parts), dynamic_smem=SMEM)
    kernels = {f"cgemm_{n}": module.kernel(f"cgemm_{n}", timeout_ms) for n in gemm_sources}
    kernels.update((fn, module.kernel(fn, timeout_ms)) for fn in ("dsmem", "nbar"))
    return kernels


def _gemm(kernel, M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(BF16)
    B = rng.standard_normal((K, N)).astype(BF16)
    C = np.full((M, N), np.nan, np.float32)
    plan = gemm_plan(M, N)
    assert plan.size == GEMM_CLUSTER, plan.reason
    kernel(gemm_args(A, B, C), [], list(plan.launch_grid))
    return C, A.astype(np.float64) @ B.astype(np.float64)


def _gemm_ok(kernel, M=40, N=72, K=136) -> bool:
    got, want = _gemm(kernel, M, N, K)
    return np.allclose(got, want, rtol=1e-5, atol=1e-4)


def _dsmem_ok(kernel) -> bool:
    out = np.full(8 * 64, -1, np.int32)
    kernel([out], [], [8])
    rank = np.arange(8)[:, None] % 2
    want = 1000 * ((rank ^ 1) + 1) + np.arange(64)[None, :] + 200000
    return np.array_equal(out.reshape(8, 64), want)


def _named_barrier_ok(kernel) -> bool:
    out = np.full(4 * 32, -1, np.int32)
    kernel([out], [], [4])
    want = 100 * (np.arange(4)[:, None] % 2 + 1) + np.arange(32)[None, :]
    return np.array_equal(out.reshape(4, 32), want)


@pytest.fixture(scope="module")
def kernels():
    sources = {"clean": CLUSTER_GEMM}
    for bug, (mutate, _) in KERNEL_BUGS.items():
        mutated = mutate(CLUSTER_GEMM)
        assert mutated != CLUSTER_GEMM, f"planting {bug} changed nothing"
        sources[bug] = mutated
    return _module("cluster_emu", sources, timeout_ms=DEADLOCK_MS)


@pytest.mark.parametrize("M,N,K", [
    (40, 72, 80),    # 3 N blocks: the grid is rounded up to 4, the 4th CTA is past N yet multicasts its half
    (64, 64, 32),    # one k-step, whole tiles
    (33, 128, 136),  # ragged M and K, five k-steps through a 2-stage ring (empty barriers flip parity)
])
def test_cluster_multicast_gemm_matches_float64(kernels, M, N, K):
    got, want = _gemm(kernels["cgemm_clean"], M, N, K, seed=M + N + K)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_distributed_shared_memory_reads_the_peer_cta(kernels):
    assert _dsmem_ok(kernels["dsmem"])


def test_cluster_arena_holds_one_aligned_slice_per_cta():
    assert cluster_smem_bytes(8224, 1) == 8224
    assert cluster_smem_bytes(8224, 2) == 2 * 9216
    assert cluster_smem_bytes(16, 4) == 4 * 1024


def test_named_barriers_are_per_cta(kernels):
    assert _named_barrier_ok(kernels["nbar"])


def test_grid_not_a_multiple_of_the_cluster_is_refused(kernels):
    with pytest.raises(EmulationError, match="cluster size 2: must .* divide gridDim.x \\(3\\)"):
        kernels["dsmem"]([np.zeros(3 * 64, np.int32)], [], [3])


@pytest.mark.parametrize("bug", sorted(KERNEL_BUGS))
def test_planted_kernel_bug_is_caught(kernels, bug):
    assert _gemm_ok(kernels["cgemm_clean"])  # the harness itself is sound
    message = KERNEL_BUGS[bug][1]
    try:
        ok = _gemm_ok(kernels[f"cgemm_{bug}"])
    except EmulationError as e:
        assert message is None or message in str(e), str(e)
        return
    assert message is None, f"planted bug {bug} ran to completion"
    assert not ok, f"planted bug {bug} went unnoticed"


@pytest.fixture(scope="module")
def emulator_include(tmp_path_factory):
    """A copy of the emulator's include tree to plant bugs in."""
    root = tmp_path_factory.mktemp("emu_include")
    shutil.copytree(emu_backend.TEMPLATES / "include", root / "include")
    return root / "include"


@pytest.mark.parametrize("bug", sorted(EMULATOR_BUGS))
def test_planted_emulator_bug_is_caught(emulator_include, monkeypatch, bug):
    name, mutate = EMULATOR_BUGS[bug]
    clean = (emu_backend.TEMPLATES / "include" / "kf" / "emu" / name).read_text()
    mutated = mutate(clean)
    assert mutated != clean, f"planting {bug} changed nothing"
    for other, _ in EMULATOR_BUGS.values():  # undo the previous test's plant
        shutil.copy(emu_backend.TEMPLATES / "include" / "kf" / "emu" / other, emulator_include / "kf" / "emu" / other)
    (emulator_include / "kf" / "emu" / name).write_text(mutated)
    monkeypatch.setattr(emu_backend, "INCLUDE_DIRS", (emu_backend.INCLUDE_DIRS[0], str(emulator_include)))
    k = _module(f"cluster_emu_{bug}", {"clean": CLUSTER_GEMM}, timeout_ms=DEADLOCK_MS)
    results = []
    for check, kernel in ((_gemm_ok, k["cgemm_clean"]), (_dsmem_ok, k["dsmem"]), (_named_barrier_ok, k["nbar"])):
        try:
            results.append(check(kernel))
        except EmulationError:
            results.append(False)
    assert not all(results), f"emulator bug {bug} went unnoticed"
