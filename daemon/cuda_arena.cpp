// The cuda slot arena: one cudaMalloc region exported with cudaIpcGetMemHandle, one interprocess
// event per slot, a ring of pinned staging buffers that O_DIRECT reads land in, and a copy stream.
//
// A miss: the cache binds a staging buffer (read_target), the read lands there, the checksum is
// verified on it, then publish() queues cudaMemcpyAsync into the slot and records the slot's
// event after it. The Ready message goes out at once: clients make their stream wait on the
// slot's event, so nothing blocks on the host. A staging buffer is handed out again only once its
// own copy event has completed.
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <unordered_map>

#include "daemon/arena.h"

namespace expertd::daemon {
namespace {

std::string cuda_message(cudaError_t e, const std::string& what) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

class CudaArena final : public SlotArena {
 public:
  ~CudaArena() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto e : slot_events_) cudaEventDestroy(e);
    for (auto& s : stages_) {
      if (s.done) cudaEventDestroy(s.done);
      if (s.buf) cudaFreeHost(s.buf);
    }
    if (host_) cudaFreeHost(host_);
    if (stream_) cudaStreamDestroy(stream_);
    if (base_) cudaFree(base_);
  }

  std::string kind() const override { return "cuda"; }
  uint32_t slot_count() const override { return count_; }
  uint64_t slot_bytes() const override { return bytes_; }
  uint32_t max_reads_in_flight() const override { return static_cast<uint32_t>(stages_.size()); }

  uint8_t* read_target(uint32_t slot) override {
    use_device();
    if (auto it = bound_.find(slot); it != bound_.end()) return stages_[it->second].buf;
    // The cache never has more reads in flight than staging buffers, so one is free or copying.
    for (size_t i = 0; i < stages_.size(); ++i) {
      size_t b = (next_ + i) % stages_.size();
      Stage& s = stages_[b];
      if (s.slot != kNone) continue;
      if (s.copying) {
        cudaError_t q = cudaEventQuery(s.done);
        if (q == cudaErrorNotReady) continue;
        s.copying = false;
        if (q != cudaSuccess) note_async_error(q);
      }
      return bind(slot, b);
    }
    // Every unbound buffer is still copying: wait for the oldest copy (tens of microseconds).
    for (size_t i = 0; i < stages_.size(); ++i) {
      size_t b = (next_ + i) % stages_.size();
      Stage& s = stages_[b];
      if (s.slot != kNone) continue;
      ++stage_waits_;
      cudaError_t e = cudaEventSynchronize(s.done);
      s.copying = false;
      if (e != cudaSuccess) note_async_error(e);
      return bind(slot, b);
    }
    return nullptr;  // more reads than staging buffers: a cache bug, reported by the caller
  }

  void abandon(uint32_t slot) override {
    if (auto it = bound_.find(slot); it != bound_.end()) {
      stages_[it->second].slot = kNone;
      bound_.erase(it);
    }
  }

  void publish(uint32_t slot, uint64_t bytes, std::function<void(Status)> done) override {
    use_device();
    auto it = bound_.find(slot);
    if (it == bound_.end())
      return done(
          make_error("cuda arena: slot " + std::to_string(slot) + " has no staging buffer"));
    Stage& s = stages_[it->second];
    bound_.erase(it);
    s.slot = kNone;
    uint8_t* dst = static_cast<uint8_t*>(base_) + uint64_t{slot} * bytes_;
    cudaError_t e = cudaMemcpyAsync(dst, s.buf, bytes, cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess) e = cudaEventRecord(slot_events_[slot], stream_);
    if (e == cudaSuccess) e = cudaEventRecord(s.done, stream_);
    if (e != cudaSuccess) {
      ++copy_errors_;
      (void)cudaGetLastError();
      return done(
          make_error(cuda_message(e, "copy of slot " + std::to_string(slot) + " to the GPU")));
    }
    s.copying = true;
    h2d_bytes_ += bytes;
    done({});
  }

  uint32_t host_slot_count() const override { return host_count_; }
  Status demote(uint32_t slot, uint32_t host_slot, uint64_t bytes) override {
    return copy(host_ + uint64_t{host_slot} * bytes_, slot_ptr(slot), bytes, cudaMemcpyDeviceToHost,
                "copy of slot " + std::to_string(slot) + " to host memory", nullptr, d2h_bytes_);
  }
  Status promote(uint32_t host_slot, uint32_t slot, uint64_t bytes) override {
    return copy(
        slot_ptr(slot), host_ + uint64_t{host_slot} * bytes_, bytes, cudaMemcpyHostToDevice,
        "copy of host slot " + std::to_string(host_slot) + " to GPU slot " + std::to_string(slot),
        slot_events_[slot], h2d_bytes_);
  }
  uint64_t d2h_bytes() const override { return d2h_bytes_; }

