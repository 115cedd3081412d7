// The socket side of expertd: accepts engine connections on a Unix socket, reads bounded and
// verified frames, dispatches them to the cache, and writes replies in order. One Asio
// io_context on the control thread; io_uring completions arrive through its eventfd.
#pragma once

// clang-format off
#include <utility>  // boost 1.74 asio needs std::exchange declared first
#include <boost/asio.hpp>
// clang-format on
#include <chrono>
#include <memory>
#include <unordered_map>

#include "daemon/cache.h"
#include "daemon/config.h"
#include "daemon/trace.h"
#include "daemon/what_if.h"

namespace expertd::daemon {

namespace asio = boost::asio;

class Server final : public CacheSink {
 public:
  Server(asio::io_context& ctx, const Config& cfg, const pack::Manifest& m, SlotArena& arena,
         Cache& cache, IoEngine& io, TraceWriter& trace, Board* board = nullptr);
  ~Server() override;
  Status listen();
  void start();     // accept loop, io_uring eventfd, timers
  void shutdown();  // stop accepting, drop clients, drain reads, then stop the io_context
  void reopen_logs();
  std::string status_json() const;
  std::vector<proto::Metric> metrics() const;

  void acquire_granted(ClientId c, uint64_t request_id, uint64_t lease_id,
                       std::span<const uint32_t> slots, std::span<const uint8_t> ready) override;
  void expert_ready(ClientId c, uint64_t lease_id, uint32_t index, ErrorCode code,
                    const std::string& message, uint32_t slot) override;
  void request_failed(ClientId c, uint64_t request_id, ErrorCode code,
                      const std::string& message) override;
  void board_acquired(ClientId c, uint32_t layer, std::span<const uint32_t> experts) override;

 private:
  struct Session;
  void accept();
  void watch_io();
  void tick();
  void write_stats_file();
  void write_state_file();
  // Queues a frame (fds ride on its first bytes: SCM_RIGHTS); frames go out in order without
  // blocking the control thread on a client that does not read.
  void send(ClientId c, std::vector<uint8_t> frame, std::vector<int> fds = {});
  void write_front(const std::shared_ptr<Session>& s);
  void refuse(const std::shared_ptr<Session>& s, ErrorCode code, const std::string& why);
  bool peer_allowed(const Session& s) const;
  void handle(const std::shared_ptr<Session>& s);
  void handle_hello(const std::shared_ptr<Session>& s, uint64_t rid, const wire::Hello* h);
  void close(const std::shared_ptr<Session>& s);
  void read_header(std::shared_ptr<Session> s);
  // ExpertsRequest: answered at once, or, before the first what-if replay has finished, when it
  // does (what_if_done) or after 2 s without it (tick).
  void answer_experts(ClientId c, uint64_t rid);
  std::vector<uint8_t> experts_frame(uint64_t rid, const WhatIfResult& w);
  void what_if_done(bool all = true);

  asio::io_context& ctx_;
  const Config& cfg_;
  const pack::Manifest& m_;
  SlotArena& arena_;
  Cache& cache_;
  IoEngine& io_;
  TraceWriter& trace_;
  Board* board_;
  std::vector<bool> places_;  // board places taken (one per engine, --clients-max of them)
  asio::local::stream_protocol::acceptor acceptor_;
  asio::posix::stream_descriptor io_event_;
  asio::steady_timer timer_;
  std::unordered_map<ClientId, std::shared_ptr<Session>> sessions_;
  ClientId next_client_ = 1;
  uint32_t engines_ = 0, monitors_ = 0, pending_ = 0;
  std::unordered_map<uid_t, uint32_t> per_uid_;  // connections of each uid, in any state
  bool stopping_ = false;
  WhatIf what_if_;
  struct ExpertsWaiting {
    ClientId client;
    uint64_t request_id;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<ExpertsWaiting> experts_waiting_;  // until the first replay, 2 s at most
  std::chrono::steady_clock::time_point start_, last_stats_, stop_deadline_;
};

}  // namespace expertd::daemon
