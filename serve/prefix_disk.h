// The prefix cache's second tier: prompt states in a directory on the SSD, one file each,
// written with O_DIRECT (4096-aligned header, tokens and state, a checksum over all of it) to a
// temporary name and renamed into place, so a file is whole or absent. The files are the index:
// opening the directory reads every header and token list, so what was written before a restart
// (or by another engine process on the same directory) is found again. Least recently used files
// go first beyond the budget. A damaged or truncated file is a miss and a counter (and is
// removed), never a wrong state; a full disk stops new writes, serving goes on.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "engine/engine.h"

namespace expertd::serve {

class PrefixDisk {
 public:
  // model_id: what the states belong to (another model's files are left alone, never read).
  static Result<std::unique_ptr<PrefixDisk>> open(const std::string& dir, uint64_t budget_bytes,
                                                  uint64_t model_id);
  ~PrefixDisk();

  struct Entry {
    std::string file;
    std::vector<int32_t> tokens;
    uint64_t bytes = 0, used = 0;
  };
  // The longest usable prefix of `prompt` among the files (as PrefixCache::find), its entry.
  std::optional<Entry> find(std::span<const int32_t> prompt, bool can_cut, int& n);
  // The state of an entry, its checksum verified (none: damaged or gone, counted).
  std::optional<engine::SeqState> read(const Entry& e);
  // Queued for the writer thread (dropped, and counted, when the queue is full).
  void write(std::span<const int32_t> tokens, const engine::SeqState& s);
  // Waits until the queued writes are on disk (tests, shutdown).
  void flush();

  struct Counters {
    std::atomic<uint64_t> writes{0}, write_bytes{0}, reads{0}, read_bytes{0}, damaged{0},
        evictions{0}, dropped{0}, write_errors{0};
    std::atomic<bool> full{false};  // a write met a full disk: no more writes
  };
  const Counters& counters() const { return c_; }
  size_t entries() const;
  uint64_t bytes() const;

 private:
  PrefixDisk(std::string dir, uint64_t budget, uint64_t model_id);
  void scan();
  void writer();
  bool write_file(const std::vector<int32_t>& tokens, const engine::SeqState& s);
  void evict_to(uint64_t budget);

  const std::string dir_;
  const uint64_t budget_, model_id_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  uint64_t bytes_ = 0, clock_ = 0;
  std::atomic<int64_t> scanned_mtime_ns_{-1};
  Counters c_;

  struct Job {
    std::vector<int32_t> tokens;
    engine::SeqState state;
  };
  static constexpr size_t kQueueMax = 8;
  std::mutex qmu_;
  std::condition_variable qcv_, idle_cv_;
  std::deque<Job> queue_;
  std::vector<int32_t> writing_;  // the job the writer holds
  bool stop_ = false, busy_ = false;
  uint64_t seq_ = 0;
  std::thread thread_;
};

}  // namespace expertd::serve
