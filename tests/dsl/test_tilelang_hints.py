"""TileLang's optional hints are honoured, recorded in the IR, or rejected -- never dropped.

Per hint (``docs/tilelang-hints.md``):

* ``T.gemm(policy=)``: recorded (``ir.Gemm.policy``, printed listing) and honoured by the
  CUDA layout planner (the accumulator's warp split), checked on host emulation;
* ``T.gemm(k_pack=)`` != 1, ``T.gemm(wg_wait=)`` != 0: rejected;
* ``T.copy(disable_tma=True)``: recorded (``ir.Copy.disable_tma``) and honoured (the loop's
  ring is cp.async on sm_90a); ``coalesced_width``, ``eviction_policy`` other than
  "evict_normal": rejected; unknown keywords: TypeError;
* ``T.Pipelined(order=, stage=)``: rejected;
* ``alloc_*(scope=)``: the scopes meaning that allocation are accepted, others rejected.

Every rejection is a ``KernelError`` raised while tracing, at the author's line.
"""
from __future__ import annotations

import inspect

import pytest

import kernforge.dsl as T
from kernforge.backends.cuda.renderer import CudaRenderer, render_cuda
from kernforge.codegen import ir
from kernforge.codegen.renderer import Target


def _line_of(fn, needle: str) -> int:
    src, start = inspect.getsourcelines(fn)
    for off, line in enumerate(src):
        if needle in line:
            return start + off
    raise AssertionError(needle)


def _gemm(M=128, N=128, K=64, bm=64, bn=64, bk=32, threads=256, stages=2, policy=None,
          copy_hints=None, dtype="bfloat16", out="float32"):
    copy_hints = copy_hints or {}

    @T.prim_func
    def kf_test_hint_gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, k * bk], A_s, **copy_hints)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f, policy=policy)
            T.copy(C_f, C[by * bm, bx * bn])
    return kf_test_hint_gemm


def _nodes(pf, cls):
    return [n for n in ir.walk(pf.ir.body) if isinstance(n, cls)]


def _warps(pf, arch) -> tuple[int, int, str]:
    """(wm, wn, gemm kind) the CUDA layout planner chose for the gemm's accumulator."""
    _, facts = CudaRenderer().lower(pf.ir, Target("cuda", arch))
    plan = facts["layouts"]
    (g, kind), = plan.gemm_kind.items()
    lay = plan.registers[g.c.buffer]
    return lay.wm, lay.wn, kind


def _raises(build, mark: str, cls=T.HintError, *needles):
    """``build()`` raises ``cls`` while tracing, at the line marked ``# MARK <mark>``."""
    with pytest.raises(cls) as ei:
        build()
    err = ei.value
    assert isinstance(err, ir.KernelError)
    assert err.loc is not None and err.loc.file == __file__
    assert err.loc.line == _line_of(build, f"# MARK {mark}")
    for n in needles:
        assert n in err.message, (n, err.message)
    return err


# ---------------------------------------------------------------- T.gemm(policy=)


def test_gemm_policy_default_is_absent_from_ir_and_listing():
    pf = _gemm()
    (g,) = _nodes(pf, ir.Gemm)
    assert g.policy is None
    assert "policy" not in str(pf.ir)


@pytest.mark.parametrize("spelling", [T.GemmWarpPolicy.FullCol, "FullCol", 2])
def test_gemm_policy_is_recorded_in_ir_and_listing(spelling):
    pf = _gemm(policy=spelling)
    (g,) = _nodes(pf, ir.Gemm)
    assert g.policy is T.GemmWarpPolicy.FullCol
    assert "policy=FullCol)" in str(pf.ir)


def test_gemm_policy_survives_the_cuda_passes():
    _, facts = CudaRenderer().lower(_gemm(policy=T.GemmWarpPolicy.Square).ir, Target("cuda", "sm_80"))
    assert [g.policy for g in facts["layouts"].gemm_kind] == [T.GemmWarpPolicy.Square]


