// run_team and its job board (team.h): the calling thread posts a range (a sequence number bumped after
// the job is written), every other thread of the team runs its chunk (if it has one) and acknowledges,
// and the caller runs the first chunk and then waits for every acknowledgement before it posts again.
// Threads wait by spinning, as OpenMP's own do between regions; they leave when the body returns.
#include <ATen/Parallel.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <utility>

#include "team.h"

namespace peagle {
namespace {

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct Board {
  alignas(64) std::atomic<uint64_t> posted{0};
  alignas(64) std::atomic<int64_t> acks{0};
  alignas(64) const RangeFn* fn = nullptr;  // the job: written before `posted` is bumped
  int64_t begin = 0, end = 0, chunk = 0, chunks = 0;
  bool stop = false;
  std::mutex error_lock;
  std::exception_ptr error;

  void run_chunk(int64_t i) {
    const int64_t b = begin + i * chunk, e = std::min(end, b + chunk);
    if (b >= e) return;
    try {
      (*fn)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> hold(error_lock);
      if (!error) error = std::current_exception();
    }
  }
};

Board board;
thread_local int64_t led = 0;  // the size of the team this thread leads

void post() {
  board.acks.store(0, std::memory_order_relaxed);
  board.posted.fetch_add(1, std::memory_order_release);
}

void wait_acks(int64_t members) {
  while (board.acks.load(std::memory_order_acquire) < members - 1) pause();
}

void member(int64_t me, uint64_t seen) {
  for (;;) {
    uint64_t now;
    while ((now = board.posted.load(std::memory_order_acquire)) == seen) pause();
    seen = now;
    if (board.stop) return;
    if (me < board.chunks) board.run_chunk(me);
    board.acks.fetch_add(1, std::memory_order_acq_rel);
  }
}

}  // namespace

int64_t team_size() { return led; }

void team_split(int64_t begin, int64_t end, int64_t chunks, RangeFn f) {
  board.fn = &f;
  board.begin = begin, board.end = end, board.chunks = chunks, board.chunk = (end - begin + chunks - 1) / chunks;
  board.error = nullptr;
  post();
  board.run_chunk(0);
  wait_acks(led);
  if (board.error) std::rethrow_exception(std::exchange(board.error, nullptr));
}

void run_team(const std::function<void()>& body) {
  const int64_t threads = at::get_num_threads();
  if (threads <= 1 || led || at::in_parallel_region() || std::getenv("PEAGLE_NO_TEAM")) return body();
  const uint64_t seen = board.posted.load(std::memory_order_acquire);
  std::exception_ptr error;
  char fork, join;
  seen_before(&fork);
#pragma omp parallel num_threads(threads)
  {
    seen_after(&fork);
    const int64_t me = omp_get_thread_num();
    if (me == 0) {
      led = omp_get_num_threads();
      try {
        body();
      } catch (...) {
        error = std::current_exception();
      }
      board.stop = true;  // the members leave (the region's end waits for them)
      post();
      led = 0;
    } else {
      member(me, seen);
    }
    seen_before(&join);
  }
  seen_after(&join);
  board.stop = false;
  if (error) std::rethrow_exception(error);
}

}  // namespace peagle
