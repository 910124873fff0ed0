// [faults] Failures in the middle of real traffic on rxe: every one must surface as an error (a
// completion status or an error_code), nothing may hang (bounded waits), and every object must
// stay destroyable.
#include "fixture.hpp"

#include <cstring>
#include <vector>

using namespace rxe;

namespace {
// A connection that gives up quickly: ~4 ms ack timeout, one retry.
connect_options quick() {
  connect_options o;
  o.timeout = 10;
  o.retry_cnt = 1;
  o.rnr_retry = 1;
  return o;
}
} // namespace

TEST_CASE("faults: a remote access error in the middle of a batch", "[faults]") {
  loopback lb;
  std::vector<unsigned char> src(64, 0x5C), dst(3 * 64, 0);
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  {
    auto batch = lb.a.start_send();
    batch.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge())
        .write({2, send_flag::signaled}, {md.iova() + 64, md.rkey() ^ 0x00F0F000u}, ms.sge())
        .write({3, send_flag::signaled}, {md.iova() + 128, md.rkey()}, ms.sge());
    need(batch.submit(), "submit");
  }
  const auto wcs = wait_wc(lb.cq_a, 3);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].status == IBV_WC_SUCCESS);
  CHECK(wcs[1].wr_id == 2);
  CHECK(wcs[1].status == IBV_WC_REM_ACCESS_ERR);
  CHECK(wc_error(wcs[1]) == std::errc::permission_denied);
  CHECK(wcs[2].wr_id == 3);
  CHECK(wcs[2].status == IBV_WC_WR_FLUSH_ERR); // not executed: the QP went to ERR
  CHECK(wc_error(wcs[2]) == std::errc::operation_canceled);
  CHECK(all_equal(dst.data(), 64, 0x5C));
  CHECK(all_equal(dst.data() + 64, 128, 0)); // neither the bad nor the flushed write landed
  CHECK(need(lb.a.state(), "state") == IBV_QPS_ERR);
  lb.recover();
  CHECK(lb.write(ms.sge(), {md.iova() + 128, md.rkey()}) == IBV_WC_SUCCESS);
  CHECK(all_equal(dst.data() + 128, 64, 0x5C));
}

TEST_CASE("faults: the peer goes away mid-operation", "[faults]") {
  device_pd dev;
  qp_pair p(dev.ctx, dev.pd, quick());
  auto &[ctx, pd] = dev;
  auto &[cq_a, cq_b, a, b] = p;
  std::vector<unsigned char> src(64, 1), dst(64, 0);
  auto ms = need(MemoryRegion::reg(pd, src.data(), src.size(), access::local_write), "reg src");
  auto md = need(MemoryRegion::reg(pd, dst.data(), dst.size(), remote_rw), "reg dst");

  SECTION("its QP moved to the error state") {
    need(b.to_error(), "peer to ERR");
    const auto st = write_one(a, cq_a, ms.sge(), {md.iova(), md.rkey()});
    INFO(ibv_wc_status_str(st));
    CHECK(st != IBV_WC_SUCCESS);
    CHECK(wc_error(st));
    CHECK(all_equal(dst.data(), dst.size(), 0));
  }
  SECTION("its QP destroyed") {
    need(b.destroy(), "destroy peer QP");
    const auto st = write_one(a, cq_a, ms.sge(), {md.iova(), md.rkey()});
    INFO(ibv_wc_status_str(st));
    CHECK(st != IBV_WC_SUCCESS);
    CHECK(wc_error(st));
    CHECK(all_equal(dst.data(), dst.size(), 0));
  }
  // Everything left is destroyable, with errors reported, in the right order.
  need(md.destroy(), "dereg");
  need(ms.destroy(), "dereg");
  need(a.destroy(), "destroy a");
  need(b.destroy(), "destroy b");
  need(cq_a.destroy(), "destroy cq a");
  need(cq_b.destroy(), "destroy cq b");
  need(pd.destroy(), "dealloc");
  need(ctx.destroy(), "close");
}

TEST_CASE("faults: more completions than the CQ holds", "[faults]") {
  Context ctx = open_device();
  auto pd = need(ProtectionDomain::alloc(ctx), "pd");
  auto cq_a = need(CompletionQueue::create(ctx, 1), "small cq");
  auto cq_b = need(CompletionQueue::create(ctx, 16), "cq b");
  const int capacity = cq_a.capacity();
  qp_caps caps;
  caps.max_send_wr = std::uint32_t(capacity) + 16;
  auto a = need(QueuePair::create(pd, cq_a, cq_a, caps), "qp a");
  auto b = need(QueuePair::create(pd, cq_b, cq_b), "qp b");
  need(connect_loopback(a, b), "connect");
  std::vector<unsigned char> src(64, 2), dst(64, 0);
  auto ms = need(MemoryRegion::reg(pd, src.data(), src.size(), access::local_write), "reg src");
  auto md = need(MemoryRegion::reg(pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const int posted = capacity + 8;
  {
    auto batch = a.start_send();
    for (int i = 0; i < posted; ++i)
      batch.write({std::uint64_t(i), send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge());
    need(batch.submit(), "submit");
  }
  // Let the overrun happen, then drain: the library must report it somehow (a poll error, an
  // error completion, or the QP in ERR) and nothing may hang.
  std::this_thread::sleep_for(300ms);
  ibv_wc wc[64];
  std::size_t got = 0;
  bool error_seen = false;
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto p = cq_a.poll(wc);
    if (!p) {
      error_seen = true;
      break;
    }
    for (std::size_t i = 0; i < p.value(); ++i) error_seen = error_seen || wc[i].status != IBV_WC_SUCCESS;
    got += p.value();
    if (p.value() == 0) std::this_thread::sleep_for(1ms);
  }
  auto st = a.state();
  const bool qp_err = st && st.value() == IBV_QPS_ERR;
  INFO("capacity " << capacity << ", posted " << posted << ", polled " << got
                   << ", error completion/poll error " << error_seen << ", QP in ERR " << qp_err);
  std::printf("faults: CQ of %d entries, %d signalled writes: %zu completions polled, error seen %d, "
              "QP in ERR %d\n",
              capacity, posted, got, int(error_seen), int(qp_err));
  // What must never happen: every completion delivered as if nothing had gone wrong.
  CHECK((error_seen || qp_err || got < std::size_t(posted)));
  // The overrun is reported as an asynchronous event of the device, naming the CQ.
  auto ev = ctx.wait_async_event(2000);
  INFO("async event: " << (ev ? ibv_event_type_str(ev.value().event_type) : ev.error().message()));
  REQUIRE(ev.has_value());
  CHECK(ev.value().event_type == IBV_EVENT_CQ_ERR);
  CHECK(ev.value().element.cq == cq_a.native_handle());
  // ... and async_error() turns it into an error_code: an overrun compares equal to ENOBUFS.
  const std::error_code overrun = async_error(ev.value());
  INFO("as error: " << overrun.message());
  CHECK(overrun);
  CHECK(overrun.category() == async_event_category());
  CHECK(overrun == std::errc::no_buffer_space);
  // rxe raises one event per lost completion: drain them; with nothing pending the wait is bounded.
  int more = 0;
  result<ibv_async_event> next = ctx.wait_async_event(50);
  while (next && more < 64) {
    CHECK(next.value().event_type == IBV_EVENT_CQ_ERR);
    ++more;
    next = ctx.wait_async_event(50);
  }
  REQUIRE_FALSE(next.has_value());
  CHECK(next.error() == errc::timeout);
  // Still destroyable (destructors run at scope end; the hook would print any failure).
}
