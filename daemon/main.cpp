// expertd: the expert-serving daemon.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <boost/asio.hpp>
#include <csignal>
#include <utility>

#include "daemon/arena.h"
#include "daemon/cache.h"
#include "daemon/config.h"
#include "daemon/io_engine.h"
#include "daemon/popularity.h"
#include "daemon/server.h"
#include "daemon/trace.h"
#include "pack/verify.h"

using namespace expertd;
using namespace expertd::daemon;

namespace {

void setup_logging(const Config& cfg) {
  std::shared_ptr<spdlog::logger> log;
  if (cfg.log_path.empty())
    log = spdlog::stderr_color_mt("expertd");
  else
    log = spdlog::basic_logger_mt("expertd", cfg.log_path);
  spdlog::set_default_logger(log);
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));
  spdlog::flush_on(spdlog::level::info);
}

// slot_count = floor(min(cache_bytes, free_bytes - reserve_bytes) / slot_bytes), and enough of
// them for every client's working set, or nothing starts.
Result<uint32_t> plan_slots(const Config& cfg, const pack::Manifest& m, uint32_t max_per_request) {
  uint64_t slot_bytes = m.slot_bytes();
  auto avail = host_available_bytes();
  if (!avail) return avail.error();
  uint64_t reserve = cfg.reserve_mib << 20, cache = cfg.cache_mib << 20;
  if (*avail <= reserve)
    return make_error("only " + std::to_string(*avail >> 20) +
                      " MiB available, less than --reserve-mib " + std::to_string(cfg.reserve_mib));
  if (cfg.cache_slots) cache = uint64_t{cfg.cache_slots} * slot_bytes;
  uint64_t budget = std::min(cache, *avail - reserve);
  uint64_t total = uint64_t{m.n_experts} * m.layers.size();
  uint64_t count = std::min(budget / slot_bytes, total);
  uint64_t need = std::min<uint64_t>(uint64_t{cfg.clients_max} * max_per_request, total);
  if (count < need)
    return make_error(
        "a cache of " + std::to_string(count) + " slots of " + std::to_string(slot_bytes) +
        " bytes cannot hold " + std::to_string(cfg.clients_max) + " clients x " +
        std::to_string(max_per_request) + " experts per request = " + std::to_string(need) +
        " slots; raise --cache-mib to at least " +
        std::to_string((need * slot_bytes + (1 << 20) - 1) >> 20) +
        " or lower --clients-max / --max-experts-per-request");
  return static_cast<uint32_t>(count);
}

