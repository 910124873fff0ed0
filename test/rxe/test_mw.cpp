// [mw] memory windows on a real rxe device: bind, access through the window, rights, chaining,
// rollback of failed binds, several windows over one region, teardown rules.
// QP `b` of the loopback fixture is the owner (it binds; a type-2B window serves only the QP it
// was bound through), QP `a` is the peer that reads and writes through the descriptor.
#include "fixture.hpp"

#include <rdmaxx/memory_window.hpp>

#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

using namespace rxe;

namespace {

constexpr access_flags owner_access = access::local_write | access::mw_bind; // no remote rights
constexpr access_flags rw_rights = access::remote_read | access::remote_write;

/// Bind through `qp` (signaled), wait for the completion, hand it to the window.
remote_descriptor bind_wait(MemoryWindow &mw, QueuePair &qp, CompletionQueue &cq, const MemoryRegion &mr,
                            window_range r, access_flags rights, std::uint64_t id = 100) {
  auto d = need(mw.bind(qp, mr, r, rights, {id, send_flag::signaled}), "bind");
  const ibv_wc wc = wait_one(cq);
  CHECK(wc.opcode == IBV_WC_BIND_MW);
  CHECK(mw.complete(wc));
  CHECK(mw.pending() == 0);
  return d;
}

void invalidate_wait(MemoryWindow &mw, QueuePair &qp, CompletionQueue &cq, std::uint64_t id = 200) {
  need(mw.invalidate(qp, {id, send_flag::signaled}), "invalidate");
  const ibv_wc wc = wait_one(cq);
  CHECK(wc.opcode == IBV_WC_LOCAL_INV);
  CHECK(mw.complete(wc));
  CHECK(mw.state() == mw_state::invalidated);
}

const char *type_name(mw_type t) { return t == mw_type::type1 ? "type 1" : "type 2B"; }

} // namespace

TEST_CASE("both window types allocate on rxe, unbound", "[mw]") {
  loopback lb;
  for (auto t : {mw_type::type1, mw_type::type2}) {
    auto mw = need(MemoryWindow::alloc(lb.pd, t, accept_risk), "alloc_mw");
    CHECK(mw.type() == t);
    CHECK(mw.state() == mw_state::unbound);
    CHECK(mw.rkey() != 0);
    CHECK(lb.pd.live_children() == 3); // two QPs and the window
  }
  CHECK(lb.pd.live_children() == 2);
}

TEST_CASE("bind, then the peer's write and read through the window land exactly in the range", "[mw]") {
  const mw_type t = GENERATE(mw_type::type1, mw_type::type2);
  INFO(type_name(t));
  loopback lb;
  std::vector<unsigned char> mem(8192, 0x11), src(512), back(512, 0);
  fill(src.data(), src.size(), 7);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  // The region itself grants nothing remotely (its rkey: 0 on Linux 6.1, its lkey on 6.12).
  check_local_only_rkey(lb, mr, mem.data(), mem.size(), ms, src.data(), src.size());
  auto mw = need(MemoryWindow::alloc(lb.pd, t, accept_risk), "alloc_mw");
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {1024, 512}, rw_rights);
  CHECK(mw.state() == mw_state::bound);
  CHECK(d.rkey == mw.rkey());
  CHECK(d.addr == mr.iova() + 1024);
  CHECK(d.length == 512);
  CHECK(d.rights == rw_rights);
  CHECK(mr.bound_windows() == 1);
  CHECK(lb.b.live_children() == (t == mw_type::type2 ? 1u : 0u));

  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(mem.data() + 1024, src.data(), 512) == 0);
  CHECK(all_equal(mem.data(), 1024, 0x11));
  CHECK(all_equal(mem.data() + 1536, mem.size() - 1536, 0x11));
  REQUIRE(lb.read(mb.sge(0, 256), d.at(256)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), src.data() + 256, 256) == 0);
  CHECK(all_equal(back.data() + 256, 256, 0));

  if (t == mw_type::type2) {
    invalidate_wait(mw, lb.b, lb.cq_b);
    CHECK(lb.b.live_children() == 0);
  } else {
    need(mw.unbind(lb.b, {300, send_flag::signaled}), "unbind");
    CHECK(mw.complete(wait_one(lb.cq_b)));
    CHECK(mw.state() == mw_state::unbound);
  }
  CHECK(mr.bound_windows() == 0);
  CHECK(mw.pending() == 0);
}

