"""The STSM + TMA-store epilogue primitives (kf/tma_store.cuh) on cuda-emu, against numpy models
written from the PTX ISA's definitions: stmatrix's fragment -> 8x8 matrix mapping, the wgmma
accumulator layout, TMA stores clipped at the tensor bounds, and the bulk async-group and
proxy-fence rules whose violations the emulator reports.  Planted bugs (a wrong lane mapping,
a missing fence, a missing wait, a wrong box coordinate) each fail."""
import numpy as np
import pytest
import torch

from kernforge.backends.cuda_emu.backend import EmulationError

from .conftest import CudaTestKernel, build_emu_module

STSM = r'''
#include "kf/tma_store.cuh"
// One warp: regs[lane][q] -> stmatrix.x4 (trans when `trans`) into four consecutive 8x8 matrices
// (matrix q at byte 128q, rows 16 bytes apart); `out` gets the 512 bytes, `back` the registers an
// ldmatrix.x4 of the same mode reads back.
extern "C" __global__ void stsm(const unsigned* regs, unsigned char* out, unsigned* back, int trans) {
  extern __shared__ __align__(1024) unsigned char kf_smem[];
  const int lane = threadIdx.x;
  uint32_t r[4];
  for (int q = 0; q < 4; ++q) r[q] = regs[4 * lane + q];
  unsigned char* row = kf_smem + 128 * (lane / 8) + 16 * (lane % 8);
  if (trans) kf::stmatrix_x4_trans(row, r); else kf::stmatrix_x4(row, r);
  __syncwarp();
  for (int i = lane; i < 512; i += 32) out[i] = kf_smem[i];
  uint32_t b[4];
  if (trans) kf::ldmatrix_x4_trans(b, row); else kf::ldmatrix_x4(b, row);
  for (int q = 0; q < 4; ++q) back[4 * lane + q] = b[q];
}
'''

# One warpgroup, two rounds through the same staging buffer: round k's 64 x N accumulator
# (acc[k][thread][N/2], the wgmma fragment) goes to the out tensor at (col0 + k*N, row0).
EPILOGUE = r'''
template <int N, int SW, int ELEM>
__device__ void epilogue_body(const float* acc, unsigned char* out, int rows, int cols, int col0, int row0) {
  extern __shared__ __align__(1024) unsigned char kf_smem[];
  unsigned char* stage = kf_smem;
  const int tid = threadIdx.x;
  CUtensorMap map;
  if (tid == 0) {
    const uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows};
    const uint64_t strides[1] = {(uint64_t)cols * ELEM};
    const uint32_t box[2] = {SW ? SW / ELEM : N, 64};
    const char* err = kf_emu::encode_tensor_map(&map, 2, ELEM, out, dims, strides, box, SW);
    if (err) kf_emu::fail("%s", err);
  }
  float d[N / 2];
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < N / 2; ++i) d[i] = acc[(round * 128 + tid) * (N / 2) + i];  // LOAD
    if (ELEM == 2) kf::epilogue_stsm_bf16<N, SW>(d, stage); else kf::epilogue_st_f32<N, SW>(d, stage);
    kf::fence_proxy_async();  // FENCE
    __syncthreads();
    if (tid == 0) {
      kf::epilogue_tma_store<N, SW, ELEM>(&map, stage, col0 + round * N, row0);  // STORE
      kf::bulk_wait_group_read<0>();  // WAIT
    }
    __syncthreads();
  }
}
'''

CASES = {"bf16_n128_sw128": (128, 128, 2), "bf16_n32_sw0": (32, 0, 2), "f32_n64_sw128": (64, 128, 4),
         "bf16_n64_sw64": (64, 64, 2)}

# planted bug -> (mutation of the bf16_n128_sw128 kernel, the emulator's error text or None: wrong data)
BUGS = {
    "lane_mapping": (lambda s: s.replace("d[i] = acc", "d[i ^ 2] = acc"), None),  # rows g and g+8 swapped
    "no_fence": (lambda s: s.replace("kf::fence_proxy_async();  // FENCE", ""), "no fence.proxy.async"),
    "no_wait": (lambda s: s.replace("kf::bulk_wait_group_read<0>();  // WAIT", ""), "still reading it"),
    "wait_one_behind": (lambda s: s.replace("bulk_wait_group_read<0>();  // WAIT", "bulk_wait_group_read<1>();"),
                        "still reading it"),  # round 2 restages while round 1's store is in flight
    "exit_before_wait": (lambda s: s.replace("kf::bulk_wait_group_read<0>();  // WAIT", "").replace(
        "round < 2", "round < 1"), "not waited for"),  # one tile, never restaged: the CTA exits too early
    "box_coordinate": (lambda s: s.replace("col0 + round * N, row0", "col0 + round * N, row0 + 8"), None),
}


def _entry(name, n, sw, elem, body):
    return f'''
{body}
extern "C" __global__ void {name}(const float* acc, unsigned char* out, int rows, int cols, int col0, int row0) {{
  epilogue_body<{n}, {sw}, {elem}>(acc, out, rows, cols, col0, row0);
}}
'''


