// --trace-path: every acquire as a compact binary record, the input of cache-policy work.
// File: "XPRTTRC1", u32 n_layers, u32 n_experts, then records:
//   u64 time_ns (since start), u32 client, u16 layer, u16 n, u16 expert[n]
// A Prefetch hint (not will_acquire) is a record whose layer has bit 15 set (kTraceHint): the
// policy lab replays hints where asked ("lfru+hints"); traces without hints read as before.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace expertd::daemon {

constexpr uint16_t kTraceHint = 0x8000;

class TraceWriter {
 public:
  Status open(const std::string& path, uint32_t n_layers, uint32_t n_experts);
  void record(uint64_t time_ns, uint32_t client, uint32_t layer, std::span<const uint32_t> experts,
              bool hint = false);
  void flush();
  Status reopen();  // SIGHUP: continue in a fresh file at the same path (rotated away)
  ~TraceWriter();
  bool enabled() const { return f_ != nullptr; }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  uint32_t n_layers_ = 0, n_experts_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace expertd::daemon
