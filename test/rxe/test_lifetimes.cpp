// [lifetimes] Destruction out of order on a real rxe device: a handle with several parents keeps
// all of them counted while its destruction is deferred, so nothing reaches verbs early and
// nothing leaks (`rdma resource show` identical before and after).
#include "fixture.hpp"

#include <rdmaxx/memory_window.hpp>
#if __has_include(<rdma/rdma_cma.h>)
#include <rdmaxx/connection.hpp>
#define RDMAXX_TEST_LIFETIMES_CM 1
#endif

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace rxe;

namespace {
std::vector<destroy_failure> reported;
void capture(const destroy_failure &f) noexcept { reported.push_back(f); }
} // namespace

// The sequence of issue 12: a QP whose destruction is deferred because a type-2 window is bound
// through it used to release its CQ at once; cq.destroy() then reached ibv_destroy_cq, which
// answered EBUSY, and the CQ (and the Context behind it) leaked.
TEST_CASE("a deferred QP keeps its CQs and PD until its last window goes", "[lifetimes]") {
  const std::string before = kernel_resources();
  INFO("before:\n" << before);
  REQUIRE(before.find("rxe0") != std::string::npos);
  reported.clear();
  auto old = set_destroy_failure_handler(&capture);
  {
    Context ctx = open_device();
    auto pd = need(ProtectionDomain::alloc(ctx), "alloc_pd");
    auto send_cq = need(CompletionQueue::create(ctx, 16), "send cq");
    auto recv_cq = need(CompletionQueue::create(ctx, 16), "recv cq");
    auto peer_cq = need(CompletionQueue::create(ctx, 16), "peer cq");
    auto qp = need(QueuePair::create(pd, send_cq, recv_cq), "owner qp");
    auto peer = need(QueuePair::create(pd, peer_cq, peer_cq), "peer qp");
    need(connect_loopback(qp, peer), "connect");
    std::vector<unsigned char> buf(4096, 0);
    auto mr = need(MemoryRegion::reg(pd, buf.data(), buf.size(), remote_rw | access::mw_bind), "reg");
    auto mw = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc mw");
    auto d = need(mw.bind(qp, mr, {0, 256}, access::remote_write, {7, send_flag::signaled}), "bind");
    CHECK(mw.complete(wait_one(send_cq)));
    REQUIRE(mw.state() == mw_state::bound);

    // The window still works through the QP whose handle is about to go.
    auto src = need(MemoryRegion::allocate(pd, 64, access::local_write), "src");
    fill(src.data(), 64, 3);
    CHECK(write_one(peer, peer_cq, src.sge(), d.at(0)) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(buf.data(), src.data(), 64) == 0);

    { QueuePair gone = std::move(qp); } // destructor: deferred, the window is bound through it
    REQUIRE(reported.size() == 1);
    CHECK(std::string(reported[0].object) == "QueuePair");
    CHECK(reported[0].error == errc::busy);
    CHECK(reported[0].live_children == 1);

    // Both CQs and the PD are still in use by the orphaned QP: refused by rdmaxx, not by verbs.
    auto r = send_cq.destroy();
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::busy);
    r = recv_cq.destroy();
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::busy);
    CHECK(send_cq);
    CHECK(pd.destroy().error() == errc::busy);

    need(mw.destroy(), "dealloc mw"); // the last child: the orphaned QP is destroyed now
    need(send_cq.destroy(), "destroy send cq");
    need(recv_cq.destroy(), "destroy recv cq");
    need(peer.destroy(), "destroy peer");
    need(peer_cq.destroy(), "destroy peer cq");
    need(mr.destroy(), "dereg");
    need(src.destroy(), "dereg src");
    need(pd.destroy(), "dealloc pd");
    need(ctx.destroy(), "close");
    CHECK(reported.size() == 1); // nothing else went wrong
  }
  set_destroy_failure_handler(old);
  CHECK(kernel_resources() == before);
}