def test_gemm_policy_takes_tilelang_positional_order():
    @T.prim_func
    def main(A: T.Tensor((64, 32), "float16"), B: T.Tensor((32, 64), "float16")):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_shared((64, 32), "float16")
            b = T.alloc_shared((32, 64), "float16")
            c = T.alloc_fragment((64, 64), "float32")
            T.gemm(a, b, c, False, False, T.GemmWarpPolicy.FullRow, True)
    (g,) = _nodes(main, ir.Gemm)
    assert g.policy is T.GemmWarpPolicy.FullRow and g.clear_accum is True


@pytest.mark.parametrize("arch,shape,policy,expect", [
    # 8 warps on a 64x64 tile: kernforge's default is as many along M as fit (as FullRow)
    ("sm_80", (64, 64), None, (4, 2, "mma")),
    ("sm_80", (64, 64), T.GemmWarpPolicy.FullRow, (4, 2, "mma")),
    ("sm_80", (64, 64), T.GemmWarpPolicy.FullCol, (1, 8, "mma")),
    # 64x128: per-warp 16x64 by default, 32x32 when square
    ("sm_80", (64, 128), None, (4, 2, "mma")),
    ("sm_80", (64, 128), T.GemmWarpPolicy.Square, (2, 4, "mma")),
    # wgmma needs whole warpgroups along M: FullCol still gets 4 warps along M
    ("sm_90a", (128, 64), None, (8, 1, "wgmma")),
    ("sm_90a", (128, 64), T.GemmWarpPolicy.FullCol, (4, 2, "wgmma")),
    ("sm_90a", (64, 64), T.GemmWarpPolicy.FullCol, (4, 2, "wgmma")),
])
def test_gemm_policy_sets_the_cuda_warp_split(arch, shape, policy, expect):
    bm, bn = shape
    pf = _gemm(M=bm * 2, N=bn * 2, bm=bm, bn=bn, policy=policy)
    assert _warps(pf, arch) == expect
    src = render_cuda(pf.ir, arch).source
    assert f"kf_wr = kf_warp % {expect[0]}, kf_wc = kf_warp / {expect[0]};" in src


def test_gemm_default_and_full_row_render_the_same_cuda():
    for arch in ("sm_80", "sm_90a"):
        base = render_cuda(_gemm().ir, arch).source
        assert render_cuda(_gemm(policy=T.GemmWarpPolicy.FullRow).ir, arch).source == base
        assert render_cuda(_gemm(policy=T.GemmWarpPolicy.FullCol).ir, "sm_80").source != \
            render_cuda(_gemm().ir, "sm_80").source


@pytest.fixture(scope="module")
def emu():
    from kernforge import backends

    try:
        backends.get("cuda-emu")
    except backends.BackendError as e:
        pytest.skip(f"cuda-emu backend unavailable: {e}")


@pytest.mark.parametrize("arch,shape,policy", [
    ("sm_80", (64, 64), T.GemmWarpPolicy.FullCol),
    ("sm_80", (64, 128), T.GemmWarpPolicy.Square),
    ("sm_90a", (128, 64), T.GemmWarpPolicy.FullCol),
])
def test_gemm_policy_results_on_cuda_emulation(emu, arch, shape, policy):
    import torch

    import kernforge

    torch.manual_seed(3)
    bm, bn = shape
    M, N, K = bm + 16, bn + 8, 48  # ragged edge tiles too
    pf = _gemm(M=M, N=N, K=K, bm=bm, bn=bn, bk=16, policy=policy)
    k = kernforge.compile(pf, backend="cuda-emu", arch=arch)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    c = torch.full((M, N), float("nan"))
    k(a, b, c)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("value", ["Diagonal", 7, True, 1.0])
def test_gemm_policy_rejects_what_is_not_a_warp_policy(value):
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 32), "float16")):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared((64, 32), "float16")
                b = T.alloc_shared((32, 64), "float16")
                c = T.alloc_fragment((64, 64), "float32")
                T.gemm(a, b, c, policy=value)  # MARK policy
        return main
    err = _raises(build, "policy", T.HintError, "policy=", "T.GemmWarpPolicy.FullCol")
    assert isinstance(err, ValueError)


