"""The CPU renderer's output, read as text (no compiler needed).

These pin down the code shapes the performance of generated kernels depends
on: an OpenMP grid, unmasked fast paths, SIMD inner loops, plain ``/`` on
non-negative index math, per-thread arena placement of big tiles, compile-time
tile shapes in helper calls, and real atomics only on global memory.
"""
from __future__ import annotations

import re

import jinja2
import pytest

import kernforge.dsl as T
from kernforge.codegen import ir
from kernforge.backends.cpu import renderer as cpu
from kernforge.backends.cpu.renderer import CpuRenderer
from kernforge.codegen.renderer import NameTable, Target


def render(pf, arch: str = "avx512bf16") -> str:
    """The source for one instruction-set path (fixed, so the text does not depend on the machine)."""
    return CpuRenderer().render(pf.ir, Target("cpu", arch)).source


def gemm(trans_a=False, trans_b=False):
    M, N, K = T.symbolic("M"), 256, 128

    @T.prim_func
    def main(A: T.Tensor((K, M) if trans_a else (M, K), "bfloat16"),
             B: T.Tensor((N, K) if trans_b else (K, N), "bfloat16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(N // 64, T.ceildiv(M, 32), threads=128) as (bx, by):
            a_s = T.alloc_shared((32, 32) if trans_a else (32, 32), "bfloat16")
            b_s = T.alloc_shared((64, 32) if trans_b else (32, 64), "bfloat16")
            acc = T.alloc_fragment((32, 64), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // 32, num_stages=2):
                T.copy(A[k * 32, by * 32] if trans_a else A[by * 32, k * 32], a_s)
                T.copy(B[bx * 64, k * 32] if trans_b else B[k * 32, bx * 64], b_s)
                T.gemm(a_s, b_s, acc, transpose_A=trans_a, transpose_B=trans_b)
            T.copy(acc, C[by * 32, bx * 64])
    return main


def test_kernel_entry_grid_and_parameters():
    src = render(gemm())
    assert 'extern "C" int kf_main(void** args, const int64_t* dims) {' in src
    assert "const kf_bf16* A = static_cast<const kf_bf16*>(args[0]);" in src  # read-only -> const
    assert "float* C = static_cast<float*>(args[2]);" in src
    assert "const int32_t M = static_cast<int32_t>(dims[0]);" in src
    assert "#pragma omp parallel if (kf_grid0 * kf_grid1 > 1)" in src and "#pragma omp for collapse(2)" in src
    # blockIdx.x varies fastest, as on a GPU: by is the outer loop
    assert src.index("for (int32_t by = 0; by < kf_grid1; ++by)") < src.index("for (int32_t bx = 0; bx < kf_grid0")
    assert "((M + 31) / 32)" in src  # non-negative: plain division, no floor helper
    assert "{{" not in src and "{%" not in src


def test_copies_have_an_unmasked_fast_path_and_simd_inner_loops():
    src = render(gemm())
    # A's rows may run past M (symbolic): one whole-tile test, then the plain copy
    assert "if ((((by * 32) + 32) <= M)) {" in src
    # B is 128 x 256 with 32 x 64 tiles from a constant grid: provably in bounds, never masked (on
    # avx512bf16 the GEMM packs B from its source and the copy is gone; on avx2 it widens B to float)
    assert re.search(r"b_s\[\w+ \* 64 \+ \w+\] = \(\(float\)kf_to_float\(B\[", render(gemm(), "avx2"))
    assert not re.search(r"if \([^\n]*< 256", src)
    inner = re.findall(r"#pragma omp simd\n\s*for \(int32_t (\w+) = 0; \1 < (\d+);", src)
    assert inner and all(int(n) in (32, 64) for _, n in inner)


@pytest.mark.parametrize("arch", ["avx2", "avx512bf16"])
@pytest.mark.parametrize("trans_a,trans_b,strides", [
    (False, False, "32, 1, 64, 1, 64, 1"),
    (True, False, "1, 32, 64, 1, 64, 1"),
    # a transposed B tile is stored N-contiguous by the layout pass: the GEMM reads
    # whole vectors along N (B_RS = 64, B_CS = 1) instead of packing it per call
    (False, True, "32, 1, 64, 1, 64, 1"),
    (True, True, "1, 32, 64, 1, 64, 1"),
])
def test_gemm_call_has_static_shapes_and_transposes_by_strides(trans_a, trans_b, strides, arch):
    src = render(gemm(trans_a, trans_b), arch)
    if trans_b and arch == "avx512bf16":
        # VDPBF16PS reads a K-major bf16 B's (k, k+1) words as they are (kf::gemm_bf16_nt packs them
        # by register transposes): no orientation, and B is read in place (B_RS = 1, B_CS = 128)
        strides = strides.replace("64, 1, 64, 1", "1, 128, 64, 1")
        assert "b_s" not in src
    elif arch == "avx512bf16":
        # an N-major bf16 B is read in place too (B_RS = 256): kf::gemm_bf16_nn packs it into (k, k+1)
        # pairs from the global rows, so the tile's copy would only move the bytes once more
        strides = strides.replace("64, 1, 64, 1", "256, 1, 64, 1")
        assert "b_s" not in src
    assert f"kf::gemm<float, 32, 64, 32, {strides}, false>(" in src
    assert "kf::gemm_scratch_bytes<float, 32, 64, 32>()" in src
    assert f"#define KF_ISA {('generic', 'avx2', 'avx512', 'avx512bf16').index(arch)}" in src
    if trans_b and arch != "avx512bf16":  # the copy writes the transposed order: (n, k) of the tile at n + 64 k
        assert re.search(r"b_s\[\w+ \+ \w+ \* 64\] = ", src)


def test_bf16_operand_tiles_are_widened_once_at_the_copy_unless_the_path_multiplies_bf16():
    """On AVX2 the micro-kernel multiplies in float: the operand tiles become float at their
    copy (exact: every value came from a bf16 tensor), so the GEMM reads them directly.
    AVX512-BF16's VDPBF16PS reads bf16: the tiles stay bf16."""
    wide, narrow = render(gemm(), "avx2"), render(gemm(), "avx512bf16")
    assert "float* __restrict__ a_s" in wide and "float* __restrict__ b_s" in wide
    assert re.search(r"a_s\[[^\]]+\] = \(\(float\)kf_to_float\(A\[", wide)
    assert "kf_bf16* __restrict__ a_s" in narrow and "b_s" not in narrow  # B: read in place, packed by the GEMM


def test_big_tiles_go_to_the_arena_small_locals_to_the_stack():
    @T.prim_func
    def main(X: T.Tensor((64, 576), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=128) as bx:
            f = T.alloc_fragment((64, 576), "float32")
            r = T.alloc_fragment((64,), "float32")
            v = T.alloc_var("int32", 3)
            T.copy(X[0, 0], f)
            T.reduce_max(f, r, dim=1)
            for i in T.Parallel(64):
                Y[i] = r[i] + T.cast(v, "float32")
    src = render(main)
    assert "constexpr size_t kf_buffers_bytes = 147712;" in src  # 147456 + 256 for r
    assert "float* __restrict__ f = reinterpret_cast<float*>(kf_arena + 0);" in src
    assert "alignas(64) int32_t v[1];" in src
    assert "kf::reduce<kf::Reduce::Max, 64, 576, 1, true, float>(f, r);" in src


def test_atomics_are_real_only_on_global_memory():
    @T.prim_func
    def main(X: T.Tensor((128,), "int32"), H: T.Tensor((16,), "int32"), F: T.Tensor((1,), "float32")):
        with T.Kernel(4, threads=32) as bx:
            hist = T.alloc_shared((16,), "int32")
            T.clear(hist)
            for i in T.Parallel(32):
                T.atomic_add(hist[X[bx * 32 + i] % 16], 1)
                T.atomic_max(F[0], T.cast(X[bx * 32 + i], "float32"))
            for i in T.Parallel(16):
                T.atomic_add(H[i], hist[i])
    src = render(main)
    # one CPU thread runs a block, so the shared histogram takes a plain read-modify-write; X may
    # be negative, so its `% 16` is the floor modulo helper (C's % would index hist[-3])
    bump = "hist[kf_floormod(X[(int64_t)((bx * 32) + i)], 16)]"
    assert f"        {bump} = {bump} + 1;\n" in src
    assert "kf::atomic_max(&F[0], " in src and "kf::atomic_add(&H[" in src
    # loops holding atomics are not declared SIMD (two lanes may hit one bin)
    for block in src.split("#pragma omp simd")[1:]:
        assert "atomic" not in block.split("}")[0] and bump not in block.split("}")[0]


def test_floor_division_helpers_only_where_operands_may_be_negative():
    @T.prim_func
    def main(A: T.Tensor((64,), "int32"), O: T.Tensor((64,), "int32"), s: T.int32):
        with T.Kernel(2, threads=32) as bx:
            for i in T.Parallel(32):
                O[bx * 32 + i] = (bx * 32 + i) // 3 + A[i] // 4 + (i + s) % 5
    src = render(main)
    assert "(((bx * 32) + i) / 3)" in src
    assert "kf_floordiv(A[" in src and "kf_floormod((i + s), 5)" in src


def test_loops_if_select_cast_and_scalar_params():
    @T.prim_func
    def main(A: T.Tensor((16,), "bfloat16"), O: T.Tensor((16,), "float16"), n: T.int64, alpha: T.float32):
        with T.Kernel(1, threads=1) as bx:
            acc = T.alloc_var("float32", 0.0)
            for k in T.serial(2, n):
                acc = acc + alpha
            for u in T.unroll(4):
                acc = acc * 0.5
            if n > 3:
                for i in T.Parallel(16):
                    O[i] = T.cast(T.where(A[i] > 0, A[i], acc), "float16")
            else:
                O[0] = T.cast(acc, "float16")
    src = render(main)
    assert "const int64_t n = *static_cast<const int64_t*>(args[2]);" in src
    assert "const float alpha = *static_cast<const float*>(args[3]);" in src
    assert "const int64_t kf_end_k = n;" in src
    assert re.search(r"for \(int64_t k = [(int64_t)]*2LL\)*; k < kf_end_k; \+\+k\) \{", src)
    assert "#pragma GCC unroll 4" in src
    assert re.search(r"if \(\(n > [(int64_t)]*3LL\)*\)\) \{", src) and "} else {" in src
    assert "kf_from_float<kf_half>(" in src and "kf_to_float(A[(int64_t)i])" in src


def test_names_that_clash_with_cpp_get_a_suffix():
    @T.prim_func
    def main(delete: T.Tensor((4,), "float32"), args: T.Tensor((4,), "float32"), kf_x: T.int32):
        with T.Kernel(1, threads=1) as bx:
            for i in T.Parallel(4):
                delete[i] = args[i] + T.cast(kf_x, "float32")
    src = render(main)
    assert "float* delete_ = static_cast<float*>(args[0]);" in src
    assert "const float* args_ = static_cast<const float*>(args[1]);" in src
    assert "const int32_t kf_x_ = " in src


def test_name_table_deduplicates():
    t = NameTable()
    a, b, c = ir.Var("x"), ir.Var("x"), ir.Var("int")
    for v in (a, b, c):
        t.add(v)
    assert (t[a], t[b], t[c]) == ("x", "x_1", "int_")


def test_template_is_strict_about_missing_parameters():
    tmpl = cpu._environment().get_template(CpuRenderer.template)
    with pytest.raises(jinja2.UndefinedError):
        tmpl.render({"kernel_name": "k"})


def test_lowered_ir_is_what_gets_rendered():
    dumps = []
    CpuRenderer().render(gemm().ir, Target("cpu"), dump=lambda name, k: dumps.append((name, k)))
    transforms = [p.__name__ for p in CpuRenderer.transforms]
    transforms.insert(1, "gemm_layout")  # the operand layout pass follows the first simplify
    assert [n for n, _ in dumps] == transforms + ["names", "nonneg_vars", "memory"]
    # the analyses describe the kernel the last transform produced, and the memory plan is the arena
    *_, (_, lowered), (_, names), _, (_, memory) = dumps
    assert isinstance(lowered, ir.Kernel) and all(p in names for p in lowered.params)
    assert memory.total > 0


def test_loop_invariant_loads_are_hoisted_out_of_maps():
    @T.prim_func
    def main(KV: T.Tensor((256, 64), "bfloat16"), table: T.Tensor((4,), "int32"), O: T.Tensor((4, 32, 64), "bfloat16")):
        with T.Kernel(4, threads=32) as bx:
            s = T.alloc_shared((32, 64), "bfloat16")
            T.copy(KV[table[bx] * 32, 0], s)  # a paged copy: the page comes from memory
            for i, j in T.Parallel(32, 64):
                s[i, j] = T.where(s[i, j] > 0, s[i, j], KV[table[bx], j])  # a load only in a branch
            T.copy(s, O[bx, 0, 0])
    src = render(main)
    hoisted = re.findall(r"const auto (kf_inv\d+) = (.*);", src)
    assert hoisted and all("table[" in e for _, e in hoisted)
    # the copies index through the hoisted value; the load inside ?: stays where it is
    # the hoisted value is the whole page offset (table[bx] * 32), so each copy adds only its row
    assert {e for _, e in hoisted} == {"(table[(int64_t)bx] * 32)"}
    assert len(re.findall(r"KV\[\(int64_t\)\(kf_inv\d+ \+ t\d+_0\) \* 64 \+ \(int64_t\)t\d+_1\]", src)) == 2
    assert re.search(r"\? [^;]*KV\[\(int64_t\)table\[", src)
