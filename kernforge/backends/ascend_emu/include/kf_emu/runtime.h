// ascend-emu: running a launch, ICPU_RUN_KF style.  Each block is one host thread with its
// own Ctx (fresh, poisoned memories); the first rule violation stops the launch and is kept
// as "rule<US>rule: detail [block b]" (US = \x1f) for the Python side (kf_ascend_emu_last_error).
//
// Modes: AIV (KERNEL_TYPE_AIV_ONLY: numBlocks vector blocks) and AIC (AIC_ONLY).  MIX kernels
// (1 AIC + 2 AIV per core, CrossCore flags) are not modelled: kernforge does not emit them yet.
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace kf_emu {

inline std::string& last_error() {
  static std::string e;
  return e;
}

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

// Registers the launch's GM buffers for the bounds checks, for the duration of the launch.
struct GmScope {
  explicit GmScope(std::vector<GmRegion> regions) { gm_regions() = std::move(regions); }
  ~GmScope() { gm_regions().clear(); }
};

// Runs fn once per block; returns 0, or 1 with last_error() set.
inline int launch(Core core, int64_t num_blocks, const std::function<void()>& fn) {
  last_error().clear();
  if (num_blocks < 1 || num_blocks > 65535) {
    last_error() = "launch: numBlocks " + std::to_string(num_blocks) + " is outside 1..65535";
    return 1;
  }
  std::mutex err_mutex;
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  auto worker = [&] {
    Ctx ctx;
    current() = &ctx;
    for (int64_t b = next++; b < num_blocks && !stop; b = next++) {
      try {
        ctx.reset(core, b, num_blocks, 0);
        fn();
        ctx.finish();
      } catch (const RuleError& e) {
        std::lock_guard<std::mutex> lock(err_mutex);
        if (!stop.exchange(true)) last_error() = e.rule + "\x1f" + e.what() + " [block " + std::to_string(b) + "]";
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(err_mutex);
        if (!stop.exchange(true)) last_error() = std::string("internal\x1f") + e.what() + " [block " + std::to_string(b) + "]";
      }
    }
    current() = nullptr;
  };
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n = std::min<int64_t>(num_blocks, std::min<int64_t>(hw, 8));
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < n; ++i) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  return last_error().empty() ? 0 : 1;
}

}  // namespace kf_emu