int run(const Config& cfg) {
  auto manifest = pack::load_manifest(cfg.manifest);
  if (!manifest) throw std::runtime_error(manifest.error().message);
  const pack::Manifest& m = *manifest;
  auto pack_fd = pack::open_pack_direct(m, cfg.manifest);  // fail-closed on the O_DIRECT contract
  if (!pack_fd) throw std::runtime_error(pack_fd.error().message);

  uint32_t max_per_request = cfg.max_experts_per_request;
  if (max_per_request == 0) max_per_request = std::max(8u, 2 * m.n_experts_used);
  max_per_request = std::min(max_per_request, m.n_experts);

  std::unique_ptr<SlotArena> arena;
  if (cfg.backend == "cuda" && m.has_rows8())
    throw std::runtime_error(
        cfg.manifest +
        " stores experts as interleaved rows (expert-pack build --layout rows8), which only "
        "engines on the CPU read: --backend cuda needs a pack built with --layout rows");
  if (cfg.backend == "cuda") {
#ifdef EXPERTD_HAVE_CUDA_ARENA
    CudaArenaOptions o;
    o.device = cfg.device;
    o.slot_bytes = m.slot_bytes();
    o.cache_bytes =
        cfg.cache_slots ? uint64_t{cfg.cache_slots} * m.slot_bytes() : cfg.cache_mib << 20;
    o.reserve_bytes = cfg.reserve_mib << 20;
    o.max_slots = uint64_t{m.n_experts} * m.layers.size();
    o.need_slots = std::min<uint64_t>(uint64_t{cfg.clients_max} * max_per_request, o.max_slots);
    o.stage_slots = cfg.stage_slots;
    o.host_slots = std::min<uint64_t>(
        cfg.host_cache_slots ? cfg.host_cache_slots : (cfg.host_cache_mib << 20) / m.slot_bytes(),
        o.max_slots);
    std::string info;
    auto a = create_cuda_arena(o, &info);
    if (!a) throw std::runtime_error(a.error().message);
    arena = std::move(*a);
    spdlog::info("cuda arena on {}", info);
#else
    throw std::runtime_error(
        "--backend cuda: this build has no CUDA arena (configure with -DEXPERTD_CUDA=ON); use "
        "--backend host");
#endif
  } else {
    auto slots = plan_slots(cfg, m, max_per_request);
    if (!slots) throw std::runtime_error(slots.error().message);
    std::string warning;
    auto a = create_host_arena(*slots, m.slot_bytes(), cfg.lock_memory, cfg.huge_pages, &warning);
    if (!a) throw std::runtime_error(a.error().message);
    arena = std::move(*a);
    if (!warning.empty()) spdlog::warn("{}", warning);
  }
  auto policy = make_policy(cfg.policy);
  boost::asio::io_context ctx(1);
  TraceWriter trace;
  if (!cfg.trace_path.empty())
    if (auto st = trace.open(cfg.trace_path, static_cast<uint32_t>(m.layers.size()), m.n_experts);
        !st)
      throw std::runtime_error(st.error().message);

  CacheConfig cc;
  cc.read_splits = cfg.read_splits;
  cc.max_experts_per_request = max_per_request;
  cc.acquire_wait_ms_max = cfg.acquire_wait_ms_max;
  cc.verify_checksums = cfg.verify_checksums;
  cc.prefetch_admit_always = cfg.prefetch_admit == "always";
  cc.prefetch_admit_spare = cfg.prefetch_admit == "spare";
  std::unique_ptr<Server> server;
  Cache* cache_ptr = nullptr;
  auto io = IoEngine::create(pack_fd->get(), cfg.queue_depth, cfg.inflight_mib << 20,
                             [&](uint64_t job, Status st) { cache_ptr->on_read_done(job, st); });
  if (!io) throw std::runtime_error(io.error().message);
  // The cache is made before the server it reports to: its events go there once it exists.
  struct DeferredSink final : CacheSink {
    CacheSink* target = nullptr;
    void acquire_granted(ClientId c, uint64_t r, uint64_t l, std::span<const uint32_t> s,
                         std::span<const uint8_t> rd) override {
      target->acquire_granted(c, r, l, s, rd);
    }
    void expert_ready(ClientId c, uint64_t l, uint32_t i, ErrorCode code, const std::string& msg,
                      uint32_t slot) override {
      target->expert_ready(c, l, i, code, msg, slot);
    }
    void request_failed(ClientId c, uint64_t r, ErrorCode code, const std::string& msg) override {
      target->request_failed(c, r, code, msg);
    }
    void board_acquired(ClientId c, uint32_t layer, std::span<const uint32_t> e) override {
      target->board_acquired(c, layer, e);
    }
  } sink;
  Cache cache(m, *arena, *policy, sink, cc);
  if (const Affinity* a = cache.affinity())
    spdlog::info("lfru+affinity: co-occurrence {} layers ahead, a table of {:.1f} MiB",
                 a->layers_ahead(), double(a->table_bytes()) / 1048576.0);
  cache_ptr = &cache;
  cache.set_io(io->get());
  std::unique_ptr<Board> board;
  if (cfg.residency_board) {
    auto b = Board::create(static_cast<uint32_t>(m.layers.size() * m.n_experts),
                           arena->slot_count(), cfg.clients_max, max_per_request);
    if (!b) throw std::runtime_error(b.error().message);
    board = std::move(*b);
    cache.set_board(board.get());
  }
  if (!cfg.state_path.empty()) {
    // A warm start is worth having, not worth refusing to serve for: a bad file is a warning.
    auto pop = load_popularity(cfg.state_path, m);
    if (!pop)
      spdlog::warn("{}; starting cold", pop.error().message);
    else if (pop->empty())
      spdlog::info("no state file at {} yet: starting cold", cfg.state_path);
    else
      spdlog::info("warm start from {}: {} popular experts to read", cfg.state_path,
                   cache.warm_start(*pop));
  }
  server = std::make_unique<Server>(ctx, cfg, m, *arena, cache, **io, trace, board.get());
  sink.target = server.get();
  if (auto st = server->listen(); !st) throw std::runtime_error(st.error().message);

  boost::asio::signal_set signals(ctx, SIGTERM, SIGINT, SIGHUP);
  std::function<void()> wait_signal = [&]() {
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        spdlog::info("SIGHUP: reopening logs");
        if (!cfg.log_path.empty()) {
          spdlog::drop("expertd");
          setup_logging(cfg);
        }
        server->reopen_logs();
        wait_signal();
        return;
      }
      spdlog::info("{}: draining and stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      sd_notify(0, "STOPPING=1");
      server->shutdown();
    });
  };
  wait_signal();
  server->start();
  spdlog::info(
      "serving {} ({} MoE layers x {} experts) on {}: {} arena, {} slots x {} KiB = {} MiB, "
      "policy {}, max {} experts per request",
      m.model_name.empty() ? m.arch : m.model_name, m.layers.size(), m.n_experts, cfg.socket,
      arena->kind(), arena->slot_count(), arena->slot_bytes() >> 10, arena->arena_bytes() >> 20,
      cfg.policy, max_per_request);
  sd_notify(0, "READY=1\nSTATUS=serving");
  ctx.run();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  int exit_code = -1;
  auto cfg = parse_config(argc, argv, &exit_code);
  if (exit_code >= 0) return exit_code;
  if (!cfg) {
    std::fprintf(stderr, "expertd: error: %s\n", cfg.error().message.c_str());
    return 2;
  }
  try {
    setup_logging(*cfg);
    return run(*cfg);
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    sd_notifyf(0, "STATUS=failed: %s", e.what());
    return 1;
  }
}
