// [cq-events]: CompletionQueue::wait without a channel (bounded busy poll), and the channel's
// separate steps: arm (incl. solicited-only), get_event, batched ack, one channel for several
// CQs, the drain-after-event rule (poll_and_arm); wait() with a channel leaves the event it woke
// on for the next arm. On a real rxe device.
#include "fixture.hpp"

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace {
using namespace rxe;
std::int64_t now_ms() { return rdmaxx::detail::monotonic_ms(); }
} // namespace

TEST_CASE("wait() without a channel: a bounded busy poll", "[cq-events]") {
  loopback lb;
  alignas(64) static unsigned char src[64], dst[64];
  fill(src, sizeof src, 1);
  std::memset(dst, 0, sizeof dst);
  auto smr = need(MemoryRegion::reg(lb.pd, src, sizeof src, access::local_write), "src");
  auto dmr = need(MemoryRegion::reg(lb.pd, dst, sizeof dst, remote_rw), "dst");
  ibv_wc wc[4];
  // Nothing posted: times out after the bound, not before, not much later.
  const auto t0 = now_ms();
  auto none = lb.cq_a.wait(wc, 200);
  const auto took = now_ms() - t0;
  REQUIRE(!none);
  CHECK(none.error() == errc::timeout);
  CHECK(took >= 200);
  CHECK(took < 1500);
  auto b = lb.a.start_send();
  b.write({.id = 5, .flags = send_flag::signaled}, {dmr.iova(), dmr.rkey()}, smr.sge());
  need(b.submit(), "submit");
  auto n = need(lb.cq_a.wait(wc, 5000), "wait");
  REQUIRE(n == 1);
  CHECK(wc[0].wr_id == 5);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(std::memcmp(src, dst, sizeof src) == 0);
  // Bad inputs.
  CHECK(lb.cq_a.wait(std::span<ibv_wc>(), 10).error() == errc::zero_length);
  CHECK(lb.cq_a.wait(wc, -1).error() == errc::timeout); // polls once, does not wait
  CHECK(lb.cq_a.arm().error() == errc::wrong_state);
  CHECK(lb.cq_a.poll_and_arm(wc).error() == errc::wrong_state);
  CompletionQueue null_cq;
  CHECK(null_cq.wait(wc, 10).error() == errc::null_handle);
  CHECK(null_cq.arm().error() == errc::null_handle);
  CHECK(null_cq.ack_events(1).error() == errc::null_handle);
  CHECK(null_cq.poll_and_arm(wc).error() == errc::null_handle);
  CompletionChannel null_ch;
  CHECK(null_ch.get_event(0).error() == errc::null_handle);
}