def _kernels():
    params = [("const float*", "buffer"), ("unsigned char*", "buffer")] + [("int", "scalar")] * 4
    # one module: the first kernel carries the includes, the first epilogue kernel the template
    out = [CudaTestKernel("stsm", '#include "kf/mma.cuh"\n' + STSM, [("const unsigned*", "buffer"),
           ("unsigned char*", "buffer"), ("unsigned*", "buffer"), ("int", "scalar")], 32)]
    for i, (name, (n, sw, elem)) in enumerate(CASES.items()):
        out.append(CudaTestKernel(name, _entry(name, n, sw, elem, EPILOGUE if i == 0 else ""), params, 128))
    for bug, (mutate, _) in BUGS.items():
        mutated = mutate(EPILOGUE).replace("epilogue_body", f"epilogue_body_{bug}")
        assert mutated != EPILOGUE.replace("epilogue_body", f"epilogue_body_{bug}"), bug
        out.append(CudaTestKernel(bug, _entry(bug, 128, 128, 2, mutated).replace(
            "epilogue_body<", f"epilogue_body_{bug}<"), params, 128))
    return out


@pytest.fixture(scope="module")
def kernels():
    return build_emu_module("emu_test_tma_store", _kernels(), dynamic_smem=32768)


def _stmatrix_model(regs, trans):
    """Matrix q's (row, col) as the PTX ISA defines the fragment: register q of lane L holds
    (row L/4, cols 2(L%4), 2(L%4)+1), low half first; .trans: (rows 2(L%4), +1; col L/4)."""
    mats = np.zeros((4, 8, 8), np.uint16)
    for lane in range(32):
        for q in range(4):
            for half in range(2):
                v = (int(regs[lane, q]) >> (16 * half)) & 0xFFFF
                if trans:
                    mats[q, 2 * (lane % 4) + half, lane // 4] = v
                else:
                    mats[q, lane // 4, 2 * (lane % 4) + half] = v
    return mats


@pytest.mark.parametrize("trans", [0, 1])
def test_stmatrix_places_each_lane_fragment(kernels, rng, trans):
    regs = rng.integers(0, 2**32, size=(32, 4), dtype=np.uint64).astype(np.uint32)
    out = np.zeros(512, np.uint8)
    back = np.zeros((32, 4), np.uint32)
    kernels["stsm"]([regs, out, back, np.array(trans, np.int32)], [], [1])
    np.testing.assert_array_equal(out.view(np.uint16).reshape(4, 8, 8), _stmatrix_model(regs, trans))
    np.testing.assert_array_equal(back, regs)  # ldmatrix of the same mode inverts it


def _fragments(tile):
    """The m64nN wgmma accumulator of a 64 x N tile, per thread (kf/wgmma.cuh):
    d[4j+q] of thread 32w + 4g + t is D(16w + g + 8(q/2), 8j + 2t + q%2)."""
    n = tile.shape[1]
    d = np.zeros((128, n // 2), np.float32)
    for tid in range(128):
        w, g, t = tid // 32, (tid % 32) // 4, tid % 4
        for j in range(n // 8):
            for q in range(4):
                d[tid, 4 * j + q] = tile[16 * w + g + 8 * (q // 2), 8 * j + 2 * t + q % 2]
    return d


def _run(kernels, name, n, elem, rows, cols, col0, row0, rng):
    tiles = rng.standard_normal((2, 64, n)).astype(np.float32)
    acc = np.ascontiguousarray(np.stack([_fragments(t) for t in tiles]))
    dtype = np.uint16 if elem == 2 else np.uint32
    sentinel = 0x7FC1 if elem == 2 else 0x7FC00001
    out = np.full((rows, cols), sentinel, dtype)
    scalars = [np.array(v, np.int32) for v in (rows, cols, col0, row0)]
    kernels[name]([acc, out.view(np.uint8), *scalars], [], [1])
    want = np.full((rows, cols), sentinel, dtype)
    for k, t in enumerate(tiles):
        bits = (torch.from_numpy(t).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16) if elem == 2
                else t.view(np.uint32))
        for r in range(64):
            for c in range(n):
                rr, cc = row0 + r, col0 + k * n + c
                if 0 <= rr < rows and 0 <= cc < cols:
                    want[rr, cc] = bits[r, c]
    return out, want


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("where", ["inside", "clipped"])
def test_epilogue_writes_the_accumulator_tile(kernels, rng, name, where):
    n, _, elem = CASES[name]
    if where == "inside":  # the tiles sit inside a larger tensor, nothing else is touched
        rows, cols, col0, row0 = 80, 2 * n + 16, 8, 8
    else:  # the second tile hangs over the right edge and both over the bottom: TMA clips
        rows, cols, col0, row0 = 72, 2 * n - 8, 0, 40
    out, want = _run(kernels, name, n, elem, rows, cols, col0, row0, rng)
    np.testing.assert_array_equal(out, want)


def test_clean_copy_of_the_planted_kernel_passes(kernels, rng):
    out, want = _run(kernels, "bf16_n128_sw128", 128, 2, 64, 256, 0, 0, rng)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_is_caught(kernels, rng, bug):
    _, error = BUGS[bug]
    if error is not None:
        with pytest.raises(EmulationError, match=error):
            _run(kernels, bug, 128, 2, 64, 256, 0, 0, rng)
        return
    out, want = _run(kernels, bug, 128, 2, 72, 256, 0, 0, rng)
    assert not np.array_equal(out, want)
