// expert-bench: benchmarks of the storage tier. Each sub-command measures expertd and a
// baseline in the same run and prints, as its last line, ratio=<x>.
//   io     expertd serving random misses vs raw O_DIRECT io_uring reads of the same blocks
//   rtt    acquire+release of a layer's cached experts (socket, board) vs a Unix-socket ping-pong
//   build  expert-pack build bytes/s vs a plain sequential copy of the same file
//   mem    expertd resident memory beyond its arena with 8 clients; expert-pack build peak RSS
//   h2d    (CUDA builds) the cuda arena's staging path vs bare cudaMemcpyAsync from pinned memory
//   kernels, attention, gemv: the CPU kernels (bench/kernels_bench.cpp)
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>
#ifdef EXPERTD_HAVE_CUDA_ARENA
#include <cuda_runtime.h>
#endif

#include "bench/kernels_bench.h"
#include "bench/policy_bench.h"
#include "client/expert_client.h"
#include "common/fd.h"
#include "daemon/arena.h"
#include "pack/builder.h"
#include "pack/verify.h"

using namespace expertd;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
std::string self_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string p(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return p.substr(0, p.rfind('/'));
}

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "expert-bench: error: %s\n", m.c_str());
  std::exit(1);
}

// A real expertd for the duration of a benchmark.
struct DaemonProc {
  pid_t pid = -1;
  std::string socket;
  DaemonProc(const std::string& manifest, std::string sock, std::vector<std::string> flags)
      : socket(std::move(sock)) {
#ifdef EXPERTD_CUDA_EMULATION
    std::string exe = self_dir() + "/../daemon/expertd_emu";  // the build against tests/cuda_emu
#else
    std::string exe = self_dir() + "/../daemon/expertd";
#endif
    pid = ::fork();
    if (pid == 0) {
      std::vector<std::string> args = {exe,    "--manifest",    manifest,    "--socket",
                                       socket, "--config",      "/dev/null", "--log-level",
                                       "warn", "--lock-memory", "false"};
      args.insert(args.end(), flags.begin(), flags.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 1000; ++i) {
      if (auto c = client::Client::connect(socket, {"probe", 2000})) return;
      int st;
      if (::waitpid(pid, &st, WNOHANG) == pid) die("expertd exited during start-up");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    die("expertd did not start");
  }
  ~DaemonProc() {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
};

double metric(client::Client& c, const std::string& name) {
  auto m = c.stats();
  if (!m) die(m.error().message);
  for (const auto& x : *m)
    if (x.name == name) return x.value;
  return 0;
}

// Raw baseline: random blocks read with O_DIRECT through io_uring at queue depth qd.
double raw_read_gbps(const pack::Manifest& m, const std::string& path, uint32_t qd, double seconds,
                     uint64_t seed) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) die("open " + path);
  io_uring ring;
  io_uring_queue_init(qd, &ring, 0);
  uint64_t slot = m.slot_bytes();
  std::vector<AlignedBuffer> bufs;
  for (uint32_t i = 0; i < qd; ++i) bufs.emplace_back(slot);
  std::mt19937_64 rng(seed);
  auto submit = [&](uint32_t i) {
    uint32_t l = static_cast<uint32_t>(rng() % m.layers.size()),
             e = static_cast<uint32_t>(rng() % m.n_experts);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd, bufs[i].data(), static_cast<unsigned>(m.layers[l].stride),
                       m.offset(l, e));
    io_uring_sqe_set_data64(sqe, i);
  };
  for (uint32_t i = 0; i < qd; ++i) submit(i);
  io_uring_submit(&ring);
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  while (secs(t0, Clock::now()) < seconds) {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) die("io_uring_wait_cqe");
    if (cqe->res < 0) die("raw read failed");
    bytes += static_cast<uint64_t>(cqe->res);
    uint32_t i = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
    io_uring_cqe_seen(&ring, cqe);
    submit(i);
    io_uring_submit(&ring);
  }
  double s = secs(t0, Clock::now());
  io_uring_queue_exit(&ring);
  ::close(fd);
  return bytes / s / 1e9;
}

