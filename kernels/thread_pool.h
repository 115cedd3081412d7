// A fixed pool of worker threads for data-parallel loops; allocated once, reused per op.
// Workers spin briefly for the next loop before sleeping: a decode step issues hundreds of
// small matmuls, and a futex wake-up per matmul would cost more than the work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kernels {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  int size() const { return n_threads_; }
  // Runs fn(begin, end) over [0, n) in chunks of at least `grain`, on every thread; blocks.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker();
  void run_chunks();
  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace kernels
