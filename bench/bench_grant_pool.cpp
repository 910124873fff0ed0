// bench/bench_grant_pool: what request-scoped grants cost per request (the GrantPool issue).
// One request = the client lends 4 KiB, sends a small request (inline send), the server
// RDMA-reads the 4 KiB through the key it got and replies with a small inline send, the client
// takes the reply (and revokes). Both sides in one process on two loopback-connected QPs (b: the
// client, owner of the buffers; a: the server). The arms, interleaved in one run (round robin,
// 11 repetitions, medians):
//   (a) unprotected: the rkey of the whole buffer pool's MR, handed out once (no grant, no
//       revoke: the server can read every slot, at any time);
//   (b) GrantPool: grant (bind) in the request's post, revoke (unbind) posted alone after the
//       reply, slot reused once the revoke's completion is handed to the pool;
//   (b') GrantPool, revoke batched into the next request's post (the grant stays alive until the
//       next request is posted);
//   (b'') GrantPool, revoke posted alone right after the reply and the lease dropped: the slot
//       returns to the pool when a later poll hands the pool the revoke's completion (no wait);
//   (c) a window per request: ibv_alloc_mw, bind in the request's post, ibv_dealloc_mw after the
//       reply (type 1 on rxe, over a region of exactly the slot registered once: the type the
//       device allows safely with untrusted peers; type 2 on devices where that is safe);
//   (d) ibv_reg_mr + ibv_dereg_mr of exactly the 4 KiB per request.
// Output: one line per comparison, "base" = the base arm's requests/s, "cand" = the candidate's,
// and the ratio cand time / base time (throughput cand/base is its inverse); RDMAXX_BENCH_JSON
// rows put the base in "raw" and the candidate in "rdmaxx". Then the work per request of each arm
// (posts, completions polled, other verbs) and the late-read check: after each arm's request is
// over, the server reads again with the key it was given.
//
//   bench_grant_pool                     all arms, timed, then the counts and the late-read check
//   bench_grant_pool only ARM N          N requests of one arm (a b b2 b3 c d) and nothing else, for
//                                        strace -c -f (subtract a run with N = 0)
//   bench_grant_pool late                the late-read check alone
#include "common.hpp"
#include "harness.hpp"

#include <rdmaxx/grant_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

using namespace rdmaxx;

namespace {

constexpr std::uint32_t slot = 4096;
constexpr std::size_t nslots = 16;
constexpr std::uint64_t recv_id = 1000, read_id = 77, reply_id = 78, req_id = 79;
constexpr int signal_every = 32; // the unsignaled sends of either side: one in 32 is signaled

// The work one arm did (per request, divided at the end).
struct counts {
  std::uint64_t requests = 0, posts = 0, wcs = 0, polls = 0, verbs = 0;
};

struct wire_req {
  std::uint64_t addr;
  std::uint32_t rkey, length;
};

struct rig {
  bench::loopback s;
  std::vector<std::byte> buf = std::vector<std::byte>(nslots * slot, std::byte{1});
  std::vector<std::byte> staging = std::vector<std::byte>(slot);
  std::array<std::byte, 64> rx_a{}, rx_b{};
  MemoryRegion pool_mr, open_mr, staging_mr, rxa_mr, rxb_mr;
  std::vector<MemoryRegion> exact; // (c): a region of exactly each slot, registered once
  GrantPool pool;
  std::uint64_t sent_a = 0, sent_b = 0;
  counts *cnt = nullptr;

