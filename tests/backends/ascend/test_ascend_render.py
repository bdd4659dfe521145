"""The Ascend C renderer and its toolchain glue: what `emit --backend ascend` prints for each
arch, the render-time capacity checks, the copy and vector lowering decisions, typed errors for
what is not lowered, `kernforge build --backend ascend`, the bisheng command lines (tested as
command lines through a stand-in bisheng), a real bisheng build when one is installed, and the
ACL host launcher against ACL headers when some are available."""
from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess

import pytest

import kernforge.dsl as T
from kernforge import backends, cli, runtime
from kernforge.backends.ascend import backend as ascend
from kernforge.backends.ascend.renderer import ARCHS, AscendCapacityError, AscendRenderError, arch_info
from kernforge.codegen.renderer import Target
from kernforge.kernels.registry import get
from kernforge.kernels.topk import topk_select
from kernforge.runtime.compilers.bisheng import arch_options


def _small_topk():
    spec = get("topk_fp32")
    return spec.factory(**spec.problems["small"].params).ir


def test_emit_prints_ascend_c_for_both_archs(capsys):
    assert cli.main(["emit", "topk_fp32", "--backend", "ascend", "--problem", "small"]) == 0
    c220 = capsys.readouterr().out
    assert cli.main(["emit", "topk_fp32", "--backend", "ascend", "--problem", "small", "--arch", "950"]) == 0
    c3510 = capsys.readouterr().out
    for src in (c220, c3510):
        assert '#include "kernel_operator.h"' in src
        assert 'extern "C" __global__ __aicore__ void kf_topk_select_kernel(GM_ADDR kf_gm_x' in src
        assert "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);" in src
        assert "AscendC::TBuf<AscendC::TPosition::VECCALC> kf_ub;" in src
        assert "kf::fill(hist" in src  # T.clear of a whole int32 tile: Duplicate
    assert "dav-c220, __NPU_ARCH__ 2201" in c220 and "of 196608 bytes" in c220
    assert "dav-3510, __NPU_ARCH__ 3510" in c3510 and "of 253952 bytes" in c3510


def test_arch_names_and_aliases():
    assert arch_info(None).name == "dav-c220" and arch_info("2201").npu_arch == 2201
    assert arch_info("dav-c310").name == "dav-3510" and ARCHS["dav-3510"].l0c == 256 * 1024
    with pytest.raises(ValueError, match="unknown arch 'sm_90a'"):
        arch_info("sm_90a")


def test_a_tile_beyond_ub_is_a_typed_error_naming_the_buffer_per_arch():
    # the GPU configuration of k = 1024: over 910B's UB, inside 950's
    from kernforge.kernels.topk import config

    kernel = topk_select(**config.choose("cuda", 1024, "float32", "int64", True, True)).ir
    b = backends.get("ascend")
    with pytest.raises(AscendCapacityError) as e:
        b.render(kernel, Target("ascend", "dav-c220"))
    assert e.value.memory == "UB" and e.value.capacity == 196608 and e.value.needed > 196608
    assert f"buffer {e.value.buffer!r} ends past the end of UB" in str(e.value)
    assert b.render(kernel, Target("ascend", "dav-3510")).ub_bytes == e.value.needed


def test_one_huge_tile_is_named():
    N = T.symbolic("N")

    @T.prim_func
    def big(X: T.Tensor((N, 1024), "float32")):
        with T.Kernel(1, threads=32) as bx:
            huge_tile = T.alloc_shared((64, 1024), "float32")
            T.copy(X[0, 0], huge_tile)
            T.copy(huge_tile, X[0, 0])

    with pytest.raises(AscendCapacityError, match="'huge_tile'") as e:
        backends.get("ascend").render(big.ir, Target("ascend", "dav-3510"))
    assert e.value.needed == 262144 and e.value.capacity == 253952
    assert e.value.loc is not None and e.value.loc.file.endswith("test_ascend_render.py")  # the alloc's line


def _copy_kernel(cols: int, start_row: int):
    M = T.symbolic("M")

    @T.prim_func
    def copy_rows(X: T.Tensor((M, cols), "float32"), Y: T.Tensor((M, cols), "float32")):
        with T.Kernel(T.ceildiv(M, 2), threads=32) as bx:
            t = T.alloc_shared((4, cols), "float32")
            T.copy(X[bx * 2, 0], t[start_row:start_row + 2, :])
            T.copy(t[start_row:start_row + 2, :], Y[bx * 2, 0])
    return copy_rows


def test_copies_are_dma_only_where_the_32_byte_rules_hold():
    b = backends.get("ascend")
    aligned = b.source(_copy_kernel(8, 2).ir)  # rows of 32 bytes, start at byte 64
    assert aligned.count("kf::copy_in(t[16], X[") == 1 and aligned.count("kf::copy_out(Y[") == 1
    unaligned = b.source(_copy_kernel(7, 1).ir)  # 28-byte rows: element loops on the scalar unit
    assert "kf::copy_in" not in unaligned and "kf::copy_out" not in unaligned
    assert "t.SetValue(" in unaligned and "X.GetValue(" in unaligned


def test_a_gemm_off_the_cube_path_is_a_typed_error_at_the_author_line():
    M = T.symbolic("M")

    @T.prim_func
    def mm(A: T.Tensor((M, 8), "float16"), B: T.Tensor((8, 16), "float16"), C: T.Tensor((M, 16), "float32")):
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            a = T.alloc_shared((16, 8), "float16")
            bb = T.alloc_shared((8, 16), "float16")
            c = T.alloc_fragment((16, 16), "float32")
            T.copy(A[bx * 16, 0], a)
            T.copy(B[0, 0], bb)
            T.gemm(a, bb, c, clear_accum=True)  # K = 8: half a fractal row
            T.copy(c, C[bx * 16, 0])

    with pytest.raises(AscendRenderError, match="K=8: the cube path needs K a multiple of 16") as e:
        backends.get("ascend").render(mm.ir)
    assert e.value.loc is not None and e.value.loc.file.endswith("test_ascend_render.py")
    assert "K a multiple of 16" in backends.get("ascend-emu").unsupported(mm.ir)


