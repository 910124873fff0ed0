// bench/bench_grant: what the safe default grant costs (issue 16). One grant cycle = grant 4 KiB
// to the peer, one 64-byte peer RDMA write through the key, revoke; all through rdmaxx, the
// variants interleaved in one run (round robin, 11 repetitions, medians):
//   - type-2 bind + write + local invalidate (the fast mechanism; unsafe on rxe with untrusted
//     peers): the baseline of every ratio;
//   - the safe default on rxe: a type-1 window bound and unbound over a region of exactly the
//     granted bytes, registered once (one StrictGrant per buffer slot, reused);
//   - reg + write + dereg of exactly the 4 KiB (what a grant without windows costs);
//   - a fresh StrictGrant per cycle (create + bind + write + revoke);
//   - a fresh ExactGrant per cycle (create + write + revoke: the one-shot default), against
//     reg + write + dereg;
//   - indirect key, 6 segments: configure + write + invalidate with the exact-region mechanism
//     (the default on rxe) against the type-2 software backend of before (trusted_peers).
// `bench_grant count type2|slot N` instead runs N cycles of one of the first two variants inside
// count_cycles() only (after a warm-up), for callgrind's --toggle-collect='*count_cycles*' and
// strace: the per-slot default against the type-2 cycle in instructions and system calls.
// Output: one line per variant, "base" = the baseline's ops/s, "cand" = the variant's, and the
// ratio cand time / base time; RDMAXX_BENCH_JSON rows put the baseline in "raw" and the variant
// in "rdmaxx".
#include "common.hpp"
#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

using namespace rdmaxx;

namespace {
struct variant {
  const char *name;
  std::function<bool(long)> run;
  std::vector<double> t;
};

[[gnu::noinline]] bool count_cycles(variant &v, long n) { return v.run(n); }
} // namespace

