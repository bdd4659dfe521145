"""``ir.Sync`` and the barrier passes: the node prints, verifies and runs as a no-op; the generic
pass puts a barrier exactly where shared memory races; the CUDA pass is where the CUDA renderer's
barriers come from, and it leaves the renderer's plans unchanged."""
from __future__ import annotations

import numpy as np
import pytest

import kernforge.dsl as T
from kernforge.backends.cpu.renderer import CpuRenderer
from kernforge.backends.cuda import barriers as cuda_barriers
from kernforge.backends.cuda.layout_plan import plan_layouts
from kernforge.backends.cuda.pipeline_plan import plan_pipelines
from kernforge.backends.cuda.renderer import CudaRenderer, render_cuda
from kernforge.codegen import ir
from kernforge.codegen.passes import barriers
from kernforge.codegen.passes.pipeline import run_pipeline
from kernforge.codegen.renderer import Target
from kernforge.codegen.verify import verify
from kernforge.interp.executor import Interpreter
from tests.backends.test_cuda_semantics import gemm, scan_and_total, scores_softmax


# ---------------------------------------------------------------- kernels


def staged_sum(n=64):
    """Shared tile written by a map, then read by another map (a read after write), then
    overwritten (a write after read), all in a loop (loop-carried hazards)."""
    @T.prim_func
    def kf_staged_sum(X: T.Tensor((4, n), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            S = T.alloc_shared((n,), "float32")
            acc = T.alloc_fragment((n,), "float32")
            T.clear(acc)
            for r in T.serial(4):
                for i in T.Parallel(n):
                    S[i] = X[r, i] * 2.0
                for i in T.Parallel(n):
                    acc[i] = acc[i] + S[n - 1 - i]
            T.copy(acc, Y)
    return kf_staged_sum


def no_hazard(n=64):
    """Only global memory and private fragments: nothing for a barrier to order."""
    @T.prim_func
    def kf_no_hazard(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            acc = T.alloc_fragment((n,), "float32")
            for i in T.Parallel(n):
                acc[i] = X[i] + 1.0
            for i in T.Parallel(n):
                Y[i] = acc[i] * 3.0
    return kf_no_hazard


def reads_only(n=64):
    """A shared tile written once, then read twice: one barrier, none between the two reads."""
    @T.prim_func
    def kf_reads_only(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), Z: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            S = T.alloc_shared((n,), "float32")
            for i in T.Parallel(n):
                S[i] = X[i]
            for i in T.Parallel(n):
                Y[i] = S[n - 1 - i]
            for i in T.Parallel(n):
                Z[i] = S[i] + 1.0
    return kf_reads_only


def overwrite(n=64):
    """Written, read, then overwritten and read again: the overwrite races only the reads
    before it (a write after read, with no write pending)."""
    @T.prim_func
    def kf_overwrite(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32"), Z: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            S = T.alloc_shared((n,), "float32")
            for i in T.Parallel(n):
                S[i] = X[i]
            for i in T.Parallel(n):
                Y[i] = S[n - 1 - i]
            for i in T.Parallel(n):
                S[i] = X[i] * 2.0
            for i in T.Parallel(n):
                Z[i] = S[n - 1 - i]
    return kf_overwrite


def listing(k: ir.Kernel) -> list[str]:
    return [line.strip() for line in repr(k).splitlines()]


def around_syncs(k: ir.Kernel) -> list[tuple[str, str]]:
    """(statement before, statement after) each ``sync block`` of the listing."""
    lines = listing(k)
    return [(lines[i - 1], lines[i + 1]) for i, line in enumerate(lines) if line == "sync block"]


# ---------------------------------------------------------------- the node


def test_sync_prints_verifies_and_rejects_unknown_scopes():
    k = staged_sum().ir
    s = ir.Sync()
    assert repr(s) == "sync block"
    synced = k.with_body(ir.Seq((s, k.body)))
    verify(synced)
    assert "  sync block" in repr(synced).splitlines()
    with pytest.raises(ir.KernelError, match="barrier scope"):
        verify(k.with_body(ir.Seq((ir.Sync("grid"), k.body))))


def test_sync_is_a_no_op_for_the_interpreter_and_the_cpu_renderer():
    k = staged_sum().ir
    synced = barriers.insert_barriers(k)
    assert barriers.syncs(synced)
    x = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    want, got = np.zeros(64, np.float32), np.zeros(64, np.float32)
    Interpreter(k).run([x, want], [], (1,))
    Interpreter(synced).run([x, got], [], (1,))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, 2 * x[:, ::-1].sum(axis=0))
    cpu = CpuRenderer()
    assert cpu.render(synced, Target("cpu")).source == cpu.render(k, Target("cpu")).source


# ---------------------------------------------------------------- the generic pass


def test_generic_pass_syncs_before_reads_after_writes_and_writes_after_reads():
    k = barriers.insert_barriers(staged_sum().ir)
    verify(k)
    lines = listing(k)
    loop = lines.index("for r in serial(0, +4):")
    write = next(i for i, line in enumerate(lines) if line.startswith("S[i] ="))
    read = next(i for i, line in enumerate(lines) if "+ S[(63 - " in line)
    # the write waits for the previous iteration's reads, the read for this iteration's write
    assert lines[write - 2] == "sync block" and lines[write - 1].startswith("for i in parallel")
    assert lines[read - 2] == "sync block" and lines[read - 1].startswith("for i_1 in parallel")
    assert loop < write - 2
    assert len(barriers.syncs(k)) == 2


def test_generic_pass_syncs_an_overwrite_of_tiles_other_threads_still_read():
    k = barriers.insert_barriers(overwrite().ir)
    got = [(before.split(" =")[0], after) for before, after in around_syncs(k)]
    assert got == [("S[i]", "for i_1 in parallel(64,):"),  # read after write
                   ("Y[i_1]", "for i_2 in parallel(64,):"),  # write after read
                   ("S[i_2]", "for i_3 in parallel(64,):")]  # read after write
    x = np.arange(64, dtype=np.float32)
    y, z = np.zeros(64, np.float32), np.zeros(64, np.float32)
    Interpreter(k).run([x, y, z], [], (1,))
    np.testing.assert_array_equal(z, 2 * x[::-1])


def test_generic_pass_inserts_nothing_without_a_hazard():
    k = no_hazard().ir
    assert barriers.insert_barriers(k) is k
    k2 = barriers.insert_barriers(reads_only().ir)
    assert len(barriers.syncs(k2)) == 1  # write -> read; read -> read needs none
    (before, after), = around_syncs(k2)
    assert before.startswith("S[i] = ") and after.startswith("for i_1 in parallel")


def test_generic_pass_is_idempotent_and_keeps_untouched_nodes():
    k = staged_sum().ir
    once = barriers.insert_barriers(k)
    assert barriers.insert_barriers(once) is once
    # statements that got no barrier are the very same objects
    olds = {id(n) for n in ir.walk(k.body) if isinstance(n, (ir.Store, ir.Copy, ir.Fill))}
    news = {id(n) for n in ir.walk(once.body) if isinstance(n, (ir.Store, ir.Copy, ir.Fill))}
    assert olds == news


def test_generic_pass_orders_branches_by_the_union_of_their_effects():
    @T.prim_func
    def kf_branch(X: T.Tensor((64,), "float32"), n: T.int32, Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            S = T.alloc_shared((64,), "float32")
            if n > 0:
                for i in T.Parallel(64):
                    S[i] = X[i]
            for i in T.Parallel(64):
                Y[i] = S[63 - i]
    k = barriers.insert_barriers(kf_branch.ir)
    (before, after), = around_syncs(k)  # the write in one branch still orders the read after it
    assert before.startswith("S[i] = ") and after.startswith("for i_1 in parallel")


# ---------------------------------------------------------------- the CUDA pass


def _barrier_count(src: str) -> int:
    return src.count("__syncthreads();")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cuda_renderer_emits_exactly_the_pass_syncs(arch):
    """Without the pass (its step replaced by the identity) the renderer emits no hazard barrier
    at all: it decides none itself."""
    pf = staged_sum()
    src = render_cuda(pf.ir, arch).source
    lowered = CudaRenderer().lower(pf.ir, Target("cuda", arch))[0]
    assert _barrier_count(src) == len(barriers.syncs(lowered)) == 2

    class NoBarriers(CudaRenderer):
        def pipeline(self, kernel, target):
            return tuple(p for p in super().pipeline(kernel, target) if getattr(p, "__name__", "") != "cuda_barriers")

    assert _barrier_count(NoBarriers().render(pf.ir, Target("cuda", arch)).source) == 0


def test_cuda_pass_charges_fragments_the_layout_plan_stages_in_shared_memory():
    """``acc`` is read at another element (``n - 1 - i``): the planner stages it in shared memory,
    so the CUDA pass (unlike the scope-only generic one) orders its write and its read."""
    @T.prim_func
    def kf_staged_fragment(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            acc = T.alloc_fragment((64,), "float32")
            for i in T.Parallel(64):
                acc[i] = X[i]
            for i in T.Parallel(64):
                Y[i] = acc[63 - i]
    k = kf_staged_fragment.ir
    assert not barriers.syncs(barriers.insert_barriers(k))
    lowered = cuda_barriers.insert_cuda_barriers(k, wgmma=False, tma=False)
    assert len(barriers.syncs(lowered)) == 1
    assert _barrier_count(render_cuda(k, "sm_80").source) == 1


def test_cuda_pipelined_ring_keeps_its_structural_barrier_and_syncs_before_the_loop():
    pf = gemm(256, 256, 256, bm=64, bn=64, bk=32, stages=3)
    lowered = CudaRenderer().lower(pf.ir, Target("cuda", "sm_80"))[0]
    src = render_cuda(pf.ir, "sm_80").source
    # one Sync: the epilogue... none before the ring (nothing pending), the ring's own barrier stays
    ring_barrier = src.index("kf::cp_async_wait<1>();")
    assert "__syncthreads();" in src[ring_barrier:ring_barrier + 80]
    assert _barrier_count(src) == len(barriers.syncs(lowered)) + 1


def _plans(k, wgmma):
    layouts = plan_layouts(k, wgmma)
    return layouts, plan_pipelines(k, layouts.staged)


def _library_kernels():
    from kernforge.kernels import registry

    out = []
    for name, spec in sorted(registry.all_specs().items()):
        label, problem = sorted(spec.problems.items())[0]
        out.append(pytest.param(lambda spec=spec, problem=problem: spec.factory(**problem.params).ir,
                                id=f"{name}/{label}"))
    return out


@pytest.mark.parametrize("make", [pytest.param(lambda: gemm().ir, id="gemm"),
                                  pytest.param(lambda: scores_softmax().ir, id="scores_softmax"),
                                  pytest.param(lambda: scan_and_total().ir, id="scan_and_total")]
                         + _library_kernels())
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_cuda_pass_leaves_the_layout_and_pipeline_plans_unchanged(make, arch):
    """The analyses after the pass plan the kernel with Syncs as the pass planned it without."""
    wgmma = arch == "sm_90a"
    renderer, target = CudaRenderer(), Target("cuda", arch)
    steps = renderer.pipeline(make(), target)
    transforms = [p for p in steps if callable(p) and getattr(p, "__name__", "") != "cuda_barriers"
                  and not hasattr(p, "fn")]
    k = run_pipeline(make(), transforms, native=renderer.native(make(), target))
    after = cuda_barriers.insert_cuda_barriers(k, wgmma, tma=wgmma)
    (l0, p0), (l1, p1) = _plans(k, wgmma), _plans(after, wgmma)
    assert l0.registers == l1.registers and l0.staged == l1.staged and l0.core_tiles == l1.core_tiles
    assert list(l0.gemm_kind.items()) == list(l1.gemm_kind.items())  # gemms keep their identity
    assert list(p0.prefetch.values()) == list(p1.prefetch.values()) and p0.stages == p1.stages


def test_cuda_pass_syncs_before_a_copy_or_reduction_into_thread_local_storage():
    """The renderer runs these as loop nests in every thread; the Sync goes in front of the
    statement (the renderer used to put its barrier inside the nest, once per iteration)."""
    @T.prim_func
    def kf_local_copy(X: T.Tensor((64,), "float32"), Y: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            S = T.alloc_shared((64,), "float32")
            L = T.alloc_local((64,), "float32")
            R = T.alloc_local((1,), "float32")
            for i in T.Parallel(64):
                S[i] = X[i]
            T.copy(S, L)
            for i in T.Parallel(64):
                S[i] = X[i] * 2.0
            T.reduce_sum(S, R, dim=0)
            Y[0] = R[0] + L[3]
    lowered = CudaRenderer().lower(kf_local_copy.ir, Target("cuda", "sm_80"))[0]
    after = [a for _, a in around_syncs(lowered)]
    assert after == ["copy S[0:+64] -> L[0:+64]", "for i_1 in parallel(64,):", "reduce_sum S -> R dim=0 clear=True"]
    src = render_cuda(kf_local_copy.ir, "sm_80").source
    assert all(line.startswith("    __syncthreads") for line in src.splitlines() if "__syncthreads" in line)
