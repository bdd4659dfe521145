// Pipe synchronisation: one SetFlag/WaitFlag pair on event id 0.  The renderer puts a pair
// around every DMA and vector instruction (producer pipe -> consumer pipe), which orders
// the pipes as program order; the ascend-emu shim checks that no pipe reads or overwrites
// another pipe's data before such a wait.
#pragma once

namespace kf {

template <AscendC::HardEvent E>
__aicore__ inline void sync() {
  AscendC::SetFlag<E>(0);
  AscendC::WaitFlag<E>(0);
}

}  // namespace kf
