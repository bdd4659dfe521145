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
//
// Each set also gets a number per core (1, 2, ...), and each wait records the number of the
// set it consumed (`consumed[waiter][setter]`), so that the direct paths of dav-3510 (UB -> L1,
// Fixpipe L0C -> UB: data written into another core's memory) can check that every direct write
// was published by a set its reader waited for, and that the writer had waited for the owner's
// last use of the blocks (Ctx::cross_touch / cross_write, rule "cross-core missing wait").
#pragma once

#include <condition_variable>
#include <deque>

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
  // set numbers: sets[r] made by core r; pending set numbers per flag as the counters above;
  // consumed[r][q]: the highest set number of core q that core r's waits have taken
  uint32_t sets[3] = {};
  std::deque<uint32_t> aic_seq[16][2], aiv_seq[2][16];
  uint32_t consumed[3][3] = {};
  Ctx* cores[3] = {};
  int started = 0;

  // the three cores register their contexts before any of them runs kernel code (a direct
  // write must find its destination reset and alive)
  void start(int role, Ctx* c) {
    std::unique_lock<std::mutex> lock(m);
    cores[role] = c;
    ++started;
    cv.notify_all();
    cv.wait(lock, [&] { return started == 3; });
  }

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

inline const char* role_name(int role) {
  static const char* n[] = {"the AIC", "AIV 0", "AIV 1"};
  return role >= 0 && role < 3 ? n[role] : "a core";
}

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
  const uint32_t n = ++g.sets[role(c)];
  if (c.core == Core::AIC) {
    for (int s = 0; s < 2; ++s) {
      if (++g.to_aiv[s][id] > 15) fail("cross-core flag overflow", "CrossCoreSetFlag(%d) of the AIC: AIV %d has 15 pending", id, s);
      g.aiv_seq[s][id].push_back(n);
    }
  } else {
    if (++g.to_aic[id][c.sub_idx] > 15)
      fail("cross-core flag overflow", "CrossCoreSetFlag(%d) of AIV %lld: 15 pending at the AIC", id, (long long)c.sub_idx);
    g.aic_seq[id][c.sub_idx].push_back(n);
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
  auto take = [&](std::deque<uint32_t>& q, int setter) {
    g.consumed[r][setter] = std::max(g.consumed[r][setter], q.front());
    q.pop_front();
  };
  if (r == 0) {
    --g.to_aic[id][0], --g.to_aic[id][1];
    take(g.aic_seq[id][0], 1), take(g.aic_seq[id][1], 2);
  } else {
    --g.to_aiv[r - 1][id];
    take(g.aiv_seq[r - 1][id], 0);
  }
}

// A direct write by the calling core into memory m of core `dst` of its group (dav-3510): the
// destination's record is checked and updated under the group's lock, which also keeps the
// destination alive while copy(base of the destination memory) moves the data.
template <class Copy>
void cross_write(int dst, Mem m, uint32_t off, uint32_t bytes, const char* what, Copy copy) {
  Ctx& c = ctx();
  Group& g = mix_group(what, 0);
  const int src = role(c);
  std::lock_guard<std::mutex> lock(g.m);
  Ctx* d = g.cores[dst];
  if (d == nullptr || g.returned[dst])
    fail("cross-core", "%s: %s writes into %s of %s, which has returned", what, role_name(src), mem_name(m), role_name(dst));
  d->cross_write(src, g.sets[src], g.consumed[src][dst], m, off, bytes);
  copy(d->mem[static_cast<int>(m)].data());
}

}  // namespace kf_emu