TEST_CASE("type 1 through the work-request path: bind and unbind in a batch", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0x22), src(64, 0x5C);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type1), "alloc_mw");
  const std::uint32_t k0 = mw.rkey();
  remote_descriptor d;
  {
    auto batch = lb.b.start_send();
    d = need(mw.bind(batch, lb.b, mr, {64, 64}, rw_rights, {1, send_flag::signaled}), "bind");
    need(batch.submit(), "submit");
  }
  CHECK(mw.complete(wait_one(lb.cq_b)));
  CHECK(d.rkey == ibv_inc_rkey(k0));
  CHECK(mw.native_handle()->rkey == d.rkey);
  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data() + 64, 64, 0x5C));
  {
    auto batch = lb.b.start_send();
    need(mw.unbind(batch, lb.b, {2, send_flag::signaled}), "unbind");
    need(batch.submit(), "submit");
  }
  CHECK(mw.complete(wait_one(lb.cq_b)));
  CHECK(mw.state() == mw_state::unbound);
  CHECK(mr.bound_windows() == 0);
  std::memset(src.data(), 0x99, src.size());
  CHECK(lb.write(ms.sge(), d.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(mem.data() + 64, 64, 0x5C));
  CHECK(all_equal(mem.data(), 64, 0x22));
}

TEST_CASE("a zero-based type-2 window: the peer addresses offsets", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), src(32, 0x7E);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {2048, 256}, rw_rights | access::zero_based);
  CHECK(d.zero_based);
  CHECK(d.addr == 0);
  REQUIRE(lb.write(ms.sge(), d.at(16)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data() + 2048 + 16, 32, 0x7E));
  CHECK(all_equal(mem.data(), 2048 + 16, 0));
  CHECK(all_equal(mem.data() + 2048 + 48, 4096 - 2048 - 48, 0));
  // Zero-based type-1 binds fail on rxe; the library refuses them first.
  auto w1 = need(MemoryWindow::alloc(lb.pd, mw_type::type1), "alloc_mw 1");
  CHECK(w1.bind(lb.b, mr, {0, 64}, access::remote_read | access::zero_based).error() == errc::wrong_type);
  invalidate_wait(mw, lb.b, lb.cq_b);
}

