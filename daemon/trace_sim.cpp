#include "daemon/trace_sim.h"

#include <cstdio>
#include <cstring>
#include <limits>

#include "daemon/policy.h"

namespace expertd::daemon {

Result<Trace> read_trace(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rbe");
  if (!f) return errno_error("open trace " + path);
  Trace t;
  char magic[8];
  bool ok = std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, "XPRTTRC1", 8) == 0 &&
            std::fread(&t.n_layers, 4, 1, f) == 1 && std::fread(&t.n_experts, 4, 1, f) == 1;
  if (!ok || t.n_layers == 0 || t.n_experts == 0 || t.n_experts > 65536) {
    std::fclose(f);
    return make_error(path + ": not an expertd trace");
  }
  for (;;) {
    TraceRecord r;
    uint16_t layer, n;
    if (std::fread(&r.time_ns, 8, 1, f) != 1) break;
    if (std::fread(&r.client, 4, 1, f) != 1 || std::fread(&layer, 2, 1, f) != 1 ||
        std::fread(&n, 2, 1, f) != 1) {
      std::fclose(f);
      return make_error(path + ": truncated record " + std::to_string(t.records.size()));
    }
    r.layer = layer;
    std::vector<uint16_t> ids(n);
    if (n && std::fread(ids.data(), 2, n, f) != n) {
      std::fclose(f);
      return make_error(path + ": truncated record " + std::to_string(t.records.size()));
    }
    for (uint16_t e : ids) {
      if (e >= t.n_experts || layer >= t.n_layers) {
        std::fclose(f);
        return make_error(path + ": record " + std::to_string(t.records.size()) +
                          " is out of range");
      }
      r.experts.push_back(e);
    }
    t.records.push_back(std::move(r));
  }
  std::fclose(f);
  return t;
}

Result<SimResult> simulate(const Trace& t, uint32_t slots, const std::string& policy_name) {
  const bool belady = policy_name == "belady";
  auto policy = belady ? nullptr : make_policy(policy_name);
  if (!belady && !policy) return make_error("unknown policy " + policy_name);
  if (slots == 0) return make_error("no slots");
  const size_t keys = size_t{t.n_layers} * t.n_experts;
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  // Belady needs each access's next use of the same expert.
  std::vector<std::vector<uint64_t>> next_use(t.records.size());
  if (belady) {
    std::vector<uint64_t> upcoming(keys, kNever);
    for (size_t i = t.records.size(); i-- > 0;) {
      const auto& r = t.records[i];
      for (uint32_t e : r.experts) {
        next_use[i].push_back(upcoming[size_t{r.layer} * t.n_experts + e]);
        upcoming[size_t{r.layer} * t.n_experts + e] = i;
      }
    }
  }
  struct Slot {
    int64_t key = -1;
    uint64_t last_access = 0, inserted = 0, next = kNever;
    bool pinned = false;
  };
  std::vector<Slot> s(slots);
  std::vector<int32_t> where(keys, -1);
  std::vector<uint32_t> freq(keys, 0);
  std::vector<uint32_t> free_list;
  for (uint32_t i = slots; i > 0; --i) free_list.push_back(i - 1);
  uint64_t clock = 0, accesses = 0;
  SimResult res;
  auto touch = [&](uint32_t i) {
    s[i].last_access = ++clock;
    ++freq[s[i].key];
    if (policy && policy->wants_aging(++accesses, slots))
      for (auto& f : freq) f /= 2;
  };
  for (size_t ri = 0; ri < t.records.size(); ++ri) {
    const auto& r = t.records[ri];
    if (r.experts.size() > slots)
      return make_error("a request of " + std::to_string(r.experts.size()) + " experts exceeds " +
                        std::to_string(slots) + " slots");
    std::vector<uint32_t> pinned;
    for (size_t k = 0; k < r.experts.size(); ++k) {  // resident first, as Cache::grant
      size_t key = size_t{r.layer} * t.n_experts + r.experts[k];
      if (where[key] < 0) continue;
      uint32_t i = static_cast<uint32_t>(where[key]);
      ++res.hits;
      s[i].pinned = true;
      if (belady) s[i].next = next_use[ri][k];
      pinned.push_back(i);
      touch(i);
    }
    for (size_t k = 0; k < r.experts.size(); ++k) {
      size_t key = size_t{r.layer} * t.n_experts + r.experts[k];
      if (where[key] >= 0) continue;
      ++res.misses;
      uint32_t i;
      if (!free_list.empty()) {
        i = free_list.back();
        free_list.pop_back();
      } else {
        int64_t best = -1;
        for (uint32_t j = 0; j < slots; ++j) {
          if (s[j].pinned) continue;
          bool better;
          if (best < 0)
            better = true;
          else if (belady)
            better = s[j].next > s[best].next;
          else
            better = policy->before({s[j].last_access, s[j].inserted, freq[s[j].key]},
                                    {s[best].last_access, s[best].inserted, freq[s[best].key]});
          if (better) best = j;
        }
        if (best < 0) return make_error("no evictable slot");
        i = static_cast<uint32_t>(best);
        where[s[i].key] = -1;
        ++res.evictions;
      }
      s[i].key = static_cast<int64_t>(key);
      s[i].inserted = ++clock;
      s[i].last_access = s[i].inserted;
      s[i].pinned = true;
      if (belady) s[i].next = next_use[ri][k];
      where[key] = static_cast<int32_t>(i);
      pinned.push_back(i);
      touch(i);
    }
    for (uint32_t i : pinned) s[i].pinned = false;
  }
  return res;
}

}  // namespace expertd::daemon