// The same objects dropped by their destructors in the worst order (parents first): every
// destruction is deferred to the last child and every object is destroyed.
TEST_CASE("parents dropped before their children are destroyed by the last child", "[lifetimes]") {
  const std::string before = kernel_resources();
  reported.clear();
  auto old = set_destroy_failure_handler(&capture);
  {
    auto ctx = std::make_unique<Context>(open_device());
    auto pd = std::make_unique<ProtectionDomain>(need(ProtectionDomain::alloc(*ctx), "pd"));
    auto cq = std::make_unique<CompletionQueue>(need(CompletionQueue::create(*ctx, 16), "cq"));
    auto rcq = std::make_unique<CompletionQueue>(need(CompletionQueue::create(*ctx, 16), "rcq"));
    auto qp = std::make_unique<QueuePair>(need(QueuePair::create(*pd, *cq, *rcq), "qp"));
    auto peer = std::make_unique<QueuePair>(need(QueuePair::create(*pd, *cq, *cq), "peer"));
    need(connect_loopback(*qp, *peer), "connect");
    std::vector<unsigned char> buf(4096, 0);
    auto mr = std::make_unique<MemoryRegion>(
        need(MemoryRegion::reg(*pd, buf.data(), buf.size(), remote_rw | access::mw_bind), "reg"));
    auto mw = std::make_unique<MemoryWindow>(need(MemoryWindow::alloc(*pd, mw_type::type2, accept_risk), "mw"));
    need(mw->bind(*qp, *mr, {0, 128}, access::remote_read, {9, send_flag::signaled}), "bind");
    CHECK(mw->complete(wait_one(*cq)));
    ctx.reset();
    pd.reset();
    cq.reset();
    rcq.reset();
    qp.reset();
    mr.reset();
    peer.reset();
    CHECK(reported.size() == 6); // ctx, pd, both CQs, the QP and the MR were deferred
    mw.reset(); // the last child: everything above it goes, children first
    CHECK(reported.size() == 6);
  }
  set_destroy_failure_handler(old);
  CHECK(kernel_resources() == before);
}

namespace {
// The destroy-failure hook of the two-thread cases: a deferred destruction (errc::busy: the parent
// went first) is expected; anything else is a verb that failed (a parent destroyed under a child,
// an object destroyed twice) and fails the pair.
std::atomic<int> deferred_reports{0};
std::atomic<int> failed_reports{0};
void count_quietly(const destroy_failure &f) noexcept {
  (f.error == errc::busy ? deferred_reports : failed_reports).fetch_add(1);
}
// The round of the pair under way: every other round holds the parent's thread back a little,
// so that both orders (child first; parent first, deferred) run for every pair, not only the one
// the two threads' start-up happens to favour.
int round_no = 0;
// Run `a` (the parents) and `b` (the child) on two threads started together.
template <class A, class B>
void together(A a, B b) {
  std::atomic<int> ready{0};
  std::thread t([&] {
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    b();
  });
  ready.fetch_add(1);
  while (ready.load() < 2) {
  }
  if (round_no % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(200));
  a();
  t.join();
}
// Rounds per pair: RDMAXX_LIFETIME_ROUNDS, default 40.
int rounds() {
  const char *e = std::getenv("RDMAXX_LIFETIME_ROUNDS");
  const int n = e ? std::atoi(e) : 0;
  return n > 0 ? n : 40;
}
// `rounds()` rounds of one pair: `round()` creates the objects and destroys the parent(s) and
// their last child with together(). Then: no verb failed, at most `parents` deferred destructions
// per round, and the kernel holds what it held before the first round (`rdma resource show`: a
// leaked or doubly destroyed PD, CQ, QP, MR or context shows there; a leaked window keeps its PD).
template <class Round>
void stress(const char *pair, int parents, Round round) {
  const std::string before = kernel_resources();
  const int deferred0 = deferred_reports.load(), failed0 = failed_reports.load();
  const int n = rounds();
  for (round_no = 0; round_no < n; ++round_no) round();
  const int deferred = deferred_reports.load() - deferred0;
  INFO(pair << ": " << n << " rounds, " << deferred << " deferred destructions");
  CHECK(failed_reports.load() == failed0);
  CHECK(deferred <= n * parents);
  CHECK(kernel_resources() == before);
  // Which thread went first varies: the count shows that both orders ran.
  std::printf("[lifetimes][threads] %s: %d rounds, parent first (deferred) %d\n", pair, n, deferred);
}
template <class T>
std::unique_ptr<T> own(result<T> r, const char *what) {
  return std::make_unique<T>(need(std::move(r), what));
}
constexpr access_flags bindable = access::local_write | access::mw_bind;
} // namespace

