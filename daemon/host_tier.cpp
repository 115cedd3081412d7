#include "daemon/host_tier.h"

namespace expertd::daemon {

HostTier::HostTier(size_t n_keys, uint32_t host_slots) {
  if (host_slots == 0) return;
  slot_of_.assign(n_keys, -1);
  key_.assign(host_slots, -1);
  prev_.assign(host_slots, -1);
  next_.assign(host_slots, -1);
  for (uint32_t h = host_slots; h > 0; --h) free_.push_back(h - 1);
}

void HostTier::unlink(uint32_t h) {
  const int32_t p = prev_[h], n = next_[h];
  (p >= 0 ? next_[static_cast<uint32_t>(p)] : oldest_) = n;
  (n >= 0 ? prev_[static_cast<uint32_t>(n)] : newest_) = p;
  prev_[h] = next_[h] = -1;
}

uint32_t HostTier::take(bool* evicted) {
  *evicted = free_.empty();
  if (!free_.empty()) {
    const uint32_t h = free_.back();
    free_.pop_back();
    return h;
  }
  const auto h = static_cast<uint32_t>(oldest_);
  slot_of_[static_cast<size_t>(key_[h])] = -1;
  key_[h] = -1;
  unlink(h);
  return h;
}

void HostTier::hold(uint32_t h, size_t key) {
  key_[h] = static_cast<int64_t>(key);
  slot_of_[key] = static_cast<int32_t>(h);
  prev_[h] = newest_;
  (newest_ >= 0 ? next_[static_cast<uint32_t>(newest_)] : oldest_) = static_cast<int32_t>(h);
  newest_ = static_cast<int32_t>(h);
}

void HostTier::free(uint32_t h) {
  if (key_[h] >= 0) {
    slot_of_[static_cast<size_t>(key_[h])] = -1;
    unlink(h);
  }
  key_[h] = -1;
  free_.push_back(h);
}

void HostTier::clear() {
  for (uint32_t h = 0; h < key_.size(); ++h)
    if (key_[h] >= 0) free(h);
}

}  // namespace expertd::daemon