TEST_CASE("window rights are enforced: a write through a read-only window fails, memory unchanged", "[mw]") {
  const mw_type t = GENERATE(mw_type::type1, mw_type::type2);
  INFO(type_name(t));
  loopback lb;
  std::vector<unsigned char> mem(4096, 0x33), src(128, 0xC4), back(128, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  auto ro = need(MemoryWindow::alloc(lb.pd, t, accept_risk), "alloc ro");
  const auto d = bind_wait(ro, lb.b, lb.cq_b, mr, {0, 1024}, access::remote_read);
  REQUIRE(lb.read(mb.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(back.data(), back.size(), 0x33));
  const auto st = lb.write(ms.sge(), d.at(0));
  CHECK(st == IBV_WC_REM_ACCESS_ERR);
  CHECK(wc_error(st) == std::errc::permission_denied);
  CHECK(all_equal(mem.data(), mem.size(), 0x33));
  lb.recover();
  // And a write-only window refuses reads.
  auto wo = need(MemoryWindow::alloc(lb.pd, t, accept_risk), "alloc wo");
  const auto dw = bind_wait(wo, lb.b, lb.cq_b, mr, {2048, 1024}, access::remote_write, 101);
  std::memset(back.data(), 0, back.size());
  CHECK(lb.read(mb.sge(), dw.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(back.data(), back.size(), 0));
}

TEST_CASE("type 2: bind and invalidate chained in one batch with one completion", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), src(64, 0xA5);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  std::uint32_t last = mw.rkey();
  for (int cycle = 0; cycle < 20; ++cycle) {
    {
      auto batch = lb.b.start_send();
      auto d = mw.bind(batch, lb.b, mr, {0, 4096}, rw_rights, {10});
      REQUIRE(d.has_value());
      REQUIRE(mw.invalidate(batch, lb.b, {11, send_flag::signaled}).has_value());
      CHECK(mw.pending() == 2);
      need(batch.submit(), "submit");
    }
    const ibv_wc wc = wait_one(lb.cq_b);
    CHECK(wc.wr_id == 11);
    CHECK(mw.complete(wc)); // confirms the bind too
    CHECK(mw.pending() == 0);
    CHECK(mw.state() == mw_state::invalidated);
    CHECK(mw.rkey() == ibv_inc_rkey(last));
    last = mw.rkey();
  }
  expect_no_completion(lb.cq_b, 100ms);
  CHECK(mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // The tracked key is right: a normal bind after 20 cycles works.
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data(), 64, 0xA5));
  invalidate_wait(mw, lb.b, lb.cq_b);
}

TEST_CASE("batch forms default to window_wr_id: the caller's own failed id-0 request leaves the window bound",
          "[mw][undo]") {
  // A bind added to a batch without a wr used id 0, the id most other work requests carry: the
  // failed completion of the caller's own write then rolled the window back to unbound while its
  // bind had executed, and the key was never revoked.
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), src(64, 0x5A);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  {
    auto batch = lb.b.start_send();
    REQUIRE(mw.bind(batch, lb.b, mr, {0, 4096}, rw_rights).has_value());
    // The caller's own write, id 0, signaled: to the region's key, which has no remote rights.
    batch.write({0, send_flag::signaled}, {mr.iova(), mr.rkey()}, ms.sge());
    need(batch.submit(), "submit");
  }
  const ibv_wc wc = wait_wc(lb.cq_b, 1).front();
  INFO("write completion: " << ibv_wc_status_str(wc.status));
  REQUIRE(wc.status != IBV_WC_SUCCESS);
  CHECK(wc.wr_id == 0);
  CHECK_FALSE(mw.complete(wc)); // not the window's
  CHECK(mw.state() == mw_state::bound);
  CHECK(mw.pending() == 1);
  CHECK(mr.bound_windows() == 1);
  CHECK(all_equal(mem.data(), mem.size(), 0));
}

TEST_CASE("a bind that completes with an error rolls state, key and counts back", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), src(64, 0x3C);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  const std::uint32_t k0 = mw.rkey();
  need(lb.b.to_error(), "b to ERR"); // the bind will be flushed
  auto d = need(mw.bind(lb.b, mr, {0, 64}, rw_rights, {5, send_flag::signaled}), "bind");
  CHECK(mw.state() == mw_state::bound); // as posted
  CHECK(mr.bound_windows() == 1);
  const ibv_wc wc = wait_wc(lb.cq_b, 1).front();
  INFO("bind completion: " << ibv_wc_status_str(wc.status));
  CHECK(wc.status != IBV_WC_SUCCESS);
  CHECK(mw.complete(wc));
  CHECK(mw.state() == mw_state::unbound);
  CHECK(mw.rkey() == k0);
  CHECK(mw.native_handle()->rkey == k0);
  CHECK(mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // Nothing to invalidate: refused, not posted (rxe would panic).
  CHECK(mw.invalidate(lb.b).error() == errc::not_bound);
  lb.recover();
  // With the key rolled back, the next bind is accepted by the kernel.
  d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  CHECK(d.rkey == ibv_inc_rkey(k0));
  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data(), 64, 0x3C));
  invalidate_wait(mw, lb.b, lb.cq_b);
}