  std::vector<uint8_t> ipc_memory_handle() const override { return mem_handle_; }
  std::vector<uint8_t> ipc_event_handles() const override { return event_handles_; }
  std::string cuda_pci_bus_id() const override { return pci_bus_id_; }
  uint64_t h2d_bytes() const override { return h2d_bytes_; }
  uint64_t copy_errors() const override { return copy_errors_; }
  uint64_t stage_waits() const override { return stage_waits_; }

  static Result<std::unique_ptr<SlotArena>> create(const CudaArenaOptions& o, std::string* info);

 private:
  static constexpr uint32_t kNone = ~0u;
  struct Stage {
    uint8_t* buf = nullptr;
    cudaEvent_t done = nullptr;  // recorded after this buffer's last copy
    uint32_t slot = kNone;       // the slot whose read lands here
    bool copying = false;
  };

  uint8_t* slot_ptr(uint32_t slot) const {
    return static_cast<uint8_t*>(base_) + uint64_t{slot} * bytes_;
  }
  Status copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, cudaMemcpyKind kind,
              const std::string& what, cudaEvent_t event, uint64_t& counter) {
    use_device();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream_);
    if (e == cudaSuccess && event) e = cudaEventRecord(event, stream_);
    if (e != cudaSuccess) {
      ++copy_errors_;
      (void)cudaGetLastError();
      return make_error(cuda_message(e, what));
    }
    counter += bytes;
    return {};
  }

  uint8_t* bind(uint32_t slot, size_t b) {
    stages_[b].slot = slot;
    bound_[slot] = b;
    next_ = (b + 1) % stages_.size();
    return stages_[b].buf;
  }

  // The CUDA current device is per thread: the calling thread (the server's, not necessarily the
  // one that created the arena) makes the arena's GPU current before it queues copies.
  void use_device() const {
    thread_local int current = -1;
    if (current != device_ && cudaSetDevice(device_) == cudaSuccess) current = device_;
  }

  void note_async_error(cudaError_t e) {
    ++copy_errors_;
    spdlog::error("{}", cuda_message(e, "cuda arena: an earlier host-to-device copy failed"));
  }

  int device_ = 0;
  void* base_ = nullptr;
  uint32_t count_ = 0;
  uint64_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> slot_events_;
  std::vector<Stage> stages_;
  std::unordered_map<uint32_t, size_t> bound_;
  size_t next_ = 0;
  std::vector<uint8_t> mem_handle_, event_handles_;
  std::string pci_bus_id_;
  uint8_t* host_ = nullptr;  // host_count_ pinned slots
  uint32_t host_count_ = 0;
  uint64_t h2d_bytes_ = 0, d2h_bytes_ = 0, copy_errors_ = 0, stage_waits_ = 0;
};