TEST_CASE("one channel for two CQs: arm, get_event names the CQ, batched ack, drain rule", "[cq-events]") {
  device_pd d;
  auto ch = need(CompletionChannel::create(d.ctx), "channel");
  auto cq1 = need(CompletionQueue::create(d.ctx, 64, &ch), "cq1");
  auto cq2 = need(CompletionQueue::create(d.ctx, 64, &ch), "cq2");
  auto a = need(QueuePair::create(d.pd, cq1, cq1), "qp a");
  auto b = need(QueuePair::create(d.pd, cq2, cq2), "qp b");
  need(connect_loopback(a, b), "connect");
  alignas(64) static unsigned char src[64], dst[64], rbuf[4][64];
  fill(src, sizeof src, 2);
  auto smr = need(MemoryRegion::reg(d.pd, src, sizeof src, access::local_write), "src");
  auto dmr = need(MemoryRegion::reg(d.pd, dst, sizeof dst, remote_rw), "dst");
  auto rmr = need(MemoryRegion::reg(d.pd, rbuf, sizeof rbuf, access::local_write), "rbuf");
  ibv_wc wc[4];
  need(cq1.arm(), "arm cq1");
  CHECK(ch.get_event(100).error() == errc::timeout);
  CHECK(ch.get_event(-1).error() == errc::invalid_argument);

  // A completion on cq1 gives an event naming cq1.
  auto w = a.start_send();
  w.write({.id = 11, .flags = send_flag::signaled}, {dmr.iova(), dmr.rkey()}, smr.sge());
  need(w.submit(), "write a");
  CHECK(need(ch.get_event(5000), "event 1") == cq1.native_handle());
  CHECK(need(cq1.poll_and_arm(wc), "drain cq1") == 1);
  CHECK(wc[0].wr_id == 11);
  CHECK(std::memcmp(src, dst, sizeof src) == 0);

  // Solicited-only on cq2: a plain send's receive completion raises no event, a solicited one does.
  for (int i = 0; i < 4; ++i) {
    ibv_sge s = rmr.sge();
    s.addr += std::uint64_t(i) * 64;
    s.length = 64;
    need(b.post_recv(100 + i, s), "post_recv");
  }
  need(cq2.ack_events(0), "ack nothing");
  // cq2 is armed for any completion from above: re-arm solicited-only after draining it.
  CHECK(need(cq2.poll_and_arm(wc, true), "drain cq2") == 0);
  ibv_sge one = smr.sge();
  one.length = 16;
  auto s1 = a.start_send();
  s1.send({.id = 21}, one);
  need(s1.submit(), "send plain");
  CHECK(ch.get_event(500).error() == errc::timeout);
  auto s2 = a.start_send();
  s2.send({.id = 22, .flags = send_flag::signaled | send_flag::solicited}, one);
  need(s2.submit(), "send solicited");
  // The solicited completion's event names cq2 (cq1's event for id 22 was not armed... cq1 is
  // armed for any completion: it may come too).
  int cq1_events = 0, cq2_events = 0;
  const auto t0 = now_ms();
  while (cq2_events == 0 && now_ms() - t0 < 5000) {
    auto e = ch.get_event(5000);
    if (!e) break;
    (e.value() == cq1.native_handle() ? cq1_events : cq2_events)++;
  }
  CHECK(cq2_events == 1);
  // The drain rule: the event came for the second receive, but both are in cq2; a span of one
  // takes them one at a time, and the last call leaves cq2 empty and armed.
  CHECK(need(cq2.poll_and_arm(std::span(wc, 1)), "drain 1") == 1);
  CHECK(wc[0].wr_id == 100);
  CHECK(wc[0].opcode == IBV_WC_RECV);
  CHECK(need(cq2.poll_and_arm(std::span(wc, 1)), "drain 2") == 1);
  CHECK(wc[0].wr_id == 101);
  CHECK(need(cq2.poll_and_arm(std::span(wc, 1)), "drain 3") == 0);
  CHECK(std::memcmp(rbuf[0], src, 16) == 0);
  CHECK(std::memcmp(rbuf[1], src, 16) == 0);
  // Batched acknowledgement: every event, in one call per CQ (destroying a CQ waits for it).
  while (true) { // cq1 may hold the send completion of id 22 and its event
    auto e = ch.get_event(200);
    if (!e) break;
    (e.value() == cq1.native_handle() ? cq1_events : cq2_events)++;
  }
  need(cq1.ack_events(unsigned(1 + cq1_events)), "ack cq1");
  need(cq2.ack_events(unsigned(cq2_events)), "ack cq2");
  need(a.destroy(), "destroy a");
  need(b.destroy(), "destroy b");
  need(cq1.destroy(), "destroy cq1");
  need(cq2.destroy(), "destroy cq2");
}

TEST_CASE("wait_for(wr_id): the one completion, the others handed over in order, never dropped", "[cq-events]") {
  loopback lb;
  alignas(64) static unsigned char src[64], dst[64];
  fill(src, sizeof src, 7);
  std::memset(dst, 0, sizeof dst);
  auto smr = need(MemoryRegion::reg(lb.pd, src, sizeof src, access::local_write), "src");
  auto dmr = need(MemoryRegion::reg(lb.pd, dst, sizeof dst, remote_rw), "dst");
  const auto post = [&](std::initializer_list<std::uint64_t> ids, std::uint32_t rkey) {
    auto b = lb.a.start_send();
    for (std::uint64_t id : ids) b.write({.id = id, .flags = send_flag::signaled}, {dmr.iova(), rkey}, smr.sge());
    need(b.submit(), "submit");
  };
  // Three writes; waiting for the last hands the first two to the handler, in order.
  post({11, 12, 13}, dmr.rkey());
  std::vector<std::uint64_t> others;
  const auto keep = [&](std::span<ibv_wc> wcs) {
    for (const ibv_wc &wc : wcs) others.push_back(wc.wr_id);
  };
  auto wc = need(lb.cq_a.wait_for(13, 5000, keep), "wait_for 13");
  CHECK(wc.wr_id == 13);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
  CHECK(others == std::vector<std::uint64_t>{11, 12});
  CHECK(std::memcmp(src, dst, sizeof src) == 0);
  // Waiting for the first of three: the two after it are handed over too (polled in the same
  // batch), not left behind or lost.
  others.clear();
  post({21, 22, 23}, dmr.rkey());
  std::this_thread::sleep_for(std::chrono::milliseconds(200)); // all three in the CQ
  wc = need(lb.cq_a.wait_for(21, 5000, keep), "wait_for 21");
  CHECK(wc.wr_id == 21);
  CHECK(others == std::vector<std::uint64_t>{22, 23});
  // Nothing of that id: errc::timeout within the bound.
  const auto t0 = now_ms();
  auto none = lb.cq_a.wait_for(99, 200, keep);
  CHECK(none.error() == errc::timeout);
  CHECK(now_ms() - t0 >= 200);
  // Without a handler: another completion first is errc::unexpected_completion, handed back.
  post({31, 32}, dmr.rkey());
  ibv_wc other{};
  auto r = lb.cq_a.wait_for(32, 5000, &other);
  CHECK(r.error() == errc::unexpected_completion);
  CHECK(retry_hint_of(r.error()) == retry_hint::after_progress);
  CHECK(other.wr_id == 31);
  CHECK(need(lb.cq_a.wait_for(32, 5000), "wait_for 32").wr_id == 32);
  // A failed completion is its wc_error() code.
  post({41}, dmr.rkey() ^ 0x100u);
  auto bad = lb.cq_a.wait_for(41, 5000);
  REQUIRE(!bad);
  CHECK(bad.error() == wc_error(IBV_WC_REM_ACCESS_ERR));
  CompletionQueue null_cq;
  CHECK(null_cq.wait_for(1, 10).error() == errc::null_handle);
  CHECK(null_cq.wait_for(1, 10, keep).error() == errc::null_handle);
}

