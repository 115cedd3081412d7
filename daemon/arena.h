// Slot arenas: where expert blocks live once read. The cache speaks only this interface, so the
// CUDA arena (VRAM slots, pinned staging, IPC handles) is a second implementation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace expertd::daemon {

class SlotArena {
 public:
  virtual ~SlotArena() = default;
  virtual std::string kind() const = 0;  // "host" or "cuda"
  virtual uint32_t slot_count() const = 0;
  virtual uint64_t slot_bytes() const = 0;
  virtual uint64_t arena_bytes() const { return uint64_t{slot_count()} * slot_bytes(); }
  // Where the O_DIRECT read of `slot` lands (host: the slot itself; cuda: a staging buffer).
  virtual uint8_t* read_target(uint32_t slot) = 0;
  // Makes a landed read visible in the slot, then calls `done` on the control thread
  // (host: at once; cuda: after the H2D copy's event). Bytes counted in h2d_bytes.
  virtual void publish(uint32_t slot, uint64_t bytes, std::function<void(Status)> done) = 0;
  // The descriptor passed to clients with SCM_RIGHTS (host memfd), or -1.
  virtual int share_fd() const { return -1; }
  virtual uint64_t h2d_bytes() const { return 0; }
};

// Bytes the host could give the arena now (MemAvailable), for the slot budget.
Result<uint64_t> host_available_bytes();

// Shared host memory: a sealed memfd mapped read-write here, read-only in clients
// (F_SEAL_FUTURE_WRITE forbids any new writable mapping). O_DIRECT reads land in the slots.
Result<std::unique_ptr<SlotArena>> create_host_arena(uint32_t slot_count, uint64_t slot_bytes,
                                                     bool lock_memory, std::string* warning);

}  // namespace expertd::daemon
