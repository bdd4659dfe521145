// ascend-emu: running a launch, ICPU_RUN_KF style.  Each block is one host thread with its
// own Ctx (fresh, poisoned memories); the first rule violation stops the launch and is kept
// as "rule<US>rule: detail [block b]" (US = \x1f) for the Python side (kf_ascend_emu_last_error).
//
// Modes: AIV (KERNEL_TYPE_AIV_ONLY: numBlocks vector blocks), AIC (AIC_ONLY) and MIX
// (KERNEL_TYPE_MIX_AIC_1_2: numBlocks groups of one AIC + two AIV, the three of a group running
// concurrently with the cross-core flags of cross_core.h).  In MIX, GetBlockIdx() is the group on
// the AIC and group * 2 + GetSubBlockIdx() on an AIV; GetBlockNum() is the number of groups on
// both (spec section 1: the AIV value is [U]).
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

// MIX: groups one after the other, the AIC and the two AIVs of a group as three threads.
inline int launch_mix(int64_t num_groups, const std::function<void()>& fn) {
  last_error().clear();
  if (num_groups < 1 || num_groups > 65535) {
    last_error() = "launch: numBlocks " + std::to_string(num_groups) + " is outside 1..65535";
    return 1;
  }
  std::mutex err_mutex;
  bool real_error = false;
  auto record = [&](const std::string& text, bool real) {
    std::lock_guard<std::mutex> lock(err_mutex);
    if (last_error().empty() || (real && !real_error)) last_error() = text;
    real_error = real_error || real;
  };
  for (int64_t g = 0; g < num_groups && last_error().empty(); ++g) {
    Group group;
    auto core = [&](int role) {
      Ctx ctx;
      current() = &ctx;
      const Core kind = role == 0 ? Core::AIC : Core::AIV;
      const std::string who = role == 0 ? "AIC" : "AIV " + std::to_string(role - 1);
      bool failed = true;
      try {
        ctx.reset(kind, role == 0 ? g : g * 2 + role - 1, num_groups, role == 0 ? 0 : role - 1);
        ctx.mix = true;
        ctx.group = &group;
#if __NPU_ARCH__ == 3510
        // the direct paths write the AIC's L1 (UB -> L1) and the AIVs' UB (Fixpipe L0C -> UB)
        ctx.xrole = role;
        ctx.xsets = &group.sets[role];
        ctx.xconsumed = group.consumed[role];
        const Mem own = role == 0 ? Mem::L1 : Mem::UB;
        ctx.xrec[static_cast<int>(own)].reset(capacity(own) / 32 + 1);
#endif
        group.start(role, &ctx);
        fn();
        ctx.finish();
        failed = false;
      } catch (const Aborted&) {
      } catch (const RuleError& e) {
        record(e.rule + "\x1f" + e.what() + " [group " + std::to_string(g) + ", " + who + "]", true);
      } catch (const std::exception& e) {
        record(std::string("internal\x1f") + e.what() + " [group " + std::to_string(g) + ", " + who + "]", true);
      }
      group.leave(role, failed);
      current() = nullptr;
    };
    std::thread aiv0(core, 1), aiv1(core, 2);
    core(0);
    aiv0.join();
    aiv1.join();
    if (last_error().empty()) {
      const std::string p = group.pending();
      if (!p.empty()) record("unbalanced CrossCoreSetFlag\x1f" + p + " [group " + std::to_string(g) + "]", true);
    }
  }
  return last_error().empty() ? 0 : 1;
}

}  // namespace kf_emu
