#include "proto/pack_format.h"

#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "common/fd.h"

namespace expertd::pack {
namespace {

constexpr std::array<std::string_view, kRoleCount> kRoleNames = {
    "gate", "up", "gate_up", "down", "gate_bias", "up_bias", "gate_up_bias", "down_bias"};

template <class T>
void put(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}
template <class T>
T get(std::span<const uint8_t> b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

uint64_t header_bytes_for(size_t n_layers) {
  return round_up(kHeaderFixedBytes + kHeaderLayerBytes * n_layers, kAlign);
}

}  // namespace

std::string_view role_name(Role r) {
  return kRoleNames[static_cast<size_t>(r)];
}

std::optional<Role> role_from_name(std::string_view name) {
  for (size_t i = 0; i < kRoleCount; ++i)
    if (kRoleNames[i] == name) return static_cast<Role>(i);
  return std::nullopt;
}

std::string_view layout_name(Layout l) {
  return l == Layout::Rows8 ? "rows8" : "rows";
}

bool Manifest::has_rows8() const {
  for (const auto& l : layers)
    for (const auto& r : l.roles)
      if (r.layout == Layout::Rows8) return true;
  return false;
}

const RoleLayout* LayerLayout::find(Role r) const {
  for (const auto& role : roles)
    if (role.role == r) return &role;
  return nullptr;
}

uint64_t Manifest::slot_bytes() const {
  uint64_t m = 0;
  for (const auto& l : layers) m = std::max(m, l.stride);
  return m;
}

std::vector<uint32_t> Manifest::moe_layers() const {
  std::vector<uint32_t> out;
  for (const auto& l : layers) out.push_back(l.model_layer);
  return out;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void lay_out(Manifest& m) {
  m.version = m.has_rows8() ? kFormatVersion : kFormatVersionRows;
  m.data_start = header_bytes_for(m.layers.size());
  uint64_t at = m.data_start;
  for (auto& l : m.layers) {
    uint64_t off = 0;
    for (auto& r : l.roles) {
      r.offset = off;
      off = round_up(off + r.bytes, kAlign);
    }
    l.stride = off;
    l.base = at;
    at += l.stride * m.n_experts;
  }
  m.pack_bytes = at;
}

std::vector<uint8_t> encode_header(const Manifest& m) {
  std::vector<uint8_t> b(m.data_start, 0);
  std::memcpy(b.data(), kMagic, 8);
  put<uint32_t>(b, 8, m.version);
  put<uint32_t>(b, 12, static_cast<uint32_t>(m.data_start));
  put<uint64_t>(b, 16, m.data_start);
  put<uint64_t>(b, 24, m.pack_bytes);
  put<uint64_t>(b, 32, m.model_id);
  put<uint32_t>(b, 40, static_cast<uint32_t>(m.layers.size()));
  put<uint32_t>(b, 44, m.n_experts);
  put<uint64_t>(b, 48, m.slot_bytes());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    size_t at = kHeaderFixedBytes + kHeaderLayerBytes * l;
    put<uint32_t>(b, at, m.layers[l].model_layer);
    put<uint32_t>(b, at + 4, static_cast<uint32_t>(m.layers[l].roles.size()));
    put<uint64_t>(b, at + 8, m.layers[l].base);
    put<uint64_t>(b, at + 16, m.layers[l].stride);
  }
  put<uint64_t>(b, 56, XXH3_64bits(b.data(), b.size()));  // checksum with this field zero
  return b;
}

Status check_header(std::span<const uint8_t> h, const Manifest& m) {
  if (h.size() < kHeaderFixedBytes || std::memcmp(h.data(), kMagic, 8) != 0)
    return make_error("not an expert pack (bad magic)");
  if (get<uint32_t>(h, 8) < kFormatVersionRows || get<uint32_t>(h, 8) > kFormatVersion)
    return make_error("pack format version " + std::to_string(get<uint32_t>(h, 8)) +
                      " is not supported (this build reads " + std::to_string(kFormatVersionRows) +
                      " to " + std::to_string(kFormatVersion) + ")");
  uint64_t data_start = get<uint64_t>(h, 16);
  if (data_start > h.size()) return make_error("pack header is truncated");
  // Found by fuzzing: a data_start below the fixed header made the checksum step write past
  // the copy of the header.
  if (data_start < kHeaderFixedBytes)
    return make_error("pack header: data_start " + std::to_string(data_start) +
                      " is inside the fixed header");
  std::vector<uint8_t> copy(h.begin(), h.begin() + static_cast<long>(data_start));
  uint64_t sum = get<uint64_t>(h, 56);
  std::memset(copy.data() + 56, 0, 8);
  if (XXH3_64bits(copy.data(), copy.size()) != sum)
    return make_error("pack header checksum mismatch");
  auto expected = encode_header(m);
  if (expected.size() != data_start || std::memcmp(expected.data(), h.data(), data_start) != 0) {
    std::string what = "layout";
    if (get<uint64_t>(h, 32) != m.model_id)
      what = "model_id";
    else if (get<uint32_t>(h, 40) != m.layers.size())
      what = "layer count";
    else if (get<uint32_t>(h, 44) != m.n_experts)
      what = "expert count";
    else if (get<uint64_t>(h, 24) != m.pack_bytes)
      what = "pack size";
    return make_error("pack header and manifest disagree (" + what + ")");
  }
  return {};
}

std::string to_json(const Manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = "expertpack";
  j["version"] = m.version;
  j["pack_file"] = m.pack_file;
  j["core_file"] = m.core_file;
  j["pack_bytes"] = m.pack_bytes;
  j["data_start"] = m.data_start;
  j["model_id"] = hex64(m.model_id);
  j["arch"] = m.arch;
  j["model_name"] = m.model_name;
  j["n_experts"] = m.n_experts;
  j["n_experts_used"] = m.n_experts_used;
  j["slot_bytes"] = m.slot_bytes();
  j["moe_layers"] = m.moe_layers();
  auto& src = j["source"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.source_files.size(); ++i)
    src.push_back({{"path", m.source_files[i]}, {"bytes", m.source_bytes[i]}});
  auto& layers = j["layers"] = nlohmann::ordered_json::array();
  for (const auto& l : m.layers) {
    nlohmann::ordered_json jl;
    jl["model_layer"] = l.model_layer;
    jl["base"] = l.base;
    jl["stride"] = l.stride;
    auto& roles = jl["roles"] = nlohmann::ordered_json::array();
    for (const auto& r : l.roles) {
      roles.push_back({{"role", role_name(r.role)},
                       {"tensor", r.tensor},
                       {"ggml_type", r.ggml_type},
                       {"ne", r.ne},
                       {"offset", r.offset},
                       {"bytes", r.bytes}});
      if (r.layout != Layout::Rows) roles.back()["layout"] = layout_name(r.layout);
    }
    auto& sums = jl["xxh3"] = nlohmann::ordered_json::array();
    for (uint64_t s : l.checksums) sums.push_back(hex64(s));
    layers.push_back(std::move(jl));
  }
  return j.dump(1) + "\n";
}

Result<Manifest> parse_manifest(std::string_view text, const std::string& what) {
  Manifest m;
  try {
    auto j = nlohmann::json::parse(text);
    if (j.value("format", "") != "expertpack")
      return make_error(what + ": not an expert pack manifest");
    m.version = j.at("version").get<uint32_t>();
    if (m.version < kFormatVersionRows || m.version > kFormatVersion)
      return make_error(what + ": manifest version " + std::to_string(m.version) +
                        " is not supported (this build reads " +
                        std::to_string(kFormatVersionRows) + " to " +
                        std::to_string(kFormatVersion) + ")");
    m.pack_file = j.at("pack_file").get<std::string>();
    m.core_file = j.value("core_file", "");
    m.pack_bytes = j.at("pack_bytes").get<uint64_t>();
    m.data_start = j.at("data_start").get<uint64_t>();
    m.model_id = std::stoull(j.at("model_id").get<std::string>(), nullptr, 16);
    m.arch = j.value("arch", "");
    m.model_name = j.value("model_name", "");
    m.n_experts = j.at("n_experts").get<uint32_t>();
    m.n_experts_used = j.value("n_experts_used", 0u);
    for (const auto& s : j.value("source", nlohmann::json::array())) {
      m.source_files.push_back(s.at("path").get<std::string>());
      m.source_bytes.push_back(s.at("bytes").get<uint64_t>());
    }
    for (const auto& jl : j.at("layers")) {
      LayerLayout l;
      l.model_layer = jl.at("model_layer").get<uint32_t>();
      l.base = jl.at("base").get<uint64_t>();
      l.stride = jl.at("stride").get<uint64_t>();
      for (const auto& jr : jl.at("roles")) {
        RoleLayout r;
        auto role = role_from_name(jr.at("role").get<std::string>());
        if (!role) return make_error(what + ": unknown role " + jr.at("role").dump());
        r.role = *role;
        r.tensor = jr.value("tensor", "");
        r.ggml_type = jr.at("ggml_type").get<uint32_t>();
        r.ne = jr.at("ne").get<std::array<uint64_t, 2>>();
        r.offset = jr.at("offset").get<uint64_t>();
        r.bytes = jr.at("bytes").get<uint64_t>();
        const std::string layout = jr.value("layout", "rows");
        if (layout == "rows8")
          r.layout = Layout::Rows8;
        else if (layout != "rows")
          return make_error(what + ": unknown layout \"" + layout + "\" of role " +
                            std::string(role_name(r.role)));
        l.roles.push_back(std::move(r));
      }
      for (const auto& s : jl.at("xxh3"))
        l.checksums.push_back(std::stoull(s.get<std::string>(), nullptr, 16));
      m.layers.push_back(std::move(l));
    }
  } catch (const std::exception& e) {
    return make_error(what + ": malformed manifest: " + e.what());
  }
  if (auto st = validate(m); !st) return make_error(what + ": " + st.error().message);
  return m;
}

Status validate(const Manifest& m) {
  if (m.layers.empty()) return make_error("manifest has no layers");
  if (m.n_experts == 0 || m.n_experts > (1u << 16)) return make_error("implausible n_experts");
  if (m.data_start % kAlign || m.data_start < header_bytes_for(m.layers.size()))
    return make_error("data_start " + std::to_string(m.data_start) +
                      " breaks the 4096-byte layout");
  uint64_t at = m.data_start;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    std::string where = "layer " + std::to_string(i) + ": ";
    if (l.stride == 0 || l.stride % kAlign)
      return make_error(where + "stride is not a multiple of 4096");
    if (l.base != at)
      return make_error(where + "base " + std::to_string(l.base) + " should be " +
                        std::to_string(at));
    if (l.roles.empty()) return make_error(where + "no roles");
    for (const auto& r : l.roles) {
      if (r.offset % kAlign)
        return make_error(where + std::string(role_name(r.role)) + " offset is not 4096-aligned");
      if (r.offset + r.bytes > l.stride)
        return make_error(where + std::string(role_name(r.role)) + " overruns the block");
      if (r.layout == Layout::Rows8) {
        if (m.version < kFormatVersion)
          return make_error(where + std::string(role_name(r.role)) +
                            " stores interleaved rows, which format version " +
                            std::to_string(m.version) + " does not have");
        if (r.role >= Role::GateBias || r.ne[1] % 8 || r.ne[0] % 256)
          return make_error(where + std::string(role_name(r.role)) +
                            " cannot store interleaved rows (a matrix of whole groups of 8 rows "
                            "of whole 256-value blocks)");
      }
    }
    if (l.checksums.size() != m.n_experts)
      return make_error(where + std::to_string(l.checksums.size()) + " checksums for " +
                        std::to_string(m.n_experts) + " experts");
    at += l.stride * m.n_experts;
  }
  if (at != m.pack_bytes)
    return make_error("pack_bytes " + std::to_string(m.pack_bytes) + " should be " +
                      std::to_string(at));
  return {};
}

Result<Manifest> load_manifest(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return errno_error("open " + path);
  char magic[4] = {};
  f.read(magic, 4);
  if (f.gcount() == 4 && std::string_view(magic, 4) == "GGUF")
    return make_error(path +
                      " is a GGUF model, not a pack manifest (expert-pack build writes "
                      "STEM.manifest.json from it)");
  f.clear();
  f.seekg(0, std::ios::end);
  if (f.tellg() > std::streamoff(256u << 20))
    return make_error(path + ": manifest is implausibly large");
  f.seekg(0);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_manifest(ss.str(), path);
}

std::string manifest_dir(const std::string& manifest_path) {
  auto slash = manifest_path.rfind('/');
  return slash == std::string::npos ? "." : manifest_path.substr(0, slash);
}

}  // namespace expertd::pack
