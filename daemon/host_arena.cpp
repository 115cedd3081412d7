#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/fd.h"
#include "daemon/arena.h"

namespace expertd::daemon {
namespace {

class HostArena final : public SlotArena {
 public:
  HostArena(UniqueFd fd, uint8_t* base, uint32_t count, uint64_t bytes)
      : fd_(std::move(fd)), base_(base), count_(count), bytes_(bytes) {}
  ~HostArena() override { ::munmap(base_, arena_bytes()); }
  std::string kind() const override { return "host"; }
  uint32_t slot_count() const override { return count_; }
  uint64_t slot_bytes() const override { return bytes_; }
  uint8_t* read_target(uint32_t slot) override { return base_ + uint64_t{slot} * bytes_; }
  void publish(uint32_t, uint64_t, std::function<void(Status)> done) override { done({}); }
  int share_fd() const override { return fd_.get(); }

 private:
  UniqueFd fd_;
  uint8_t* base_;
  uint32_t count_;
  uint64_t bytes_;
};

}  // namespace

Result<std::unique_ptr<SlotArena>> create_host_arena(uint32_t slot_count, uint64_t slot_bytes,
                                                     bool lock_memory, std::string* warning) {
  uint64_t bytes = uint64_t{slot_count} * slot_bytes;
  UniqueFd fd(::memfd_create("expertd-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errno_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return errno_error("size the arena memfd to " + std::to_string(bytes) + " bytes");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error("map the arena (" + std::to_string(bytes) + " bytes)");
  if (lock_memory && ::mlock(p, bytes) != 0 && warning)
    *warning = "mlock of the arena failed (" + std::string(std::strerror(errno)) +
               "); raise LimitMEMLOCK to keep slots out of swap";
  // Clients may map the arena read-only and nothing else; the size can never change.
  if (::fcntl(fd.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    int err = errno;
    ::munmap(p, bytes);
    return errno_error("seal the arena memfd", err);
  }
  return std::unique_ptr<SlotArena>(
      new HostArena(std::move(fd), static_cast<uint8_t*>(p), slot_count, slot_bytes));
}

}  // namespace expertd::daemon
