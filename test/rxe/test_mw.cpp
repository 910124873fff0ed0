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

/// The setup the cases share: the loopback pair (QP b is the owner, it binds; QP a is the peer),
/// the owner's memory `mem` (`mem_bytes` bytes of `mem_fill`) registered with no remote rights
/// (`mr`), the peer's source `src` (`src_bytes` of `src_fill`; none when 0) registered for local
/// access (`ms`), and one window `mw` of type `t` on the PD, unbound.
struct window_fixture : loopback {
  std::vector<unsigned char> mem, src;
  MemoryRegion mr, ms;
  MemoryWindow mw;
  window_fixture(mw_type t, std::size_t mem_bytes, unsigned char mem_fill, std::size_t src_bytes = 0,
                 unsigned char src_fill = 0)
      : mem(mem_bytes, mem_fill), src(src_bytes, src_fill),
        mr(need(MemoryRegion::reg(pd, mem.data(), mem.size(), owner_access), "reg owner")),
        ms(src_bytes ? need(MemoryRegion::reg(pd, src.data(), src.size(), access::local_write), "reg src")
                     : MemoryRegion{}),
        mw(need(MemoryWindow::alloc(pd, t, accept_risk), "alloc_mw")) {}
  /// bind_wait() of `mw` over `r` of `mr` through QP b.
  remote_descriptor bind(window_range r, access_flags rights, std::uint64_t id = 100) {
    return bind_wait(mw, b, cq_b, mr, r, rights, id);
  }
  /// invalidate_wait() of `mw` through QP b.
  void invalidate() { invalidate_wait(mw, b, cq_b); }
};

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
  window_fixture lb(t, 8192, 0x11, 512);
  fill(lb.src.data(), lb.src.size(), 7);
  std::vector<unsigned char> back(512, 0);
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  // The region itself grants nothing remotely (its rkey: 0 on Linux 6.1, its lkey on 6.12).
  check_local_only_rkey(lb, lb.mr, lb.mem.data(), lb.mem.size(), lb.ms, lb.src.data(), lb.src.size());
  const auto d = lb.bind({1024, 512}, rw_rights);
  CHECK(lb.mw.state() == mw_state::bound);
  CHECK(d.rkey == lb.mw.rkey());
  CHECK(d.addr == lb.mr.iova() + 1024);
  CHECK(d.length == 512);
  CHECK(d.rights == rw_rights);
  CHECK(lb.mr.bound_windows() == 1);
  CHECK(lb.b.live_children() == (t == mw_type::type2 ? 1u : 0u));

  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(lb.mem.data() + 1024, lb.src.data(), 512) == 0);
  CHECK(all_equal(lb.mem.data(), 1024, 0x11));
  CHECK(all_equal(lb.mem.data() + 1536, lb.mem.size() - 1536, 0x11));
  REQUIRE(lb.read(mb.sge(0, 256), d.at(256)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), lb.src.data() + 256, 256) == 0);
  CHECK(all_equal(back.data() + 256, 256, 0));

  if (t == mw_type::type2) {
    lb.invalidate();
    CHECK(lb.b.live_children() == 0);
  } else {
    need(lb.mw.unbind(lb.b, {300, send_flag::signaled}), "unbind");
    CHECK(lb.mw.complete(wait_one(lb.cq_b)));
    CHECK(lb.mw.state() == mw_state::unbound);
  }
  CHECK(lb.mr.bound_windows() == 0);
  CHECK(lb.mw.pending() == 0);
}

