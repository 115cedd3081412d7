// The expert pack format (DESIGN.md section 2): one contiguous, 4096-aligned block per
// (layer, expert), roles at 4096-aligned offsets inside the block, per-layer stride, a binary
// header in the first data_start bytes, and a JSON manifest that repeats the layout with
// per-role types/shapes and per-expert xxh3-64 checksums. Header and manifest must agree.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace expertd::pack {

inline constexpr char kMagic[8] = {'X', 'P', 'R', 'T', 'P', 'A', 'C', 'K'};
// Version 1: every role stores its rows as the source GGUF does. Version 2 adds roles stored
// interleaved eight rows at a time (Layout::Rows8): a build older than it must not read such a
// pack as rows, so only packs that have one say 2.
inline constexpr uint32_t kFormatVersionRows = 1;
inline constexpr uint32_t kFormatVersion = 2;  // the newest this build reads and writes
inline constexpr uint64_t kAlign = 4096;
inline constexpr uint64_t kHeaderFixedBytes = 64;
inline constexpr uint64_t kHeaderLayerBytes = 24;

// The roles an expert block may hold, in the order they are laid out.
enum class Role : uint8_t { Gate, Up, GateUp, Down, GateBias, UpBias, GateUpBias, DownBias };
inline constexpr size_t kRoleCount = 8;
std::string_view role_name(Role r);
std::optional<Role> role_from_name(std::string_view name);

// How a role's bytes are laid out: the source's rows, or interleaved eight rows at a time
// (kernels/rows8.h: the same quantized values, the rows' bits in every dot; expert-pack build
// --layout rows8 for engines on the CPU, which read it without a copy).
enum class Layout : uint8_t { Rows, Rows8 };
std::string_view layout_name(Layout l);

struct RoleLayout {
  Role role;
  uint32_t ggml_type = 0;
  std::array<uint64_t, 2> ne{1, 1};  // ne[0] row length, ne[1] rows (1 for biases)
  uint64_t offset = 0;               // inside the block, multiple of kAlign
  uint64_t bytes = 0;                // payload of this role for one expert
  std::string tensor;                // source tensor name
  Layout layout = Layout::Rows;
};

struct LayerLayout {
  uint32_t model_layer = 0;
  uint64_t base = 0;    // file offset of expert 0
  uint64_t stride = 0;  // bytes per expert block, multiple of kAlign
  std::vector<RoleLayout> roles;
  std::vector<uint64_t> checksums;  // xxh3-64 of each expert's whole block (stride bytes)
  const RoleLayout* find(Role r) const;
};

struct Manifest {
  uint32_t version = kFormatVersionRows;  // lay_out sets it: 2 where a role is Rows8
  std::string pack_file;                  // file name, relative to the manifest's directory
  std::string core_file;
  uint64_t pack_bytes = 0;
  uint64_t data_start = 0;
  uint64_t model_id = 0;  // identity of the source model (see pack builder)
  std::string arch;
  std::string model_name;
  uint32_t n_experts = 0;
  uint32_t n_experts_used = 0;
  std::vector<std::string> source_files;
  std::vector<uint64_t> source_bytes;
  std::vector<LayerLayout> layers;  // index = pack layer

  uint64_t offset(uint32_t layer, uint32_t expert) const {
    return layers[layer].base + uint64_t{expert} * layers[layer].stride;
  }
  uint64_t slot_bytes() const;  // the largest stride: every block fits one slot
  bool has_rows8() const;       // a role stores interleaved rows
  std::vector<uint32_t> moe_layers() const;
};

// Fills base/stride/data_start/pack_bytes from the roles (bytes set, offsets computed here), and
// the version their layouts need.
void lay_out(Manifest& m);

std::vector<uint8_t> encode_header(const Manifest& m);  // exactly data_start bytes
Status check_header(std::span<const uint8_t> header, const Manifest& m);

std::string to_json(const Manifest& m);
Result<Manifest> parse_manifest(std::string_view json, const std::string& what);
Result<Manifest> load_manifest(const std::string& path);
// Checks the manifest's internal consistency: alignment, strides, offsets, counts.
Status validate(const Manifest& m);

std::string manifest_dir(const std::string& manifest_path);
std::string hex64(uint64_t v);

}  // namespace expertd::pack
