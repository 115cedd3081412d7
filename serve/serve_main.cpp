// expert-serve: an OpenAI- and Anthropic-compatible HTTP server over the bundled engine, its
// concurrent requests batched so that each MoE layer reads the union of their experts once.
#include <signal.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "chat/model_chat.h"
#include "engine/engine.h"
#include "engine/factory.h"
#include "engine/model.h"
#include "engine/state_file.h"
#include "engine/tokenizer.h"
#include "gguf/gguf_reader.h"
#include "kernels/kernels.h"
#include "serve/dashboard.h"
#include "serve/kv_events.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "serve/server.h"
#include "serve/web.h"
#include "serve/workers.h"

using namespace expertd;

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "expert-serve: error: %s\n", why.c_str());
  std::exit(1);
}

std::string default_model() {
  for (const char* p : {EXPERTD_INSTALLED_MODEL, EXPERTD_SOURCE_MODEL})
    if (std::filesystem::exists(p)) return p;
  die(std::string("no --model given and the bundled model is not at ") + EXPERTD_INSTALLED_MODEL +
      " or " + EXPERTD_SOURCE_MODEL);
}

// The model's name for clients: its file name without .gguf (and .core of a pack's core).
std::string model_id(const std::string& path) {
  std::string n = std::filesystem::path(path).filename().string();
  for (const char* ext : {".gguf", ".core"})
    if (n.size() > std::strlen(ext) && n.ends_with(ext)) n.resize(n.size() - std::strlen(ext));
  return n;
}