TEST_CASE("a batch dropped after a bind rolls the window back by itself", "[mw][undo]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), other(4096, 0), src(64, 0x5A);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto mr_dropped = need(MemoryRegion::reg(lb.pd, other.data(), other.size(), owner_access), "reg other");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  const std::uint32_t k0 = mw.rkey();
  {
    auto batch = lb.b.start_send();
    REQUIRE(mw.bind(batch, lb.b, mr_dropped, {0, 64}, rw_rights, {1, send_flag::signaled}).has_value());
    CHECK(mw.state() == mw_state::bound); // as posted
    CHECK(mr_dropped.bound_windows() == 1);
  } // dropped: aborted, and the batch undoes the bind
  CHECK(mw.state() == mw_state::unbound);
  CHECK(mw.rkey() == k0);
  CHECK(mw.native_handle()->rkey == k0);
  CHECK(mw.pending() == 0);
  CHECK(mr_dropped.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  CHECK(mr_dropped.destroy().has_value()); // not busy: the window no longer counts on it
  expect_no_completion(lb.cq_b, 100ms);
  // A normal cycle still works, with the key after k0 (the kernel never saw the dropped one).
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  CHECK(d.rkey == ibv_inc_rkey(k0));
  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data(), 64, 0x5A));
  invalidate_wait(mw, lb.b, lb.cq_b);
}

TEST_CASE("a dropped batch undoes only its own window operations", "[mw][undo]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), src(64, 0x77);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  {
    // a bind confirmed before, then an invalidate in a batch that is dropped
    auto batch = lb.b.start_send();
    REQUIRE(mw.invalidate(batch, lb.b, {12, send_flag::signaled}).has_value());
    CHECK(mw.state() == mw_state::invalidated);
  }
  CHECK(mw.state() == mw_state::bound);
  CHECK(mw.rkey() == d.rkey);
  CHECK(mw.pending() == 0);
  CHECK(mr.bound_windows() == 1);
  CHECK(lb.b.live_children() == 1);
  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS); // the grant still works
  CHECK(all_equal(mem.data(), 64, 0x77));
  {
    // bind and invalidate of one window in one dropped batch: back to before both
    invalidate_wait(mw, lb.b, lb.cq_b);
    const std::uint32_t k1 = mw.rkey();
    std::optional<SendBatch> batch(lb.b.start_send()); // moved in: the undo list moves with it
    REQUIRE(mw.bind(*batch, lb.b, mr, {0, 64}, rw_rights, {13}).has_value());
    REQUIRE(mw.invalidate(*batch, lb.b, {14, send_flag::signaled}).has_value());
    CHECK(mw.pending() == 2);
    batch.reset(); // dropped
    CHECK(mw.state() == mw_state::invalidated);
    CHECK(mw.rkey() == k1);
    CHECK(mw.pending() == 0);
    CHECK(mr.bound_windows() == 0);
  }
  expect_no_completion(lb.cq_b, 100ms);
  bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  invalidate_wait(mw, lb.b, lb.cq_b);
}

TEST_CASE("a batch whose submit fails (QP not at RTS) rolls its window operations back", "[mw][undo]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), src(64, 0x19);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  const std::uint32_t k0 = mw.rkey();
  need(lb.b.to_reset(), "b to RESET");
  {
    auto batch = lb.b.start_send();
    REQUIRE(mw.bind(batch, lb.b, mr, {0, 64}, rw_rights, {3, send_flag::signaled}).has_value());
    CHECK(mw.pending() == 1);
    const auto r = batch.submit();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::wrong_state);
    // rolled back before submit() returned
    CHECK(mw.state() == mw_state::unbound);
    CHECK(mw.rkey() == k0);
    CHECK(mw.native_handle()->rkey == k0);
    CHECK(mw.pending() == 0);
    CHECK(mr.bound_windows() == 0);
    CHECK(lb.b.live_children() == 0);
  }
  // the posting form too: its failed submit leaves the window unchanged
  CHECK(mw.bind(lb.b, mr, {0, 64}, rw_rights).error() == errc::wrong_state);
  CHECK(mw.state() == mw_state::unbound);
  CHECK(mw.pending() == 0);
  CHECK(mw.rkey() == k0);
  lb.recover();
  expect_no_completion(lb.cq_b, 100ms); // nothing of the refused batches ran after reconnecting
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  CHECK(d.rkey == ibv_inc_rkey(k0));
  REQUIRE(lb.write(ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data(), 64, 0x19));
  invalidate_wait(mw, lb.b, lb.cq_b);
}

