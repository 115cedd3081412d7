#include "bench/policy_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "daemon/trace_sim.h"

using namespace expertd;

namespace {

int fail(const std::string& m) {
  std::fprintf(stderr, "expert-bench: error: %s\n", m.c_str());
  return 1;
}

}  // namespace

// Replays an expertd trace: per-layer expert popularity, and the hit rate of each policy and of
// the offline optimum (Belady) at several cache sizes.
int bench_policy(const std::string& path, const std::vector<double>& fractions) {
  auto t = daemon::read_trace(path);
  if (!t) return fail(t.error().message);
  uint64_t accesses = 0;
  for (const auto& r : t->records) accesses += r.experts.size();
  uint64_t hinted = 0;
  for (const auto& h : t->hints) hinted += h.experts.size();
  std::printf("trace %s: %zu acquires, %llu expert accesses, %u layers x %u experts", path.c_str(),
              t->records.size(), (unsigned long long)accesses, t->n_layers, t->n_experts);
  if (!t->hints.empty())
    std::printf("; %zu prefetch hints of %llu experts", t->hints.size(),
                (unsigned long long)hinted);
  std::printf("\n");
  for (uint32_t l = 0; l < t->n_layers;
       ++l) {  // popularity: share of the layer's accesses per expert, sorted
    std::vector<uint64_t> c(t->n_experts, 0);
    uint64_t total = 0;
    for (const auto& r : t->records)
      if (r.layer == l)
        for (uint32_t e : r.experts) ++c[e], ++total;
    if (!total) continue;
    std::sort(c.rbegin(), c.rend());
    std::printf("layer %2u popularity:", l);
    uint64_t top = 0;
    for (uint32_t i = 0; i < t->n_experts; ++i) {
      if (i < 8) std::printf(" %4.1f%%", 100.0 * c[i] / total);
      if (i < t->n_experts / 10) top += c[i];
    }
    uint32_t unused = static_cast<uint32_t>(std::count(c.begin(), c.end(), 0));
    std::printf("  | top 10%% of experts: %.1f%% of accesses, %u never used\n", 100.0 * top / total,
                unused);
  }
  std::vector<std::string> policies = {"lru", "lfu", "lfru"};
  for (const auto& p : daemon::lab_policy_names()) policies.push_back(p);
  // What knowing the coming routing is worth: the rest of this step, then one and two steps more.
  policies.push_back("lfru+affinity");
  for (const char* p : {"lfru+h0", "lfru+h1", "lfru+h2"}) policies.push_back(p);
  if (!t->hints.empty())  // the daemon's policy with the trace's hints replayed
    for (const char* p : {"lfru+hints", "lfru+hints-always", "lfru+hints-spare", "lfru+drafts",
                          "lfru+drafts+prefetch"})
      policies.push_back(p);
  policies.push_back("belady");
  auto width = [](const std::string& p) { return static_cast<int>(std::max<size_t>(8, p.size())); };
  std::printf("\n%-8s", "cache");
  for (const auto& p : policies) std::printf(" %*s", width(p), p.c_str());
  std::printf("\n");
  double last_ratio = 0;
  for (double f : fractions) {
    uint32_t slots =
        std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(f * t->n_layers * t->n_experts)));
    std::printf("%5.0f%%  ", f * 100);
    double lfru = 0, opt = 0;
    std::string reads;  // the hints' policies: what the drive read, per miss of Belady's
    uint64_t opt_misses = 0;
    // A speculative verify eval's union can exceed a small cache: replayed in waves.
    const daemon::Trace waves = daemon::in_waves(*t, slots);
    for (const auto& p : policies) {
      auto r = daemon::simulate(waves, slots, p);
      if (!r) return fail(r.error().message);
      std::printf(" %*.3f", width(p), r->hit_rate());
      if (p == "lfru") lfru = r->hit_rate();
      if (p == "belady") opt = r->hit_rate(), opt_misses = r->misses;
      if (p.find("+hints") != std::string::npos || p == "lfru+drafts+prefetch")
        reads += " " + p + " " + std::to_string(r->misses) + " misses + " +
                 std::to_string(r->prefetch_reads) + " hint reads (" +
                 std::to_string(r->prefetch_used) + " used);";
    }
    std::printf("   (%u slots)\n", slots);
    if (!reads.empty())
      std::printf("        reads:%s belady %llu misses\n", reads.c_str(),
                  (unsigned long long)opt_misses);
    last_ratio = opt > 0 ? lfru / opt : 0;
  }
  std::printf("ratio=%.3f\n", last_ratio);  // lfru / belady at the last size
  return 0;
}
