// The CPU emulation of the CUDA runtime subset in include/cuda_runtime.h. Each CUDA thread of the
// running block is a fiber (its own stack, switched by hand: cuda_emu_switch below, or ucontext
// where that is not x86-64); the scheduler runs every ready fiber until it finishes or reaches a
// barrier, then releases a barrier once everyone it concerns has arrived: __syncthreads waits
// for the block's live threads, a warp shuffle for its warp's live lanes. Blocks run one after
// another, so a static local is the block's shared memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.h"

#if defined(__x86_64__)
extern "C" void cuda_emu_switch(void** save_sp, void* new_sp);
extern "C" void cuda_emu_trampoline();
// Saves the callee-saved registers and the stack pointer of the running context, switches to
// another's; a new fiber starts in the trampoline, which calls r13(r12).
asm(R"(
  .pushsection .text
  .globl cuda_emu_switch
  .type cuda_emu_switch,@function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch,.-cuda_emu_switch
  .globl cuda_emu_trampoline
  .type cuda_emu_trampoline,@function
cuda_emu_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size cuda_emu_trampoline,.-cuda_emu_trampoline
  .popsection
)");
#else
#include <ucontext.h>
#endif

// A stream: a worker thread running its operations in order.
struct CUstream_emu {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> q;
  bool busy = false, stop = false;
  uint64_t issued = 0, waited = 0;  // ops pushed; of them, those the host has waited for
  std::thread worker;

  CUstream_emu() : worker([this] { run(); }) {}
  void push(std::function<void()> op) {
    {
      std::lock_guard lock(m);
      q.push_back(std::move(op));
      ++issued;
    }
    cv.notify_all();
  }
  void drain() {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return q.empty() && !busy; });
  }
  // The host waits for everything issued: whether anything was issued since it last did.
  bool host_waits() {
    std::lock_guard lock(m);
    const bool any = issued > waited;
    waited = issued;
    return any;
  }
  void shut() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void run() {
    std::unique_lock lock(m);
    for (;;) {
      cv.wait(lock, [&] { return stop || !q.empty(); });
      if (q.empty()) return;  // stop, and everything issued has run
      auto op = std::move(q.front());
      q.pop_front();
      busy = true;
      lock.unlock();
      op();
      lock.lock();
      busy = false;
      cv.notify_all();
    }
  }
};

// An event: how many times it was recorded, and how many of those records its stream reached.
// Interprocess events keep these in a shared page, which their IPC handle names.
struct EventState {
  std::atomic<uint64_t> recorded{0}, completed{0};
};
struct CUevent_emu {
  EventState* st = nullptr;
  int fd = -1;  // the shared page's memfd (interprocess events created here)
  bool mapped = false;
};

