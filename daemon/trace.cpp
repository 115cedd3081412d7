#include "daemon/trace.h"

#include <cstring>

namespace expertd::daemon {

Status TraceWriter::open(const std::string& path, uint32_t n_layers, uint32_t n_experts) {
  path_ = path;
  n_layers_ = n_layers;
  n_experts_ = n_experts;
  f_ = std::fopen(path.c_str(), "wbe");
  if (!f_) return errno_error("open trace " + path);
  std::fwrite("XPRTTRC1", 1, 8, f_);
  std::fwrite(&n_layers, 4, 1, f_);
  std::fwrite(&n_experts, 4, 1, f_);
  return {};
}

void TraceWriter::record(uint64_t time_ns, uint32_t client, uint32_t layer,
                         std::span<const uint32_t> experts, bool hint) {
  if (!f_) return;
  auto put = [&](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  };
  uint16_t l = static_cast<uint16_t>(layer | (hint ? kTraceHint : 0)),
           n = static_cast<uint16_t>(experts.size());
  put(&time_ns, 8);
  put(&client, 4);
  put(&l, 2);
  put(&n, 2);
  for (uint32_t e : experts) {
    uint16_t v = static_cast<uint16_t>(e);
    put(&v, 2);
  }
  if (buf_.size() >= (1u << 16)) flush();
}

void TraceWriter::flush() {
  if (!f_ || buf_.empty()) return;
  std::fwrite(buf_.data(), 1, buf_.size(), f_);
  std::fflush(f_);
  buf_.clear();
}

Status TraceWriter::reopen() {
  if (!f_) return {};
  flush();
  std::fclose(f_);
  f_ = nullptr;
  return open(path_, n_layers_, n_experts_);
}

TraceWriter::~TraceWriter() {
  flush();
  if (f_) std::fclose(f_);
}

}  // namespace expertd::daemon