  result<void> setup() noexcept {
    RDMAXX_TRYV(bench::make_loopback(s));
    RDMAXX_TRY(pm, MemoryRegion::reg(s.pd, buf.data(), buf.size(), access::local_write));
    pool_mr = std::move(pm);
    RDMAXX_TRY(om, MemoryRegion::reg(s.pd, buf.data(), buf.size(), access::local_write | access::remote_read));
    open_mr = std::move(om);
    RDMAXX_TRY(sm, MemoryRegion::reg(s.pd, staging.data(), staging.size(), access::local_write));
    staging_mr = std::move(sm);
    RDMAXX_TRY(ra, MemoryRegion::reg(s.pd, rx_a.data(), rx_a.size(), access::local_write));
    rxa_mr = std::move(ra);
    RDMAXX_TRY(rb, MemoryRegion::reg(s.pd, rx_b.data(), rx_b.size(), access::local_write));
    rxb_mr = std::move(rb);
    for (std::size_t i = 0; i < nslots; ++i) {
      RDMAXX_TRY(e, MemoryRegion::reg(s.pd, buf.data() + i * slot, slot, access::local_write | access::mw_bind));
      exact.push_back(std::move(e));
    }
    RDMAXX_TRY(p, GrantPool::create(s.pd, pool_mr, {.slot_size = slot, .slots = nslots}));
    pool = std::move(p);
    for (int i = 0; i < 32; ++i) { // one message in flight per side: every receive uses one buffer
      RDMAXX_TRYV(s.a.post_recv(recv_id, rxa_mr.sge()));
      RDMAXX_TRYV(s.b.post_recv(recv_id, rxb_mr.sge()));
    }
    return success();
  }

  // Poll `cq` until `done()`; pool completions go to the pool; any failure ends it.
  template <class Done>
  bool poll_until(CompletionQueue &cq, Done &&done) noexcept {
    ibv_wc wc[8];
    while (!done()) {
      auto n = cq.poll(wc);
      if (!n) return false;
      ++cnt->polls;
      cnt->wcs += n.value();
      for (std::size_t k = 0; k < n.value(); ++k)
        if (wc[k].status != IBV_WC_SUCCESS) return false;
      for (ibv_wc &w : pool.complete(std::span(wc, n.value()))) on_wc(w);
    }
    return true;
  }
  bool got_recv_a = false, got_recv_b = false, got_read = false;
  void on_wc(const ibv_wc &w) noexcept {
    if (w.wr_id == recv_id) (w.qp_num == s.a.qp_num() ? got_recv_a : got_recv_b) = true;
    else if (w.wr_id == read_id) got_read = true;
  }
  bool repost(QueuePair &qp, const MemoryRegion &mr) noexcept {
    ++cnt->posts;
    return qp.post_recv(recv_id, mr.sge()).has_value();
  }

  // The client's request: `extra` adds the grant (and a revoke) to the batch first.
  template <class Extra>
  bool request(const remote_descriptor &plain, Extra &&extra) noexcept {
    auto b = s.b.start_send();
    std::optional<remote_descriptor> d = extra(b);
    if (!d) return false;
    const wire_req r{d->rkey ? d->addr : plain.addr, d->rkey ? d->rkey : plain.rkey, slot};
    send_flags f{};
    if (d->rkey) f |= send_flag::fence; // behind the bind in the same post
    if (++sent_b % signal_every == 0) f |= send_flag::signaled;
    b.send_inline({req_id, f}, std::as_bytes(std::span(&r, 1)));
    ++cnt->posts;
    return b.submit().has_value();
  }
  // The server: take the request, read the 4 KiB through its key, reply.
  bool serve() noexcept {
    got_recv_a = got_read = false;
    if (!poll_until(s.cq_a, [&] { return got_recv_a; })) return false;
    wire_req r;
    std::memcpy(&r, rx_a.data(), sizeof r);
    if (!repost(s.a, rxa_mr)) return false;
    {
      auto b = s.a.start_send();
      b.read({read_id, send_flag::signaled}, {r.addr, r.rkey}, staging_mr.sge());
      ++cnt->posts;
      if (!b.submit()) return false;
    }
    if (!poll_until(s.cq_a, [&] { return got_read; })) return false;
    const std::array<std::byte, 16> reply{};
    auto b = s.a.start_send();
    b.send_inline({reply_id, ++sent_a % signal_every == 0 ? send_flag::signaled : send_flag{}}, reply);
    ++cnt->posts;
    return b.submit().has_value();
  }
  bool take_reply() noexcept {
    got_recv_b = false;
    return poll_until(s.cq_b, [&] { return got_recv_b; }) && repost(s.b, rxb_mr);
  }

