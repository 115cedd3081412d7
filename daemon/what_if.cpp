#include "daemon/what_if.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cmath>

#include "daemon/trace_sim.h"

namespace expertd::daemon {

using Clock = std::chrono::steady_clock;

WhatIf::WhatIf(WhatIfShape shape, std::function<void()> notify)
    : shape_(std::move(shape)), notify_(std::move(notify)) {
  assert(shape_.accesses_max > 0 && shape_.n_experts <= 65536 && shape_.n_layers <= 65536);
  ring_.resize(shape_.accesses_max);
}

WhatIf::~WhatIf() {
  stopping_.store(true, std::memory_order_relaxed);  // a daemon stopping waits for one size only
  if (worker_.joinable()) worker_.join();
}

void WhatIf::record(uint32_t client, uint32_t layer, std::span<const uint32_t> experts) {
  ++seq_;
  for (uint32_t e : experts) {
    ring_[head_] = {seq_, client, static_cast<uint16_t>(layer), static_cast<uint16_t>(e)};
    if (++head_ == ring_.size()) head_ = 0, wrapped_ = true;
  }
  recorded_ += experts.size();
}

WhatIfResult WhatIf::poll() {
  WhatIfResult r;
  {
    std::lock_guard lock(mu_);
    r = result_;
  }
  if (running()) return r;
  if (worker_.joinable()) worker_.join();
  const auto period = std::chrono::duration<double>(std::max(1.0, 10 * r.replay_s));
  if (recorded_ == replayed_upto_ || (!r.rows.empty() && Clock::now() - r.at < period)) return r;
  // The ring in order, oldest first: a copy the worker owns (the ring moves on meanwhile).
  std::vector<Access> copy;
  copy.reserve(wrapped_ ? ring_.size() : head_);
  if (wrapped_)
    copy.insert(copy.end(), ring_.begin() + static_cast<std::ptrdiff_t>(head_), ring_.end());
  copy.insert(copy.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(head_));
  replayed_upto_ = recorded_;
  running_.store(true, std::memory_order_release);
  worker_ = std::thread(&WhatIf::replay, this, std::move(copy), wrapped_);
  return r;
}

// The window replays from a cold cache: its first access of each expert misses at every size,
// so a short window understates what any size gives (the rows compare with each other, and with
// the live hit rate only over a window as long as the run). A cuda arena's host tier under VRAM is
// not part of the replay: the rows are VRAM slot counts.
void WhatIf::replay(std::vector<Access> a, bool wrapped) {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);  // below serving
  const auto t0 = Clock::now();
  Trace t;
  t.n_layers = shape_.n_layers;
  t.n_experts = shape_.n_experts;
  size_t i = 0;
  if (wrapped)  // the oldest acquire may have lost its first experts to the ring: left out
    while (i < a.size() && a[i].seq == a.front().seq) ++i;
  const size_t first = i;
  while (i < a.size()) {
    TraceRecord rec;
    rec.client = a[i].client;
    rec.layer = a[i].layer;
    for (const uint32_t seq = a[i].seq; i < a.size() && a[i].seq == seq; ++i)
      rec.experts.push_back(a[i].expert);
    t.records.push_back(std::move(rec));
  }
  WhatIfResult r;
  r.accesses = a.size() - first;
  const uint64_t keys = uint64_t{shape_.n_layers} * shape_.n_experts;
  for (double f : {0.5, 1.0, 2.0, 4.0}) {
    if (stopping_.load(std::memory_order_relaxed)) break;
    const auto want = static_cast<uint64_t>(std::llround(f * shape_.slot_count));
    const auto slots = static_cast<uint32_t>(std::clamp<uint64_t>(want, 1, keys));
    if (!r.rows.empty() && r.rows.back().slots == slots) continue;  // every expert fits already
    WhatIfRow row;
    row.slots = slots;
    row.cache_mib = (uint64_t{slots} * shape_.slot_bytes + (1u << 19)) >> 20;
    if (auto sim = simulate(t, slots, shape_.policy)) row.hit_rate = sim->hit_rate();
    r.rows.push_back(row);
  }
  r.at = Clock::now();
  r.replay_s = std::chrono::duration<double>(r.at - t0).count();
  {
    std::lock_guard lock(mu_);
    result_ = std::move(r);
  }
  running_.store(false, std::memory_order_release);
  if (notify_) notify_();
}

}  // namespace expertd::daemon