def test_gemm_flag_given_a_policy_positionally_in_the_wrong_slot_is_rejected():
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 32), "float16")):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared((64, 32), "float16")
                b = T.alloc_shared((32, 64), "float16")
                c = T.alloc_fragment((64, 64), "float32")
                T.gemm(a, b, c, False, T.GemmWarpPolicy.Square)  # MARK flag
        return main
    _raises(build, "flag", T.HintError, "transpose_B", "policy=")


# ---------------------------------------------------------------- T.gemm(k_pack=, wg_wait=)


@pytest.mark.parametrize("kw,value", [("k_pack", 2), ("k_pack", True), ("wg_wait", 1), ("wg_wait", -1)])
def test_gemm_k_pack_and_wg_wait_are_rejected(kw, value):
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 32), "float16")):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared((64, 32), "float16")
                b = T.alloc_shared((32, 64), "float16")
                c = T.alloc_fragment((64, 64), "float32")
                T.gemm(a, b, c, **{kw: value})  # MARK gemm
        return main
    err = _raises(build, "gemm", T.HintError, f"{kw}={value!r}", "not supported")
    assert isinstance(err, ValueError)


def test_gemm_default_k_pack_and_wg_wait_are_accepted():
    @T.prim_func
    def main(A: T.Tensor((64, 32), "float16")):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_shared((64, 32), "float16")
            b = T.alloc_shared((32, 64), "float16")
            c = T.alloc_fragment((64, 64), "float32")
            T.gemm(a, b, c, k_pack=1, wg_wait=0)
    assert len(_nodes(main, ir.Gemm)) == 1


# ---------------------------------------------------------------- T.copy(**hints)


def test_copy_disable_tma_is_recorded_in_ir_and_listing():
    pf = _gemm(copy_hints={"disable_tma": True})
    flags = [c.disable_tma for c in _nodes(pf, ir.Copy)]
    assert flags == [True, False, False]
    assert str(pf.ir).count("(disable_tma=True)") == 1
    plain = _gemm(copy_hints={"disable_tma": False})
    assert not any(c.disable_tma for c in _nodes(plain, ir.Copy))
    assert "disable_tma" not in str(plain.ir)


def test_copy_disable_tma_keeps_the_pipeline_on_cp_async():
    with_tma = render_cuda(_gemm().ir, "sm_90a")
    assert with_tma.tensor_maps and "kf::tma_load_" in with_tma.source
    without = render_cuda(_gemm(copy_hints={"disable_tma": True}).ir, "sm_90a")
    # the hint is on A's load: the pipeline's loads move to cp.async; only the epilogue's
    # TMA store (its own copy, not hinted) may keep a tensor map
    assert "kf::tma_load_" not in without.source and "cp_async" in without.source
    assert all(m.name.startswith("kf_tmap_store_") for m in without.tensor_maps)


def test_copy_eviction_normal_is_accepted():
    pf = _gemm(copy_hints={"eviction_policy": "evict_normal"})
    assert len(_nodes(pf, ir.Copy)) == 3


@pytest.mark.parametrize("hints,needles", [
    ({"coalesced_width": 4}, ("coalesced_width=4", "not supported")),
    ({"eviction_policy": "evict_first"}, ("eviction_policy='evict_first'", "not supported")),
    ({"eviction_policy": "evict_last"}, ("eviction_policy='evict_last'", "not supported")),
    ({"eviction_policy": "evict_sometimes"}, ("eviction_policy='evict_sometimes'", "evict_normal")),
    ({"disable_tma": "yes"}, ("disable_tma", "True or False")),
])
def test_copy_hints_kernforge_cannot_honour_are_rejected(hints, needles):
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 32), "float16")):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared((64, 32), "float16")
                T.copy(A[0, 0], a, **hints)  # MARK copy
        return main
    err = _raises(build, "copy", T.HintError, *needles)
    assert isinstance(err, ValueError)