TEST_CASE("type 1 through the work-request path: bind and unbind in a batch", "[mw]") {
  window_fixture lb(mw_type::type1, 4096, 0x22, 64, 0x5C);
  const std::uint32_t k0 = lb.mw.rkey();
  remote_descriptor d;
  {
    auto batch = lb.b.start_send();
    d = need(lb.mw.bind(batch, lb.b, lb.mr, {64, 64}, rw_rights, {1, send_flag::signaled}), "bind");
    need(batch.submit(), "submit");
  }
  CHECK(lb.mw.complete(wait_one(lb.cq_b)));
  CHECK(d.rkey == ibv_inc_rkey(k0));
  CHECK(lb.mw.native_handle()->rkey == d.rkey);
  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data() + 64, 64, 0x5C));
  {
    auto batch = lb.b.start_send();
    need(lb.mw.unbind(batch, lb.b, {2, send_flag::signaled}), "unbind");
    need(batch.submit(), "submit");
  }
  CHECK(lb.mw.complete(wait_one(lb.cq_b)));
  CHECK(lb.mw.state() == mw_state::unbound);
  CHECK(lb.mr.bound_windows() == 0);
  std::memset(lb.src.data(), 0x99, lb.src.size());
  CHECK(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(lb.mem.data() + 64, 64, 0x5C));
  CHECK(all_equal(lb.mem.data(), 64, 0x22));
}

TEST_CASE("a zero-based type-2 window: the peer addresses offsets", "[mw]") {
  window_fixture lb(mw_type::type2, 4096, 0, 32, 0x7E);
  const auto d = lb.bind({2048, 256}, rw_rights | access::zero_based);
  CHECK(d.zero_based);
  CHECK(d.addr == 0);
  REQUIRE(lb.write(lb.ms.sge(), d.at(16)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data() + 2048 + 16, 32, 0x7E));
  CHECK(all_equal(lb.mem.data(), 2048 + 16, 0));
  CHECK(all_equal(lb.mem.data() + 2048 + 48, 4096 - 2048 - 48, 0));
  // Zero-based type-1 binds fail on rxe; the library refuses them first.
  auto w1 = need(MemoryWindow::alloc(lb.pd, mw_type::type1), "alloc_mw 1");
  CHECK(w1.bind(lb.b, lb.mr, {0, 64}, access::remote_read | access::zero_based).error() == errc::wrong_type);
  lb.invalidate();
}

