// expert-pack verify / inspect.
#pragma once

#include <cstdint>
#include <string>

#include "common/fd.h"
#include "common/result.h"
#include "proto/pack_format.h"

namespace expertd::pack {

struct VerifyOptions {
  std::string manifest_path;
  std::string source_path;  // "" = the source recorded in the manifest, when present
  bool progress = true;
};

struct VerifyReport {
  uint64_t experts_checked = 0;
  uint64_t bytes_read = 0;
  bool source_compared = false;
  std::string source_note;  // why the source was not compared
};

// Opens the pack named by a manifest with O_DIRECT and checks its header against the manifest
// and its size. Fails closed when the file system refuses O_DIRECT.
Result<UniqueFd> open_pack_direct(const Manifest& m, const std::string& manifest_path);

Result<VerifyReport> verify_pack(const VerifyOptions& opts);
std::string inspect(const Manifest& m);

}  // namespace expertd::pack
