// A fixed set of worker threads that run one indexed loop at a time, shared by the compiled
// proposers' batched steps. The caller takes part in the loop, so a pool of n workers uses n + 1
// threads; workers sleep between loops (no spinning on a shared host).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spec_plugins {

class WorkerPool {
 public:
  explicit WorkerPool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int workers() const { return int(threads_.size()); }

  // Runs fn(i) for every i in [0, count), in chunks of `grain`, on the caller and as many workers as
  // there are further chunks (a small loop on a many-core host wakes few threads: each one woken is
  // waited for); returns when all are done and rethrows the first exception any of them raised.
  void run(size_t count, size_t grain, const std::function<void(size_t)>& fn) {
    const size_t chunks = grain == 0 ? 0 : (count + grain - 1) / grain;
    if (threads_.empty() || chunks <= 1) {
      for (size_t i = 0; i < count; ++i) fn(i);
      return;
    }
    const int helpers = chunks - 1 < threads_.size() ? int(chunks - 1) : int(threads_.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      count_ = count;
      grain_ = grain;
      next_.store(0);
      tickets_ = helpers;
      busy_ = helpers;
      error_ = nullptr;
    }
    if (helpers == int(threads_.size())) {
      wake_.notify_all();
    } else {
      for (int i = 0; i < helpers; ++i) wake_.notify_one();
    }
    drain();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return busy_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void drain() {
    try {
      for (;;) {
        const size_t from = next_.fetch_add(grain_);
        if (from >= count_) break;
        const size_t to = from + grain_ < count_ ? from + grain_ : count_;
        for (size_t i = from; i < to; ++i) (*fn_)(i);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(count_);
    }
  }

  void work() {
    for (;;) {
      {
        // A loop hands out `tickets_` places and waits until each was taken and its drain is done. Any
        // worker may take any ticket, one it woke for or not, and more than one in a loop: run() wakes
        // helpers with notify_one, and a notification can reach a worker that already took a ticket of
        // this loop and went back to sleep; had it to leave the ticket to another, that ticket could stay
        // untaken and run() wait forever. A worker woken with no ticket left sleeps on.
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || tickets_ > 0; });
        if (stop_) return;
        --tickets_;
      }
      drain();
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t count_ = 0, grain_ = 1;
  std::atomic<size_t> next_{0};
  int busy_ = 0, tickets_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// One thread that runs one task at a time while the caller goes on: post() hands it a task (after the
// previous one is done), wait() returns once the task is done and rethrows what it threw. For work
// between two engine steps (the suffix tree's tentative appends); a task must not touch Python.
class Background {
 public:
  Background() { thread_ = std::thread([this] { loop(); }); }
  ~Background() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  void post(std::function<void()> task) {
    wait();
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = std::move(task);
      busy_ = true;
    }
    wake_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return !busy_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] { return stop_ || busy_; });
        if (busy_) task = std::move(task_);
        else return;  // stopped with nothing to do
      }
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = error;
        busy_ = false;
      }
      done_.notify_all();
    }
  }

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::function<void()> task_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
};

// Workers for a batched step on this host: one per extra core, at most `cap` (on a 16-core GPU host the
// suffix tree's step at 512 requests took 0.29-0.35 ms with 7 workers, 0.46-0.49 with 3, no less with 15).
inline int default_workers(int cap = 7) {
  const unsigned hw = std::thread::hardware_concurrency();
  const int extra = hw > 1 ? int(hw) - 1 : 0;
  return extra < cap ? extra : cap;
}

}  // namespace spec_plugins