  // ---- the arms: n requests each ----
  bool unprotected(long n) noexcept {
    const remote_descriptor open{open_mr.iova(), slot, open_mr.rkey(), access::remote_read};
    for (long i = 0; i < n; ++i) {
      if (!request(open, [](SendBatch &) { return std::optional(remote_descriptor{}); }) || !serve() ||
          !take_reply())
        return false;
      ++cnt->requests;
    }
    return true;
  }
  bool pooled(long n) noexcept {
    for (long i = 0; i < n; ++i) {
      auto l = pool.acquire();
      if (!l) return false;
      GrantLease &lease = l.value();
      if (!request({}, [&](SendBatch &b) -> std::optional<remote_descriptor> {
            auto d = pool.grant(b, s.b, lease, access::remote_read);
            if (!d) return std::nullopt;
            return d.value();
          }) ||
          !serve() || !take_reply())
        return false;
      ++cnt->posts;
      if (!pool.revoke(s.b, lease)) return false;
      if (!poll_until(s.cq_b, [&] { return lease.state() == lease_state::ready; }) || !pool.give_back(lease))
        return false;
      ++cnt->requests;
    }
    return true;
  }
  bool pooled_batched(long n) noexcept {
    GrantLease prev;
    for (long i = 0; i < n; ++i) {
      auto l = pool.acquire();
      if (!l) return false;
      GrantLease &lease = l.value();
      if (!request({}, [&](SendBatch &b) -> std::optional<remote_descriptor> {
            if (prev && !pool.revoke(b, s.b, prev)) return std::nullopt; // the previous grant
            auto d = pool.grant(b, s.b, lease, access::remote_read);
            if (!d) return std::nullopt;
            return d.value();
          }) ||
          !serve() || !take_reply())
        return false;
      if (prev) {
        if (!poll_until(s.cq_b, [&] { return prev.state() == lease_state::ready; }) || !pool.give_back(prev))
          return false;
      }
      prev = std::move(lease);
      ++cnt->requests;
    }
    if (!prev) return true;
    ++cnt->posts;
    return pool.revoke(s.b, prev) &&
           poll_until(s.cq_b, [&] { return prev.state() == lease_state::ready; }) && pool.give_back(prev);
  }
  bool pooled_dropped(long n) noexcept {
    for (long i = 0; i < n; ++i) {
      if (pool.available() == 0 && !poll_until(s.cq_b, [&] { return pool.available() != 0; })) return false;
      auto l = pool.acquire();
      if (!l) return false;
      GrantLease &lease = l.value();
      if (!request({}, [&](SendBatch &b) -> std::optional<remote_descriptor> {
            auto d = pool.grant(b, s.b, lease, access::remote_read);
            if (!d) return std::nullopt;
            return d.value();
          }) ||
          !serve() || !take_reply())
        return false;
      ++cnt->posts;
      if (!pool.revoke(s.b, lease)) return false;
      ++cnt->requests;
    } // the lease is dropped revoking: its slot comes back with the revoke's completion
    return poll_until(s.cq_b, [&] { return pool.available() == pool.size(); });
  }
  bool window_per_request(long n) noexcept {
    for (long i = 0; i < n; ++i) {
      ++cnt->verbs;
      auto w = MemoryWindow::alloc(s.pd, mw_type::type1);
      if (!w) return false;
      if (!request({}, [&](SendBatch &b) -> std::optional<remote_descriptor> {
            auto d = w.value().bind(b, s.b, exact[0], {0, slot}, access::remote_read, {5, {}});
            if (!d) return std::nullopt;
            return d.value();
          }) ||
          !serve() || !take_reply())
        return false;
      ++cnt->verbs;
      if (!w.value().destroy()) return false; // synchronous: the key is dead when it returns
      ++cnt->requests;
    }
    return true;
  }
  bool reg_per_request(long n) noexcept {
    for (long i = 0; i < n; ++i) {
      ++cnt->verbs;
      auto m = MemoryRegion::reg(s.pd, buf.data(), slot, access::local_write | access::remote_read);
      if (!m) return false;
      const remote_descriptor d{m.value().iova(), slot, m.value().rkey(), access::remote_read};
      if (!request(d, [](SendBatch &) { return std::optional(remote_descriptor{}); }) || !serve() ||
          !take_reply())
        return false;
      ++cnt->verbs;
      if (!m.value().destroy()) return false;
      ++cnt->requests;
    }
    return true;
  }
};

struct arm {
  const char *name;
  std::function<bool(long)> run;
  counts c;
  std::vector<double> t;
};

// After the request is over, the server reads again with the key it was given: a fresh rig per
// arm (the refused read moves both QPs to ERR).
struct late_result {
  const char *arm;
  ibv_wc_status status;
  const char *protection;
};
ibv_wc_status late_read(int which) {
  rig r;
  counts c;
  r.cnt = &c;
  bench::must(r.setup(), "late-read setup");
  remote_descriptor key{r.open_mr.iova(), slot, r.open_mr.rkey(), access::remote_read};
  MemoryWindow bare; // (x): kept bound until the late read
  bool ok = true;
  if (which == 1) { // GrantPool: grant, request served, revoke confirmed
    auto l = bench::must(r.pool.acquire(), "acquire");
    ok = r.request({}, [&](SendBatch &b) -> std::optional<remote_descriptor> {
      auto d = r.pool.grant(b, r.s.b, l, access::remote_read);
      if (!d) return std::nullopt;
      key = d.value();
      return d.value();
    }) && r.serve() && r.take_reply() && r.pool.revoke(r.s.b, l).has_value() &&
         r.poll_until(r.s.cq_b, [&] { return l.state() == lease_state::ready; });
  } else if (which == 2) { // window per request: deallocated
    auto w = bench::must(MemoryWindow::alloc(r.s.pd, mw_type::type1), "alloc");
    ok = r.request({}, [&](SendBatch &b) -> std::optional<remote_descriptor> {
      auto d = w.bind(b, r.s.b, r.exact[0], {0, slot}, access::remote_read, {5, {}});
      if (!d) return std::nullopt;
      key = d.value();
      return d.value();
    }) && r.serve() && r.take_reply() && w.destroy().has_value();
  } else if (which == 3) { // reg per request: deregistered
    auto m = bench::must(MemoryRegion::reg(r.s.pd, r.buf.data(), slot, access::local_write | access::remote_read), "reg");
    key = {m.iova(), slot, m.rkey(), access::remote_read};
    ok = r.request(key, [](SendBatch &) { return std::optional(remote_descriptor{}); }) && r.serve() &&
         r.take_reply() && m.destroy().has_value();
  } else if (which == 4) { // GrantPool: the key of a grant 128 grants ago, the slot granted again
    auto l = bench::must(r.pool.acquire(), "acquire");
    for (std::uint32_t g = 0; ok && g <= r.pool.grants_per_window(); ++g) {
      auto b = r.s.b.start_send();
      auto d = r.pool.grant(b, r.s.b, l, access::remote_read);
      ok = d && b.submit();
      if (!ok) break;
      if (g == 0) key = d.value();
      if (g == r.pool.grants_per_window()) break; // stays granted: the late read comes now
      ok = r.pool.revoke(r.s.b, l) && r.poll_until(r.s.cq_b, [&] { return l.state() == lease_state::ready; });
    }
  } else if (which == 5) { // the same with a bare type-1 window rebound as often: the key is back
    bare = bench::must(MemoryWindow::alloc(r.s.pd, mw_type::type1), "alloc");
    ibv_wc wc{};
    for (std::uint32_t g = 0; ok && g <= 128; ++g) {
      auto d = bare.bind(r.s.b, r.exact[0], {0, slot}, access::remote_read);
      ok = d && bench::rdmaxx_wait(r.s.cq_b, wc) && bare.complete(wc);
      if (!ok) break;
      if (g == 0) key = d.value();
      if (g == 128) break; // stays bound, with the 129th key
      ok = bare.unbind(r.s.b) && bench::rdmaxx_wait(r.s.cq_b, wc) && bare.complete(wc);
    }
  } else {
    ok = r.request(key, [](SendBatch &) { return std::optional(remote_descriptor{}); }) && r.serve() &&
         r.take_reply();
  }
  if (!ok) {
    std::fprintf(stderr, "bench_grant_pool: late-read setup of arm %d failed\n", which);
    std::exit(1);
  }
  auto b = r.s.a.start_send();
  b.read({read_id, send_flag::signaled}, {key.addr, key.rkey}, r.staging_mr.sge());
  bench::must(b.submit(), "late read");
  ibv_wc wc{};
  for (;;) {
    auto n = r.s.cq_a.poll({&wc, 1});
    if (!n) return IBV_WC_GENERAL_ERR;
    if (n.value() == 1 && wc.wr_id == read_id) return wc.status;
    if (n.value() == 1 && wc.status != IBV_WC_SUCCESS && wc.wr_id != read_id) continue;
  }
}

bool late_checks() {
  // The late read: what each arm's protection is worth once a request is over.
  const late_result late[] = {
      {"(a) unprotected", late_read(0), "none: every slot stays readable by the peer, forever"},
      {"(b) GrantPool", late_read(1), "this slot, this request, until the revoke completes"},
      {"(c) window per request", late_read(2), "this slot, until dealloc returns"},
      {"(d) reg+dereg per request", late_read(3), "this slot, until dereg returns"},
      {"(b) GrantPool, key 128 grants old", late_read(4), "windows renewed before a key repeats"},
      {"(x) bare type-1 window, 128 rebinds", late_read(5), "none: the 129th bind's key is the 1st's"},
  };
  bool ok = true;
  for (const auto &l : late) {
    const bool want_fail = l.arm[1] != 'a' && l.arm[1] != 'x';
    const bool as_expected = want_fail ? l.status == IBV_WC_REM_ACCESS_ERR : l.status == IBV_WC_SUCCESS;
    ok &= as_expected;
    std::printf("late read after the request: %-36s %-22s %s  (protection: %s)\n", l.arm,
                ibv_wc_status_str(l.status), as_expected ? "as expected" : "UNEXPECTED", l.protection);
  }
  return ok;
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 2 && std::strcmp(argv[1], "late") == 0) return late_checks() ? 0 : 1;
  rig r;
  bench::must(r.setup(), "setup");
  std::vector<arm> arms;
  arms.push_back({"(a) unprotected: pool MR rkey handed out once", [&](long n) { return r.unprotected(n); }, {}, {}});
  arms.push_back({"(b) GrantPool, revoke posted alone", [&](long n) { return r.pooled(n); }, {}, {}});
  arms.push_back({"(b') GrantPool, revoke in the next request's post",
                  [&](long n) { return r.pooled_batched(n); }, {}, {}});
  arms.push_back({"(b'') GrantPool, revoke posted alone, lease dropped (no wait)",
                  [&](long n) { return r.pooled_dropped(n); }, {}, {}});
  arms.push_back({"(c) window per request: alloc + bind (type 1) + dealloc",
                  [&](long n) { return r.window_per_request(n); }, {}, {}});
  arms.push_back({"(d) reg_mr + dereg_mr of the 4 KiB per request", [&](long n) { return r.reg_per_request(n); }, {}, {}});
  // A/A: (a) a second time in every repetition (the ratio an unchanged arm gets).
  arms.push_back({"(a) again", arms[0].run, {}, {}});

