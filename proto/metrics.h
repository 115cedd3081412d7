// One stats registry rendering: the daemon fills a list of metrics (name, unit, help, value);
// expertctl and the stats file render the same list as a table, JSON or Prometheus text.
#pragma once

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
};

std::string render_table(const std::vector<Metric>& metrics);
std::string render_json(const std::vector<Metric>& metrics);  // one object, name -> value
std::string render_prometheus(const std::vector<Metric>& metrics,
                              const std::string& prefix = "expertd_");

}  // namespace expertd::proto
