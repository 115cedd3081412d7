// expertctl's views of the per-expert snapshot (Client::experts_json): `stats --experts`.
#include "client/expertctl_experts.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace expertd::ctl {

namespace {

using json = nlohmann::json;

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

std::string percent(double hits, double looked) {
  return looked > 0 ? fmt("%5.1f%%", 100.0 * hits / looked) : std::string("    -");
}

std::string mib(double bytes) {
  return bytes >= 1024.0 * 1048576.0 ? fmt("%.2f GiB", bytes / (1024.0 * 1048576.0))
                                     : fmt("%.1f MiB", bytes / 1048576.0);
}

uint64_t sum(const json& a, size_t from, size_t to) {
  uint64_t s = 0;
  for (size_t i = from; i < to; ++i) s += a[i].get<uint64_t>();
  return s;
}

// The what-if rows on one line: "8 MiB 41.2% | 16 MiB 55.0% (now) | ...".
std::string what_if_line(const json& j) {
  std::string out;
  const uint64_t now_slots = j["slot_count"].get<uint64_t>();
  for (const auto& r : j["what_if"]) {
    if (!out.empty()) out += " | ";
    out += std::to_string(r["cache_mib"].get<uint64_t>()) + " MiB ";
    out += r["hit_rate"].is_null() ? std::string("-") : percent(r["hit_rate"].get<double>(), 1.0);
    if (r["slots"].get<uint64_t>() == now_slots) out += " (now)";
  }
  if (out.empty()) return "no acquires recorded yet";
  return out + fmt("   (%s replay of the last %llu accesses, %.0f s old)",
                   j["policy"].get<std::string>().c_str(),
                   (unsigned long long)j["what_if_accesses"].get<uint64_t>(),
                   j["what_if_age_s"].get<double>());
}

}  // namespace

int cmd_experts_summary(client::Client& c) {
  auto e = c.experts_json();
  if (!e) {
    std::fprintf(stderr, "expertctl: error: %s\n", e.error().message.c_str());
    return 1;
  }
  const json j = json::parse(*e);
  const uint32_t E = j["n_expert"].get<uint32_t>();
  std::printf("%zu MoE layers x %u experts; %s slots: %u x %llu KiB; policy %s\n",
              j["layers"].size(), E, j["tiers"].get<std::string>().c_str(),
              j["slot_count"].get<uint32_t>(),
              (unsigned long long)(j["slot_bytes"].get<uint64_t>() >> 10),
              j["policy"].get<std::string>().c_str());
  std::printf("%5s %5s %9s %12s %12s %8s\n", "layer", "model", "resident", "hits", "misses",
              "hit rate");
  uint64_t hits_total = 0, misses_total = 0;
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const auto& L = j["layers"][l];
    const std::string r = L["resident"].get<std::string>();
    const auto resident = std::count_if(r.begin(), r.end(), [](char ch) { return ch != '.'; });
    const uint64_t h = sum(L["hits"], 0, E), m = sum(L["misses"], 0, E);
    hits_total += h, misses_total += m;
    std::printf("%5zu %5u %4ld/%-4u %12llu %12llu %8s\n", l, L["model_layer"].get<uint32_t>(),
                long(resident), E, (unsigned long long)h, (unsigned long long)m,
                percent(double(h), double(h + m)).c_str());
  }
  std::printf("%5s %5s %9s %12llu %12llu %8s\n", "all", "", "", (unsigned long long)hits_total,
              (unsigned long long)misses_total,
              percent(double(hits_total), double(hits_total + misses_total)).c_str());
  const auto& d = j["drive"];
  std::printf("drive     %s read", mib(d["read_bytes"].get<double>()).c_str());
  if (!d["read_mib_s_measured"].is_null())
    std::printf(", %.0f MiB/s measured while reading", d["read_mib_s_measured"].get<double>());
  std::printf("\nwhat if   %s\n", what_if_line(j).c_str());
  std::printf("connected");
  for (const auto& en : j["engines"])
    std::printf("  %s (%s, pid %d, %llu acquires)", en["name"].get<std::string>().c_str(),
                en["kind"].get<std::string>().c_str(), en["pid"].get<int>(),
                (unsigned long long)en["acquires"].get<uint64_t>());
  std::printf("\n");
  return 0;
}

}  // namespace expertd::ctl
