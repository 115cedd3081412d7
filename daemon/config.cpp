#include "daemon/config.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "daemon/policy.h"

namespace expertd::daemon {

Status Config::validate() const {
  if (manifest.empty())
    return make_error("--manifest is required (STEM.manifest.json from expert-pack build)");
  if (backend != "host" && backend != "cuda")
    return make_error("--backend must be host or cuda, not '" + backend + "'");
  if (!make_policy(policy))
    return make_error("--policy must be one of " + policy_names() + ", not '" + policy + "'");
  if (cache_mib == 0) return make_error("--cache-mib must be positive");
  if (queue_depth < 1 || queue_depth > 4096) return make_error("--queue-depth must be 1..4096");
  if (read_splits < 1 || read_splits > 64) return make_error("--read-splits must be 1..64");
  if (clients_max < 1 || clients_max > 1024) return make_error("--clients-max must be 1..1024");
  if (monitors_max < 1 || monitors_max > 64) return make_error("--monitors-max must be 1..64");
  if (pending_max < 1 || pending_max > 1024) return make_error("--pending-max must be 1..1024");
  if (hello_timeout_ms < 10 || hello_timeout_ms > 600000)
    return make_error("--hello-timeout-ms must be 10..600000");
  if (stage_slots < 1 || stage_slots > 1024) return make_error("--stage-slots must be 1..1024");
  if (device < 0) return make_error("--device must be a GPU ordinal (0, 1, ...)");
  if ((host_cache_mib || host_cache_slots) && backend != "cuda")
    return make_error(
        "--host-cache-mib / --host-cache-slots: a host tier under VRAM needs --backend cuda (the "
        "host backend's slots are host memory already: give it the memory with --cache-mib)");
  if (frame_bytes_max < 4096 || frame_bytes_max > (64u << 20))
    return make_error("--frame-bytes-max must be 4 KiB..64 MiB");
  if (inflight_mib == 0) return make_error("--inflight-mib must be positive");
  if (socket.size() >= 108)
    return make_error("--socket path is longer than a Unix socket allows (107 bytes)");
  return {};
}

std::string Config::to_json() const {
  nlohmann::ordered_json j = {{"manifest", manifest},
                              {"socket", socket},
                              {"backend", backend},
                              {"cache_mib", cache_mib},
                              {"cache_slots", cache_slots},
                              {"reserve_mib", reserve_mib},
                              {"stage_slots", stage_slots},
                              {"host_cache_mib", host_cache_mib},
                              {"host_cache_slots", host_cache_slots},
                              {"device", device},
                              {"read_splits", read_splits},
                              {"queue_depth", queue_depth},
                              {"inflight_mib", inflight_mib},
                              {"policy", policy},
                              {"clients_max", clients_max},
                              {"monitors_max", monitors_max},
                              {"pending_max", pending_max},
                              {"hello_timeout_ms", hello_timeout_ms},
                              {"uid_connections_max", uid_connections_max},
                              {"allow_uid", allow_uid},
                              {"allow_gid", allow_gid},
                              {"max_experts_per_request", max_experts_per_request},
                              {"frame_bytes_max", frame_bytes_max},
                              {"acquire_wait_ms_max", acquire_wait_ms_max},
                              {"verify_checksums", verify_checksums},
                              {"residency_board", residency_board},
                              {"prefetch_admit", prefetch_admit},
                              {"lock_memory", lock_memory},
                              {"huge_pages", huge_pages},
                              {"stats_path", stats_path},
                              {"stats_interval_s", stats_interval_s},
                              {"trace_path", trace_path},
                              {"state_path", state_path},
                              {"log_level", log_level},
                              {"log_path", log_path}};
  return j.dump();
}

Result<Config> parse_config(int argc, char** argv, int* exit_code) {
  Config c;
  CLI::App app{
      "expertd: serves a MoE model's experts from an NVMe expert pack to engine processes "
      "over a Unix socket"};
  app.set_config("--config", c.config_path, "config file (key = value lines; flags override it)",
                 false);
  app.add_option("--manifest", c.manifest, "STEM.manifest.json written by expert-pack build");
  app.add_option("--socket", c.socket, "Unix socket path")->capture_default_str();
  app.add_option("--backend", c.backend, "slot arena: host (shared memory) or cuda (VRAM)")
      ->capture_default_str();
  app.add_option("--cache-mib", c.cache_mib, "arena budget in MiB")->capture_default_str();
  app.add_option("--cache-slots", c.cache_slots,
                 "exact number of expert slots (overrides --cache-mib)");
  app.add_option("--reserve-mib", c.reserve_mib, "memory to leave free, MiB")
      ->capture_default_str();
  app.add_option("--stage-slots", c.stage_slots,
                 "cuda: pinned staging buffers (reads in flight at most)")
      ->capture_default_str();
  app.add_option("--device", c.device, "cuda: GPU ordinal")->capture_default_str();
  app.add_option("--host-cache-mib", c.host_cache_mib,
                 "cuda: pinned host memory under the VRAM slots; experts evicted from VRAM move "
                 "there, and a VRAM miss it holds costs one copy instead of a read (0 = none)")
      ->capture_default_str();
  app.add_option("--host-cache-slots", c.host_cache_slots,
                 "cuda: exact number of host tier slots (overrides --host-cache-mib)");
  app.add_option("--read-splits", c.read_splits, "parallel reads per miss")->capture_default_str();
  app.add_option("--queue-depth", c.queue_depth, "io_uring queue depth")->capture_default_str();
  app.add_option("--inflight-mib", c.inflight_mib, "bound on read bytes in flight, MiB")
      ->capture_default_str();
  app.add_option("--policy", c.policy, "eviction policy: " + policy_names())->capture_default_str();
  app.add_option("--clients-max", c.clients_max, "engine connections at once")
      ->capture_default_str();
  app.add_option("--monitors-max", c.monitors_max,
                 "expertctl (monitor) connections at once; they take no engine place")
      ->capture_default_str();
  app.add_option("--pending-max", c.pending_max, "connections that have not said Hello yet")
      ->capture_default_str();
  app.add_option("--hello-timeout-ms", c.hello_timeout_ms,
                 "close a connection that has not said Hello in this time")
      ->capture_default_str();
  app.add_option("--uid-connections-max", c.uid_connections_max,
                 "connections one uid may hold (0: clients + monitors + pending)")
      ->capture_default_str();
  app.add_option("--allow-uid", c.allow_uid,
                 "serve only peers with these uids (SO_PEERCRED; with --allow-gid: either)")
      ->delimiter(',');
  app.add_option("--allow-gid", c.allow_gid, "serve only peers with these primary gids")
      ->delimiter(',');
  app.add_option("--max-experts-per-request", c.max_experts_per_request,
                 "experts one acquire may pin (0 = 2 x experts used per token, at least 8)")
      ->capture_default_str();
  app.add_option("--frame-bytes-max", c.frame_bytes_max, "largest protocol frame")
      ->capture_default_str();
  app.add_option("--acquire-wait-ms-max", c.acquire_wait_ms_max,
                 "how long an acquire may wait for slots")
      ->capture_default_str();
  app.add_option("--prefetch-admit", c.prefetch_admit,
                 "a hint into a full cache: colder (evict only an expert acquired less often "
                 "than the hinted one), always (evict the policy's victim), or spare (evict the "
                 "policy's victim among experts no hint of the current step named, and spare "
                 "those on every eviction: for speculative decoding's draft hints)")
      ->check(CLI::IsMember({"colder", "always", "spare"}))
      ->capture_default_str();
  app.add_option("--verify-checksums", c.verify_checksums,
                 "check every read against the manifest's xxh3")
      ->capture_default_str();
  app.add_option("--lock-memory", c.lock_memory, "mlock the arena")->capture_default_str();
  app.add_option("--huge-pages", c.huge_pages,
                 "host arena in 2 MiB transparent huge pages where the host allows them "
                 "(/sys/kernel/mm/transparent_hugepage/shmem_enabled advise or always; a warning "
                 "at start says when it does not, for an arena of 32 MiB or more)")
      ->capture_default_str();
  app.add_option("--residency-board", c.residency_board,
                 "share which experts are ready so engines pin hits without a round trip "
                 "(false: every acquire through the socket)")
      ->capture_default_str();
  app.add_option("--socket-group", c.socket_group, "group owning the socket (mode 0660)");
  app.add_option("--stats-path", c.stats_path, "write stats JSON here every --stats-interval-s");
  app.add_option("--stats-interval-s", c.stats_interval_s, "stats file interval")
      ->capture_default_str();
  app.add_option("--trace-path", c.trace_path,
                 "record every acquire (time, client, layer, experts)");
  app.add_option("--state-path", c.state_path,
                 "keep the experts' popularity here (every --stats-interval-s and at stop) and "
                 "start warm from it: the policy ranks as before, the most popular experts are "
                 "read into free slots");
  app.add_option("--log-level", c.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--log-path", c.log_path, "log file (SIGHUP reopens it); default stderr");
  app.set_version_flag("--version", "expertd 0.1.0");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    *exit_code = app.exit(e);
    return make_error("");
  }
  *exit_code = -1;
  if (auto st = c.validate(); !st) return st.error();
  return c;
}

}  // namespace expertd::daemon
