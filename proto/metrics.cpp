#include "proto/metrics.h"

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
  std::string out;
  for (const auto& m : metrics) {
    std::string name = prefix + m.name + (m.kind == MetricKind::Counter ? "_total" : "");
    out += "# HELP " + name + " " + m.help + "\n";
    out += "# TYPE " + name + (m.kind == MetricKind::Counter ? " counter\n" : " gauge\n");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", m.value);
    out += name + " " + buf + "\n";
  }
  return out;
}

}  // namespace expertd::proto