// Alternating rounds of the two sides (raw reads, then expertd serving the clients), so drift on
// a shared disk hits both alike; each round's ratio, and the medians.
int bench_io(const std::string& manifest_path, uint32_t qd, uint32_t clients, double seconds,
             const std::string& backend, uint32_t rounds) {
  auto m = pack::load_manifest(manifest_path);
  if (!m) die(m.error().message);
  std::string pack_path = pack::manifest_dir(manifest_path) + "/" + m->pack_file;
  uint32_t per = std::max(1u, qd / clients);
  rounds = std::max(1u, rounds);
  std::printf("pack %s: %zu layers x %u experts, stride %llu KiB, %.2f GiB\n", pack_path.c_str(),
              m->layers.size(), m->n_experts, (unsigned long long)(m->slot_bytes() >> 10),
              m->pack_bytes / 1073741824.0);
  // expertd with a cache of exactly one working set per client: nearly every acquire misses.
  std::string sock = "/tmp/expert-bench-io.sock";
  DaemonProc d(manifest_path, sock,
               {"--cache-slots", std::to_string((clients + 1) * per), "--clients-max",
                std::to_string(clients + 1), "--max-experts-per-request", std::to_string(per),
                "--queue-depth", std::to_string(qd), "--policy", "lru", "--reserve-mib", "256",
                "--backend", backend, "--stage-slots", std::to_string(std::min(qd, 1024u))});
  auto admin = client::Client::connect(sock);
  if (!admin) die(admin.error().message);
  // The clients stay connected across rounds and run while `run` is set.
  std::atomic<bool> run{false}, quit{false};
  std::atomic<uint32_t> busy{0};
  std::vector<std::thread> ts;
  for (uint32_t k = 0; k < clients; ++k)
    ts.emplace_back([&, k] {
      auto c = client::Client::connect(sock);
      if (!c) die(c.error().message);
      std::mt19937_64 rng(100 + k);
      while (!quit) {
        if (!run) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        ++busy;
        while (run) {
          uint32_t l = static_cast<uint32_t>(rng() % m->layers.size());
          std::vector<uint32_t> ids;
          while (ids.size() < per) {
            uint32_t e = static_cast<uint32_t>(rng() % m->n_experts);
            if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
          }
          auto lease = (*c)->acquire(l, ids);
          if (!lease) die(lease.error().message);
          if (auto st = (*c)->wait_ready(*lease); !st) die(st.error().message);
          if (!(*c)->release(*lease)) die("release failed");
        }
        --busy;
      }
    });
  std::vector<double> raws, serveds, ratios;
  for (uint32_t r = 0; r < rounds; ++r) {
    const double raw = raw_read_gbps(*m, pack_path, qd, seconds, 1);
    const double start_bytes = metric(**admin, "pack_read_bytes");
    auto t0 = Clock::now();
    run = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    run = false;
    while (busy > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double served =
        (metric(**admin, "pack_read_bytes") - start_bytes) / secs(t0, Clock::now()) / 1e9;
    raws.push_back(raw), serveds.push_back(served), ratios.push_back(served / raw);
    std::printf("round %u: raw %.3f GB/s, expertd %.3f GB/s, ratio %.3f\n", r + 1, raw, served,
                served / raw);
  }
  quit = true;
  for (auto& t : ts) t.join();
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const double raw = median(raws), served = median(serveds);
  std::printf("raw io_uring O_DIRECT, qd %u: %.3f GB/s (%.0f blocks/s; median of %u rounds)\n", qd,
              raw, raw * 1e9 / m->slot_bytes(), rounds);
  std::printf(
      "expertd (%s arena), %u clients x %u experts, qd %u: %.3f GB/s (%.0f misses/s), hit rate "
      "%.3f, io_errors %.0f, "
      "read p50 %.0f us p99 %.0f us\n",
      backend.c_str(), clients, per, qd, served, served * 1e9 / m->slot_bytes(),
      metric(**admin, "hit_rate"), metric(**admin, "io_errors"),
      metric(**admin, "read_latency_us_p50"), metric(**admin, "read_latency_us_p99"));
  std::printf("ratio=%.3f (median of %u rounds; %.3f-%.3f)\n", median(ratios), rounds,
              *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  return 0;
}

int bench_rtt(const std::string& manifest_path, uint32_t iters) {
  auto pct = [](std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p / 100 * v.size()))];
  };
  // Baseline: a 64-byte request and a 64-byte reply over a Unix socket pair, two threads.
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  std::thread echo([&] {
    char b[64];
    while (::recv(sv[1], b, 64, MSG_WAITALL) == 64) ::send(sv[1], b, 64, 0);
  });
  std::vector<double> base;
  char b[64] = {};
  for (uint32_t i = 0; i < iters; ++i) {
    auto t = Clock::now();
    ::send(sv[0], b, 64, 0);
    ::recv(sv[0], b, 64, MSG_WAITALL);
    base.push_back(secs(t, Clock::now()) * 1e6);
  }
  ::shutdown(sv[0], SHUT_RDWR), echo.join(), ::close(sv[0]), ::close(sv[1]);
  std::string sock = "/tmp/expert-bench-rtt.sock";
  DaemonProc d(manifest_path, sock,
               {"--cache-slots", "64", "--clients-max", "2", "--max-experts-per-request", "8",
                "--reserve-mib", "256"});
  // One connection pins hits from the residency board, one sends every acquire through the
  // socket; a layer's worth of cached experts each time, the two in alternating rounds.
  const client::Client::Options socket_only{.use_board = false};
  auto c = client::Client::connect(sock);
  auto s = client::Client::connect(sock, socket_only);
  if (!c || !s) die((c ? s : c).error().message);
  const std::vector<uint32_t> layer = {0, 1, 2, 3, 4, 5, 6, 7};
  if (auto w = (*c)->acquire(0, layer); !w || !(*c)->wait_ready(*w) || !(*c)->release(*w))
    die("warm-up acquire failed");
  std::vector<double> via_socket, via_board;
  const uint32_t rounds = 10;
  uint32_t board_misses = 0;
  for (uint32_t r = 0; r < 2 * rounds; ++r) {
    client::Client& cl = r % 2 ? **c : **s;
    auto& out = r % 2 ? via_board : via_socket;
    for (uint32_t i = 0; i < iters / rounds; ++i) {
      auto t = Clock::now();
      auto l = cl.acquire(0, layer);
      if (!l || std::count(l->ready.begin(), l->ready.end(), 1) != 8)
        die("a cached expert was not ready at once");
      if (r % 2 == 0 && l->from_board) die("the board was used by the socket-only connection");
      board_misses += r % 2 == 1 && !l->from_board;  // a full ring: through the socket
      if (!cl.release(*l)) die("release failed");
      out.push_back(secs(t, Clock::now()) * 1e6);
    }
  }
  auto line = [&](const char* what, const std::vector<double>& v) {
    std::printf("%s: p50 %.2f us  p99 %.2f us\n", what, pct(v, 50), pct(v, 99));
  };
  line("unix socket ping-pong (64 B)", base);
  line("expertd acquire+release of a layer's 8 cached experts through the socket", via_socket);
  line("expertd acquire+release of a layer's 8 cached experts from the residency board", via_board);
  std::printf("board acquires that went through the socket: %u of %zu\n", board_misses,
              via_board.size());
  std::printf("ratio=%.2f (socket acquire / ping-pong)\n", pct(via_socket, 50) / pct(base, 50));
  std::printf("board_speedup=%.1f (socket acquire / board acquire, p50)\n",
              pct(via_socket, 50) / pct(via_board, 50));
  return 0;
}

