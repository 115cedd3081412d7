#include "kernels/thread_pool.h"

#include <algorithm>

namespace kernels {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t b = next_.fetch_add(chunk_);
    if (b >= n_) return;
    (*fn_)(b, std::min(n_, b + chunk_));
  }
}

void ThreadPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    std::lock_guard lk(mu_);
    if (--busy_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(n / std::max<int64_t>(grain, 1), n_threads_ * 4));
  if (threads_.empty() || chunks == 1) return fn(0, n);
  {
    std::lock_guard lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + chunks - 1) / chunks;
    next_ = 0;
    busy_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  cv_.notify_all();
  run_chunks();
  std::unique_lock lk(mu_);
  done_cv_.wait(lk, [&] { return busy_ == 0; });
}

}  // namespace kernels
