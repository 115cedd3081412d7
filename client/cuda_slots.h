// The engine's view of a cuda arena: the daemon's slot memory opened once per connection
// (cudaIpcOpenMemHandle), each slot's interprocess event opened on first use, and a call that
// makes a CUDA stream wait for a slot's copy (cudaStreamWaitEvent: no host blocking on the hit
// path). Built only with the CUDA tier (library expertclient_cuda).
//
// Contract: release a lease only after the GPU work that reads its slots has completed (e.g.
// after cudaStreamSynchronize or a host wait on an event recorded after that work): once
// released, a slot may be overwritten by the daemon's next copy.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "client/expert_client.h"
#include "common/result.h"

namespace expertd::client {

class CudaSlots {
 public:
  // Opens the arena announced by a cuda-backend expertd, making the daemon's GPU (by PCI bus id)
  // the calling thread's current device. Fails with a clear error when the daemon serves a host
  // arena, its GPU is not visible here, or the IPC open is refused (container permissions).
  static Result<std::unique_ptr<CudaSlots>> open(const ModelInfo& info);
  ~CudaSlots();
  CudaSlots(const CudaSlots&) = delete;
  CudaSlots& operator=(const CudaSlots&) = delete;

  // Device address of a slot (valid for the connection's lifetime).
  const uint8_t* slot_ptr(uint32_t slot) const { return base_ + uint64_t{slot} * slot_bytes_; }
  // Makes `stream` wait for the last copy into `slot` (call after the slot is ready).
  Status wait(cudaStream_t stream, uint32_t slot);
  // The same for every slot of a lease.
  Status wait(cudaStream_t stream, const Lease& lease);
  uint64_t ipc_open_errors() const { return ipc_open_errors_; }

 private:
  CudaSlots() = default;
  const uint8_t* base_ = nullptr;
  uint64_t slot_bytes_ = 0;
  uint32_t slot_count_ = 0;
  std::vector<uint8_t> event_handles_;
  std::vector<cudaEvent_t> events_;  // opened on demand
  uint64_t ipc_open_errors_ = 0;
};

}  // namespace expertd::client
