// One stats registry rendering: the daemon and expert-serve fill lists of metrics (name, unit,
// help, value, labels); expertctl, the stats file and GET /metrics render them as a table, JSON
// or Prometheus text. One latency histogram for both.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace expertd::proto {

enum class MetricKind : uint8_t { Counter = 0, Gauge = 1 };

struct Metric {
  std::string name;  // snake_case, unit last: read_latency_us_p99
  std::string unit;  // "", "bytes", "us", "ratio", ...
  std::string help;
  MetricKind kind = MetricKind::Counter;
  double value = 0;
  std::string labels;  // Prometheus labels, e.g. {reason="busy"}; "" for none
};

// Log-linear histogram of integer samples (microseconds in expertd, nanoseconds in
// expert-serve): 8 sub-buckets per power of two (percentiles within 12.5% above the truth), fixed
// memory, lock-free (relaxed atomics: record from any thread).
class Histogram {
 public:
  void record(uint64_t v);
  uint64_t percentile(double p) const;  // upper bound of the bucket holding the p-th sample
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t max() const { return max_.load(std::memory_order_relaxed); }
  void reset();
  // Prometheus text: buckets at every power of 4 up to 4^20 (le = 4^k - 1 samples, exact),
  // sum and count, in the metric's unit = sample / 10^decimals (9: ns as seconds), printed
  // exactly.
  void render_prometheus(std::string& out, const std::string& name, const std::string& help,
                         int decimals) const;

 private:
  static constexpr int kSub = 8;
  static constexpr int kBuckets = 40 * kSub;
  static int bucket(uint64_t v);
  static uint64_t bucket_upper(int b);
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> count_{0}, sum_{0}, max_{0};
};

std::string render_table(const std::vector<Metric>& metrics);
std::string render_json(const std::vector<Metric>& metrics);  // one object, name -> value
std::string render_prometheus(const std::vector<Metric>& metrics,
                              const std::string& prefix = "expertd_");

}  // namespace expertd::proto