def test_copy_unknown_keyword_is_a_type_error_naming_it():
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 32), "float16")):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared((64, 32), "float16")
                T.copy(A[0, 0], a, disable_tmaa=True, swizzle=1)  # MARK copy
        return main
    err = _raises(build, "copy", T.UnknownHintError, "'disable_tmaa'", "'swizzle'")
    assert isinstance(err, TypeError)


# ---------------------------------------------------------------- T.Pipelined(order=, stage=)


@pytest.mark.parametrize("kw", [{"order": [0, 1, 2]}, {"stage": [0, 0, 1]},
                                {"order": [0, 1, 2], "stage": [0, 0, 1]}])
def test_pipelined_schedule_hints_are_rejected(kw):
    def build():
        @T.prim_func
        def main(A: T.Tensor((64, 32), "float16")):
            with T.Kernel(1, threads=128) as bx:
                a = T.alloc_shared((16, 32), "float16")
                for k in T.Pipelined(4, num_stages=2, **kw):  # MARK loop
                    T.copy(A[k * 16, 0], a)
        return main
    err = _raises(build, "loop", T.HintError, *(f"{n}=" for n in kw), "num_stages")
    assert isinstance(err, ValueError)


def test_pipelined_without_schedule_hints_is_unchanged():
    (loop,) = [n for n in ir.walk(_gemm(stages=3).ir.body) if isinstance(n, ir.For)]
    assert loop.kind == ir.LoopKind.PIPELINED and loop.num_stages == 3


# ---------------------------------------------------------------- alloc_*(scope=)


def test_scopes_that_match_the_allocation_are_accepted():
    @T.prim_func
    def main(A: T.Tensor((16,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            s1 = T.alloc_shared((16,), "float32", scope="shared")
            s2 = T.alloc_shared((16,), "float32", scope="shared.dyn")
            f = T.alloc_fragment((16,), "float32", scope="local.fragment")
            lo = T.alloc_local((2,), "float32", scope="local")
            v1 = T.alloc_var("int32", scope="local.var")
            v2 = T.alloc_var("int32", init=3, scope="local")
    scopes = {n.buffer.name: n.buffer.scope for n in ir.walk(main.ir.body) if isinstance(n, ir.Allocate)}
    assert scopes == {"s1": ir.Scope.SHARED, "s2": ir.Scope.SHARED, "f": ir.Scope.FRAGMENT,
                      "lo": ir.Scope.LOCAL, "v1": ir.Scope.LOCAL, "v2": ir.Scope.LOCAL}


@pytest.mark.parametrize("fn,scope,needles", [
    ("alloc_shared", "local.fragment", ("T.alloc_shared(scope='local.fragment')", "T.alloc_fragment")),
    ("alloc_shared", "local", ("contradicts", "T.alloc_local")),
    ("alloc_fragment", "shared.dyn", ("contradicts", "T.alloc_shared")),
    ("alloc_fragment", "local", ("contradicts", "'local.fragment'")),
    ("alloc_local", "shared", ("contradicts", "T.alloc_shared")),
    ("alloc_var", "local.fragment", ("contradicts", "T.alloc_fragment")),
    ("alloc_shared", "global", ("global",)),
    ("alloc_shared", "texture", ("'texture'", "not a scope")),
    ("alloc_fragment", None, ("scope=None",)),
])
def test_scopes_that_contradict_the_allocation_are_rejected(fn, scope, needles):
    def build():
        @T.prim_func
        def main(A: T.Tensor((16,), "float32")):
            with T.Kernel(1, threads=32) as bx:
                if fn == "alloc_var":
                    T.alloc_var("int32", scope=scope)  # MARK alloc
                else:
                    getattr(T, fn)((16,), "float32", scope=scope)  # MARK alloc
        return main
    with pytest.raises(T.HintError) as ei:
        build()
    err = ei.value
    assert isinstance(err, ValueError) and err.loc is not None and err.loc.file == __file__
    src, start = inspect.getsourcelines(build)
    marked = {start + i for i, line in enumerate(src) if "# MARK alloc" in line}
    assert err.loc.line in marked
    for n in needles:
        assert n in err.message, (n, err.message)