namespace cuda_emu {
namespace {

constexpr size_t kStackBytes = 128 * 1024;
constexpr unsigned kMaxThreadsPerBlock = 1024;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  std::abort();
}

struct Fiber {
  enum State { Ready, AtWarp, AtBlock, Done };
  std::unique_ptr<char[]> stack;
  ThreadCtx ctx;
  State state = Ready;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

struct Grid {
  std::mutex launch_mutex;  // one launch at a time, whichever host thread asks
  dim3 grid, block, bidx;
  std::vector<max_align_t> shared;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  std::vector<Fiber> fibers;
  std::vector<float> xchg;  // one shuffle slot per thread
  unsigned n = 0;
  int cur = -1;
#if defined(__x86_64__)
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
};
Grid g;
thread_local cudaError_t last_error = cudaSuccess;

Fiber& me() {
  if (g.cur < 0) die("a device function was called outside a kernel launch");
  return g.fibers[static_cast<size_t>(g.cur)];
}

void to_scheduler(Fiber& f) {
#if defined(__x86_64__)
  cuda_emu_switch(&f.sp, g.sched_sp);
#else
  swapcontext(&f.uc, &g.sched);
#endif
}

extern "C" void cuda_emu_fiber_main(void* p) {
  auto* f = static_cast<Fiber*>(p);
  g.body(g.arg);
  f->state = Fiber::Done;
  to_scheduler(*f);
  die("a finished fiber was resumed");
}

#if !defined(__x86_64__)
void fiber_entry_uc(unsigned hi, unsigned lo) {
  cuda_emu_fiber_main(reinterpret_cast<void*>((uintptr_t(hi) << 32) | lo));
}
#endif

void start(Fiber& f) {
  if (!f.stack) f.stack.reset(new char[kStackBytes]);
#if defined(__x86_64__)
  auto top = (reinterpret_cast<uintptr_t>(f.stack.get()) + kStackBytes) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<void**>(top - 16 - 56);  // r15 r14 r13 r12 rbx rbp ret
  frame[0] = frame[1] = nullptr;
  frame[2] = reinterpret_cast<void*>(&cuda_emu_fiber_main);
  frame[3] = &f;
  frame[4] = frame[5] = nullptr;
  frame[6] = reinterpret_cast<void*>(&cuda_emu_trampoline);
  f.sp = frame;
#else
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack.get();
  f.uc.uc_stack.ss_size = kStackBytes;
  f.uc.uc_link = nullptr;
  const auto v = reinterpret_cast<uintptr_t>(&f);
  makecontext(&f.uc, reinterpret_cast<void (*)()>(fiber_entry_uc), 2, unsigned(v >> 32),
              unsigned(v));
#endif
}

void resume(size_t i) {
  g.cur = static_cast<int>(i);
#if defined(__x86_64__)
  cuda_emu_switch(&g.sched_sp, g.fibers[i].sp);
#else
  swapcontext(&g.sched, &g.fibers[i].uc);
#endif
  g.cur = -1;
}

void run_block() {
  const unsigned n = g.n;
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = g.fibers[i];
    f.ctx.thread_idx =
        dim3(i % g.block.x, (i / g.block.x) % g.block.y, i / (g.block.x * g.block.y));
    f.ctx.lane = i % 32, f.ctx.warp = i / 32;
    f.state = Fiber::Ready;
    start(f);
  }
  for (;;) {
    for (unsigned i = 0; i < n; ++i)
      if (g.fibers[i].state == Fiber::Ready) resume(i);
    // Every fiber is done or waiting: release the barriers whose parties have all arrived.
    unsigned alive = 0, at_block = 0;
    for (unsigned i = 0; i < n; ++i) {
      alive += g.fibers[i].state != Fiber::Done;
      at_block += g.fibers[i].state == Fiber::AtBlock;
    }
    if (alive == 0) return;
    bool released = false;
    if (at_block == alive) {
      for (unsigned i = 0; i < n; ++i)
        if (g.fibers[i].state == Fiber::AtBlock) g.fibers[i].state = Fiber::Ready;
      released = true;
    } else {
      for (unsigned w = 0; w * 32 < n; ++w) {
        unsigned live = 0, waiting = 0;
        for (unsigned i = w * 32; i < std::min(n, w * 32 + 32); ++i) {
          live += g.fibers[i].state != Fiber::Done;
          waiting += g.fibers[i].state == Fiber::AtWarp;
        }
        if (live > 0 && waiting == live) {
          for (unsigned i = w * 32; i < std::min(n, w * 32 + 32); ++i)
            if (g.fibers[i].state == Fiber::AtWarp) g.fibers[i].state = Fiber::Ready;
          released = true;
        }
      }
    }
    if (!released)
      die("deadlock: threads wait at barriers that can never complete (divergent __syncthreads or "
          "shuffle)");
  }
}

}  // namespace

const ThreadCtx& current_thread() {
  return me().ctx;
}
const dim3& block_idx() {
  return g.bidx;
}
const dim3& block_dim() {
  return g.block;
}
const dim3& grid_dim() {
  return g.grid;
}
void* dynamic_shared() {
  return g.shared.data();
}

void syncthreads() {
  Fiber& f = me();
  f.state = Fiber::AtBlock;
  to_scheduler(f);
}

float shfl_xor(float v, int lane_mask) {
  Fiber& f = me();
  const unsigned self = f.ctx.warp * 32 + f.ctx.lane,
                 other = f.ctx.warp * 32 + (f.ctx.lane ^ unsigned(lane_mask) % 32);
  if (other >= g.n) die("a warp shuffle reads a lane that does not exist");
  g.xchg[self] = v;
  f.state = Fiber::AtWarp;  // every lane of the warp has written
  to_scheduler(f);
  const float r = g.xchg[other];
  f.state = Fiber::AtWarp;  // every lane has read before anyone writes again
  to_scheduler(f);
  return r;
}

bool valid_launch(dim3 grid, dim3 block) {
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > kMaxThreadsPerBlock || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    last_error = cudaErrorInvalidValue;
    return false;
  }
  return true;
}