// wait() with a channel: the event that woke it stays on the channel until the next arm of the
// CQ (the next wait() that finds the CQ empty, arm(), poll_and_arm()) takes and acknowledges
// it. Every event taken must be acknowledged before ibv_destroy_cq returns: the destroy runs on
// a thread of its own and is given 10 s.
TEST_CASE("wait() with a channel: the event it woke on is taken by the next arm, then acknowledged", "[cq-events]") {
  channel_pair f(64, 7);
  ibv_wc wc[4];
  for (std::uint64_t id = 1; id <= 3; ++id) {
    std::atomic<bool> posted_ok{false};
    std::thread t = f.post_write_after(id, 100, &posted_ok); // comes while wait() sleeps
    auto n = f.cq.wait(wc, 10000);
    t.join();
    REQUIRE(posted_ok);
    REQUIRE(n);
    REQUIRE(n.value() == 1);
    CHECK(wc[0].wr_id == id);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    CHECK(f.readable()); // the event is still on the channel
  }
  CHECK(f.src == f.dst);
  need(f.cq.arm(), "arm"); // takes the last wait's event, then arms
  CHECK_FALSE(f.readable());
  // Armed, nothing posted: a wait that sleeps and times out; no event comes.
  CHECK(f.cq.wait(wc, 50).error() == errc::timeout);
  CHECK_FALSE(f.readable());
  // The same, the event this time taken by the next wait before it arms.
  std::thread t2 = f.post_write_after(9, 100); // checked by the wait below
  auto n9 = f.cq.wait(wc, 10000);
  t2.join();
  REQUIRE(n9);
  CHECK(wc[0].wr_id == 9);
  CHECK(f.readable());
  CHECK(f.cq.wait(wc, 50).error() == errc::timeout);
  CHECK_FALSE(f.readable());
  f.a = QueuePair{};
  REQUIRE(destroyed_within(std::move(f.cq), 10000)); // every event taken was acknowledged
}

// The event wait() left is taken by another reader first (the channel's get_event(), as a
// router would on its non-blocking fd): the CQ's next arm finds none, goes on, and arms. It
// neither fails with EAGAIN nor blocks, and the next completion raises an event.
TEST_CASE("wait() left an event another reader took: the next arm goes on (non-blocking channel)", "[cq-events]") {
  channel_pair f(64, 5);
  const int fl = ::fcntl(f.ch.fd(), F_GETFL);
  REQUIRE(fl >= 0);
  REQUIRE(::fcntl(f.ch.fd(), F_SETFL, fl | O_NONBLOCK) == 0);
  ibv_wc wc[4];
  std::thread t = f.post_write_after(1, 100); // checked by the completion it gives
  auto n = f.cq.wait(wc, 10000);
  t.join();
  REQUIRE(n);
  CHECK(wc[0].wr_id == 1);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  // The other reader takes the event wait() left, and acknowledges it.
  auto ev = f.ch.get_event(0);
  REQUIRE(ev);
  CHECK(ev.value() == f.cq.native_handle());
  need(f.cq.ack_events(1), "ack");
  auto armed = f.cq.arm(); // its pending event is gone: EAGAIN on this fd, taken as nothing left
  REQUIRE(armed);
  REQUIRE(f.post_write(2));
  auto ev2 = f.ch.get_event(5000); // armed: the completion raised an event
  REQUIRE(ev2);
  CHECK(ev2.value() == f.cq.native_handle());
  need(f.cq.ack_events(1), "ack 2");
  auto p2 = f.cq.poll(wc);
  REQUIRE(p2);
  REQUIRE(p2.value() == 1);
  CHECK(wc[0].wr_id == 2);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(f.src == f.dst);
  f.a = QueuePair{};
  REQUIRE(destroyed_within(std::move(f.cq), 10000)); // every event taken was acknowledged
}
