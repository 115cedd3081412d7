// Slot arenas: where expert blocks live once read. The cache speaks only this interface, so the
// CUDA arena (VRAM slots, pinned staging, IPC handles) is a second implementation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/meminfo.h"
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
  // Reads that may be in flight at once (cuda: one per staging buffer); the cache queues the rest.
  virtual uint32_t max_reads_in_flight() const { return ~0u; }
  // A read into read_target(slot) failed or was rejected: its target is free again.
  virtual void abandon(uint32_t slot) { (void)slot; }
  // The descriptor passed to clients with SCM_RIGHTS (host memfd), or -1.
  virtual int share_fd() const { return -1; }
  // host: the arena's bytes backed by 2 MiB pages (--huge-pages; the host's shmem_enabled).
  virtual uint64_t huge_page_bytes() const { return 0; }
  // cuda: cudaIpcMemHandle_t of the arena and one cudaIpcEventHandle_t per slot, for HelloReply.
  virtual std::vector<uint8_t> ipc_memory_handle() const { return {}; }
  virtual std::vector<uint8_t> ipc_event_handles() const { return {}; }
  virtual std::string cuda_pci_bus_id() const { return {}; }
  virtual uint64_t h2d_bytes() const { return 0; }
  virtual uint64_t copy_errors() const { return 0; }  // failed host-to-device copies
  virtual uint64_t stage_waits() const {
    return 0;
  }  // reads that waited for a staging buffer's copy
  // cuda: pinned host memory under the VRAM slots (--host-cache-mib). An expert evicted from VRAM
  // is copied down into a host slot (demote), and a VRAM miss the host tier holds is copied up
  // from it (promote) instead of read from the drive. Both run on the arena's one copy stream, so
  // they are ordered with every other copy into or out of the same slots: nothing waits.
  virtual uint32_t host_slot_count() const { return 0; }
  virtual Status demote(uint32_t slot, uint32_t host_slot, uint64_t bytes) {
    (void)slot, (void)host_slot, (void)bytes;
    return make_error("this arena has no host tier");
  }
  // Records the slot's event after the copy, as publish() does.
  virtual Status promote(uint32_t host_slot, uint32_t slot, uint64_t bytes) {
    (void)slot, (void)host_slot, (void)bytes;
    return make_error("this arena has no host tier");
  }
  virtual uint64_t d2h_bytes() const { return 0; }
};

using expertd::host_available_bytes;  // common/meminfo.h: the slot budget

// Shared host memory: a sealed memfd mapped read-write here, read-only in clients
// (F_SEAL_FUTURE_WRITE forbids any new writable mapping). O_DIRECT reads land in the slots. With
// `huge_pages` it is mapped 2 MiB-aligned and advised to transparent huge pages before it is
// faulted in; `warning` says so where the host left it in 4 KiB pages.
Result<std::unique_ptr<SlotArena>> create_host_arena(uint32_t slot_count, uint64_t slot_bytes,
                                                     bool lock_memory, bool huge_pages,
                                                     std::string* warning);

struct CudaArenaOptions {
  int device = 0;
  uint64_t slot_bytes = 0;
  uint64_t cache_bytes = 0;    // --cache-mib (or --cache-slots x slot_bytes)
  uint64_t reserve_bytes = 0;  // VRAM left to engines
  uint64_t max_slots = 0;      // every expert of the pack
  uint64_t need_slots = 0;     // clients_max x max_experts_per_request
  uint32_t stage_slots = 8;
  uint64_t host_slots = 0;  // the pinned host tier under VRAM (--host-cache-mib / -slots)
};

// VRAM slots (cudaMalloc + cudaIpcGetMemHandle), an interprocess event per slot, pinned staging.
// Built only with the CUDA tier (EXPERTD_HAVE_CUDA_ARENA); `info` describes the device.
Result<std::unique_ptr<SlotArena>> create_cuda_arena(const CudaArenaOptions& o, std::string* info);

}  // namespace expertd::daemon