def test_the_ascend_backend_renders_but_does_not_launch():
    b = backends.get("ascend")
    assert backends.device("ascend") == "npu" and backends.lang("ascend-emu") == "ascend-c"
    with pytest.raises(backends.BackendError, match="ascend-emu"):
        b.target(launch=True)
    with pytest.raises(backends.BackendError):
        b.build(_small_topk())


def test_build_reports_per_buffer_usage(capsys, monkeypatch):
    monkeypatch.setenv("KERNFORGE_JIT_BISHENG", "/nonexistent/bisheng")
    assert cli.main(["build", "topk_fp32", "--backend", "ascend", "--problem", "small", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["UB used"] == "34048 / 196608 bytes" and report["L0C used"] == "0 / 131072 bytes"
    assert report["UB cand_key"] == "1280 bytes at 24576"
    assert report["compiled"].startswith("no: bisheng not found")


# ---------------------------------------------------------------- bisheng


def test_bisheng_arch_options():
    assert arch_options("dav-c220") == ("-xasc", "--npu-arch=dav-2201")
    assert arch_options("dav-3510") == ("-xasc", "--npu-arch=dav-3510")
    assert arch_options("dav-c220", legacy=True) == ("-xcce", "--cce-aicore-arch=dav-c220-vec", "--cce-aicore-only")
    assert arch_options("dav-3510", legacy=True)[1] == "--cce-aicore-arch=dav-c310-vec"
    with pytest.raises(ValueError, match="unknown arch"):
        arch_options("sm_90a")


@pytest.fixture
def fake_bisheng(tmp_path, monkeypatch):
    """A stand-in bisheng that records its command line, answers the probes with g++'s and
    writes an empty object, so the real compile path runs without CANN."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("the stand-in bisheng answers its probes with g++, which is not on PATH")
    log = tmp_path / "argv.log"
    tool = tmp_path / "bisheng"
    tool.write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  *"-E -v"*) exec {gxx} "$@" ;;
  --version) echo "bisheng (stand-in) 0.0"; exit 0 ;;
esac
: > kernel.o
echo "kernel.o: kernel.cpp" > kernel.d
""")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KERNFORGE_JIT_BISHENG", str(tool))
    runtime.reset()
    yield log
    runtime.reset()


@pytest.mark.parametrize("arch, npu_arch", [("dav-c220", "dav-2201"), ("dav-3510", "dav-3510")])
def test_bisheng_command_line_per_arch(fake_bisheng, arch, npu_arch):
    report = backends.get("ascend").build_report(_small_topk(), arch)
    assert report["compiled"].endswith("kernel.o")
    compile_line = [l for l in fake_bisheng.read_text().splitlines() if "kernel.cpp" in l][-1].split()
    want = ["-O2", "-std=c++17", "-fPIC", "-c", "-xasc", f"--npu-arch={npu_arch}",
            f"-D__NPU_ARCH__={arch_info(arch).npu_arch}"]
    assert compile_line[:len(want)] == want
    assert f"-I{os.path.abspath(ascend.INCLUDE_DIR)}" in compile_line
    assert compile_line[-5:] == ["-MF", "kernel.d", "-o", "kernel.o", "kernel.cpp"]


@pytest.mark.skipif(ascend.bisheng_available() is None,
                    reason="bisheng is not installed (KERNFORGE_JIT_BISHENG / $ASCEND_HOME_PATH / PATH): "
                           "the real device compile of the Ascend C source is skipped")
@pytest.mark.parametrize("arch", ["dav-c220", "dav-3510"])
def test_real_bisheng_compiles_the_source(arch):
    report = backends.get("ascend").build_report(_small_topk(), arch)
    assert os.path.getsize(report["compiled"]) > 0


def _acl_include():
    """ACL headers: $KERNFORGE_ACL_INCLUDE, or an installed torch_npu (its wheel ships include/acl)."""
    found = os.environ.get("KERNFORGE_ACL_INCLUDE")
    if found:
        return found
    spec = importlib.util.find_spec("torch_npu")
    if spec and spec.submodule_search_locations:
        inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
        if os.path.exists(os.path.join(inc, "acl", "acl.h")):
            return inc
    return None


@pytest.mark.skipif(_acl_include() is None,
                    reason="no ACL headers: set KERNFORGE_ACL_INCLUDE to torch_npu/include (torch-npu's wheel "
                           "ships acl/acl.h) to check the host launcher")
@pytest.mark.parametrize("kernel", ["topk", "mix_gemm"])
def test_the_acl_host_launcher_compiles_against_acl_headers(tmp_path, kernel):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on PATH")
    if kernel == "topk":  # a vector-only kernel
        ir_kernel = _small_topk()
    else:  # a MIX kernel: its launcher carries the GM workspace of the cube hand-off
        spec = get("bf16_gemm_nt")
        ir_kernel = spec.factory(**spec.problems["small"].params).ir
    program = backends.get("ascend").render(ir_kernel)
    host = tmp_path / "host.cpp"
    host.write_text(ascend.host_source(program))
    text = host.read_text()
    assert "aclrtLaunchKernel(kf_function, num_blocks, args, sizeof(*args), stream)" in text
    assert ("void* kf_gm_workspace;" in text) == (kernel == "mix_gemm")
    subprocess.run([gxx, "-std=c++17", "-fsyntax-only", f"-I{_acl_include()}", str(host)], check=True)