void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

int bench_build(const std::string& model, const std::string& out_dir) {
  uint64_t size = 0;
  {
    UniqueFd in(::open(model.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in.valid()) die("open " + model);
    size = *file_size(in.get(), model);
  }
  // Baseline: sequential copy, 8 MiB buffered reads and writes, then fsync (what cp does).
  std::string copy = out_dir + "/expert-bench-copy.bin";
  drop_cache(model);
  auto t0 = Clock::now();
  {
    UniqueFd in(::open(model.c_str(), O_RDONLY | O_CLOEXEC));
    UniqueFd out(::open(copy.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    std::vector<char> buf(8 << 20);
    ssize_t n;
    while ((n = ::read(in.get(), buf.data(), buf.size())) > 0)
      if (::write(out.get(), buf.data(), static_cast<size_t>(n)) != n) die("copy write failed");
    ::fsync(out.get());
  }
  double copy_s = secs(t0, Clock::now());
  drop_cache(copy);
  ::unlink(copy.c_str());
  drop_cache(model);
  pack::BuildOptions o;
  o.model_path = model;
  o.out_dir = out_dir;
  o.progress = false;
  t0 = Clock::now();
  auto rep = pack::build_pack(o);
  if (!rep) die(rep.error().message);
  double build_s = secs(t0, Clock::now());
  std::printf(
      "source %.2f GiB\nsequential copy: %.2f s, %.0f MiB/s\nexpert-pack build: %.2f s, %.0f MiB/s "
      "(pack + core)\n",
      size / 1073741824.0, copy_s, size / 1048576.0 / copy_s, build_s, size / 1048576.0 / build_s);
  std::printf("ratio=%.3f\n", copy_s / build_s);
  return 0;
}

uint64_t status_kb(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string k;
  uint64_t v = 0;
  std::string rest;
  while (f >> k) {
    if (k == key + ":") {
      f >> v;
      return v;
    }
    std::getline(f, rest);
  }
  return 0;
}

int bench_mem(const std::string& manifest_path, const std::string& model,
              const std::string& out_dir) {
  std::string sock = "/tmp/expert-bench-mem.sock";
  uint64_t beyond_kb = 0;
  {
    DaemonProc d(manifest_path, sock,
                 {"--cache-mib", "512", "--clients-max", "9", "--reserve-mib", "256"});
    std::vector<std::unique_ptr<client::Client>> cs;
    for (int i = 0; i < 8; ++i) {
      auto c = client::Client::connect(sock);
      if (!c) die(c.error().message);
      cs.push_back(std::move(*c));
    }
    auto m = pack::load_manifest(manifest_path);
    for (uint32_t k = 0; k < 8; ++k) {  // every client uses a working set
      std::vector<uint32_t> ids;
      for (uint32_t i = 0; i < std::min(8u, m->n_experts); ++i)
        ids.push_back((k * 8 + i) % m->n_experts);
      auto l = cs[k]->acquire(k % m->layers.size(), ids);
      if (!l || !cs[k]->wait_ready(*l)) die("acquire failed");
      if (!cs[k]->release(*l)) die("release failed");
    }
    uint64_t rss = status_kb(d.pid, "VmRSS"), shmem = status_kb(d.pid, "RssShmem");
    beyond_kb = rss - shmem;
    std::printf(
        "expertd with 8 clients: VmRSS %llu KiB, of which arena (RssShmem) %llu KiB, beyond the "
        "arena %.1f MiB "
        "(target < 64 MiB)\n",
        (unsigned long long)rss, (unsigned long long)shmem, beyond_kb / 1024.0);
  }
  double build_peak_mib = 0;
  auto cached_kb = [] {
    std::ifstream f("/proc/meminfo");
    std::string k, unit;
    uint64_t v;
    while (f >> k >> v) {
      std::getline(f, unit);
      if (k == "Cached:") return v;
    }
    return uint64_t{0};
  };
  if (!model.empty()) {
    drop_cache(model);
    uint64_t cached_before = cached_kb();
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string exe = self_dir() + "/../pack/expert-pack";
      ::execl(exe.c_str(), "expert-pack", "-q", "build", model.c_str(), "--out", out_dir.c_str(),
              nullptr);
      ::_exit(127);
    }
    int st;
    rusage ru{};
    ::wait4(pid, &st, 0, &ru);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("expert-pack build failed");
    build_peak_mib = ru.ru_maxrss / 1024.0;
    std::printf(
        "expert-pack build peak RSS: %.1f MiB (target < 1024 MiB); page cache grew by %.1f MiB for "
        "a %.1f MiB "
        "source\n",
        build_peak_mib, (double(cached_kb()) - double(cached_before)) / 1024.0,
        double(std::filesystem::file_size(model)) / 1048576.0);
  }
  std::printf("ratio=%.3f\n", beyond_kb / 1024.0 / 64.0);
  return 0;
}

// An engine's access pattern without an engine: per token and layer, top-k experts drawn from a
// Zipf(s) popularity over a per-layer permutation, acquired, waited for, released.
int bench_sim(const std::string& sock, uint32_t tokens, uint32_t top_k, double zipf_s,
              uint64_t seed) {
  auto c = client::Client::connect(sock);
  if (!c) die(c.error().message);
  const auto& info = (*c)->info();
  uint32_t E = info.n_experts, L = static_cast<uint32_t>(info.layers.size());
  top_k = std::min({top_k, E, info.max_experts_per_request});
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint32_t>> perm(L, std::vector<uint32_t>(E));
  for (auto& p : perm) {
    std::iota(p.begin(), p.end(), 0u);
    std::shuffle(p.begin(), p.end(), rng);
  }
  std::vector<double> w(E);
  for (uint32_t i = 0; i < E; ++i) w[i] = 1.0 / std::pow(i + 1.0, zipf_s);
  std::discrete_distribution<uint32_t> zipf(w.begin(), w.end());
  double h0 = metric(**c, "cache_hits"), m0 = metric(**c, "cache_misses"),
         b0 = metric(**c, "pack_read_bytes");
  auto t0 = Clock::now();
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<uint32_t> ids;
      while (ids.size() < top_k) {
        uint32_t e = perm[l][zipf(rng)];
        if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
      }
      auto lease = (*c)->acquire(l, ids);
      if (!lease) die(lease.error().message);
      if (auto st = (*c)->wait_ready(*lease); !st) die(st.error().message);
      if (!(*c)->release(*lease)) die("release failed");
    }
  double s = secs(t0, Clock::now());
  double hits = metric(**c, "cache_hits") - h0, misses = metric(**c, "cache_misses") - m0;
  double bytes = metric(**c, "pack_read_bytes") - b0;
  std::printf(
      "%u tokens x %u layers x top-%u (Zipf %.2f): %.1f tokens/s, hit rate %.3f, %.1f "
      "misses/token, "
      "%.2f MiB read/token\n",
      tokens, L, top_k, zipf_s, tokens / s, hits / (hits + misses), misses / tokens,
      bytes / tokens / 1048576.0);
  std::printf("ratio=%.3f\n", hits / (hits + misses));
  return 0;
}

}  // namespace