TEST_CASE("a batch holds SendBatch::max_undo window operations; one more is refused cleanly", "[mw][undo]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  std::vector<MemoryWindow> ws;
  for (std::size_t i = 0; i <= SendBatch::max_undo; ++i)
    ws.push_back(need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw"));
  const std::uint32_t last_key = ws.back().rkey();
  {
    auto batch = lb.b.start_send();
    for (std::size_t i = 0; i < SendBatch::max_undo; ++i)
      REQUIRE(ws[i].bind(batch, lb.b, mr, {64 * i, 64}, rw_rights, {20 + i}).has_value());
    CHECK(ws.back().bind(batch, lb.b, mr, {0, 64}, rw_rights, {30}).error() == errc::too_many_pending);
    CHECK(ws.back().state() == mw_state::unbound);
    CHECK(ws.back().pending() == 0);
    CHECK(ws.back().rkey() == last_key);
    CHECK(mr.bound_windows() == SendBatch::max_undo);
  }
  for (const auto &w : ws) {
    CHECK(w.state() == mw_state::unbound);
    CHECK(w.pending() == 0);
  }
  CHECK(mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  expect_no_completion(lb.cq_b, 100ms);
}

TEST_CASE("remote invalidate: the peer's send-with-invalidate, the owner learns it from its receive", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0x44), src(64, 0xEE), msg(16, 1), rbuf(16, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mm = need(MemoryRegion::reg(lb.pd, msg.data(), msg.size(), access::local_write), "reg msg");
  auto mrb = need(MemoryRegion::reg(lb.pd, rbuf.data(), rbuf.size(), access::local_write), "reg rbuf");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 1024}, rw_rights);
  need(lb.b.post_recv(900, mrb.sge()), "post_recv");
  {
    auto batch = lb.a.start_send();
    const ibv_sge s = mm.sge();
    batch.send_inv({901, send_flag::signaled}, d.rkey, std::span<const ibv_sge>(&s, 1));
    need(batch.submit(), "send_inv");
  }
  wait_one(lb.cq_a);
  const ibv_wc r = wait_one(lb.cq_b);
  INFO("recv wc_flags " << r.wc_flags << " invalidated_rkey " << r.invalidated_rkey);
  CHECK(r.opcode == IBV_WC_RECV);
  CHECK(r.invalidated_rkey == d.rkey);
  WARN("rxe remote-invalidate receive: wc_flags=" << r.wc_flags
                                                  << ((r.wc_flags & IBV_WC_WITH_INV) ? " (WITH_INV set)"
                                                                                     : " (WITH_INV not set)"));
  CHECK(mw.complete(r));
  CHECK(mw.state() == mw_state::invalidated);
  CHECK(mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // The library now refuses a local invalidate (remote-then-local panics rxe).
  CHECK(mw.invalidate(lb.b).error() == errc::not_bound);
  CHECK(lb.write(ms.sge(), d.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(mem.data(), mem.size(), 0x44));
  lb.recover();
  // It can be bound again, with a new key.
  const auto d2 = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  CHECK(d2.rkey != d.rkey);
  REQUIRE(lb.write(ms.sge(), d2.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data(), 64, 0xEE));
  CHECK(mw.destroy().has_value()); // revoked for good
}

TEST_CASE("several windows over one region, different rights and ranges for different peers", "[mw]") {
  loopback lb;           // peer 1: a -> b
  qp_pair p2(lb.ctx, lb.pd); // peer 2: p2.a -> p2.b
  std::vector<unsigned char> mem(4096, 0), src(256, 0x61), back(256, 0);
  fill(mem.data(), mem.size(), 9);
  const std::vector<unsigned char> orig = mem;
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  auto w1 = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc w1");
  auto w2 = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc w2");
  const auto d1 = bind_wait(w1, lb.b, lb.cq_b, mr, {0, 1024}, rw_rights);
  const auto d2 = bind_wait(w2, p2.b, p2.cq_b, mr, {2048, 1024}, access::remote_read, 101);
  CHECK(mr.bound_windows() == 2);
  CHECK(d1.rkey != d2.rkey);

  REQUIRE(lb.write(ms.sge(), d1.at(100)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data() + 100, 256, 0x61));
  REQUIRE(p2.read(mb.sge(), d2.at(0)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), orig.data() + 2048, 256) == 0);
  // Peer 2's window is read-only.
  CHECK(p2.write(ms.sge(), d2.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::memcmp(mem.data() + 2048, orig.data() + 2048, 2048) == 0);
  p2.recover();
  // A type-2B window serves only the QP it was bound through: peer 2 cannot use peer 1's key.
  CHECK(p2.write(ms.sge(), d1.at(0)) == IBV_WC_REM_ACCESS_ERR);
  p2.recover();

  // Revoke peer 1 for good; peer 2 keeps working.
  need(w1.destroy(), "dealloc w1");
  CHECK(mr.bound_windows() == 1);
  std::memset(src.data(), 0x62, src.size());
  const std::vector<unsigned char> before = mem;
  CHECK(lb.write(ms.sge(), d1.at(100)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(mem == before);
  std::memset(back.data(), 0, back.size());
  REQUIRE(p2.read(mb.sge(), d2.at(512)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), orig.data() + 2048 + 512, 256) == 0);
  invalidate_wait(w2, p2.b, p2.cq_b);
}

TEST_CASE("deregistering a region with a bound window is refused with busy, not leaked", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type1), "alloc_mw");
  bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, access::remote_read);
  auto r = mr.destroy();
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::busy);
  CHECK(mr);                      // still registered and usable
  CHECK(mr.lkey() != 0);
  need(mw.unbind(lb.b, {7, send_flag::signaled}), "unbind");
  CHECK(mw.complete(wait_one(lb.cq_b)));
  CHECK(mr.bound_windows() == 0);
  need(mr.destroy(), "dereg after unbind");
  CHECK_FALSE(mr);
}