void run_grid(dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*), void* arg) {
  std::lock_guard lock(g.launch_mutex);  // kernels of different streams take turns
  const unsigned n = block.x * block.y * block.z;
  if (g.cur >= 0) die("a kernel launched from inside a kernel");
  g.grid = grid, g.block = block, g.body = body, g.arg = arg, g.n = n;
  g.shared.assign((shared_bytes + sizeof(max_align_t) - 1) / sizeof(max_align_t) + 1,
                  max_align_t{});
  if (g.fibers.size() < n) g.fibers.resize(n);
  g.xchg.assign(n, 0.0f);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g.bidx = dim3(x, y, z);
        run_block();
      }
}

namespace {
std::mutex streams_mutex;
std::set<CUstream_emu*> streams;
void drain_all() {
  std::vector<CUstream_emu*> all;
  {
    std::lock_guard lock(streams_mutex);
    all.assign(streams.begin(), streams.end());
  }
  for (auto* s : all) s->drain();
}
// Copies out of pinned memory wait a little before they read it, as a DMA engine may: code that
// reuses such a buffer before its copy completed then reads back what it wrote later.
void dma_delay() {
  thread_local std::minstd_rand rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
}
void wait_for(const EventState* st, uint64_t gen) {
  while (st->completed.load(std::memory_order_acquire) < gen)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}
}  // namespace

void enqueue(cudaStream_t s, std::function<void()> op) {
  if (s)
    s->push(std::move(op));
  else
    op();
}

}  // namespace cuda_emu

