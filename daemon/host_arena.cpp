#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/fd.h"
#include "common/shared_map.h"
#include "daemon/arena.h"

namespace expertd::daemon {
namespace {

class HostArena final : public SlotArena {
 public:
  HostArena(UniqueFd fd, uint8_t* base, uint32_t count, uint64_t bytes, uint64_t huge)
      : fd_(std::move(fd)), base_(base), count_(count), bytes_(bytes), huge_(huge) {}
  ~HostArena() override { ::munmap(base_, arena_bytes()); }
  std::string kind() const override { return "host"; }
  uint32_t slot_count() const override { return count_; }
  uint64_t slot_bytes() const override { return bytes_; }
  uint8_t* read_target(uint32_t slot) override { return base_ + uint64_t{slot} * bytes_; }
  void publish(uint32_t, uint64_t, std::function<void(Status)> done) override { done({}); }
  int share_fd() const override { return fd_.get(); }
  uint64_t huge_page_bytes() const override { return huge_; }

 private:
  UniqueFd fd_;
  uint8_t* base_;
  uint32_t count_;
  uint64_t bytes_;
  uint64_t huge_;  // bytes in 2 MiB pages once faulted in
};

}  // namespace

Result<std::unique_ptr<SlotArena>> create_host_arena(uint32_t slot_count, uint64_t slot_bytes,
                                                     bool lock_memory, bool huge_pages,
                                                     std::string* warning) {
  uint64_t bytes = uint64_t{slot_count} * slot_bytes;
  UniqueFd fd(::memfd_create("expertd-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errno_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return errno_error("size the arena memfd to " + std::to_string(bytes) + " bytes");
  auto mapped = map_shared_aligned(fd.get(), bytes, PROT_READ | PROT_WRITE, huge_pages);
  if (!mapped) return make_error("map the arena: " + mapped.error().message);
  void* p = *mapped;
  // Faulted in now (after the advice, so huge pages where granted): a shortage is an error here,
  // not a SIGBUS later. Kernels before 5.14 lack MADV_POPULATE_WRITE: a write per page instead.
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) != 0) {
    int err = errno;
    if (err == EINVAL) {
      for (uint64_t o = 0; o < bytes; o += 4096) static_cast<volatile uint8_t*>(p)[o] = 0;
    } else {
      ::munmap(p, bytes);
      return errno_error("fault in the arena (" + std::to_string(bytes) + " bytes)", err);
    }
  }
  auto warn = [&](const std::string& w) {
    if (warning) *warning += (warning->empty() ? "" : "; ") + w;
  };
  if (lock_memory && ::mlock(p, bytes) != 0)
    warn("mlock of the arena failed (" + std::string(std::strerror(errno)) +
         "); raise LimitMEMLOCK to keep slots out of swap");
  // Decode reading experts from 2 MiB pages ran 0-5% faster than from 4 KiB pages (0.99x of the
  // engine's own huge-page copies against 0.95x; docs/performance.md): say so where it cannot.
  // Below 32 MiB, four times what a TLB's few thousand 4 KiB entries cover, no warning.
  const uint64_t huge = huge_pages ? huge_mapped_bytes(p) : 0;
  if (huge_pages && bytes >= (uint64_t{32} << 20) && huge < bytes / 2) {
    const std::string policy = shmem_thp_policy();
    warn("the arena is in 4 KiB pages (" + std::to_string(huge >> 20) + " of " +
         std::to_string(bytes >> 20) + " MiB in 2 MiB pages; shmem_enabled is " +
         (policy.empty() ? "absent" : "'" + policy + "'") +
         "): decode from its slots measured 0-5% slower than from 2 MiB pages. Run 'echo advise > "
         "/sys/kernel/mm/transparent_hugepage/shmem_enabled' before expertd starts (systemd: "
         "expertd-thp.conf in /etc/tmpfiles.d), or --huge-pages false to silence this");
  }
  // Clients may map the arena read-only and nothing else; the size can never change.
  if (::fcntl(fd.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    int err = errno;
    ::munmap(p, bytes);
    return errno_error("seal the arena memfd", err);
  }
  return std::unique_ptr<SlotArena>(
      new HostArena(std::move(fd), static_cast<uint8_t*>(p), slot_count, slot_bytes, huge));
}

}  // namespace expertd::daemon
