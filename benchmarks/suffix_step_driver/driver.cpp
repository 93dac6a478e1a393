// The suffix tree's batched C++ step (Cache::step) on the batches dump_batches.py wrote, timed without Python.
//
//   g++ -O3 -march=native -std=c++17 -pthread -I proposers/suffix_tree \
//       benchmarks/suffix_step_driver/driver.cpp -o /tmp/driver
//   /tmp/driver BATCHES [draft 0|1] [threads] [interleave]
//
// Between steps it reads 64 MB, as an engine's own work between two drafting steps would push the trees out of
// cache. Prints the median and minimum microseconds per step over the steps after the first five. To compare a
// change to the core (cache.hpp and the headers it includes), build the driver twice (-I pointing at each
// version's proposers/suffix_tree) and run the two in turns.
//
// Instructions and simulated cache misses of the timed steps only, which do not depend on the machine's load
// (build with -DCOUNT_WITH_CALLGRIND -g, then run under callgrind with the 32 MB last-level cache of this VM):
//   valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no --cache-sim=yes --LL=33554432,16,64 \
//       /tmp/driver BATCHES 1 0 16        # then: callgrind_annotate callgrind.out.PID
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cache.hpp"
#ifdef COUNT_WITH_CALLGRIND
#include <valgrind/callgrind.h>
#define TIMED_STEP_BOUNDARY CALLGRIND_TOGGLE_COLLECT
#else
#define TIMED_STEP_BOUNDARY
#endif

using namespace suffix_tree;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BATCHES [draft 0|1] [threads] [interleave]\n", argv[0]);
    return 2;
  }
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) {
    std::perror(argv[1]);
    return 2;
  }
  const bool draft = argc > 2 ? std::atoi(argv[2]) != 0 : true;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 0;
  const int interleave = argc > 4 ? std::atoi(argv[4]) : 16;
  int B = 0, steps = 0;
  auto read = [&](void* p, size_t n) {
    if (std::fread(p, 4, n, f) != n) {
      std::fprintf(stderr, "%s: truncated\n", argv[1]);
      std::exit(2);
    }
  };
  read(&B, 1);
  read(&steps, 1);
  std::vector<int> len(B), fresh(size_t(B) * steps);
  read(len.data(), B);
  read(fresh.data(), fresh.size());
  std::vector<std::vector<int>> tok(B);
  for (auto& t : tok) {
    int n = 0;
    read(&n, 1);
    t.resize(n);
    read(t.data(), n);
  }
  CacheOptions o;
  Cache cache(o);
  cache.set_interleave(interleave);
  std::unique_ptr<spec_plugins::WorkerPool> pool;
  if (threads > 0) pool = std::make_unique<spec_plugins::WorkerPool>(threads);
  std::vector<Cache::Row> rows(B);
  std::vector<Draft> out;
  for (int i = 0; i < B; ++i) rows[i] = Cache::Row{i, tok[i].data(), size_t(len[i]), 16, Cache::kStart};
  cache.step(rows, out, pool.get(), 64);
  std::vector<char> other(64 << 20, 1);
  long sink = 0;
  std::vector<double> us;
#ifdef COUNT_WITH_CALLGRIND
  CALLGRIND_START_INSTRUMENTATION;  // the 64 MB reads between steps then evict the simulated caches too
#endif
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < B; ++i) {
      const int k = fresh[size_t(s) * B + i];
      rows[i] = Cache::Row{i, tok[i].data() + len[i], size_t(k), draft ? 16 : 0, Cache::kContinue};
      cache.classify(rows[i], size_t(len[i] + k), k);
      len[i] += k;
    }
    for (size_t q = 0; q < other.size(); q += 64) sink += other[q]++;
    const auto t0 = std::chrono::steady_clock::now();
    if (s >= 5) TIMED_STEP_BOUNDARY;
    cache.step(rows, out, pool.get(), 64);
    if (s >= 5) TIMED_STEP_BOUNDARY;
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= 5) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  size_t drafted = 0;
  for (const Draft& d : out) drafted += d.tokens.size();
  std::printf("median %.0f us, min %.0f us per step (last step drafted %zu tokens)%s\n", us[us.size() / 2], us[0],
              drafted, sink == 42 ? " " : "");
  return 0;
}
