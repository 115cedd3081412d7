// What the host could give a process now: /proc/meminfo's MemAvailable (the daemon's slot budget,
// the CPU backend's interleaved copies).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "common/result.h"

namespace expertd {

inline Result<uint64_t> host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kb;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return make_error("cannot read MemAvailable from /proc/meminfo");
}

}  // namespace expertd
