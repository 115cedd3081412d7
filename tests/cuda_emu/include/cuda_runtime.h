// The subset of the CUDA runtime that expertd's CUDA kernels, GPU engine and cuda arena use,
// emulated on the CPU (tests/cuda_emu/cuda_emu.cpp). A kernel launch runs every block of the grid
// in turn, each CUDA thread of a block a fiber (so __syncthreads and warp shuffles have their
// CUDA meaning).
// Streams are asynchronous as on a GPU: each created stream has a worker thread that runs its
// copies and kernels in order, while the host goes on; events carry generation counters (in
// shared memory when interprocess) that cudaStreamWaitEvent and cudaEventSynchronize wait on;
// copies from pinned host memory are read when the stream gets to them (after a random delay, to
// widen the windows in which a missing wait would show), from pageable memory when issued, as
// CUDA does. Device allocations are shared memory (memfd), so CUDA IPC works between processes of
// one machine: a handle names the exporter's file descriptor, opened through /proc. Built with
// EXPERTD_CUDA_EMULATION; the real headers are never seen by such a build. It checks the device
// code's indexing, arithmetic and barriers and the host code's ordering of its streams and
// events; not timing, not the hardware. Faults for tests to inject, read from the environment
// at each call: CUDA_EMU_FAIL_H2D=N fails this process's Nth copy out of pinned memory to the
// device; CUDA_EMU_DENY_IPC=1 refuses cudaIpcOpenMemHandle (a container without the rights).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>

#ifndef EXPERTD_CUDA_EMULATION
#error "tests/cuda_emu/include is for the CUDA emulation build only"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // one block runs at a time: a static local is the block's shared memory

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotSupported = 801,
  cudaErrorNotReady = 600,
  cudaErrorUnknown = 999,  // what the emulation's injected faults return
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
using cudaStream_t = struct CUstream_emu*;
using cudaEvent_t = struct CUevent_emu*;
struct cudaIpcMemHandle_t {
  char reserved[64];
};
struct cudaIpcEventHandle_t {
  char reserved[64];
};
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount;
  int major, minor;
};
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 1;
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaEventInterprocess = 4;
constexpr unsigned cudaHostAllocPortable = 1;

cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
cudaError_t cudaDeviceGetByPCIBusId(int* d, const char* bus);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemset(void* p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t s = nullptr);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p);
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void* p);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* h, cudaEvent_t e);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* e, cudaIpcEventHandle_t h);

inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline float __uint_as_float(unsigned u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

namespace cuda_emu {

struct ThreadCtx {
  dim3 thread_idx;
  unsigned lane = 0, warp = 0;
};
const ThreadCtx& current_thread();
const dim3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void* dynamic_shared();
void syncthreads();
float shfl_xor(float v, int lane_mask);

// What the host has waited for, as the CUDA runtime makes it wait. stream_waits: for work issued
// to a stream since the host last waited on it (a stream synchronised, a copy into pageable host
// memory, a copy from pageable host memory — the runtime synchronises the stream before it — and
// an unfinished event synchronised). blocking_copies: copies that return once done (to or from
// pageable host memory).
uint64_t stream_waits();
uint64_t blocking_copies();

// Runs body() as every CUDA thread of every block of the grid.
void run_grid(dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*), void* arg);
// A launch's configuration is checked when it is issued (an error for cudaGetLastError).
bool valid_launch(dim3 grid, dim3 block);
// Runs op in stream order: at once for the null stream, else on the stream's worker thread.
void enqueue(cudaStream_t s, std::function<void()> op);

template <typename... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  template <typename... A>
  void operator()(A&&... a) const {
    if (!valid_launch(grid, block)) return;
    auto args = std::make_shared<std::tuple<P...>>(std::forward<A>(a)...);
    enqueue(stream, [k = kernel, args, g = grid, b = block, sh = shared] {
      struct Call {
        void (*k)(P...);
        std::tuple<P...>* args;
      } call{k, args.get()};
      run_grid(
          g, b, sh,
          [](void* p) {
            auto* c = static_cast<Call*>(p);
            std::apply(c->k, *c->args);
          },
          &call);
    });
  }
};
template <typename... P>
Launch<P...> launch(void (*k)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream) {
  return {k, grid, block, shared, stream};
}

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::current_thread().thread_idx)
#define blockIdx (::cuda_emu::block_idx())
#define blockDim (::cuda_emu::block_dim())
#define gridDim (::cuda_emu::grid_dim())
inline void __syncthreads() {
  ::cuda_emu::syncthreads();
}
inline float __shfl_xor_sync(unsigned /*mask: every lane of the warp takes part*/, float v,
                             int lane_mask) {
  return ::cuda_emu::shfl_xor(v, lane_mask);
}
