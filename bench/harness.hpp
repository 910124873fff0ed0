// bench/harness.hpp: raw-verbs vs rdmaxx, interleaved in one run.
//
// Each benchmark gives two bodies doing the same work, one in raw rdma-core and one in rdmaxx.
// They run alternately (raw, rdmaxx, raw, rdmaxx, ...) for `reps` repetitions of `iters`
// operations, so that drift in an emulated VM hits both alike; the report is the median ops/s of
// each and the ratio rdmaxx/raw of the median times per operation (> 1 means rdmaxx is slower),
// plus the ratio of the best repetitions (stalls of the emulated VM only ever add time).
//
// Environment: RDMAXX_BENCH_SCALE (float, default 1) scales iteration counts (the rxe suite's smoke
// run uses a tiny one); RDMAXX_BENCH_JSON=path appends one JSON object per result line.
#pragma once

#include <rdmaxx/device.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace bench {

// Type-2 windows measured on rxe accept the device-wide exposure (see type2_risk).
inline constexpr rdmaxx::type2_risk accept_risk = rdmaxx::type2_risk::accept_kernel_panic_by_any_peer;

inline double scale() {
  const char *s = std::getenv("RDMAXX_BENCH_SCALE");
  return s ? std::atof(s) : 1.0;
}
inline long scaled(long n) { return std::max(1L, long(double(n) * scale())); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct outcome {
  std::string name;
  double raw_ops = 0, rdmaxx_ops = 0, ratio = 0;
  double ratio_best = 0; // best rep of each side: less sensitive to an emulated VM's stalls
  int reps = 0;
  long iters = 0;
  std::vector<double> raw_s, rdmaxx_s; // every repetition's seconds per op (records: "values")
  std::vector<double> aa_s;            // RDMAXX_BENCH_AA: raw timed again in each repetition
};

/// RDMAXX_BENCH_AA=1 (tools/bench sets it): compare() times raw a second time in every repetition,
/// and the row carries "aa", raw again / raw: the ratio an unchanged program gets (the noise floor).
inline bool aa_enabled() {
  const char *s = std::getenv("RDMAXX_BENCH_AA");
  return s && *s && *s != '0';
}

inline void report(const outcome &o, const char *unit = "ops/s") {
  std::printf("%-44s raw %10.0f  rdmaxx %10.0f %s  rdmaxx/raw %.3f (best %.3f)  (%d reps x %ld)\n",
              o.name.c_str(), o.raw_ops, o.rdmaxx_ops, unit, o.ratio, o.ratio_best, o.reps, o.iters);
  std::fflush(stdout);
  if (const char *path = std::getenv("RDMAXX_BENCH_JSON")) {
    if (FILE *f = std::fopen(path, "a")) {
      std::fprintf(f,
                   "{\"benchmark\": \"%s\", \"raw\": %.1f, \"rdmaxx\": %.1f, \"ratio\": %.4f, "
                   "\"ratio_best\": %.4f, \"unit\": \"%s\", \"repetitions\": %d, "
                   "\"iterations\": %ld",
                   o.name.c_str(), o.raw_ops, o.rdmaxx_ops, o.ratio, o.ratio_best, unit, o.reps,
                   o.iters);
      // Every repetition (seconds per op), where the caller kept them.
      if (!o.aa_s.empty() && !o.raw_s.empty())
        std::fprintf(f, ", \"aa\": %.4f", median(o.aa_s) / median(o.raw_s));
      for (int side = 0; side < 3; ++side) {
        const auto &v = side == 0 ? o.raw_s : side == 1 ? o.rdmaxx_s : o.aa_s;
        if (v.empty()) continue;
        std::fprintf(f, ", \"%s_s\": [", side == 0 ? "raw" : side == 1 ? "rdmaxx" : "aa");
        for (std::size_t i = 0; i < v.size(); ++i) std::fprintf(f, "%s%.9g", i ? ", " : "", v[i]);
        std::fprintf(f, "]");
      }
      std::fprintf(f, "}\n");
      std::fclose(f);
    }
  }
}

/// Run raw(iters) and ours(iters) alternately `reps` times; each returns false on failure.
/// The ratio is rdmaxx time per op over raw time per op (medians).
inline bool compare(const std::string &name, int reps, long iters,
                    const std::function<bool(long)> &raw, const std::function<bool(long)> &ours) {
  using clock = std::chrono::steady_clock;
  std::vector<double> tr, to, ta;
  const bool aa = aa_enabled();
  // One untimed warm-up of each.
  if (!raw(std::max(1L, iters / 10)) || !ours(std::max(1L, iters / 10))) return false;
  for (int r = 0; r < reps; ++r) {
    for (int side = 0; side < (aa ? 3 : 2); ++side) {
      // Alternate which side goes first, so neither always runs on a warmer cache; the A/A run
      // of raw goes last, after both.
      const bool raw_turn = side == 2 || (side == 0) == (r % 2 == 0);
      const auto t0 = clock::now();
      if (!(raw_turn ? raw(iters) : ours(iters))) return false;
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      (side == 2 ? ta : raw_turn ? tr : to).push_back(s / double(iters));
    }
  }
  outcome o{name, 1.0 / median(tr), 1.0 / median(to), median(to) / median(tr),
            *std::min_element(to.begin(), to.end()) / *std::min_element(tr.begin(), tr.end()),
            reps, iters, tr, to, ta};
  report(o);
  return true;
}

} // namespace bench
