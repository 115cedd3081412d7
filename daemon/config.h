// expertd configuration: one struct, defaults in code, then /etc/expertd/expertd.conf (or
// --config FILE), then flags; validated once at start-up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace expertd::daemon {

struct Config {
  std::string config_path = "/etc/expertd/expertd.conf";
  std::string manifest;  // STEM.manifest.json (required)
  std::string socket = "/run/expertd/expertd.sock";
  std::string backend = "host";   // host | cuda
  uint64_t cache_mib = 4096;      // arena budget
  uint32_t cache_slots = 0;       // exact slot count instead of --cache-mib (0 = off)
  uint64_t reserve_mib = 1024;    // memory left to everything else
  uint32_t stage_slots = 8;       // cuda: pinned staging buffers
  uint64_t host_cache_mib = 0;    // cuda: pinned host tier under VRAM (0 = none)
  uint32_t host_cache_slots = 0;  // cuda: exact host tier slot count (overrides host_cache_mib)
  int device = 0;                 // cuda: GPU ordinal
  uint32_t read_splits = 1;       // parallel reads per miss
  uint32_t queue_depth = 64;      // io_uring submission queue entries
  uint64_t inflight_mib = 256;    // bytes in flight bound
  std::string policy = "lfru";
  uint32_t clients_max = 8;          // engines at once
  uint32_t monitors_max = 4;         // expertctl connections at once (they pin no slot)
  uint32_t pending_max = 16;         // connections that have not said Hello yet
  uint32_t hello_timeout_ms = 3000;  // a connection silent this long before its Hello is closed
  uint32_t uid_connections_max =
      0;  // connections of one uid in any state (0: clients + monitors + pending)
  std::vector<uint32_t> allow_uid,
      allow_gid;                         // non-empty: only these peers (SO_PEERCRED) are served
  uint32_t max_experts_per_request = 0;  // 0 = auto: 2 x experts used per token, at least 8
  uint32_t frame_bytes_max = 1u << 20;
  uint32_t acquire_wait_ms_max = 30000;
  bool verify_checksums = true;
  bool residency_board = true;            // proto/board.h
  std::string prefetch_admit = "colder";  // colder | always | spare
  bool lock_memory = true;
  bool huge_pages = true;    // host arena: 2 MiB-aligned, advised to transparent huge pages
  std::string socket_group;  // chown the socket to this group (0660)
  std::string stats_path;
  uint32_t stats_interval_s = 10;
  std::string trace_path;
  std::string state_path;  // popularity kept across restarts (a warm start); "" = none
  std::string log_level = "info";
  std::string log_path;  // "" = stderr (journald under systemd)

  Status validate() const;
  std::string to_json() const;
};

// Parses config file + flags. Returns nullopt-like error for bad input; `exit_code` is set when
// the parser already handled the request (--help, --version): the program should exit with it.
Result<Config> parse_config(int argc, char** argv, int* exit_code);

}  // namespace expertd::daemon