// A rolling restart loses no request: the gateways see /health 503 and stop sending, those sent
// meanwhile get 503 with Retry-After (and are retried on another server), and the generations
// running finish, for up to `timeout_s` (then stop() cancels them). A second signal cuts it short.
void drain(serve::Server& server, const sigset_t& sigs, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  server.drain();
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::fprintf(stderr, "expert-serve: draining: %d request(s) running, up to %gs to finish\n",
               server.generations(), timeout_s);
  timespec poll{0, 20 * 1000 * 1000};
  while (server.generations() > 0 && Clock::now() < deadline)
    if (sigtimedwait(&sigs, nullptr, &poll) > 0) {
      std::fprintf(stderr, "expert-serve: a second signal: stopping now\n");
      break;
    }
  if (const int left = server.generations(); left > 0)
    std::fprintf(stderr, "expert-serve: drained but %d request(s) still running: cancelled\n",
                 left);
  else
    std::fprintf(stderr, "expert-serve: drained\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "expert-serve: OpenAI- and Anthropic-compatible HTTP server; concurrent requests "
      "are batched and share expert reads"};
  std::string model, socket, host = "127.0.0.1", api_key, chat_template_file, alias;
  bool local = false;
  int port = 8080, parallel = 4, ctx = 4096, queue_max = 64;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_t max_body_mb = 8;
  int workers = 1, worker_fd = -1;
  bool prefetch = false, interleave = true;
  std::string device = "cpu";
  std::string kv_type_name = "f32";
  size_t prefix_cache_mib = 1024;
  std::string prefix_cache_dir;
  double prefix_cache_gib = 16;
  double drain_timeout_s = 30;
  std::string web_dir;
  app.add_option("--model", model,
                 "model GGUF, or the core GGUF of an expert pack (default: the bundled model)");
  app.add_option("--socket", socket, "expertd socket: experts come from the daemon");
  app.add_flag("--local", local, "read experts in place from the GGUF");
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "port to listen on (0: any free one, printed)")
      ->capture_default_str();
  app.add_option("--parallel", parallel,
                 "sequences decoded together (continuous batching: one expert fetch per layer for "
                 "all of them)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--ctx", ctx, "context length of each sequence (KV cache)")
      ->capture_default_str()
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--queue-max", queue_max,
                 "requests waiting for a sequence beyond the running ones; more get 503")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--api-key", api_key,
                 "require this key (Authorization: Bearer KEY, or x-api-key: KEY) on /v1/ "
                 "(default: $EXPERT_SERVE_API_KEY, else none)");
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--device", device,
                 "cpu, or cuda: weights, KV caches and MoE kernels on the GPU, experts from a cuda "
                 "expertd's VRAM slots (or uploaded whole with --local); prompt prefixes are not "
                 "reused there")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--kv-type", kv_type_name,
                 "the KV caches' type: f32, or f16 (half the bytes per position in the caches and "
                 "in the prefix tiers, as llama.cpp's default; logits within the F16 rounding)")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  app.add_option("--chat-template", chat_template_file,
                 "a Jinja chat template file instead of the model's tokenizer.chat_template")
      ->check(CLI::ExistingFile);
  app.add_flag("--prefetch", prefetch,
               "hint each next layer's likely experts (the union over the batch) to expertd before "
               "they are needed");
  app.add_flag(
      "--interleave,!--no-interleave", interleave,
      "CPU: decode reads interleaved copies (eight rows side by side) of the " +
          kernels::rows8_type_names() +
          " matrices of the core and, with --local where they fit in half the available "
          "memory, of the experts; the same logits, the copies' memory added (default: on)");
  app.add_option("--workers", workers,
                 "engine processes, each with its own --parallel sequences and KV caches, on one "
                 "expertd (1: the engine runs in this process)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--worker-fd", worker_fd, "(internal: run as an engine process on this socket)")
      ->group("");
  app.add_option("--prefix-cache-mib", prefix_cache_mib,
                 "RAM for prompt prefixes' attention states, reused by later requests whose "
                 "prompts begin the same way (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--prefix-cache-dir", prefix_cache_dir,
                 "a directory on the SSD for prompt prefixes' states beyond RAM (written with "
                 "O_DIRECT, checksummed, kept across restarts and shared by --workers)");
  app.add_option("--prefix-cache-gib", prefix_cache_gib, "the SSD tier's size")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  std::string kv_events_endpoint, kv_events_topic;
  app.add_option("--kv-events-endpoint", kv_events_endpoint,
                 "publish the prefix cache's block events (stored, removed, all cleared) in "
                 "vLLM's KV-event format on a ZMQ PUB socket: bound for tcp://*:PORT, ipc:// and "
                 "inproc://, connected otherwise (docs/fleet.md, KV events); needs "
                 "--prefix-cache-mib > 0, one engine process and --device cpu");
  app.add_option("--kv-events-topic", kv_events_topic, "the topic frame of each event batch");
  std::string speculative = "none";
  int draft_max = 8;
  app.add_option(
         "--speculative", speculative,
         "draft tokens verified in one batched eval (greedy output unchanged): none, "
         "ngram (prompt lookup), or mtp (the model's own NextN block, where the GGUF "
         "has one: GLM-4.5/4.6/4.7, GLM-5, Qwen3.5, Qwen3-Next, DeepSeek-V3.2 and -V4, Hy3, "
         "Ling 3.0, MiMo-V2 and Step 3.5); "
         "a request may say "
         "\"speculative\": \"ngram\", "
         "\"mtp\" (with mtp here) or \"none\" itself")
      ->check(CLI::IsMember({"none", "ngram", "mtp"}))
      ->capture_default_str();
  app.add_option("--draft-max", draft_max,
                 "most drafts per step (a request's \"draft_max\" overrides it)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--alias", alias, "the model's name in the API (default: its file name)");
  app.add_option("--max-body-mb", max_body_mb, "largest request body (413 beyond)")
      ->capture_default_str();
  app.add_option("--drain-timeout-s", drain_timeout_s,
                 "on SIGTERM or SIGINT: /health answers 503 and new requests 503 with "
                 "Retry-After, the running ones have this long to finish, then it exits 0 (a "
                 "second signal: at once; docs/fleet.md)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--web-dir", web_dir,
                 "the page served at / (a chat and a live dashboard, docs/web.md): its files' "
                 "directory (default: share/expertd/web beside the binary, the source tree's "
                 "serve/web for a build, or the install prefix's)");
  serve::ServerOptions so;
  auto* lim = "Limits (slow and hostile clients)";
  app.add_option("--header-timeout-s", so.header_timeout_s,
                 "a request's line and headers must arrive within this, from its first byte "
                 "(a new connection's: from its accept)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0))
      ->group(lim);
  app.add_option("--body-timeout-s", so.body_timeout_s,
                 "a request's body must arrive within this, from the end of its headers")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0))
      ->group(lim);
  app.add_option("--keepalive-s", so.keepalive_s, "an idle connection is closed after this")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0))
      ->group(lim);
  app.add_option("--write-timeout-s", so.write_timeout_s,
                 "each write of a response must finish within this; a client that stops reading "
                 "is dropped and its generation ended")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0))
      ->group(lim);
  app.add_option("--max-connections", so.max_connections,
                 "established connections (past their first request's headers and key); more "
                 "get 503 (/health and /metrics are still answered)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24))
      ->group(lim);
  app.add_option("--pending-connections-max", so.pending_connections_max,
                 "connections not yet past their first request's headers and key, held apart; "
                 "when full, the oldest is closed for a new one")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24))
      ->group(lim);
  app.add_option("--peer-connections-max", so.peer_connections_max,
                 "connections from one address, of each kind: established ones beyond it get 503, "
                 "pending ones make way oldest first (0: no cap; behind a reverse proxy every "
                 "client has its address)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24))
      ->group(lim);
  app.add_option("--requests-max", so.requests_max,
                 "requests being answered at once, each on a thread of its own (generations "
                 "waiting in --queue-max included); more get 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20))
      ->group(lim);
  app.add_option("--io-threads", so.io_threads, "threads reading and writing connections")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->group(lim);
  app.set_config("--config", "",
                 "read options from this file (key = value lines, as "
                 "systemd/expert-serve.conf.example)");
  CLI11_PARSE(app, argc, argv);
  const engine::KvType kv_type = kv_type_name == "f16" ? engine::KvType::F16 : engine::KvType::F32;
  if (api_key.empty())
    if (const char* k = std::getenv("EXPERT_SERVE_API_KEY")) api_key = k;
  if (model.empty()) model = default_model();
  if (local && !socket.empty()) die("--local and --socket exclude each other");
  if (!local && socket.empty()) die("give --socket of the expertd serving the model, or --local");

  auto f = gguf::Model::open(model);
  if (!f) die(f.error().message);
  const bool mtp = speculative == "mtp";
  auto m = engine::Model::load(*f, /*nextn=*/mtp);
  if (!m) die(m.error().message);
  if (local && !m->has_local_experts)
    die(model + " is a core GGUF without experts: pass --socket of the expertd serving its pack");
  auto tok = engine::Tokenizer::load(*f);
  if (!tok) die(tok.error().message);

  auto chat = chat::ModelChat::load(*f, *tok, chat_template_file);
  if (!chat) die(chat.error().message);

  const engine::Model& mod = *m;
  engine::EngineSpec spec;
  spec.device = device, spec.socket = local ? "" : socket, spec.threads = threads;
  spec.n_ctx = ctx, spec.n_seq = parallel, spec.kv = kv_type, spec.prefetch = prefetch;
  spec.interleave = interleave;
  if (auto st = engine::check_spec(spec); !st) die(st.error().message);
  serve::EngineFactory make = [&]() -> expertd::Result<std::unique_ptr<engine::Forward>> {
    auto e = engine::make_engine(mod, spec);
    if (e && mtp)
      if (auto st = (*e)->set_nextn(true); !st) return st.error();
    return e;
  };

  // SIGINT/SIGTERM drain the server, then stop it: blocked here, taken by a thread.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  serve::Metrics metrics;
  metrics.model_name = alias.empty() ? model_id(model) : alias;
  metrics.kv_positions_max = int64_t(workers) * parallel * ctx;
  serve::Grammars grammars(*tok);
  std::unique_ptr<serve::PrefixDisk> disk;
  if (!prefix_cache_dir.empty()) {
    if (prefix_cache_mib == 0)
      die("--prefix-cache-dir needs the RAM tier (--prefix-cache-mib > 0)");
    // The states are the model's: its file's identity names them (engine/state_file.h).
    auto model_identity = engine::model_identity(model, kv_type, mtp);
    if (!model_identity) die(model_identity.error().message);
    auto d = serve::PrefixDisk::open(prefix_cache_dir, uint64_t(prefix_cache_gib * (1ull << 30)),
                                     *model_identity);
    if (!d) die(d.error().message);
    disk = std::move(*d);
    metrics.prefix_disk = disk.get();
  }
  std::unique_ptr<serve::KvEvents> kv_events;
  if (!kv_events_endpoint.empty()) {
    if (prefix_cache_mib == 0)
      die("--kv-events-endpoint needs the prefix cache (--prefix-cache-mib > 0)");
    if (workers > 1)
      die("--kv-events-endpoint with --workers > 1 is not supported: each engine process has its "
          "own prefix cache (run one expert-serve per endpoint)");
    if (device != "cpu")
      die("--kv-events-endpoint needs --device cpu (its events were not tested on cuda)");
    auto k = serve::KvEvents::open(kv_events_endpoint, kv_events_topic,
                                   uint32_t(serve::PrefixCache::kBlock));
    if (!k) die(k.error().message);
    kv_events = std::move(*k);
  }
  if (worker_fd >= 0) {  // an engine process of --workers: no HTTP, the protocol on the fd
    ::signal(SIGPIPE, SIG_IGN);
    serve::Scheduler sched(make, *tok, parallel, ctx, 2 * parallel, metrics, grammars,
                           prefix_cache_mib << 20, disk.get());
    sched.set_draft_max(speculative == "none" ? 0 : draft_max);
    if (mtp) sched.set_draft_source(engine::DraftKind::Mtp);
    return serve::run_worker(worker_fd, sched, metrics);
  }
  std::unique_ptr<serve::Generator> generator;
  if (workers > 1)
    generator = std::make_unique<serve::Workers>(std::vector<std::string>(argv, argv + argc),
                                                 workers, parallel, ctx, queue_max, metrics);
  else {
    auto one = std::make_unique<serve::Scheduler>(make, *tok, parallel, ctx, queue_max, metrics,
                                                  grammars, prefix_cache_mib << 20, disk.get());
    one->set_kv_events(kv_events.get());
    one->set_draft_max(speculative == "none" ? 0 : draft_max);
    if (mtp) one->set_draft_source(engine::DraftKind::Mtp);
    generator = std::move(one);
  }
  serve::Generator& sched = *generator;
  // Every connection is a descriptor: the soft limit goes to the hard one, and the caps must fit.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
      ::getrlimit(RLIMIT_NOFILE, &rl);
    }
    const uint64_t need = uint64_t(so.max_connections) + uint64_t(so.pending_connections_max) + 64;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
      std::fprintf(stderr,
                   "expert-serve: warning: the descriptor limit (%llu, ulimit -n) is below "
                   "--max-connections + --pending-connections-max; beyond it new connections "
                   "wait in the kernel's backlog\n",
                   static_cast<unsigned long long>(rl.rlim_cur));
  }
  so.host = host, so.port = port, so.api_key = api_key, so.max_body = max_body_mb << 20;
  so.model_id = metrics.model_name;
  so.draft_max = draft_max, so.nextn = mtp;
  so.model_path = std::filesystem::absolute(model).string();
  so.model_arch = mod.hp.arch;
  so.sequences_max = workers * parallel, so.queue_max = queue_max;
  metrics.expert_use.init(mod.hp.n_blocks(), mod.hp.n_expert);
  serve::DashboardInfo di;
  di.model_id = so.model_id, di.arch = mod.hp.arch, di.device = device;
  di.experts = local ? "local" : socket;
  di.n_layer = mod.hp.n_layer, di.n_expert = mod.hp.n_expert;
  di.n_expert_used = mod.hp.n_expert_used;
  di.chat_template = chat->tmpl.has_value();
  di.sequences_max = so.sequences_max, di.n_ctx = ctx;
  // With --workers the engine processes count the tokens: asked for them (as /metrics asks) at
  // each snapshot, at most twice a second.
  std::function<void()> refresh;
  if (workers > 1) refresh = [&sched] { sched.daemon_metrics(); };
  serve::Dashboard dashboard(di, metrics, local ? "" : socket, std::move(refresh));
  std::optional<serve::WebFiles> web;
  if (web_dir.empty()) web_dir = serve::WebFiles::find("/proc/self/exe");
  if (web_dir.empty()) {
    std::fprintf(stderr,
                 "expert-serve: warning: the page's files are not installed: / answers 404 "
                 "(give --web-dir)\n");
  } else if (auto w = serve::WebFiles::load(web_dir)) {
    web = std::move(*w);
  } else {
    die(w.error().message);
  }
  serve::Server server(so, sched, *tok, std::move(*chat), metrics, grammars);
  server.serve_page(web ? &*web : nullptr, &dashboard);
  if (auto st = server.listen(); !st) die(st.error().message);
  std::thread sig([&] {
    int s = 0;
    sigwait(&sigs, &s);
    drain(server, sigs, drain_timeout_s);
    server.stop();
  });
  std::fprintf(stderr,
               "expert-serve: %s (%s) on http://%s:%d, %d engine process(es) of %d sequences of %d "
               "positions (%s KV cache), device %s, experts %s\n",
               so.model_id.c_str(), mod.hp.arch.c_str(), host.c_str(), server.port(), workers,
               parallel, ctx, engine::kv_type_name(kv_type), device.c_str(),
               local ? "local" : socket.c_str());
  sd_notify(0, "READY=1\nSTATUS=serving");
  server.run();
  sig.join();
  // The RAM tier goes with this process: subscribers drop what they knew of it.
  if (kv_events) kv_events->publish({{serve::BlockEvent::Cleared, {}, false, 0, {}}});
  return 0;
}
