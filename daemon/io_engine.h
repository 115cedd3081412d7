// io_uring reads of pack blocks with O_DIRECT. Bounded queue depth and bytes in flight; a read
// that finds no room waits in a FIFO (demand reads before prefetch reads). Short reads are
// resubmitted for the remainder, EINTR/EAGAIN retried, real errors reported per job.
// Single-threaded: submit() and reap() run on the daemon's control thread.
#pragma once

#include <liburing.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/fd.h"
#include "common/result.h"

namespace expertd::daemon {

enum class IoPriority : uint8_t { Demand = 0, Prefetch = 1 };

struct IoStats {
  uint64_t reads_submitted = 0;
  uint64_t short_reads = 0;
  uint64_t retries = 0;
  uint64_t bytes_in_flight = 0;
  uint64_t bytes_in_flight_max = 0;  // high-water mark
  uint64_t queued = 0;               // parts waiting in the FIFOs now
  // The drive as the daemon drives it: bytes read and the time any read was in flight (the
  // dashboards' measured bandwidth, bytes_done / busy time; never reset).
  uint64_t bytes_done = 0;
  uint64_t busy_ns = 0;  // finished busy periods; IoEngine::busy_ns() adds the current one
};

// What the cache asks of its reads: the drive's (IoEngine) or the trace simulator's, which
// completes them at once (daemon/cache_sim.h).
class BlockReader {
 public:
  virtual ~BlockReader() = default;
  // Reads [offset, offset+bytes) into dst in `splits` parallel parts.
  virtual void read(uint64_t job, uint64_t offset, uint64_t bytes, uint8_t* dst, uint32_t splits,
                    IoPriority prio) = 0;
  // Moves a job's queued prefetch parts to the demand queue (a demand miss joined it).
  virtual void promote(uint64_t job) = 0;
  virtual const IoStats& stats() const = 0;
};

class IoEngine final : public BlockReader {
 public:
  // Called once per job when all its parts are done: ok, or the first error.
  using Done = std::function<void(uint64_t job, Status status)>;

  static Result<std::unique_ptr<IoEngine>> create(int pack_fd, uint32_t queue_depth,
                                                  uint64_t inflight_bytes_max, Done done);
  ~IoEngine();

  int event_fd() const { return event_fd_.get(); }
  // Reads [offset, offset+bytes) into dst in `splits` parallel parts. offset, bytes and dst must
  // honour the 4096-byte O_DIRECT contract (asserted: the caller validated the layout).
  void read(uint64_t job, uint64_t offset, uint64_t bytes, uint8_t* dst, uint32_t splits,
            IoPriority prio) override;
  void promote(uint64_t job) override;
  // Reaps completions, then runs callbacks, then submits what the freed room allows.
  void reap();
  bool idle() const { return in_flight_ == 0 && demand_.empty() && prefetch_.empty(); }
  const IoStats& stats() const override { return stats_; }
  uint64_t busy_ns() const;  // stats().busy_ns and the busy period going on now
  void reset_high_water() { stats_.bytes_in_flight_max = stats_.bytes_in_flight; }

 private:
  struct Part {
    uint64_t job;
    uint64_t offset;
    uint64_t bytes;  // remaining
    uint8_t* dst;
  };
  struct Op {  // one submitted SQE
    Part part;
    bool busy = false;
  };
  struct Job {
    uint64_t id;
    uint32_t parts_left;
    Status status;
  };
  IoEngine() = default;
  void pump();
  bool submit_part(const Part& p);
  Job* find_job(uint64_t id);
  void part_done(uint64_t job, const Status& st, std::vector<std::pair<uint64_t, Status>>& out);

  io_uring ring_{};
  bool ring_ok_ = false;
  int fd_ = -1;
  UniqueFd event_fd_;
  uint64_t inflight_bytes_max_ = 0;
  uint32_t in_flight_ = 0;
  std::chrono::steady_clock::time_point busy_since_;  // when in_flight_ last left 0
  std::vector<Op> ops_;                               // queue_depth entries, allocated once
  std::vector<uint32_t> free_ops_;
  std::deque<Part> demand_, prefetch_;
  std::vector<Job> jobs_;  // jobs with parts outstanding (small: bounded by slots loading)
  Done done_;
  IoStats stats_;
};

}  // namespace expertd::daemon
