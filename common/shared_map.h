// Shared mappings of a memfd (the daemon's host slot arena) placed on a 2 MiB boundary and advised
// to transparent huge pages: reading the slots then takes one TLB entry per 2 MiB instead of per
// 4 KiB, where the host lets shared memory use huge pages
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled "advise", "within_size", "always").
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/result.h"

namespace expertd {

inline constexpr uint64_t kHugePage = uint64_t{2} << 20;

// Maps `bytes` of `fd` from offset 0 with MAP_SHARED, the start 2 MiB-aligned (a huge page backs
// only an aligned range); with `huge`, advised MADV_HUGEPAGE (a hint: without huge pages the
// mapping works the same).
inline Result<void*> map_shared_aligned(int fd, uint64_t bytes, int prot, bool huge) {
  const uint64_t span = bytes + kHugePage;
  void* r = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    return errno_error("reserve " + std::to_string(span) + " bytes of addresses");
  const auto base = reinterpret_cast<uintptr_t>(r);
  const uintptr_t at = (base + kHugePage - 1) & ~(kHugePage - 1), end = at + bytes;
  void* p = ::mmap(reinterpret_cast<void*>(at), bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::munmap(r, span);
    return errno_error("map " + std::to_string(bytes) + " bytes", err);
  }
  if (at > base) ::munmap(r, at - base);
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  if (huge) (void)::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

// The bytes of this process's mapping that starts at `start` that are mapped in 2 MiB pages
// (/proc/self/smaps: ShmemPmdMapped, FilePmdMapped, AnonHugePages), 0 if it cannot be read.
inline uint64_t huge_mapped_bytes(const void* start) {
  std::ifstream f("/proc/self/smaps");
  char want[32];
  std::snprintf(want, sizeof want, "%lx-",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(start)));
  std::string line;
  bool in = false;
  uint64_t kb = 0;
  while (std::getline(f, line)) {
    const bool header = !line.empty() && line.find(':') > line.find(' ');  // "addr-addr perms ..."
    if (header) {
      if (in) break;
      in = line.rfind(want, 0) == 0;
      continue;
    }
    if (!in) continue;
    for (const char* key : {"ShmemPmdMapped:", "FilePmdMapped:", "AnonHugePages:"})
      if (line.rfind(key, 0) == 0) {
        const char* b = line.data() + std::char_traits<char>::length(key);
        while (*b == ' ') ++b;
        uint64_t v = 0;
        std::from_chars(b, line.data() + line.size(), v);
        kb += v;
      }
  }
  return kb << 10;
}

// The host's policy for huge pages in shared memory (the bracketed word of
// /sys/kernel/mm/transparent_hugepage/shmem_enabled), or "" where the kernel has none.
inline std::string shmem_thp_policy() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string s;
  std::getline(f, s);
  const auto a = s.find('['), b = s.find(']');
  return a == std::string::npos || b == std::string::npos || b < a ? ""
                                                                   : s.substr(a + 1, b - a - 1);
}

}  // namespace expertd