TEST_CASE("destroying a QP with a bound type-2 window returns promptly", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto qp = need(QueuePair::create(lb.pd, lb.cq_b, lb.cq_b), "create qp");
  auto peer = need(QueuePair::create(lb.pd, lb.cq_a, lb.cq_a), "create peer");
  need(connect_loopback(peer, qp), "connect");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  bind_wait(mw, qp, lb.cq_b, mr, {0, 64}, access::remote_read);
  CHECK(qp.live_children() == 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = qp.destroy(); // rxe would block ~50 s in ibv_destroy_qp
  const auto refused_in = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::busy);
  CHECK(refused_in < 1s);
  need(mw.destroy(), "dealloc window");
  const auto t1 = std::chrono::steady_clock::now();
  need(qp.destroy(), "destroy qp");
  const auto destroyed_in = std::chrono::steady_clock::now() - t1;
  WARN("QP destroy after the window was deallocated: "
       << std::chrono::duration_cast<std::chrono::milliseconds>(destroyed_in).count() << " ms");
  CHECK(destroyed_in < 5s);
  need(peer.destroy(), "destroy peer");
}

namespace {
std::vector<destroy_failure> reported;
void capture(const destroy_failure &f) noexcept { reported.push_back(f); }
} // namespace

TEST_CASE("a region and a QP destroyed under a bound window go when the window goes", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0);
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  {
    auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
    auto qp = need(QueuePair::create(lb.pd, lb.cq_b, lb.cq_b), "create qp");
    auto peer = need(QueuePair::create(lb.pd, lb.cq_a, lb.cq_a), "create peer");
    need(connect_loopback(peer, qp), "connect");
    bind_wait(mw, qp, lb.cq_b, mr, {0, 64}, access::remote_read);
    reported.clear();
    auto old = set_destroy_failure_handler(&capture);
    const auto t0 = std::chrono::steady_clock::now();
    mr = MemoryRegion{}; // the window still uses both: reported, destruction deferred
    qp = QueuePair{};
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    set_destroy_failure_handler(old);
    REQUIRE(reported.size() == 2);
    CHECK(std::string(reported[0].object) == "MemoryRegion");
    CHECK(std::string(reported[1].object) == "QueuePair");
    CHECK(reported[0].error == errc::busy);
  }
  CHECK(lb.pd.live_children() == 5); // a, b, the window, the deferred MR and QP
  const auto t1 = std::chrono::steady_clock::now();
  need(mw.destroy(), "dealloc"); // the window goes first, then the MR and the QP
  CHECK(std::chrono::steady_clock::now() - t1 < 5s);
  CHECK(lb.pd.live_children() == 2);
}