// The cuda arena's staging path without the drive: every iteration binds a pinned staging buffer
// (waiting for its previous copy when the ring is full), queues the copy into a slot and records
// the slot's interprocess event, exactly as a miss does. Baseline: back-to-back cudaMemcpyAsync of
// the same sizes from pinned buffers on one stream.
int bench_h2d(uint64_t slot_kib, uint32_t slots, uint32_t stages, double seconds, int device) {
#ifdef EXPERTD_HAVE_CUDA_ARENA
  const uint64_t slot = slot_kib << 10;
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
  };
  check(cudaSetDevice(device), "cudaSetDevice");
  double bare = 0;
  {
    void* dev = nullptr;
    check(cudaMalloc(&dev, slots * slot), "cudaMalloc");
    std::vector<void*> pinned(stages);
    for (auto& p : pinned) check(cudaHostAlloc(&p, slot, cudaHostAllocPortable), "cudaHostAlloc");
    cudaStream_t st;
    check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    uint64_t n = 0;
    auto t0 = Clock::now();
    while (secs(t0, Clock::now()) < seconds) {
      for (int k = 0; k < 64; ++k, ++n)
        check(cudaMemcpyAsync(static_cast<uint8_t*>(dev) + (n % slots) * slot, pinned[n % stages],
                              slot, cudaMemcpyHostToDevice, st),
              "cudaMemcpyAsync");
      check(cudaStreamSynchronize(st), "sync");
    }
    bare = n * slot / secs(t0, Clock::now()) / 1e9;
    cudaStreamDestroy(st);
    for (auto p : pinned) cudaFreeHost(p);
    cudaFree(dev);
  }
  std::printf("bare cudaMemcpyAsync from pinned memory, %llu KiB blocks: %.2f GB/s\n",
              (unsigned long long)slot_kib, bare);
  daemon::CudaArenaOptions o;
  o.device = device;
  o.slot_bytes = slot;
  o.cache_bytes = slots * slot;
  o.max_slots = slots;
  o.need_slots = 1;
  o.stage_slots = stages;
  std::string info;
  auto arena = daemon::create_cuda_arena(o, &info);
  if (!arena) die(arena.error().message);
  uint64_t n = 0, failed = 0;
  auto t0 = Clock::now();
  while (secs(t0, Clock::now()) < seconds) {
    for (int k = 0; k < 64; ++k, ++n) {
      uint32_t s = static_cast<uint32_t>(n % slots);
      if (!(*arena)->read_target(s)) die("no staging buffer");
      (*arena)->publish(s, slot, [&](Status st) { failed += !st; });
    }
  }
  check(cudaDeviceSynchronize(), "sync");
  double staged = n * slot / secs(t0, Clock::now()) / 1e9;
  std::printf(
      "cuda arena staging path (%u pinned buffers, event per slot) on %s: %.2f GB/s, %llu stage "
      "waits, %llu copy errors\n",
      stages, info.c_str(), staged, (unsigned long long)(*arena)->stage_waits(),
      (unsigned long long)((*arena)->copy_errors() + failed));
  std::printf("ratio=%.3f\n", staged / bare);
  return 0;
