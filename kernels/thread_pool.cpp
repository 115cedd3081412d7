#include "kernels/thread_pool.h"

#include <immintrin.h>

#include <algorithm>

namespace kernels {

namespace {
constexpr int kSpinIterations = 1 << 14;  // ~50 us of polling before a worker sleeps
}

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
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen &&
           !stop_.load(std::memory_order_relaxed)) {
      if (++spins < kSpinIterations) {
        _mm_pause();
        continue;
      }
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_.load() != seen; });
    }
    if (stop_) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();
    busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(n / std::max<int64_t>(grain, 1), n_threads_ * 4));
  if (threads_.empty() || chunks == 1) return fn(0, n);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + chunks - 1) / chunks;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(threads_.size()), std::memory_order_relaxed);
  {
    std::lock_guard lk(mu_);  // pairs with the sleepers' predicate check
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  run_chunks();
  while (busy_.load(std::memory_order_acquire) != 0) _mm_pause();
}

}  // namespace kernels
