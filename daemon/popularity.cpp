#include "daemon/popularity.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace expertd::daemon {

namespace {
constexpr const char* kFormat = "expertd-popularity";
constexpr int kVersion = 1;
}  // namespace

Status save_popularity(const std::string& path, const pack::Manifest& m,
                       std::span<const uint32_t> frequency) {
  const size_t L = m.layers.size(), X = m.n_experts;
  if (frequency.size() != L * X) return make_error("popularity table of the wrong size");
  nlohmann::ordered_json j = {{"format", kFormat},
                              {"version", kVersion},
                              {"model_id", pack::hex64(m.model_id)},
                              {"layers", L},
                              {"experts", X}};
  auto& rows = j["frequency"] = nlohmann::json::array();
  for (size_t l = 0; l < L; ++l)
    rows.push_back(
        std::vector<uint32_t>(frequency.begin() + l * X, frequency.begin() + (l + 1) * X));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return errno_error("cannot write the state file " + tmp);
    f << j.dump() << "\n";
    f.flush();
    if (!f) return errno_error("cannot write the state file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return errno_error("cannot rename " + tmp + " to " + path);
  return {};
}

Result<std::vector<uint32_t>> load_popularity(const std::string& path, const pack::Manifest& m) {
  std::ifstream f(path);
  if (!f) {
    if (errno == ENOENT) return std::vector<uint32_t>{};  // a first start
    return errno_error("cannot read the state file " + path);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  auto bad = [&](const std::string& why) { return make_error("state file " + path + ": " + why); };
  if (j.is_discarded() || !j.is_object()) return bad("not JSON");
  if (j.value("format", "") != kFormat || j.value("version", 0) != kVersion)
    return bad(std::string("not an ") + kFormat + " version " + std::to_string(kVersion) + " file");
  if (j.value("model_id", "") != pack::hex64(m.model_id))
    return bad("written for model " + j.value("model_id", std::string("?")) +
               ", this pack serves model " + pack::hex64(m.model_id));
  const size_t L = m.layers.size(), X = m.n_experts;
  const auto& rows = j["frequency"];
  if (j.value("layers", size_t{0}) != L || j.value("experts", size_t{0}) != X || !rows.is_array() ||
      rows.size() != L)
    return bad("its shape is not the pack's (" + std::to_string(L) + " layers x " +
               std::to_string(X) + " experts)");
  std::vector<uint32_t> out;
  out.reserve(L * X);
  for (const auto& r : rows) {
    if (!r.is_array() || r.size() != X) return bad("a layer's row has the wrong length");
    for (const auto& v : r) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX)
        return bad("a count is not an unsigned 32-bit number");
      out.push_back(v.get<uint32_t>());
    }
  }
  return out;
}

}  // namespace expertd::daemon