using cuda_emu::enqueue;
using cuda_emu::last_error;

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "CUDA emulation on the CPU");
  p->totalGlobalMem = size_t{1} << 32, p->multiProcessorCount = 1, p->major = 9, p->minor = 0;
  return cudaSuccess;
}
constexpr const char* kBusId = "0000:00:00.0";  // the emulated device's
cudaError_t cudaDeviceGetByPCIBusId(int* d, const char* bus) {
  if (std::string(bus) != kBusId) return cudaErrorInvalidDevice;
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int d) {
  if (d != 0) return cudaErrorInvalidDevice;
  std::snprintf(bus, size_t(len), "%s", kBusId);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  cuda_emu::drain_all();
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaErrorNotSupported) return "operation not supported by the CUDA emulation";
  if (e == cudaErrorUnknown) return "a fault injected into the CUDA emulation";
  return cudaGetErrorName(e);
}
// Device memory: shared mappings of memfds, so that cudaIpcGetMemHandle can name one. Each
// allocation ends (to 16 bytes) where an inaccessible guard page begins, and one more guards its
// start: a kernel or copy that runs past the end of a buffer faults at once, as
// compute-sanitizer would report on a GPU.
namespace {
constexpr size_t kPage = 4096;
struct Mapping {
  int fd = -1;           // the memfd (allocations made here)
  void* base = nullptr;  // the reserved range: guard, file pages, guard
  size_t reserved = 0;
  size_t file_bytes = 0, offset = 0;  // the file's size; the allocation's offset in it
  bool imported = false;              // opened from another process's handle
};
std::mutex maps_mutex;
std::map<void*, Mapping> maps;
struct IpcMem {
  char magic[8];
  int32_t pid, fd;
  uint64_t file_bytes, offset;
};
static_assert(sizeof(IpcMem) <= sizeof(cudaIpcMemHandle_t));
constexpr char kMagic[8] = {'e', 'x', 'p', 'e', 'm', 'u', '1', 0};

// Maps file_bytes of fd between two guard pages; returns the first file byte, or null.
char* map_guarded(int fd, size_t file_bytes, void** base, size_t* reserved) {
  *reserved = file_bytes + 2 * kPage;
  void* r = mmap(nullptr, *reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) return nullptr;
  char* data = static_cast<char*>(r) + kPage;
  if (mmap(data, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    munmap(r, *reserved);
    return nullptr;
  }
  *base = r;
  return data;
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const size_t body = (std::max<size_t>(bytes, 1) + 15) / 16 * 16;
  const size_t file_bytes = (body + kPage - 1) / kPage * kPage;
  int fd = memfd_create("cuda-emu", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, off_t(file_bytes)) != 0) {
    if (fd >= 0) close(fd);
    return cudaErrorMemoryAllocation;
  }
  Mapping m{fd, nullptr, 0, file_bytes, file_bytes - body, false};
  char* data = map_guarded(fd, file_bytes, &m.base, &m.reserved);
  if (!data) {
    close(fd);
    return cudaErrorMemoryAllocation;
  }
  std::lock_guard lock(maps_mutex);
  *p = data + m.offset;
  maps[*p] = m;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  cuda_emu::drain_all();  // as CUDA: cudaFree waits for the device's work
  std::lock_guard lock(maps_mutex);
  auto it = maps.find(p);
  if (it == maps.end() || it->second.imported) return cudaErrorInvalidValue;
  munmap(it->second.base, it->second.reserved);
  close(it->second.fd);
  maps.erase(it);
  return cudaSuccess;
}
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  std::lock_guard lock(maps_mutex);
  auto it = maps.find(p);
  if (it == maps.end() || it->second.imported) return cudaErrorInvalidValue;
  IpcMem m{};
  std::memcpy(m.magic, kMagic, 8);
  m.pid = getpid(), m.fd = it->second.fd, m.file_bytes = it->second.file_bytes,
  m.offset = it->second.offset;
  std::memset(h, 0, sizeof *h);
  std::memcpy(h, &m, sizeof m);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned) {
  IpcMem m;
  std::memcpy(&m, &h, sizeof m);
  if (std::memcmp(m.magic, kMagic, 8) != 0) return cudaErrorInvalidValue;
  if (m.pid == getpid()) return cudaErrorInvalidValue;  // as CUDA: not in the exporting process
  if (const char* deny = std::getenv("CUDA_EMU_DENY_IPC"); deny && std::string(deny) == "1")
    return cudaErrorUnknown;
  const std::string path = "/proc/" + std::to_string(m.pid) + "/fd/" + std::to_string(m.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return cudaErrorInvalidValue;
  Mapping mp{-1, nullptr, 0, m.file_bytes, m.offset, true};
  char* data = map_guarded(fd, m.file_bytes, &mp.base, &mp.reserved);
  close(fd);
  if (!data) return cudaErrorMemoryAllocation;
  std::lock_guard lock(maps_mutex);
  *p = data + m.offset;
  maps[*p] = mp;
  return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void* p) {
  std::lock_guard lock(maps_mutex);
  auto it = maps.find(p);
  if (it == maps.end() || !it->second.imported) return cudaErrorInvalidValue;
  munmap(it->second.base, it->second.reserved);
  maps.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = size_t{8} << 30, *total_bytes = size_t{16} << 30;
  return cudaSuccess;
}
namespace {
std::mutex pinned_mutex;
std::map<const char*, size_t> pinned;  // cudaHostAlloc'd ranges
bool is_pinned(const void* p) {
  std::lock_guard lock(pinned_mutex);
  auto it = pinned.upper_bound(static_cast<const char*>(p));
  if (it == pinned.begin()) return false;
  --it;
  return static_cast<const char*>(p) < it->first + it->second;
}
}  // namespace
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  const size_t len = std::max<size_t>((bytes + 4095) / 4096 * 4096, 4096);
  *p = std::aligned_alloc(4096, len);
  if (!*p) return cudaErrorMemoryAllocation;
  std::lock_guard lock(pinned_mutex);
  pinned[static_cast<const char*>(*p)] = len;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  cuda_emu::drain_all();
  {
    std::lock_guard lock(pinned_mutex);
    pinned.erase(static_cast<const char*>(p));
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
// As CUDA: from pageable host memory the source is taken when the copy is issued; into pageable
// host memory the copy completes before the call returns; pinned and device memory are read and
// written when the stream reaches the copy.
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s) {
  if (!s || bytes == 0) return cudaMemset(p, v, bytes);
  s->push([p, v, bytes] { std::memset(p, v, bytes); });
  return cudaSuccess;
}
namespace cuda_emu {
std::atomic<uint64_t> n_stream_waits{0}, n_blocking_copies{0};
uint64_t stream_waits() {
  return n_stream_waits.load();
}
uint64_t blocking_copies() {
  return n_blocking_copies.load();
}
void host_waits_for(cudaStream_t s) {
  if (s && s->host_waits()) ++n_stream_waits;
}
}  // namespace cuda_emu
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s) {
  if (k == cudaMemcpyHostToDevice && is_pinned(src)) {
    static std::atomic<long> copies{0};
    const long n = ++copies;
    if (const char* fail = std::getenv("CUDA_EMU_FAIL_H2D"); fail && std::atol(fail) == n)
      return cudaErrorUnknown;
  }
  if (!s || bytes == 0) return cudaMemcpy(dst, src, bytes, k);
  if (k == cudaMemcpyHostToDevice && !is_pinned(src)) {
    cuda_emu::host_waits_for(s), ++cuda_emu::n_blocking_copies;
    auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + bytes);
    s->push([dst, copy] { std::memcpy(dst, copy->data(), copy->size()); });
  } else if (k == cudaMemcpyDeviceToHost && !is_pinned(dst)) {
    cuda_emu::host_waits_for(s), ++cuda_emu::n_blocking_copies;
    s->drain();
    std::memmove(dst, src, bytes);
  } else {
    const bool dma = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToHost;
    s->push([dst, src, bytes, dma] {
      if (dma) cuda_emu::dma_delay();
      std::memmove(dst, src, bytes);
    });
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind k, cudaStream_t s) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  auto rows = [=] {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
  };
  if (k == cudaMemcpyDeviceToDevice)
    enqueue(s, rows);
  else {  // host memory on either side: completed before returning (the engine copies device to
          // device only)
    if (s) s->drain();
    cuda_emu::host_waits_for(s), ++cuda_emu::n_blocking_copies;
    rows();
  }
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_emu;
  std::lock_guard lock(cuda_emu::streams_mutex);
  cuda_emu::streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidValue;
  {
    std::lock_guard lock(cuda_emu::streams_mutex);
    cuda_emu::streams.erase(s);
  }
  s->shut();
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s) s->drain();
  cuda_emu::host_waits_for(s);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return cudaErrorInvalidValue;
  const uint64_t gen = e->st->recorded.load();  // the event's latest record, as CUDA
  EventState* st = e->st;
  enqueue(s, [st, gen] { cuda_emu::wait_for(st, gen); });
  return cudaSuccess;
}
// Events: a record counts up `recorded` when issued and sets `completed` when its stream gets
// there.
namespace {
struct IpcEvent {
  char magic[8];
  int32_t pid, fd;
};
static_assert(sizeof(IpcEvent) <= sizeof(cudaIpcEventHandle_t));
}  // namespace
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  auto* ev = new CUevent_emu;
  if (flags & cudaEventInterprocess) {
    ev->fd = memfd_create("cuda-emu-event", MFD_CLOEXEC);
    if (ev->fd < 0 || ftruncate(ev->fd, 4096) != 0) return delete ev, cudaErrorMemoryAllocation;
    void* m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ev->fd, 0);
    if (m == MAP_FAILED) return close(ev->fd), delete ev, cudaErrorMemoryAllocation;
    ev->st = new (m) EventState;
    ev->mapped = true;
  } else {
    ev->st = new EventState;
  }
  *e = ev;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidValue;
  cuda_emu::drain_all();  // a record still queued must not touch a freed event
  if (e->mapped)
    munmap(e->st, 4096);
  else
    delete e->st;
  if (e->fd >= 0) close(e->fd);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidValue;
  EventState* st = e->st;
  const uint64_t gen = st->recorded.fetch_add(1) + 1;
  enqueue(s, [st, gen] {
    uint64_t c = st->completed.load();
    while (c < gen && !st->completed.compare_exchange_weak(c, gen)) {
    }
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidValue;
  return e->st->completed.load() >= e->st->recorded.load() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidValue;
  if (e->st->completed.load() < e->st->recorded.load()) ++cuda_emu::n_stream_waits;
  cuda_emu::wait_for(e->st, e->st->recorded.load());
  return cudaSuccess;
}
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* h, cudaEvent_t e) {
  if (!e || e->fd < 0) return cudaErrorInvalidValue;  // as CUDA: interprocess events only
  IpcEvent m{};
  std::memcpy(m.magic, kMagic, 8);
  m.pid = getpid(), m.fd = e->fd;
  std::memset(h, 0, sizeof *h);
  std::memcpy(h, &m, sizeof m);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* e, cudaIpcEventHandle_t h) {
  IpcEvent m;
  std::memcpy(&m, &h, sizeof m);
  if (std::memcmp(m.magic, kMagic, 8) != 0 || m.pid == getpid()) return cudaErrorInvalidValue;
  const std::string path = "/proc/" + std::to_string(m.pid) + "/fd/" + std::to_string(m.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return cudaErrorInvalidValue;
  void* a = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (a == MAP_FAILED) return cudaErrorMemoryAllocation;
  auto* ev = new CUevent_emu;
  ev->st = static_cast<EventState*>(a);
  ev->mapped = true;
  *e = ev;
  return cudaSuccess;
}