  if (argc == 4 && std::strcmp(argv[1], "only") == 0) { // for strace -c: one arm, nothing else
    const std::string which = argv[2];
    const long n = std::atol(argv[3]);
    const int k = which == "a" ? 0 : which == "b" ? 1 : which == "b2" ? 2 : which == "b3" ? 3 : which == "c" ? 4 : which == "d" ? 5 : -1;
    if (k < 0) return 2;
    r.cnt = &arms[std::size_t(k)].c;
    return arms[std::size_t(k)].run(n) ? 0 : 1;
  }

  using clock = std::chrono::steady_clock;
  const int reps = 11;
  const long iters = bench::scaled(300);
  counts warm;
  r.cnt = &warm;
  for (auto &v : arms)
    if (!v.run(std::max(1L, iters / 10))) {
      std::fprintf(stderr, "bench_grant_pool: %s failed (warm-up)\n", v.name);
      return 1;
    }
  for (int rep = 0; rep < reps; ++rep)
    for (std::size_t j = 0; j < arms.size(); ++j) {
      arm &v = arms[(j + std::size_t(rep)) % arms.size()]; // rotate who goes first
      r.cnt = &v.c;
      const auto t0 = clock::now();
      if (!v.run(iters)) {
        std::fprintf(stderr, "bench_grant_pool: %s failed\n", v.name);
        return 1;
      }
      v.t.push_back(std::chrono::duration<double>(clock::now() - t0).count() / double(iters));
    }
  auto emit = [&](const char *name, const arm &base, const arm &v) {
    bench::outcome o{name, 1.0 / bench::median(base.t), 1.0 / bench::median(v.t),
                     bench::median(v.t) / bench::median(base.t),
                     *std::min_element(v.t.begin(), v.t.end()) / *std::min_element(base.t.begin(), base.t.end()),
                     reps, iters, base.t, v.t, {}};
    std::printf("%-62s base %8.0f  cand %8.0f req/s  cand/base time %.3f (best %.3f)  throughput x%.2f\n",
                name, o.raw_ops, o.rdmaxx_ops, o.ratio, o.ratio_best, 1.0 / o.ratio);
    if (std::getenv("RDMAXX_BENCH_JSON")) bench::report(o, "requests/s");
  };
  emit("4K read request: GrantPool (b) vs unprotected (a)", arms[0], arms[1]);
  emit("4K read request: GrantPool (b) vs window per request (c)", arms[4], arms[1]);
  emit("4K read request: GrantPool (b) vs reg+dereg per request (d)", arms[5], arms[1]);
  emit("4K read request: GrantPool batched revoke (b') vs (a)", arms[0], arms[2]);
  emit("4K read request: GrantPool batched revoke (b') vs (c)", arms[4], arms[2]);
  emit("4K read request: GrantPool batched revoke (b') vs (d)", arms[5], arms[2]);
  emit("4K read request: GrantPool revoke, no wait (b'') vs (a)", arms[0], arms[3]);
  emit("4K read request: GrantPool revoke, no wait (b'') vs (c)", arms[4], arms[3]);
  emit("4K read request: GrantPool revoke, no wait (b'') vs (d)", arms[5], arms[3]);
  emit("A/A 4K read request: (a) again / (a)", arms[0], arms[6]);
  std::printf("work per request (timed runs): posts (each a doorbell: a system call on rxe), "
              "completions polled, poll calls, other verbs (system calls)\n");
  for (const arm &v : arms) {
    const double q = double(std::max<std::uint64_t>(1, v.c.requests));
    std::printf("  %-58s posts %.2f  completions %.2f  polls %.1f  other verbs %.2f\n", v.name,
                double(v.c.posts) / q, double(v.c.wcs) / q, double(v.c.polls) / q, double(v.c.verbs) / q);
  }
  std::printf("  GrantPool stats: %llu grants, %llu revokes, %llu windows renewed (key reuse)\n",
              static_cast<unsigned long long>(r.pool.stats().grants),
              static_cast<unsigned long long>(r.pool.stats().revokes),
              static_cast<unsigned long long>(r.pool.stats().windows_renewed));

  const bool late_ok = late_checks();
  return late_ok && r.pool.available() == r.pool.size() ? 0 : 1;
}