TEST_CASE("window rights are enforced: a write through a read-only window fails, memory unchanged", "[mw]") {
  const mw_type t = GENERATE(mw_type::type1, mw_type::type2);
  INFO(type_name(t));
  window_fixture lb(t, 4096, 0x33, 128, 0xC4);
  std::vector<unsigned char> back(128, 0);
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  const auto d = lb.bind({0, 1024}, access::remote_read);
  REQUIRE(lb.read(mb.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(back.data(), back.size(), 0x33));
  const auto st = lb.write(lb.ms.sge(), d.at(0));
  CHECK(st == IBV_WC_REM_ACCESS_ERR);
  CHECK(wc_error(st) == std::errc::permission_denied);
  CHECK(all_equal(lb.mem.data(), lb.mem.size(), 0x33));
  lb.recover();
  // And a write-only window refuses reads.
  auto wo = need(MemoryWindow::alloc(lb.pd, t, accept_risk), "alloc wo");
  const auto dw = bind_wait(wo, lb.b, lb.cq_b, lb.mr, {2048, 1024}, access::remote_write, 101);
  std::memset(back.data(), 0, back.size());
  CHECK(lb.read(mb.sge(), dw.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(back.data(), back.size(), 0));
}

TEST_CASE("type 2: bind and invalidate chained in one batch with one completion", "[mw]") {
  window_fixture lb(mw_type::type2, 4096, 0, 64, 0xA5);
  std::uint32_t last = lb.mw.rkey();
  for (int cycle = 0; cycle < 20; ++cycle) {
    {
      auto batch = lb.b.start_send();
      auto d = lb.mw.bind(batch, lb.b, lb.mr, {0, 4096}, rw_rights, {10});
      REQUIRE(d.has_value());
      REQUIRE(lb.mw.invalidate(batch, lb.b, {11, send_flag::signaled}).has_value());
      CHECK(lb.mw.pending() == 2);
      need(batch.submit(), "submit");
    }
    const ibv_wc wc = wait_one(lb.cq_b);
    CHECK(wc.wr_id == 11);
    CHECK(lb.mw.complete(wc)); // confirms the bind too
    CHECK(lb.mw.pending() == 0);
    CHECK(lb.mw.state() == mw_state::invalidated);
    CHECK(lb.mw.rkey() == ibv_inc_rkey(last));
    last = lb.mw.rkey();
  }
  expect_no_completion(lb.cq_b, 100ms);
  CHECK(lb.mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // The tracked key is right: a normal bind after 20 cycles works.
  const auto d = lb.bind({0, 64}, rw_rights);
  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data(), 64, 0xA5));
  lb.invalidate();
}

TEST_CASE("batch forms default to window_wr_id: the caller's own failed id-0 request leaves the window bound",
          "[mw][undo]") {
  // A bind added to a batch without a wr used id 0, the id most other work requests carry: the
  // failed completion of the caller's own write then rolled the window back to unbound while its
  // bind had executed, and the key was never revoked.
  window_fixture lb(mw_type::type2, 4096, 0, 64, 0x5A);
  {
    auto batch = lb.b.start_send();
    REQUIRE(lb.mw.bind(batch, lb.b, lb.mr, {0, 4096}, rw_rights).has_value());
    // The caller's own write, id 0, signaled: to the region's key, which has no remote rights.
    batch.write({0, send_flag::signaled}, {lb.mr.iova(), lb.mr.rkey()}, lb.ms.sge());
    need(batch.submit(), "submit");
  }
  const ibv_wc wc = wait_wc(lb.cq_b, 1).front();
  INFO("write completion: " << ibv_wc_status_str(wc.status));
  REQUIRE(wc.status != IBV_WC_SUCCESS);
  CHECK(wc.wr_id == 0);
  CHECK_FALSE(lb.mw.complete(wc)); // not the window's
  CHECK(lb.mw.state() == mw_state::bound);
  CHECK(lb.mw.pending() == 1);
  CHECK(lb.mr.bound_windows() == 1);
  CHECK(all_equal(lb.mem.data(), lb.mem.size(), 0));
}

TEST_CASE("a bind that completes with an error rolls state, key and counts back", "[mw]") {
  window_fixture lb(mw_type::type2, 4096, 0, 64, 0x3C);
  const std::uint32_t k0 = lb.mw.rkey();
  need(lb.b.to_error(), "b to ERR"); // the bind will be flushed
  auto d = need(lb.mw.bind(lb.b, lb.mr, {0, 64}, rw_rights, {5, send_flag::signaled}), "bind");
  CHECK(lb.mw.state() == mw_state::bound); // as posted
  CHECK(lb.mr.bound_windows() == 1);
  const ibv_wc wc = wait_wc(lb.cq_b, 1).front();
  INFO("bind completion: " << ibv_wc_status_str(wc.status));
  CHECK(wc.status != IBV_WC_SUCCESS);
  CHECK(lb.mw.complete(wc));
  CHECK(lb.mw.state() == mw_state::unbound);
  CHECK(lb.mw.rkey() == k0);
  CHECK(lb.mw.native_handle()->rkey == k0);
  CHECK(lb.mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // Nothing to invalidate: refused, not posted (rxe would panic).
  CHECK(lb.mw.invalidate(lb.b).error() == errc::not_bound);
  lb.recover();
  // With the key rolled back, the next bind is accepted by the kernel.
  d = lb.bind({0, 64}, rw_rights);
  CHECK(d.rkey == ibv_inc_rkey(k0));
  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data(), 64, 0x3C));
  lb.invalidate();
}