// The handles of a parent and of its last child are independent: destroyed on two threads at
// once, every pair of real objects is destroyed once, children first, and nothing stays in the
// kernel. Every parent/child registration the library makes is here (detail::handle's nodes):
// run alone as test/rxe-lifetimes-threads under TSan in tools/dev test, and in the ASan rxe run.
TEST_CASE("a parent and its last child destroyed on two threads at once, for each pair",
          "[lifetimes][threads]") {
  deferred_reports = 0;
  failed_reports = 0;
  auto old = set_destroy_failure_handler(&count_quietly);
  {
    Context ctx = open_device();
    std::vector<unsigned char> mem(4096);

    // ---- a device context's children ----
    stress("Context / ProtectionDomain", 1, [&] {
      auto c = std::make_unique<Context>(open_device());
      auto pd = own(ProtectionDomain::alloc(*c), "pd");
      together([&] { c.reset(); }, [&] { pd.reset(); });
    });
    stress("Context / CompletionQueue", 1, [&] {
      auto c = std::make_unique<Context>(open_device());
      auto cq = own(CompletionQueue::create(*c, 8), "cq");
      together([&] { c.reset(); }, [&] { cq.reset(); });
    });
    stress("Context / CompletionChannel", 1, [&] {
      auto c = std::make_unique<Context>(open_device());
      auto ch = own(CompletionChannel::create(*c), "channel");
      together([&] { c.reset(); }, [&] { ch.reset(); });
    });
    stress("CompletionChannel / CompletionQueue", 1, [&] {
      auto ch = own(CompletionChannel::create(ctx), "channel");
      auto cq = own(CompletionQueue::create(ctx, 8, ch.get()), "cq on the channel");
      together([&] { ch.reset(); }, [&] { cq.reset(); });
    });

    // ---- a PD's and the CQs' children ----
    stress("ProtectionDomain / MemoryRegion", 1, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto mr = own(MemoryRegion::reg(*pd, mem.data(), mem.size(), bindable), "mr");
      together([&] { pd.reset(); }, [&] { mr.reset(); });
    });
    stress("ProtectionDomain / MemoryWindow", 1, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto mw = own(MemoryWindow::alloc(*pd, mw_type::type1), "mw");
      together([&] { pd.reset(); }, [&] { mw.reset(); });
    });
    stress("ProtectionDomain / QueuePair", 1, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto cq = own(CompletionQueue::create(ctx, 8), "cq");
      auto qp = own(QueuePair::create(*pd, *cq, *cq), "qp");
      together([&] { pd.reset(); }, [&] { qp.reset(); });
    });
    stress("send CQ + receive CQ / QueuePair", 2, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto scq = own(CompletionQueue::create(ctx, 8), "send cq");
      auto rcq = own(CompletionQueue::create(ctx, 8), "recv cq");
      auto qp = own(QueuePair::create(*pd, *scq, *rcq), "qp");
      together([&] { scq.reset(); rcq.reset(); }, [&] { qp.reset(); });
    });

    // ---- bound windows: their MR, and (type 2) the QP they were bound through ----
    {
      device_pd d;
      qp_pair qps(d.ctx, d.pd);
      stress("MemoryRegion (allocate()d) / bound type-1 window", 1, [&] {
        auto mr = own(MemoryRegion::allocate(d.pd, 4096, bindable), "allocated mr");
        auto w = own(MemoryWindow::alloc(d.pd, mw_type::type1), "w");
        (void)need(w->bind(qps.b, *mr, {0, 4096}, access::remote_read), "bind");
        REQUIRE(w->complete(wait_one(qps.cq_b)));
        together([&] { mr.reset(); }, [&] { w.reset(); });
      });
      stress("QueuePair / bound type-2 window", 1, [&] {
        auto cq = own(CompletionQueue::create(d.ctx, 16), "cq");
        auto qp = own(QueuePair::create(d.pd, *cq, *cq), "qp");
        auto peer = own(QueuePair::create(d.pd, *cq, *cq), "peer");
        need(connect_loopback(*qp, *peer), "connect");
        auto mr = own(MemoryRegion::reg(d.pd, mem.data(), mem.size(), bindable | access::remote_write), "mr");
        auto w = own(MemoryWindow::alloc(d.pd, mw_type::type2, accept_risk), "type-2 window");
        (void)need(w->bind(*qp, *mr, {0, 256}, access::remote_write, {7, send_flag::signaled}), "bind");
        REQUIRE(w->complete(wait_one(*cq)));
        together([&] { qp.reset(); }, [&] { w.reset(); });
      });
    }

    // ---- software indirect keys: their PD (and exact regions), the QP they were configured
    // through, the MemoryRegions of their segments, and a key nested in another ----
    {
      std::vector<unsigned char> b1(1500), b2(777);
      struct key_round {
        std::unique_ptr<ProtectionDomain> pd;
        std::unique_ptr<MemoryRegion> m1, m2;
        std::unique_ptr<qp_pair> qps;
        key_round(const Context &ctx, std::vector<unsigned char> &b1, std::vector<unsigned char> &b2)
            : pd(own(ProtectionDomain::alloc(ctx), "pd")),
              m1(own(MemoryRegion::reg(*pd, b1.data(), b1.size(), remote_rw | access::mw_bind), "m1")),
              m2(own(MemoryRegion::reg(*pd, b2.data(), b2.size(), remote_rw | access::mw_bind), "m2")),
              qps(std::make_unique<qp_pair>(ctx, *pd)) {}
        // A key configured with remote rights through QP b, its binds confirmed.
        std::unique_ptr<IndirectKey> key(const layout &l) {
          auto k = own(IndirectKey::create(*pd, 4), "create key");
          auto batch = qps->b.start_send();
          need(k->configure(batch, qps->b, l, remote_rw, {900, send_flag::signaled}), "configure");
          need(batch.submit(), "submit configure");
          REQUIRE(k->complete(wait_one(qps->cq_b)));
          return k;
        }
        std::unique_ptr<IndirectKey> key() { return key(layout::list({{*m1, 10, 40}, {*m2, 0, 25}})); }
      };
      stress("QueuePair (and its CQ) / configured IndirectKey", 2, [&] {
        key_round r(ctx, b1, b2);
        auto k = r.key();
        REQUIRE(k->backend() == umr_backend::software);
        together([&] { r.qps.reset(); }, [&] { k.reset(); }); // QP b, and the CQs behind it
      });
      stress("MemoryRegion x2 / configured IndirectKey", 2, [&] {
        key_round r(ctx, b1, b2);
        auto k = r.key();
        together([&] { r.m1.reset(); r.m2.reset(); }, [&] { k.reset(); });
      });
      stress("ProtectionDomain + MemoryRegion x2 / IndirectKey (its exact regions kept)", 3, [&] {
        key_round r(ctx, b1, b2);
        auto k = r.key();
        need(k->revoke(), "invalidate"); // the windows go; the exact regions stay, on the PD
        r.qps.reset();
        together([&] { r.pd.reset(); r.m1.reset(); r.m2.reset(); }, [&] { k.reset(); });
      });
      stress("MemoryRegion x2 + inner key / nested IndirectKey", 2, [&] {
        key_round r(ctx, b1, b2);
        auto inner = r.key();
        auto outer = r.key(layout::list({{*inner, 5, 30}, {*r.m2, 100, 64}}));
        together([&] { inner.reset(); r.m1.reset(); r.m2.reset(); }, [&] { outer.reset(); });
      });
    }

    // ---- the grants: StrictGrant (its exact region and window on the PD; type 2: the QP),
    // GrantPool (its regions, windows and link on the PD), ExactGrant (its region) ----
    stress("ProtectionDomain + MemoryRegion / granted StrictGrant", 2, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto mr = own(MemoryRegion::reg(*pd, mem.data(), mem.size(), access::local_write), "mr");
      auto qps = std::make_unique<qp_pair>(ctx, *pd);
      auto g = own(StrictGrant::create(*pd, *mr, {512, 1024}), "strict grant");
      (void)need(g->grant(qps->b, access::remote_write), "grant");
      REQUIRE(g->window().complete(wait_one(qps->cq_b)));
      qps.reset(); // a type-1 window does not hang on the QP
      together([&] { pd.reset(); mr.reset(); }, [&] { g.reset(); });
    });
    stress("QueuePair (and its CQ) / granted type-2 StrictGrant", 2, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto mr = own(MemoryRegion::reg(*pd, mem.data(), mem.size(), bindable), "mr");
      auto qps = std::make_unique<qp_pair>(ctx, *pd);
      auto g = own(StrictGrant::create(*pd, *mr, {0, 2048}, mw_type::type2, accept_risk), "strict grant");
      (void)need(g->grant(qps->b, access::remote_read), "grant");
      REQUIRE(g->window().complete(wait_one(qps->cq_b)));
      together([&] { qps.reset(); }, [&] { g.reset(); });
    });
    stress("ProtectionDomain + MemoryRegion / GrantPool with a granted lease", 2, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto buf = own(MemoryRegion::allocate(*pd, 4 * 4096, access::local_write), "buffers");
      auto qps = std::make_unique<qp_pair>(ctx, *pd);
      auto pool = own(GrantPool::create(*pd, *buf, {.slot_size = 4096}), "pool");
      std::optional<GrantLease> lease(need(pool->acquire(), "acquire"));
      {
        // The grant's bind is unsignaled: a fenced write through the granted key after it in the
        // same batch completes once the grant works.
        auto src = own(MemoryRegion::allocate(*pd, 64, access::local_write), "src");
        fill(src->data(), 64, 5);
        auto b = qps->b.start_send();
        auto d = need(pool->grant(b, qps->b, *lease, access::remote_write), "grant");
        b.write({1, send_flag::fence | send_flag::signaled}, d.at(0), src->sge());
        need(b.submit(), "submit");
        auto wc = wait_wc(qps->cq_b, 1);
        REQUIRE(wc.front().status == IBV_WC_SUCCESS);
        (void)pool->complete(std::span<ibv_wc>(wc));
        REQUIRE(lease->state() == lease_state::granted);
        CHECK(std::memcmp(buf->data(), src->data(), 64) == 0); // slot 0 goes out first
      }
      qps.reset();
      together([&] { pd.reset(); buf.reset(); }, [&] { pool.reset(); lease.reset(); });
    });
    stress("ProtectionDomain + MemoryRegion / ExactGrant", 2, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto mr = own(MemoryRegion::reg(*pd, mem.data(), mem.size(), access::local_write), "mr");
      auto g = own(ExactGrant::create(*pd, *mr, {0, 4096}, access::remote_read), "exact grant");
      together([&] { pd.reset(); mr.reset(); }, [&] { g.reset(); });
    });
  }
  set_destroy_failure_handler(old);
}

