// A terminal progress bar with bytes/s; silent when stderr is not a terminal.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace expertd::pack {

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes, bool enabled)
      : label_(std::move(label)),
        total_(total_bytes),
        enabled_(enabled && isatty(2)),
        start_(std::chrono::steady_clock::now()) {}
  void update(uint64_t done_bytes) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (done_bytes < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    double s = std::chrono::duration<double>(now - start_).count();
    double frac = total_ ? double(done_bytes) / double(total_) : 1.0;
    int filled = static_cast<int>(frac * 30);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(30, ' ');
    std::fprintf(stderr, "\r%s [%s] %5.1f%%  %.2f / %.2f GiB  %.0f MiB/s ", label_.c_str(),
                 bar.c_str(), frac * 100, done_bytes / 1073741824.0, total_ / 1073741824.0,
                 s > 0 ? done_bytes / 1048576.0 / s : 0.0);
    if (done_bytes >= total_) std::fputc('\n', stderr);
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace expertd::pack
