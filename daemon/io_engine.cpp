#include "daemon/io_engine.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cassert>
#include <cstring>

namespace expertd::daemon {

Result<std::unique_ptr<IoEngine>> IoEngine::create(int pack_fd, uint32_t queue_depth,
                                                   uint64_t inflight_bytes_max, Done done) {
  std::unique_ptr<IoEngine> io(new IoEngine());
  io->fd_ = pack_fd;
  io->inflight_bytes_max_ = inflight_bytes_max;
  io->done_ = std::move(done);
  int rc = io_uring_queue_init(queue_depth, &io->ring_, 0);
  if (rc < 0) return errno_error("io_uring_queue_init(" + std::to_string(queue_depth) + ")", -rc);
  io->ring_ok_ = true;
  io->event_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!io->event_fd_.valid()) return errno_error("eventfd");
  rc = io_uring_register_eventfd(&io->ring_, io->event_fd_.get());
  if (rc < 0) return errno_error("io_uring_register_eventfd", -rc);
  io->ops_.resize(queue_depth);
  for (uint32_t i = queue_depth; i > 0; --i) io->free_ops_.push_back(i - 1);
  return io;
}

IoEngine::~IoEngine() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
}

void IoEngine::read(uint64_t job, uint64_t offset, uint64_t bytes, uint8_t* dst, uint32_t splits,
                    IoPriority prio) {
  assert(offset % kDirectAlign == 0 && bytes % kDirectAlign == 0 && bytes > 0);
  assert(reinterpret_cast<uintptr_t>(dst) % kDirectAlign == 0);
  uint64_t pages = bytes / kDirectAlign;
  splits = static_cast<uint32_t>(std::clamp<uint64_t>(splits, 1, pages));
  jobs_.push_back(Job{job, splits, {}});
  auto& q = prio == IoPriority::Demand ? demand_ : prefetch_;
  uint64_t at = 0;
  for (uint32_t i = 0; i < splits; ++i) {
    uint64_t n = (pages * (i + 1) / splits - pages * i / splits) * kDirectAlign;
    q.push_back(Part{job, offset + at, n, dst + at});
    at += n;
  }
  assert(at == bytes);
  pump();
}

void IoEngine::promote(uint64_t job) {
  auto it = std::stable_partition(prefetch_.begin(), prefetch_.end(),
                                  [&](const Part& p) { return p.job != job; });
  demand_.insert(demand_.end(), it, prefetch_.end());
  prefetch_.erase(it, prefetch_.end());
  pump();
}

bool IoEngine::submit_part(const Part& p) {
  if (free_ops_.empty()) return false;
  if (in_flight_ > 0 && stats_.bytes_in_flight + p.bytes > inflight_bytes_max_) return false;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) return false;
  uint32_t idx = free_ops_.back();
  free_ops_.pop_back();
  ops_[idx] = Op{p, true};
  io_uring_prep_read(sqe, fd_, p.dst, static_cast<unsigned>(p.bytes), p.offset);
  io_uring_sqe_set_data64(sqe, idx);
  if (in_flight_++ == 0) busy_since_ = std::chrono::steady_clock::now();
  stats_.bytes_in_flight += p.bytes;
  stats_.bytes_in_flight_max = std::max(stats_.bytes_in_flight_max, stats_.bytes_in_flight);
  ++stats_.reads_submitted;
  return true;
}

void IoEngine::pump() {
  bool any = false;
  for (auto* q : {&demand_, &prefetch_}) {
    while (!q->empty() && submit_part(q->front())) {
      q->pop_front();
      any = true;
    }
    if (!q->empty()) break;  // FIFO: a waiting demand read is never overtaken by a prefetch
  }
  stats_.queued = demand_.size() + prefetch_.size();
  if (any) io_uring_submit(&ring_);
}

IoEngine::Job* IoEngine::find_job(uint64_t id) {
  for (auto& j : jobs_)
    if (j.id == id) return &j;
  return nullptr;
}

void IoEngine::part_done(uint64_t job, const Status& st,
                         std::vector<std::pair<uint64_t, Status>>& out) {
  Job* j = find_job(job);
  assert(j && j->parts_left > 0);
  if (!st && j->status) j->status = st;
  if (--j->parts_left == 0) {
    out.emplace_back(j->id, j->status);
    *j = jobs_.back();
    jobs_.pop_back();
  }
}

uint64_t IoEngine::busy_ns() const {
  if (in_flight_ == 0) return stats_.busy_ns;
  return stats_.busy_ns +
         static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - busy_since_)
                                   .count());
}

void IoEngine::reap() {
  uint64_t v;
  while (::read(event_fd_.get(), &v, sizeof v) > 0) {
  }
  // Reap every completion first; callbacks run after, so they may submit new reads freely.
  std::vector<std::pair<uint64_t, Status>> finished;
  std::vector<Part> resubmit;
  io_uring_cqe* cqe;
  while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
    uint32_t idx = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
    int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    Op& op = ops_[idx];
    assert(op.busy);
    Part p = op.part;
    op.busy = false;
    free_ops_.push_back(idx);
    if (--in_flight_ == 0)
      stats_.busy_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  std::chrono::steady_clock::now() - busy_since_)
                                                  .count());
    stats_.bytes_in_flight -= p.bytes;
    if (res > 0) stats_.bytes_done += static_cast<uint64_t>(res);
    if (res == -EINTR || res == -EAGAIN) {
      ++stats_.retries;
      resubmit.push_back(p);
    } else if (res < 0) {
      part_done(p.job, errno_error("read of pack offset " + std::to_string(p.offset), -res),
                finished);
    } else if (res == 0) {
      part_done(p.job,
                make_error("pack ends before offset " + std::to_string(p.offset) +
                           " (truncated while serving?)"),
                finished);
    } else if (static_cast<uint64_t>(res) < p.bytes) {
      ++stats_.short_reads;
      if (res % kDirectAlign != 0) {
        part_done(p.job,
                  make_error("short read of " + std::to_string(res) + " bytes at offset " +
                             std::to_string(p.offset) + " breaks 4096-byte alignment"),
                  finished);
      } else {
        p.offset += static_cast<uint64_t>(res);
        p.dst += res;
        p.bytes -= static_cast<uint64_t>(res);
        resubmit.push_back(p);
      }
    } else {
      part_done(p.job, {}, finished);
    }
  }
  // Retries go to the front: they were admitted before anything still queued.
  for (auto it = resubmit.rbegin(); it != resubmit.rend(); ++it) demand_.push_front(*it);
  pump();
  for (auto& [job, st] : finished) done_(job, st);
}

}  // namespace expertd::daemon