Result<std::unique_ptr<SlotArena>> CudaArena::create(const CudaArenaOptions& o, std::string* info) {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess)
    return make_error(cuda_message(e, "--backend cuda: no usable CUDA device"));
  if (o.device < 0 || o.device >= n)
    return make_error("--device " + std::to_string(o.device) + ": this machine has " +
                      std::to_string(n) + " CUDA device(s)");
  if (cudaError_t e = cudaSetDevice(o.device); e != cudaSuccess)
    return make_error(cuda_message(e, "select CUDA device"));
  size_t free_b = 0, total_b = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_b, &total_b); e != cudaSuccess)
    return make_error(cuda_message(e, "query free GPU memory"));
  // slot_count = floor(min(cache, free_vram - reserve) / slot_bytes), at least one working set per
  // client.
  if (free_b <= o.reserve_bytes)
    return make_error("GPU " + std::to_string(o.device) + " has " + std::to_string(free_b >> 20) +
                      " MiB free, not more than --reserve-mib " +
                      std::to_string(o.reserve_bytes >> 20));
  uint64_t budget = std::min<uint64_t>(o.cache_bytes, free_b - o.reserve_bytes);
  uint64_t count = std::min<uint64_t>(budget / o.slot_bytes, o.max_slots);
  if (count < o.need_slots)
    return make_error(
        "the GPU budget holds " + std::to_string(count) + " slots of " +
        std::to_string(o.slot_bytes) + " bytes, fewer than the " + std::to_string(o.need_slots) +
        " needed for one working set per client; raise --cache-mib, lower --reserve-mib, "
        "--clients-max or --max-experts-per-request");
  if (o.stage_slots == 0) return make_error("--stage-slots must be at least 1");

  std::unique_ptr<CudaArena> a(new CudaArena);
  a->device_ = o.device;
  a->count_ = static_cast<uint32_t>(count);
  a->bytes_ = o.slot_bytes;
  if (cudaError_t e = cudaMalloc(&a->base_, count * o.slot_bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(cuda_message(e, "cudaMalloc of the slot arena (" +
                                          std::to_string((count * o.slot_bytes) >> 20) +
                                          " MiB on GPU " + std::to_string(o.device) + ")"));
  }
  cudaIpcMemHandle_t mh;
  if (cudaError_t e = cudaIpcGetMemHandle(&mh, a->base_); e != cudaSuccess)
    return make_error(cuda_message(e, "export the slot arena (cudaIpcGetMemHandle)"));
  a->mem_handle_.assign(reinterpret_cast<uint8_t*>(&mh),
                        reinterpret_cast<uint8_t*>(&mh) + sizeof mh);
  if (cudaError_t e = cudaStreamCreateWithFlags(&a->stream_, cudaStreamNonBlocking);
      e != cudaSuccess)
    return make_error(cuda_message(e, "create the copy stream"));
  a->slot_events_.resize(count, nullptr);
  a->event_handles_.resize(count * sizeof(cudaIpcEventHandle_t));
  for (uint64_t i = 0; i < count; ++i) {
    if (cudaError_t e = cudaEventCreateWithFlags(&a->slot_events_[i],
                                                 cudaEventInterprocess | cudaEventDisableTiming);
        e != cudaSuccess)
      return make_error(
          cuda_message(e, "create the interprocess event of slot " + std::to_string(i)));
    cudaIpcEventHandle_t eh;
    if (cudaError_t e = cudaIpcGetEventHandle(&eh, a->slot_events_[i]); e != cudaSuccess)
      return make_error(cuda_message(e, "export the event of slot " + std::to_string(i)));
    std::memcpy(a->event_handles_.data() + i * sizeof eh, &eh, sizeof eh);
    // A recorded event from the start: a client may wait on any slot's event at any time.
    if (cudaError_t e = cudaEventRecord(a->slot_events_[i], a->stream_); e != cudaSuccess)
      return make_error(cuda_message(e, "record the event of slot " + std::to_string(i)));
  }
  a->stages_.resize(o.stage_slots);
  for (auto& s : a->stages_) {
    void* p = nullptr;
    if (cudaError_t e = cudaHostAlloc(&p, o.slot_bytes, cudaHostAllocPortable); e != cudaSuccess) {
      (void)cudaGetLastError();
      return make_error(cuda_message(e, "pinned staging buffer of " + std::to_string(o.slot_bytes) +
                                            " bytes (cudaHostAlloc)"));
    }
    s.buf = static_cast<uint8_t*>(p);
    if (reinterpret_cast<uintptr_t>(p) % 4096 != 0)
      return make_error(
          "cudaHostAlloc returned a staging buffer that is not 4096-aligned; O_DIRECT needs it");
    if (cudaError_t e = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming); e != cudaSuccess)
      return make_error(cuda_message(e, "create a staging event"));
  }
  if (o.host_slots > 0) {
    void* p = nullptr;
    if (cudaError_t e = cudaHostAlloc(&p, o.host_slots * o.slot_bytes, cudaHostAllocPortable);
        e != cudaSuccess) {
      (void)cudaGetLastError();
      return make_error(cuda_message(e, "pinned host tier of " +
                                            std::to_string((o.host_slots * o.slot_bytes) >> 20) +
                                            " MiB (--host-cache-mib; cudaHostAlloc)"));
    }
    a->host_ = static_cast<uint8_t*>(p);
    a->host_count_ = static_cast<uint32_t>(o.host_slots);
  }
  if (cudaError_t e = cudaStreamSynchronize(a->stream_); e != cudaSuccess)
    return make_error(cuda_message(e, "initialise the slot events"));
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, o.device) == cudaSuccess) a->pci_bus_id_ = bus;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, o.device);
  if (info)
    *info = std::string("GPU ") + std::to_string(o.device) + " (" + prop.name + "), " +
            std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) + "; " +
            std::to_string(o.stage_slots) + " pinned staging buffers" +
            (o.host_slots ? ", a host tier of " + std::to_string(o.host_slots) + " pinned slots (" +
                                std::to_string((o.host_slots * o.slot_bytes) >> 20) + " MiB)"
                          : std::string());
  return std::unique_ptr<SlotArena>(std::move(a));
}

}  // namespace

Result<std::unique_ptr<SlotArena>> create_cuda_arena(const CudaArenaOptions& o, std::string* info) {
  return CudaArena::create(o, info);
}

}  // namespace expertd::daemon
