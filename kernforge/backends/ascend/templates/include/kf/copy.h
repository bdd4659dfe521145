// Tile copies between GM and UB as DataCopyPad (the renderer's copies.dma_plan decides
// which copies come here).  A tile is `rows x cols` elements; UB rows start every
// `ub_pitch` elements (32-byte aligned), GM rows every `gm_pitch`.  Only the in-bounds
// part (`valid_rows x valid_cols`, clamped at 0) moves: kernforge's copy semantics read 0
// out of bounds (the tile is zeroed first, by the scalar unit) and skip writes out of
// bounds.  DataCopyPad pads each UB row to 32 bytes with 0.  A copy_in with `wait` false (a
// T.Pipelined stage) does not wait for its DMA: the tile's TQue EnQue/DeQue does.
#pragma once

namespace kf {

__aicore__ inline uint32_t round32(uint32_t n) { return (n + 31) / 32 * 32; }

__aicore__ inline uint32_t clamp_extent(int64_t v, uint32_t n) {
  return v <= 0 ? 0u : (v >= int64_t(n) ? n : uint32_t(v));
}

template <class T>
__aicore__ inline void copy_in(const AscendC::LocalTensor<T>& dst, const AscendC::GlobalTensor<T>& src, uint32_t rows,
                               uint32_t cols, uint32_t ub_pitch, int64_t valid_rows, int64_t valid_cols,
                               uint64_t gm_pitch, bool wait = true) {
  const uint32_t vr = clamp_extent(valid_rows, rows), vc = clamp_extent(valid_cols, cols);
  if (vr < rows || vc < cols) {
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < cols; ++c) dst.SetValue(r * ub_pitch + c, T(0));
  }
  sync<AscendC::HardEvent::S_MTE2>();
  sync<AscendC::HardEvent::V_MTE2>();
  if (vr > 0 && vc > 0) {
    const uint32_t bytes = vc * sizeof(T), padded = round32(bytes);
    AscendC::DataCopyExtParams params(uint16_t(vr), bytes, uint32_t((gm_pitch - vc) * sizeof(T)),
                                      rows > 1 ? (ub_pitch * uint32_t(sizeof(T)) - padded) / 32 : 0u, 0);
    AscendC::DataCopyPadExtParams<T> pad(true, 0, uint8_t((padded - bytes) / sizeof(T)), T(0));
    AscendC::DataCopyPad(dst, src, params, pad);
  }
  if (!wait) return;  // a T.Pipelined stage: its queue's EnQue/DeQue orders the DMA for the consumer
  sync<AscendC::HardEvent::MTE2_S>();
  sync<AscendC::HardEvent::MTE2_V>();
}

template <class T>
__aicore__ inline void copy_out(const AscendC::GlobalTensor<T>& dst, const AscendC::LocalTensor<T>& src, uint32_t rows,
                                uint32_t cols, uint32_t ub_pitch, int64_t valid_rows, int64_t valid_cols,
                                uint64_t gm_pitch) {
  const uint32_t vr = clamp_extent(valid_rows, rows), vc = clamp_extent(valid_cols, cols);
  sync<AscendC::HardEvent::S_MTE3>();
  sync<AscendC::HardEvent::V_MTE3>();
  if (vr > 0 && vc > 0) {
    const uint32_t bytes = vc * sizeof(T);
    AscendC::DataCopyExtParams params(uint16_t(vr), bytes,
                                      rows > 1 ? (ub_pitch * uint32_t(sizeof(T)) - round32(bytes)) / 32 : 0u,
                                      uint32_t((gm_pitch - vc) * sizeof(T)), 0);
    AscendC::DataCopyPad(dst, src, params);
  }
  sync<AscendC::HardEvent::MTE3_S>();
  sync<AscendC::HardEvent::MTE3_V>();
  sync<AscendC::HardEvent::MTE3_MTE2>();
}

}  // namespace kf
