// expert-pack build: GGUF MoE model -> STEM.expertpack + STEM.manifest.json + STEM.core.gguf.
#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"
#include "gguf/gguf_reader.h"
#include "proto/pack_format.h"

namespace expertd::pack {

struct BuildOptions {
  std::string model_path;
  std::string out_dir;  // "" = the model's directory
  bool progress = true;
  uint64_t batch_bytes = 32ull << 20;  // bytes per write; two batches are in memory at once
  // Layout::Rows8: every expert matrix whose type has interleaved rows (kernels'
  // rows8_supported) stored that way, for engines on the CPU; the others as
  // rows.
  Layout layout = Layout::Rows;
};

struct BuildReport {
  std::string manifest_path, pack_path, core_path;
  uint64_t pack_bytes = 0, core_bytes = 0, source_bytes = 0;
  double seconds = 0;
  bool direct_io = true;  // false when the output file system refused O_DIRECT writes
};

// The layout of the routed experts of `model` (checksums not yet filled). Fails with a clear
// message for a model with no routed experts or inconsistent expert tensors.
Result<Manifest> plan_layout(const gguf::Model& model, Layout layout = Layout::Rows);
// The bytes of one expert's role in the source GGUF (the pack's are its layout's).
uint64_t source_role_bytes(const RoleLayout& r);

// The identity of a source model: xxh3-64 over every shard's metadata and tensor infos.
uint64_t source_identity(const gguf::Model& model);

// "dir/Qwen3-30B-00001-of-00002.gguf" -> "Qwen3-30B"
std::string model_stem(const std::string& path);

Result<BuildReport> build_pack(const BuildOptions& opts);

}  // namespace expertd::pack