#ifdef RDMAXX_TEST_LIFETIMES_CM
// A Connection's QP borrows the caller's PD and CQ (conn_options::pd): the Connection and those
// destroyed on two threads at once. A server thread accepts each connection.
TEST_CASE("a caller's PD and CQ and the Connection on them destroyed on two threads at once",
          "[lifetimes][threads][cm]") {
  deferred_reports = 0;
  failed_reports = 0;
  auto old = set_destroy_failure_handler(&count_quietly);
  {
    Context ctx = open_device();
    // librdmacm opens one context per device the first time and keeps it: the baseline
    // (stress()) is taken after the listener exists.
    auto l = need(Listener::listen(need(address::parse("192.0.2.1:0"), "address")), "listen");
    const address to = need(address::parse("192.0.2.1:" + std::to_string(l.port())), "address");
    stress("ProtectionDomain + CompletionQueue / Connection", 2, [&] {
      auto pd = own(ProtectionDomain::alloc(ctx), "pd");
      auto cq = own(CompletionQueue::create(ctx, 16), "cq");
      std::atomic<bool> done{false};
      std::thread server([&] {
        auto req = l.get_request(20000);
        if (!req) return;
        auto c = req.value().accept({.timeout_ms = 20000});
        while (c && !done.load()) std::this_thread::sleep_for(1ms);
      });
      auto c = Connection::connect(to, {.pd = pd.get(), .send_cq = cq.get(), .recv_cq = cq.get(),
                                        .timeout_ms = 20000});
      if (!c) {
        done = true;
        server.join();
      }
      auto conn = own(std::move(c), "connect");
      together([&] { pd.reset(); cq.reset(); }, [&] { conn.reset(); });
      done = true;
      server.join();
    });
  }
  set_destroy_failure_handler(old);
}
#endif
