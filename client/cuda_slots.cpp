#include "client/cuda_slots.h"

#include <cstring>
#include <string>

namespace expertd::client {

namespace {
std::string cuda_message(cudaError_t e, const std::string& what) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}
}  // namespace

Result<std::unique_ptr<CudaSlots>> CudaSlots::open(const ModelInfo& info) {
  if (info.arena_kind != "cuda")
    return make_error("expertd serves a " + info.arena_kind + " arena, not a cuda one");
  if (info.cuda_ipc_handle.size() != sizeof(cudaIpcMemHandle_t))
    return make_error("expertd sent a CUDA memory handle of " +
                      std::to_string(info.cuda_ipc_handle.size()) + " bytes, expected " +
                      std::to_string(sizeof(cudaIpcMemHandle_t)));
  if (info.cuda_event_handles.size() != uint64_t{info.slot_count} * sizeof(cudaIpcEventHandle_t))
    return make_error("expertd sent " + std::to_string(info.cuda_event_handles.size()) +
                      " bytes of event handles for " + std::to_string(info.slot_count) + " slots");
  // The daemon's GPU by PCI bus id: device ordinals differ between processes
  // (CUDA_VISIBLE_DEVICES); the calling thread's current device becomes that GPU.
  if (!info.cuda_pci_bus_id.empty()) {
    int dev = -1;
    if (cudaError_t e = cudaDeviceGetByPCIBusId(&dev, info.cuda_pci_bus_id.c_str());
        e != cudaSuccess) {
      (void)cudaGetLastError();
      return make_error(cuda_message(e, "expertd's arena is on GPU " + info.cuda_pci_bus_id +
                                            ", which this process cannot see"));
    }
    if (cudaError_t e = cudaSetDevice(dev); e != cudaSuccess)
      return make_error(cuda_message(e, "select expertd's GPU"));
  }
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, info.cuda_ipc_handle.data(), sizeof mh);
  void* p = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(
        cuda_message(e,
                     "open expertd's GPU slot arena (cudaIpcOpenMemHandle; same machine, a GPU "
                     "visible to both processes and IPC permitted in the container?)"));
  }
  std::unique_ptr<CudaSlots> s(new CudaSlots);
  s->base_ = static_cast<const uint8_t*>(p);
  s->slot_bytes_ = info.slot_bytes;
  s->slot_count_ = info.slot_count;
  s->event_handles_ = info.cuda_event_handles;
  s->events_.assign(info.slot_count, nullptr);
  return s;
}

CudaSlots::~CudaSlots() {
  for (auto e : events_)
    if (e) cudaEventDestroy(e);
  if (base_) cudaIpcCloseMemHandle(const_cast<uint8_t*>(base_));
}

Status CudaSlots::wait(cudaStream_t stream, uint32_t slot) {
  if (slot >= slot_count_)
    return make_error("slot " + std::to_string(slot) + " is outside the arena");
  if (!events_[slot]) {
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, event_handles_.data() + uint64_t{slot} * sizeof eh, sizeof eh);
    if (cudaError_t e = cudaIpcOpenEventHandle(&events_[slot], eh); e != cudaSuccess) {
      ++ipc_open_errors_;
      events_[slot] = nullptr;
      (void)cudaGetLastError();
      return make_error(cuda_message(
          e, "open the event of slot " + std::to_string(slot) + " (cudaIpcOpenEventHandle)"));
    }
  }
  if (cudaError_t e = cudaStreamWaitEvent(stream, events_[slot], 0); e != cudaSuccess)
    return make_error(cuda_message(e, "make a stream wait for slot " + std::to_string(slot)));
  return {};
}

Status CudaSlots::wait(cudaStream_t stream, const Lease& lease) {
  for (uint32_t s : lease.slots) EXPERTD_TRY(wait(stream, s));
  return {};
}

}  // namespace expertd::client
