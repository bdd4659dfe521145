// ascend-emu: cross-core flags of a MIX launch (spec section 3), the hand-off between one
// AIC and its two AIVs.  The three cores of a group run as concurrent host threads (as
// ICPU_RUN_KF forks them), so a protocol that would hang on the NPU blocks here too, and is
// reported as a deadlock instead of hanging the test run.
//
// Mode 2 (AIC <-> its AIVs), the only mode modelled, as counters per flag id 0..15:
//   AIV CrossCoreSetFlag<2, P>(id): +1 on the AIC's counter of (id, this AIV);
//   AIC CrossCoreWaitFlag(id): waits until *both* AIVs' counters of id are > 0 and takes one
//     from each ("Mode 2 AIC wait requires both paired AIV notifications");
//   AIC CrossCoreSetFlag<2, P>(id): +1 on each AIV's counter of id;
//   AIV CrossCoreWaitFlag(id): waits for its own counter of id and takes one.
// A counter past 15 is an overflow (the hardware's counters are 4 bits [U]); a flag still
// pending when the group ends is unbalanced; every thread of a group waiting at once is a
// deadlock.
#pragma once

#include <condition_variable>

namespace kf_emu {

// a thread of a group stopped because another one failed: not the launch's error
struct Aborted : RuleError {
  Aborted() : RuleError("aborted", "another core of the group failed") {}
};

struct Group {
  std::mutex m;
  std::condition_variable cv;
  int to_aic[16][2] = {};  // pending AIV -> AIC notifications, per flag id and AIV
  int to_aiv[2][16] = {};  // pending AIC -> AIV notifications
  int wait_id[3] = {-1, -1, -1};  // the flag each core (0 AIC, 1 + AIV sub) waits on, -1 none
  bool returned[3] = {};
  bool abort = false;

  bool ready(int role, int id) const {
    return role == 0 ? to_aic[id][0] > 0 && to_aic[id][1] > 0 : to_aiv[role - 1][id] > 0;
  }

  // every core still running waits on a flag nobody can set any more
  bool deadlocked() const {
    for (int r = 0; r < 3; ++r)
      if (!returned[r] && (wait_id[r] < 0 || ready(r, wait_id[r]))) return false;
    return true;
  }

  // a core of the group returned (or failed): waiters re-check for a deadlock
  void leave(int role, bool failed) {
    std::lock_guard<std::mutex> lock(m);
    returned[role] = true;
    abort = abort || failed;
    cv.notify_all();
  }

  // a set flag that nobody waited for when every core of the group has returned
  std::string pending() const {
    for (int id = 0; id < 16; ++id)
      for (int s = 0; s < 2; ++s) {
        if (to_aic[id][s]) return "CrossCoreSetFlag(" + std::to_string(id) + ") of AIV " + std::to_string(s) +
                                  " never waited for by the AIC";
        if (to_aiv[s][id]) return "CrossCoreSetFlag(" + std::to_string(id) + ") of the AIC never waited for by AIV " +
                                  std::to_string(s);
      }
    return "";
  }
};

inline int role(const Ctx& c) { return c.core == Core::AIC ? 0 : 1 + int(c.sub_idx); }

inline Group& mix_group(const char* what, int id) {
  Ctx& c = ctx();
  if (!c.mix || c.group == nullptr) fail("cross-core", "%s needs a MIX kernel launched as AIC + 2 AIV groups", what);
  if (id < 0 || id > 15) fail("event id", "%s(%d): cross-core flag ids are 0..15", what, id);
  return *c.group;
}

inline void cross_core_set(int mode, int id) {
  Group& g = mix_group("CrossCoreSetFlag", id);
  if (mode != 2) fail("cross-core", "CrossCoreSetFlag mode %d is not modelled (mode 2: AIC <-> its AIVs)", mode);
  const Ctx& c = ctx();
  std::lock_guard<std::mutex> lock(g.m);
  if (c.core == Core::AIC) {
    for (int s = 0; s < 2; ++s)
      if (++g.to_aiv[s][id] > 15) fail("cross-core flag overflow", "CrossCoreSetFlag(%d) of the AIC: AIV %d has 15 pending", id, s);
  } else if (++g.to_aic[id][c.sub_idx] > 15) {
    fail("cross-core flag overflow", "CrossCoreSetFlag(%d) of AIV %lld: 15 pending at the AIC", id, (long long)c.sub_idx);
  }
  g.cv.notify_all();
}

inline void cross_core_wait(int id) {
  Group& g = mix_group("CrossCoreWaitFlag", id);
  const int r = role(ctx());
  std::unique_lock<std::mutex> lock(g.m);
  g.wait_id[r] = id;
  while (!g.ready(r, id)) {
    if (g.abort) {
      g.wait_id[r] = -1;
      throw Aborted();
    }
    if (g.deadlocked()) {
      g.wait_id[r] = -1;
      g.abort = true;
      g.cv.notify_all();
      fail("cross-core deadlock", "%s waits on CrossCoreWaitFlag(%d) while every other core of its group waits or "
           "has returned (hangs on the NPU)", r == 0 ? "the AIC" : r == 1 ? "AIV 0" : "AIV 1", id);
    }
    g.cv.wait(lock);
  }
  g.wait_id[r] = -1;
  if (r == 0) --g.to_aic[id][0], --g.to_aic[id][1];
  else --g.to_aiv[r - 1][id];
}

}  // namespace kf_emu