TEST_CASE("a batch dropped after a bind rolls the window back by itself", "[mw][undo]") {
  window_fixture lb(mw_type::type2, 4096, 0, 64, 0x5A);
  std::vector<unsigned char> other(4096, 0);
  auto mr_dropped = need(MemoryRegion::reg(lb.pd, other.data(), other.size(), owner_access), "reg other");
  const std::uint32_t k0 = lb.mw.rkey();
  {
    auto batch = lb.b.start_send();
    REQUIRE(lb.mw.bind(batch, lb.b, mr_dropped, {0, 64}, rw_rights, {1, send_flag::signaled}).has_value());
    CHECK(lb.mw.state() == mw_state::bound); // as posted
    CHECK(mr_dropped.bound_windows() == 1);
  } // dropped: aborted, and the batch undoes the bind
  CHECK(lb.mw.state() == mw_state::unbound);
  CHECK(lb.mw.rkey() == k0);
  CHECK(lb.mw.native_handle()->rkey == k0);
  CHECK(lb.mw.pending() == 0);
  CHECK(mr_dropped.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  CHECK(mr_dropped.destroy().has_value()); // not busy: the window no longer counts on it
  expect_no_completion(lb.cq_b, 100ms);
  // A normal cycle still works, with the key after k0 (the kernel never saw the dropped one).
  const auto d = lb.bind({0, 64}, rw_rights);
  CHECK(d.rkey == ibv_inc_rkey(k0));
  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data(), 64, 0x5A));
  lb.invalidate();
}

TEST_CASE("a dropped batch undoes only its own window operations", "[mw][undo]") {
  window_fixture lb(mw_type::type2, 4096, 0, 64, 0x77);
  const auto d = lb.bind({0, 64}, rw_rights);
  {
    // a bind confirmed before, then an invalidate in a batch that is dropped
    auto batch = lb.b.start_send();
    REQUIRE(lb.mw.invalidate(batch, lb.b, {12, send_flag::signaled}).has_value());
    CHECK(lb.mw.state() == mw_state::invalidated);
  }
  CHECK(lb.mw.state() == mw_state::bound);
  CHECK(lb.mw.rkey() == d.rkey);
  CHECK(lb.mw.pending() == 0);
  CHECK(lb.mr.bound_windows() == 1);
  CHECK(lb.b.live_children() == 1);
  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS); // the grant still works
  CHECK(all_equal(lb.mem.data(), 64, 0x77));
  {
    // bind and invalidate of one window in one dropped batch: back to before both
    lb.invalidate();
    const std::uint32_t k1 = lb.mw.rkey();
    std::optional<SendBatch> batch(lb.b.start_send()); // moved in: the undo list moves with it
    REQUIRE(lb.mw.bind(*batch, lb.b, lb.mr, {0, 64}, rw_rights, {13}).has_value());
    REQUIRE(lb.mw.invalidate(*batch, lb.b, {14, send_flag::signaled}).has_value());
    CHECK(lb.mw.pending() == 2);
    batch.reset(); // dropped
    CHECK(lb.mw.state() == mw_state::invalidated);
    CHECK(lb.mw.rkey() == k1);
    CHECK(lb.mw.pending() == 0);
    CHECK(lb.mr.bound_windows() == 0);
  }
  expect_no_completion(lb.cq_b, 100ms);
  lb.bind({0, 64}, rw_rights);
  lb.invalidate();
}