TEST_CASE("what a strict grant costs against a type-2 bind + invalidate (printed, not asserted)", "[mw]") {
  loopback lb;
  std::vector<unsigned char> mem(1 << 20, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
  constexpr int cycles = 50;
  using clock = std::chrono::steady_clock;
  auto per_cycle_us = [](clock::duration d) {
    return double(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()) / 1000.0 / cycles;
  };
  // (a) grant + revoke through one window: bind and invalidate chained, one completion.
  const auto t0 = clock::now();
  for (int i = 0; i < cycles; ++i) {
    auto batch = lb.b.start_send();
    REQUIRE(mw.bind(batch, lb.b, mr, {4096, 4096}, rw_rights, {1}).has_value());
    REQUIRE(mw.invalidate(batch, lb.b, {2, send_flag::signaled}).has_value());
    need(batch.submit(), "submit");
    REQUIRE(mw.complete(wait_one(lb.cq_b)));
  }
  const auto window_cycle = per_cycle_us(clock::now() - t0);
  // (b) strict grant + revoke: register the exact range, bind, deallocate, deregister.
  const auto t1 = clock::now();
  for (int i = 0; i < cycles; ++i) {
    auto g = need(StrictGrant::create(lb.pd, mr, {4096, 4096}, mw_type::type2, accept_risk), "strict grant");
    need(g.grant(lb.b, rw_rights, {3, send_flag::signaled}), "strict bind");
    REQUIRE(g.window().complete(wait_one(lb.cq_b)));
    need(g.destroy(), "revoke");
  }
  const auto strict_cycle = per_cycle_us(clock::now() - t1);
  // (c) a 64 B RDMA write round trip, the unit of REFERENCE's relative costs.
  std::vector<unsigned char> src(64, 1), dst(64, 0);
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const auto t2 = clock::now();
  for (int i = 0; i < cycles; ++i) REQUIRE(lb.write(ms.sge(), {md.iova(), md.rkey()}) == IBV_WC_SUCCESS);
  const auto write_rt = per_cycle_us(clock::now() - t2);
  WARN("grant+revoke of 4 KiB on " << lb.ctx.name() << " (" << cycles << " cycles): type-2 bind+invalidate "
       << window_cycle << " us (" << window_cycle / write_rt << "x a 64 B write round trip of " << write_rt
       << " us); strict grant (reg exact MR + bind + dealloc + dereg) " << strict_cycle << " us ("
       << strict_cycle / write_rt << "x), " << strict_cycle / window_cycle << "x the window cycle");
  need(mw.destroy(), "dealloc");
}