#else
  (void)slot_kib, (void)slots, (void)stages, (void)seconds, (void)device;
  die("this build has no CUDA tier (configure with -DEXPERTD_CUDA=ON)");
#endif
}

// A million acquires (by default) from 8 clients over a cache a third of the pack's experts:
// expertd's memory beyond its arena, its open descriptors and the acquire latency (acquire until
// every expert is ready, then release) in the first and the last tenth of the run. Flat = pass:
// ratio = last tenth's p99 / first tenth's p99, with the RSS and descriptor counts beside it.
int bench_soak(const std::string& manifest_path, uint64_t acquires, uint32_t n_clients) {
  auto m = pack::load_manifest(manifest_path);
  if (!m) die(m.error().message);
  const uint32_t k = std::min(4u, m->n_experts), per_request = std::max(8u, k);
  const uint64_t all = uint64_t{m->n_experts} * m->layers.size();
  const uint64_t slots = std::max<uint64_t>(all / 3, uint64_t{n_clients} * per_request);
  std::string sock = "/tmp/expert-bench-soak.sock";
  DaemonProc d(manifest_path, sock,
               {"--cache-slots", std::to_string(slots), "--clients-max", std::to_string(n_clients),
                "--max-experts-per-request", std::to_string(per_request), "--reserve-mib", "256"});
  auto fds = [&] {
    uint64_t n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid) + "/fd"))
      ++n;
    return n;
  };
  auto beyond_mib = [&] {
    return (status_kb(d.pid, "VmRSS") - status_kb(d.pid, "RssShmem")) / 1024.0;
  };
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  const uint64_t tenth = acquires / 10;
  std::vector<std::vector<float>> first(n_clients), last(n_clients);  // latencies, us
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (uint32_t c = 0; c < n_clients; ++c)
    ts.emplace_back([&, c] {
      auto cl = client::Client::connect(sock, {"soak", 30000});
      if (!cl) return failed = true, void();
      std::mt19937_64 rng(c + 1);
      std::vector<uint32_t> ids;
      for (;;) {
        const uint64_t i = done.fetch_add(1);
        if (i >= acquires) return;
        const uint32_t layer = static_cast<uint32_t>(rng() % m->layers.size());
        ids.clear();
        while (ids.size() < k) {  // skewed toward low ids (popular experts), distinct
          const double u = std::uniform_real_distribution<double>(0, 1)(rng);
          const uint32_t e = static_cast<uint32_t>(std::pow(u, 2.0) * m->n_experts) % m->n_experts;
          if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
        }
        const auto a = Clock::now();
        auto l = (*cl)->acquire(layer, ids);
        if (!l || !(*cl)->wait_ready(*l) || !(*cl)->release(*l)) return failed = true, void();
        const float us = static_cast<float>(secs(a, Clock::now()) * 1e6);
        if (i < tenth)
          first[c].push_back(us);
        else if (i >= acquires - tenth)
          last[c].push_back(us);
      }
    });
  // Memory and descriptors once the first tenth is done, and at the end.
  while (done.load() < tenth && !failed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double rss_start = beyond_mib();
  const uint64_t fds_start = fds();
  for (auto& t : ts) t.join();
  if (failed) die("a soak client failed");
  const double wall = secs(t0, Clock::now());
  const double rss_end = beyond_mib();
  const uint64_t fds_end = fds();
  auto pct = [](std::vector<std::vector<float>>& per, double q) {
    std::vector<float> v;
    for (auto& x : per) v.insert(v.end(), x.begin(), x.end());
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return double(v[std::min(v.size() - 1, size_t(q * double(v.size())))]);
  };
  auto probe = client::Client::connect(sock, {"soak-stats", 5000, /*monitor=*/true});
  if (!probe) die(probe.error().message);
  std::printf(
      "%llu acquires of %u experts by %u clients in %.1f s (%.0f/s); cache %llu of %llu experts\n",
      (unsigned long long)acquires, k, n_clients, wall, acquires / wall, (unsigned long long)slots,
      (unsigned long long)all);
  std::printf("hit rate %.3f, io_errors %.0f, leases left %.0f\n",
              metric(**probe, "cache_hits") /
                  std::max(1.0, metric(**probe, "cache_hits") + metric(**probe, "cache_misses")),
              metric(**probe, "io_errors"), metric(**probe, "leases"));
  std::printf(
      "first tenth: RSS beyond arena %.1f MiB, %llu fds, latency p50 %.0f us p99 %.0f us p99.9 "
      "%.0f us\n",
      rss_start, (unsigned long long)fds_start, pct(first, 0.5), pct(first, 0.99),
      pct(first, 0.999));
  std::printf(
      "last tenth:  RSS beyond arena %.1f MiB, %llu fds, latency p50 %.0f us p99 %.0f us p99.9 "
      "%.0f us\n",
      rss_end, (unsigned long long)fds_end, pct(last, 0.5), pct(last, 0.99), pct(last, 0.999));
  std::printf("rss_growth_mib=%.1f fd_growth=%lld\n", rss_end - rss_start,
              (long long)fds_end - (long long)fds_start);
  std::printf("ratio=%.3f\n", pct(last, 0.99) / std::max(1.0, pct(first, 0.99)));
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"expert-bench: storage-tier benchmarks; each prints ratio=<x> last"};
  app.require_subcommand(1);
  std::string manifest, model, out_dir = "/tmp";
  uint32_t qd = 64, clients = 16, iters = 20000;
  double seconds = 10;
  auto* io = app.add_subcommand(
      "io", "expertd random misses vs raw O_DIRECT io_uring reads (target >= 0.85)");
  io->add_option("--manifest", manifest, "pack manifest (a Qwen3-30B-A3B-shaped synthetic pack)")
      ->required();
  io->add_option("--queue-depth", qd, "reads in flight, both sides")->capture_default_str();
  io->add_option("--clients", clients, "engine clients")->capture_default_str();
  io->add_option("--seconds", seconds, "duration of each side in each round")
      ->capture_default_str();
  uint32_t io_rounds = 5;
  io->add_option("--rounds", io_rounds, "alternating rounds of the two sides (medians reported)")
      ->capture_default_str();
  std::string backend = "host";
  io->add_option("--backend", backend, "expertd's arena: host or cuda (misses delivered into VRAM)")
      ->capture_default_str();
  uint64_t slot_kib = 2592;
  uint32_t h2d_slots = 256, stages = 8;
  int device = 0;
  auto* h2d = app.add_subcommand(
      "h2d", "cuda arena staging path vs bare pinned cudaMemcpyAsync (target >= 0.9; CUDA builds)");
  h2d->add_option("--slot-kib", slot_kib, "bytes per copy (a Qwen3-30B-A3B Q4_K expert: 2592 KiB)")
      ->capture_default_str();
  h2d->add_option("--slots", h2d_slots, "VRAM slots cycled through")->capture_default_str();
  h2d->add_option("--stage-slots", stages, "pinned staging buffers")->capture_default_str();
  h2d->add_option("--seconds", seconds, "duration of each side")->capture_default_str();
  h2d->add_option("--device", device, "GPU ordinal")->capture_default_str();
  auto* rtt = app.add_subcommand(
      "rtt",
      "acquire+release of a layer of cached experts, through the socket and from the residency "
      "board, vs a Unix-socket ping-pong (target <= 3)");
  rtt->add_option("--manifest", manifest)->required();
  rtt->add_option("--iters", iters)->capture_default_str();
  auto* build = app.add_subcommand("build", "expert-pack build vs sequential copy (target >= 0.7)");
  build->add_option("--model", model, "MoE GGUF")->required();
  build->add_option("--out", out_dir, "scratch directory on the same drive")->capture_default_str();
  auto* mem =
      app.add_subcommand("mem", "expertd memory beyond its arena with 8 clients; build peak RSS");
  mem->add_option("--manifest", manifest)->required();
  mem->add_option("--model", model, "also measure expert-pack build of this GGUF");
  mem->add_option("--out", out_dir)->capture_default_str();
  uint64_t soak_acquires = 1000000;
  uint32_t soak_clients = 8;
  auto* soak = app.add_subcommand(
      "soak",
      "a million acquires from 8 clients, cache a third of the pack: RSS, fds, latency "
      "at start and end (ratio = end p99 / start p99; flat = pass)");
  soak->add_option("--manifest", manifest)->required();
  soak->add_option("--acquires", soak_acquires)->capture_default_str();
  soak->add_option("--clients", soak_clients)->capture_default_str();
  std::string sock;
  uint32_t tokens = 200, top_k = 8;
  double zipf_s = 1.0;
  auto* sim = app.add_subcommand(
      "sim", "an engine's access pattern against a running expertd; ratio = hit rate");
  sim->add_option("--socket", sock, "expertd socket")->required();
  sim->add_option("--tokens", tokens)->capture_default_str();
  sim->add_option("--top-k", top_k)->capture_default_str();
  sim->add_option("--zipf", zipf_s, "popularity skew")->capture_default_str();
  std::string trace_path;
  std::vector<double> fractions = {0.10, 0.25, 0.50};
  auto* pol = app.add_subcommand(
      "policy",
      "replay an expertd trace: popularity, hit rate of the daemon's policies, the lab's (sieve, "
      "s3fifo, arc, 2q, lecar: simulation only) and Belady; ratio = lfru/belady");
  pol->add_option("--trace", trace_path, "file written by expertd --trace-path")->required();
  pol->add_option("--fractions", fractions, "cache sizes as fractions of all experts")
      ->delimiter(',');
  KernelsArgs kern_args;
  auto* kern = add_kernels_command(app, kern_args);
  AttentionArgs att_args;
  auto* att = add_attention_command(app, att_args);
  GemvArgs gemv_args;
  auto* gemv = add_gemv_command(app, gemv_args);
  CLI11_PARSE(app, argc, argv);
  if (att->parsed()) return bench_attention(att_args);
  if (gemv->parsed()) return bench_gemv(gemv_args);
  if (kern->parsed()) return bench_kernels(kern_args);
  if (pol->parsed()) return bench_policy(trace_path, fractions);
  if (sim->parsed()) return bench_sim(sock, tokens, top_k, zipf_s, 7);
  ::signal(SIGPIPE, SIG_IGN);
  if (h2d->parsed()) return bench_h2d(slot_kib, h2d_slots, stages, seconds, device);
  if (io->parsed()) return bench_io(manifest, qd, clients, seconds, backend, io_rounds);
  if (rtt->parsed()) return bench_rtt(manifest, iters);
  if (build->parsed()) return bench_build(model, out_dir);
  if (soak->parsed()) return bench_soak(manifest, soak_acquires, soak_clients);
  return bench_mem(manifest, model, out_dir);
}