int main(int argc, char **argv) {
  bench::loopback s;
  bench::must(bench::make_loopback(s), "setup");
  std::vector<unsigned char> buf(1 << 20), src(64, 7);
  const access_flags owner = access::local_write | access::mw_bind;
  auto mr = bench::must(MemoryRegion::reg(s.pd, buf.data(), buf.size(), owner), "reg");
  auto ms = bench::must(MemoryRegion::reg(s.pd, src.data(), src.size(), access::local_write), "reg src");
  auto w2 = bench::must(MemoryWindow::alloc(s.pd, mw_type::type2, bench::accept_risk), "alloc type 2");
  auto safe = bench::must(StrictGrant::create(s.pd, mr, {8192, 4096}), "strict grant");
  const access_flags rights = access::remote_write | access::remote_read;
  ibv_wc wc{};
  // The peer's write (QP a) through a key; its completion.
  auto peer_write = [&](std::uint64_t addr, std::uint32_t rkey) {
    auto b = s.a.start_send();
    b.write({9, send_flag::signaled}, {addr, rkey}, ms.sge());
    return b.submit().has_value() && bench::rdmaxx_wait(s.cq_a, wc);
  };
  auto owner_wait = [&](MemoryWindow &w) {
    if (!bench::rdmaxx_wait(s.cq_b, wc)) return false;
    w.complete(wc);
    return true;
  };
  // Indirect keys over six pieces of three regions of the owner.
  std::vector<unsigned char> t1(8192), t2(8192), t3(8192);
  const access_flags tacc = access::local_write | access::remote_write | access::mw_bind;
  auto m1 = bench::must(MemoryRegion::reg(s.pd, t1.data(), t1.size(), tacc), "reg t1");
  auto m2 = bench::must(MemoryRegion::reg(s.pd, t2.data(), t2.size(), tacc), "reg t2");
  auto m3 = bench::must(MemoryRegion::reg(s.pd, t3.data(), t3.size(), tacc), "reg t3");
  const layout l = layout::list({{m1, 3, 301}, {m2, 100, 333}, {m3, 7, 350},
                                 {m1, 4000, 299}, {m3, 5000, 360}, {m2, 6000, 355}});
  auto k_safe = bench::must(IndirectKey::create(s.pd, 8), "ikey default");
  auto k_t2 = bench::must(IndirectKey::create(s.pd, 8, {.grant = {.trusted_peers = true, .type2 = bench::accept_risk}}), "ikey type 2");
  auto ikey_cycle = [&](IndirectKey &k, long n) {
    for (long i = 0; i < n; ++i) {
      auto b = s.b.start_send();
      if (!k.configure(b, s.b, l, access::local_write | access::remote_write, {1, send_flag::signaled}) ||
          !b.submit() || !bench::rdmaxx_wait(s.cq_b, wc) || !k.complete(wc))
        return false;
      const auto seg = k.segments()[0];
      if (!peer_write(seg.addr, seg.rkey) || !k.revoke()) return false;
    }
    return true;
  };

  std::vector<variant> vs;
  vs.push_back({"grant cycle: type-2 bind + write + invalidate (baseline)", [&](long n) {
                  for (long i = 0; i < n; ++i) {
                    auto d = w2.bind(s.b, mr, {8192, 4096}, rights);
                    if (!d || !owner_wait(w2) || !peer_write(d.value().addr, d.value().rkey) ||
                        !w2.invalidate(s.b) || !owner_wait(w2))
                      return false;
                  }
                  return true;
                }, {}});
  vs.push_back({"grant cycle: safe default, type-1 over exact region", [&](long n) {
                  for (long i = 0; i < n; ++i) {
                    auto d = safe.grant(s.b, rights);
                    if (!d || !owner_wait(safe.window()) ||
                        !peer_write(d.value().addr, d.value().rkey) || !safe.revoke(s.b) ||
                        !owner_wait(safe.window()))
                      return false;
                  }
                  return true;
                }, {}});
  vs.push_back({"grant cycle: reg + write + dereg of the 4 KiB", [&](long n) {
                  for (long i = 0; i < n; ++i) {
                    auto m = MemoryRegion::reg(s.pd, buf.data() + 8192, 4096,
                                               access::local_write | access::remote_write);
                    if (!m || !peer_write(m.value().iova(), m.value().rkey()) || !m.value().destroy())
                      return false;
                  }
                  return true;
                }, {}});
  vs.push_back({"grant cycle: fresh StrictGrant (create+bind+write+revoke)", [&](long n) {
                  for (long i = 0; i < n; ++i) {
                    auto g = StrictGrant::create(s.pd, mr, {8192, 4096});
                    if (!g) return false;
                    auto d = g.value().grant(s.b, rights);
                    if (!d || !owner_wait(g.value().window()) ||
                        !peer_write(d.value().addr, d.value().rkey) || !g.value().destroy())
                      return false;
                  }
                  return true;
                }, {}});
  vs.push_back({"ikey 6 segments: configure+write+revoke, type-2 windows over exact regions",
                [&](long n) { return ikey_cycle(k_t2, n); }, {}});
  vs.push_back({"ikey 6 segments: configure+write+revoke, type-1 windows over exact regions (default)",
                [&](long n) { return ikey_cycle(k_safe, n); }, {}});

  // The one-shot default (issue 24): against reg + write + dereg of the same bytes (vs[2]).
  vs.push_back({"grant cycle: ExactGrant (create+write+revoke), one-shot", [&](long n) {
                  for (long i = 0; i < n; ++i) {
                    auto g = ExactGrant::create(s.pd, mr, {8192, 4096}, rights);
                    if (!g) return false;
                    const auto d = g.value().descriptor();
                    if (!peer_write(d.addr, d.rkey) || !g.value().destroy()) return false;
                  }
                  return true;
                }, {}});

  // A/A: the baseline a second time in every repetition (the ratio an unchanged cycle gets).
  vs.push_back({"A/A grant cycle: the type-2 baseline again / the baseline", vs[0].run, {}});

  if (argc == 4 && std::strcmp(argv[1], "count") == 0) {
    variant &v = vs[std::strcmp(argv[2], "slot") == 0 ? 1 : 0];
    const long n = std::atol(argv[3]);
    if (!v.run(300) || !count_cycles(v, n)) return 1;
    std::printf("%s: %ld cycles\n", v.name, n);
    return 0;
  }

  using clock = std::chrono::steady_clock;
  const int reps = 11;
  const long iters = bench::scaled(300);
  for (auto &v : vs)
    if (!v.run(std::max(1L, iters / 10))) {
      std::fprintf(stderr, "bench_grant: %s failed (warm-up)\n", v.name);
      return 1;
    }
  for (int r = 0; r < reps; ++r)
    for (std::size_t j = 0; j < vs.size(); ++j) {
      variant &v = vs[(j + std::size_t(r)) % vs.size()]; // rotate who goes first
      const auto t0 = clock::now();
      if (!v.run(iters)) {
        std::fprintf(stderr, "bench_grant: %s failed\n", v.name);
        return 1;
      }
      v.t.push_back(std::chrono::duration<double>(clock::now() - t0).count() / double(iters));
    }
  auto emit = [&](const variant &base, const variant &v) {
    bench::outcome o{v.name, 1.0 / bench::median(base.t), 1.0 / bench::median(v.t),
                     bench::median(v.t) / bench::median(base.t),
                     *std::min_element(v.t.begin(), v.t.end()) /
                         *std::min_element(base.t.begin(), base.t.end()),
                     reps, iters, base.t, v.t, {}};
    std::printf("%-62s base %8.0f  cand %8.0f cycles/s  cand/base time %.3f (best %.3f)\n",
                v.name, o.raw_ops, o.rdmaxx_ops, o.ratio, o.ratio_best);
    if (std::getenv("RDMAXX_BENCH_JSON")) bench::report(o, "cycles/s");
  };
  for (std::size_t j = 1; j < 4; ++j) emit(vs[0], vs[j]);
  emit(vs[4], vs[5]);
  emit(vs[2], vs[6]);
  emit(vs[0], vs[7]);
  if (!safe.destroy() || !w2.destroy() || !k_safe.destroy() || !k_t2.destroy()) return 1;
  return 0;
}
