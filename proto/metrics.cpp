#include "proto/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace expertd::proto {
namespace {
std::string format_value(const Metric& m) {
  char buf[64];
  if (m.unit == "bytes" && m.value >= 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.0f (%.1f MiB)", m.value, m.value / (1024.0 * 1024.0));
  else if (m.value == std::floor(m.value) && std::fabs(m.value) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", m.value);
  else
    std::snprintf(buf, sizeof buf, "%.4g", m.value);
  return buf;
}
}  // namespace

std::string render_table(const std::vector<Metric>& metrics) {
  size_t w = 0;
  for (const auto& m : metrics) w = std::max(w, m.name.size());
  std::string out;
  char line[512];
  for (const auto& m : metrics) {
    std::snprintf(line, sizeof line, "%-*s  %22s  %s\n", static_cast<int>(w), m.name.c_str(),
                  format_value(m).c_str(), m.help.c_str());
    out += line;
  }
  return out;
}

std::string render_json(const std::vector<Metric>& metrics) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& m : metrics) {
    if (m.value == std::floor(m.value) && std::fabs(m.value) < 9e15)
      j[m.name] = static_cast<int64_t>(m.value);
    else
      j[m.name] = m.value;
  }
  return j.dump();
}

std::string render_prometheus(const std::vector<Metric>& metrics, const std::string& prefix) {
  std::string out, last;
  for (const auto& m : metrics) {
    std::string name = prefix + m.name + (m.kind == MetricKind::Counter ? "_total" : "");
    if (name != last) {
      out += "# HELP " + name + " " + m.help + "\n";
      out += "# TYPE " + name + (m.kind == MetricKind::Counter ? " counter\n" : " gauge\n");
      last = name;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", m.value);
    out += name + m.labels + " " + buf + "\n";
  }
  return out;
}

int Histogram::bucket(uint64_t v) {
  if (v < kSub) return static_cast<int>(v);
  int msb = 63 - std::countl_zero(v);
  int sub = static_cast<int>((v >> (msb - 3)) & (kSub - 1));
  int b = (msb - 2) * kSub + sub;
  return b < kBuckets ? b : kBuckets - 1;
}

uint64_t Histogram::bucket_upper(int b) {
  if (b < kSub) return static_cast<uint64_t>(b);
  int msb = b / kSub + 2, sub = b % kSub;
  return ((uint64_t{kSub} + static_cast<uint64_t>(sub) + 1) << (msb - 3)) - 1;
}

void Histogram::record(uint64_t v) {
  counts_[static_cast<size_t>(bucket(v))].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  uint64_t m = max_.load(std::memory_order_relaxed);
  while (v > m && !max_.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
  }
}

void Histogram::reset() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  max_.store(0, std::memory_order_relaxed);
}

uint64_t Histogram::percentile(double p) const {
  const uint64_t n = count();
  if (n == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(std::ceil(p / 100.0 * static_cast<double>(n)));
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[static_cast<size_t>(b)].load(std::memory_order_relaxed);
    if (seen >= rank) return std::min(bucket_upper(b), max());
  }
  return max();
}

namespace {
// v / 10^decimals, exactly, without trailing zeros.
std::string fixed_point(uint64_t v, int decimals) {
  std::string d = std::to_string(v);
  if (decimals <= 0) return d;
  if (d.size() <= static_cast<size_t>(decimals))
    d.insert(0, static_cast<size_t>(decimals) + 1 - d.size(), '0');
  d.insert(d.size() - static_cast<size_t>(decimals), ".");
  while (d.back() == '0') d.pop_back();
  if (d.back() == '.') d.pop_back();
  return d;
}
}  // namespace

void Histogram::render_prometheus(std::string& out, const std::string& name,
                                  const std::string& help, int decimals) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  int next = 0;  // buckets [0, next) summed into cum
  for (int k = 0; k <= 20; ++k) {
    const uint64_t le = (uint64_t{1} << (2 * k)) - 1;  // a bucket edge: bucket_upper of some b
    while (next < kBuckets && bucket_upper(next) <= le)
      cum += counts_[static_cast<size_t>(next++)].load(std::memory_order_relaxed);
    out += name + "_bucket{le=\"" + fixed_point(le, decimals) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count()) + "\n";
  out += name + "_sum " + fixed_point(sum(), decimals) + "\n" + name + "_count " +
         std::to_string(count()) + "\n";
}

}  // namespace expertd::proto
