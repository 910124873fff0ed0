// [lifetimes] Destruction out of order on a real rxe device: a handle with several parents keeps
// all of them counted while its destruction is deferred, so nothing reaches verbs early and
// nothing leaks (`rdma resource show` identical before and after).
#include "fixture.hpp"

#include <rdmaxx/memory_window.hpp>

#include <atomic>
#include <cstring>
#include <memory>
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
    CHECK(pd.dealloc().error() == errc::busy);

    need(mw.dealloc(), "dealloc mw"); // the last child: the orphaned QP is destroyed now
    need(send_cq.destroy(), "destroy send cq");
    need(recv_cq.destroy(), "destroy recv cq");
    need(peer.destroy(), "destroy peer");
    need(peer_cq.destroy(), "destroy peer cq");
    need(mr.dereg(), "dereg");
    need(src.dereg(), "dereg src");
    need(pd.dealloc(), "dealloc pd");
    need(ctx.close(), "close");
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
std::atomic<int> quiet_reports{0};
void count_quietly(const destroy_failure &) noexcept { quiet_reports.fetch_add(1); }
// Run `a` and `b` on two threads started together.
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
  a();
  t.join();
}
} // namespace

// The handles of a parent and of its last child are independent: destroyed on two threads at
// once, every pair of real objects is destroyed once, children first, and nothing stays in the
// kernel (ASan/LSan in the sanitized rxe run; the handle layer alone also runs under TSan).
TEST_CASE("a parent and its last child destroyed on two threads at once, for each pair",
          "[lifetimes][threads]") {
  const std::string before = kernel_resources();
  quiet_reports = 0;
  auto old = set_destroy_failure_handler(&count_quietly);
  constexpr int rounds = 40;
  {
    Context ctx = open_device();
    std::vector<unsigned char> mem(4096);
    for (int i = 0; i < rounds; ++i) {
      // Context / PD
      auto c = std::make_unique<Context>(open_device());
      auto pd = std::make_unique<ProtectionDomain>(need(ProtectionDomain::alloc(*c), "pd"));
      together([&] { c.reset(); }, [&] { pd.reset(); });
      // PD / MR, PD / window
      auto pd2 = std::make_unique<ProtectionDomain>(need(ProtectionDomain::alloc(ctx), "pd2"));
      auto mr = std::make_unique<MemoryRegion>(
          need(MemoryRegion::reg(*pd2, mem.data(), mem.size(), access::local_write | access::mw_bind), "mr"));
      auto mw = std::make_unique<MemoryWindow>(need(MemoryWindow::alloc(*pd2, mw_type::type1), "mw"));
      together([&] { pd2.reset(); }, [&] { mr.reset(); });
      together([&] { mw.reset(); }, [] {});
      // CQ / QP, PD / QP
      auto pd3 = std::make_unique<ProtectionDomain>(need(ProtectionDomain::alloc(ctx), "pd3"));
      auto cq = std::make_unique<CompletionQueue>(need(CompletionQueue::create(ctx, 8), "cq"));
      auto qp = std::make_unique<QueuePair>(need(QueuePair::create(*pd3, *cq, *cq), "qp"));
      together([&] { cq.reset(); pd3.reset(); }, [&] { qp.reset(); });
      // MR / bound window (an allocate()d region: its pages go after it)
      auto pd4 = std::make_unique<ProtectionDomain>(need(ProtectionDomain::alloc(ctx), "pd4"));
      qp_pair qps(ctx, *pd4);
      auto amr = std::make_unique<MemoryRegion>(
          need(MemoryRegion::allocate(*pd4, 4096, access::local_write | access::mw_bind), "amr"));
      auto w = std::make_unique<MemoryWindow>(need(MemoryWindow::alloc(*pd4, mw_type::type1), "w"));
      (void)need(w->bind(qps.b, *amr, {0, 4096}, access::remote_read), "bind");
      REQUIRE(w->complete(wait_one(qps.cq_b)));
      together([&] { amr.reset(); }, [&] { w.reset(); });
      REQUIRE(amr == nullptr);
    }
  }
  set_destroy_failure_handler(old);
  INFO("deferred destructions reported: " << quiet_reports.load());
  CHECK(kernel_resources() == before);
}