TEST_CASE("a batch whose submit fails (QP not at RTS) rolls its window operations back", "[mw][undo]") {
  window_fixture lb(mw_type::type2, 4096, 0, 64, 0x19);
  const std::uint32_t k0 = lb.mw.rkey();
  need(lb.b.to_reset(), "b to RESET");
  {
    auto batch = lb.b.start_send();
    REQUIRE(lb.mw.bind(batch, lb.b, lb.mr, {0, 64}, rw_rights, {3, send_flag::signaled}).has_value());
    CHECK(lb.mw.pending() == 1);
    const auto r = batch.submit();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::wrong_state);
    // rolled back before submit() returned
    CHECK(lb.mw.state() == mw_state::unbound);
    CHECK(lb.mw.rkey() == k0);
    CHECK(lb.mw.native_handle()->rkey == k0);
    CHECK(lb.mw.pending() == 0);
    CHECK(lb.mr.bound_windows() == 0);
    CHECK(lb.b.live_children() == 0);
  }
  // the posting form too: its failed submit leaves the window unchanged
  CHECK(lb.mw.bind(lb.b, lb.mr, {0, 64}, rw_rights).error() == errc::wrong_state);
  CHECK(lb.mw.state() == mw_state::unbound);
  CHECK(lb.mw.pending() == 0);
  CHECK(lb.mw.rkey() == k0);
  lb.recover();
  expect_no_completion(lb.cq_b, 100ms); // nothing of the refused batches ran after reconnecting
  const auto d = lb.bind({0, 64}, rw_rights);
  CHECK(d.rkey == ibv_inc_rkey(k0));
  REQUIRE(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data(), 64, 0x19));
  lb.invalidate();
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
  window_fixture lb(mw_type::type2, 4096, 0x44, 64, 0xEE);
  std::vector<unsigned char> msg(16, 1), rbuf(16, 0);
  auto mm = need(MemoryRegion::reg(lb.pd, msg.data(), msg.size(), access::local_write), "reg msg");
  auto mrb = need(MemoryRegion::reg(lb.pd, rbuf.data(), rbuf.size(), access::local_write), "reg rbuf");
  const auto d = lb.bind({0, 1024}, rw_rights);
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
  CHECK(lb.mw.complete(r));
  CHECK(lb.mw.state() == mw_state::invalidated);
  CHECK(lb.mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // The library now refuses a local invalidate (remote-then-local panics rxe).
  CHECK(lb.mw.invalidate(lb.b).error() == errc::not_bound);
  CHECK(lb.write(lb.ms.sge(), d.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(lb.mem.data(), lb.mem.size(), 0x44));
  lb.recover();
  // It can be bound again, with a new key.
  const auto d2 = lb.bind({0, 64}, rw_rights);
  CHECK(d2.rkey != d.rkey);
  REQUIRE(lb.write(lb.ms.sge(), d2.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data(), 64, 0xEE));
  CHECK(lb.mw.destroy().has_value()); // revoked for good
}

TEST_CASE("several windows over one region, different rights and ranges for different peers", "[mw]") {
  window_fixture lb(mw_type::type2, 4096, 0, 256, 0x61); // peer 1: a -> b, its window lb.mw
  qp_pair p2(lb.ctx, lb.pd); // peer 2: p2.a -> p2.b
  fill(lb.mem.data(), lb.mem.size(), 9);
  const std::vector<unsigned char> orig = lb.mem;
  std::vector<unsigned char> back(256, 0);
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  auto w2 = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc w2");
  const auto d1 = lb.bind({0, 1024}, rw_rights);
  const auto d2 = bind_wait(w2, p2.b, p2.cq_b, lb.mr, {2048, 1024}, access::remote_read, 101);
  CHECK(lb.mr.bound_windows() == 2);
  CHECK(d1.rkey != d2.rkey);

  REQUIRE(lb.write(lb.ms.sge(), d1.at(100)) == IBV_WC_SUCCESS);
  CHECK(all_equal(lb.mem.data() + 100, 256, 0x61));
  REQUIRE(p2.read(mb.sge(), d2.at(0)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), orig.data() + 2048, 256) == 0);
  // Peer 2's window is read-only.
  CHECK(p2.write(lb.ms.sge(), d2.at(0)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(std::memcmp(lb.mem.data() + 2048, orig.data() + 2048, 2048) == 0);
  p2.recover();
  // A type-2B window serves only the QP it was bound through: peer 2 cannot use peer 1's key.
  CHECK(p2.write(lb.ms.sge(), d1.at(0)) == IBV_WC_REM_ACCESS_ERR);
  p2.recover();

  // Revoke peer 1 for good; peer 2 keeps working.
  need(lb.mw.destroy(), "dealloc w1");
  CHECK(lb.mr.bound_windows() == 1);
  std::memset(lb.src.data(), 0x62, lb.src.size());
  const std::vector<unsigned char> before = lb.mem;
  CHECK(lb.write(lb.ms.sge(), d1.at(100)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(lb.mem == before);
  std::memset(back.data(), 0, back.size());
  REQUIRE(p2.read(mb.sge(), d2.at(512)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), orig.data() + 2048 + 512, 256) == 0);
  invalidate_wait(w2, p2.b, p2.cq_b);
}

TEST_CASE("deregistering a region with a bound window is refused with busy, not leaked", "[mw]") {
  window_fixture lb(mw_type::type1, 4096, 0);
  lb.bind({0, 64}, access::remote_read);
  auto r = lb.mr.destroy();
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::busy);
  CHECK(lb.mr); // still registered and usable
  CHECK(lb.mr.lkey() != 0);
  need(lb.mw.unbind(lb.b, {7, send_flag::signaled}), "unbind");
  CHECK(lb.mw.complete(wait_one(lb.cq_b)));
  CHECK(lb.mr.bound_windows() == 0);
  need(lb.mr.destroy(), "dereg after unbind");
  CHECK_FALSE(lb.mr);
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
  window_fixture lb(mw_type::type2, 1 << 20, 0, 64, 1);
  constexpr int cycles = 50;
  using clock = std::chrono::steady_clock;
  auto per_cycle_us = [](clock::duration d) {
    return double(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()) / 1000.0 / cycles;
  };
  // (a) grant + revoke through one window: bind and invalidate chained, one completion.
  const auto t0 = clock::now();
  for (int i = 0; i < cycles; ++i) {
    auto batch = lb.b.start_send();
    REQUIRE(lb.mw.bind(batch, lb.b, lb.mr, {4096, 4096}, rw_rights, {1}).has_value());
    REQUIRE(lb.mw.invalidate(batch, lb.b, {2, send_flag::signaled}).has_value());
    need(batch.submit(), "submit");
    REQUIRE(lb.mw.complete(wait_one(lb.cq_b)));
  }
  const auto window_cycle = per_cycle_us(clock::now() - t0);
  // (b) strict grant + revoke: register the exact range, bind, deallocate, deregister.
  const auto t1 = clock::now();
  for (int i = 0; i < cycles; ++i) {
    auto g = need(StrictGrant::create(lb.pd, lb.mr, {4096, 4096}, mw_type::type2, accept_risk), "strict grant");
    need(g.grant(lb.b, rw_rights, {3, send_flag::signaled}), "strict bind");
    REQUIRE(g.window().complete(wait_one(lb.cq_b)));
    need(g.destroy(), "revoke");
  }
  const auto strict_cycle = per_cycle_us(clock::now() - t1);
  // (c) a 64 B RDMA write round trip, the unit of REFERENCE's relative costs.
  std::vector<unsigned char> dst(64, 0);
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const auto t2 = clock::now();
  for (int i = 0; i < cycles; ++i) REQUIRE(lb.write(lb.ms.sge(), {md.iova(), md.rkey()}) == IBV_WC_SUCCESS);
  const auto write_rt = per_cycle_us(clock::now() - t2);
  WARN("grant+revoke of 4 KiB on " << lb.ctx.name() << " (" << cycles << " cycles): type-2 bind+invalidate "
       << window_cycle << " us (" << window_cycle / write_rt << "x a 64 B write round trip of " << write_rt
       << " us); strict grant (reg exact MR + bind + dealloc + dereg) " << strict_cycle << " us ("
       << strict_cycle / write_rt << "x), " << strict_cycle / window_cycle << "x the window cycle");
  need(lb.mw.destroy(), "dealloc");
}
