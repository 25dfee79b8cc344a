// Work split over torch's threads. An operator called on its own forks an OpenMP region per range (as
// at::parallel_for). decoder_layers runs its layers inside one region, a team: the calling thread runs the
// operators, and the other threads wait on a job board for their chunk of each range it posts, instead of
// a region being forked and joined per operator (~150 a decoding step). The chunks
// are at::parallel_for's, so each thread's share is what it was; a range that makes one chunk runs on
// the calling thread without waking anyone. A chunk's exception reaches the caller, as at::parallel_for's.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/FunctionRef.h>

#include <algorithm>
#include <functional>
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace peagle {

// ThreadSanitizer sees the job board's atomics but not OpenMP's fork and join (libgomp is not instrumented); in a
// -fsanitize=thread build they are told to it, so that what it reports is a race of the kernels' own.
#if defined(__SANITIZE_THREAD__)
inline void seen_before(void* token) { __tsan_release(token); }
inline void seen_after(void* token) { __tsan_acquire(token); }
#else
inline void seen_before(void*) {}
inline void seen_after(void*) {}
#endif

using RangeFn = c10::function_ref<void(int64_t, int64_t)>;

// The size of the team the calling thread leads, or 0.
int64_t team_size();
void team_split(int64_t begin, int64_t end, int64_t chunks, RangeFn f);

// The threads a range is split over: the team's, else torch's.
inline int64_t split_threads() { return team_size() ? team_size() : at::get_num_threads(); }

// Rows a chunk of a row operator (norms, RoPE, quantizing activations) holds at least: inside a team a range
// costs a post (~0.1 us), so a verify pass's few rows split between the threads; outside one it forks a
// region (~0.5 us), worth it from 16 rows.
inline int64_t row_grain() { return team_size() ? 1 : 16; }

// at::parallel_for's split of [begin, end) into at most one chunk a thread, at least ``grain`` long.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t team = team_size(), range = end - begin, threads = team ? team : at::get_num_threads();
  const int64_t chunks = std::min<int64_t>(threads, grain > 0 ? (range + grain - 1) / grain : threads);
  if (chunks <= 1 || (!team && at::in_parallel_region())) return f(begin, end);
  if (team) return team_split(begin, end, chunks, f);
  char fork, join;
  seen_before(&fork);
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    seen_after(&fork);
    f(b, e);
    seen_before(&join);
  });
  seen_after(&join);
}

// ``body`` on the calling thread with torch's other threads as its team (on the calling thread alone where
// there is one thread, or inside another parallel region or team).
void run_team(const std::function<void()>& body);

}  // namespace peagle
