// [core] device tests on a real rxe device.
#include "fixture.hpp"

#include <array>
#include <cstring>
#include <vector>

using namespace rxe;

TEST_CASE("the device reports memory-window types 1 and 2B", "[core]") {
  Context ctx = open_device();
  auto caps = need(ctx.query_capabilities(), "query_capabilities");
  INFO("device " << caps.name);
  CHECK(caps.mw_type1);
  CHECK(caps.mw_type2b);
  CHECK(caps.max_mw > 0);
  CHECK(caps.max_mr > 0);
  CHECK(caps.max_sge > 0);
  CHECK(caps.max_inline_data > 0);
  CHECK_FALSE(caps.mlx5dv);
  // Not an mlx5 device: opened with ibv_open_device, no DEVX context.
  CHECK_FALSE(ctx.mlx5_devx());
  CHECK_FALSE(caps.mlx5_devx);
  if (std::string_view(caps.name).rfind("rxe", 0) == 0) {
    // rxe has no ibv_rereg_mr: the live probe must say so.
    CHECK(caps.native_rereg == tristate::no);
  }
  auto port = need(ctx.query_port(1), "query_port");
  CHECK(port.state == IBV_PORT_ACTIVE);
}

TEST_CASE("RDMA write between loopback QPs delivers exactly the bytes sent", "[core]") {
  loopback lb;
  std::vector<unsigned char> src(8192), dst(8192 + 64, 0xEE);
  fill(src.data(), src.size(), 1);
  auto msrc = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mdst = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  REQUIRE(lb.write(msrc.sge(0, 8192), {mdst.iova() + 32, mdst.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(dst.data() + 32, src.data(), 8192) == 0);
  CHECK(all_equal(dst.data(), 32, 0xEE));                // before the target range
  CHECK(all_equal(dst.data() + 32 + 8192, 32, 0xEE));    // after it
}

// The provider's poll entry is cached in the CompletionQueue and moves with it.
TEST_CASE("a moved CompletionQueue polls its completions; the moved-from one answers EINVAL", "[core]") {
  loopback lb;
  std::vector<unsigned char> src(64), dst(64, 0xEE);
  fill(src.data(), src.size(), 3);
  auto msrc = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mdst = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  auto b = lb.a.start_send();
  b.write({.id = 0x51, .flags = send_flag::signaled}, {mdst.iova(), mdst.rkey()}, msrc.sge(0, 64));
  REQUIRE(b.submit().has_value());
  CompletionQueue moved = std::move(lb.cq_a);
  std::array<ibv_wc, 2> wc{};
  CHECK(lb.cq_a.poll(wc).error() == std::errc::invalid_argument);
  const std::size_t n = need(moved.wait(wc, 5000), "wait on the moved CQ");
  REQUIRE(n == 1);
  CHECK(wc[0].wr_id == 0x51);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(std::memcmp(dst.data(), src.data(), 64) == 0);
  lb.cq_a = std::move(moved); // back, so that the QPs are destroyed first
  CHECK(need(lb.cq_a.poll(wc), "poll after moving back") == 0);
}

TEST_CASE("RDMA read fetches the peer's bytes", "[core]") {
  loopback lb;
  std::vector<unsigned char> remote(4096), local(4096, 0);
  fill(remote.data(), remote.size(), 2);
  auto mr = need(MemoryRegion::reg(lb.pd, remote.data(), remote.size(), remote_rw), "reg remote");
  auto ml = need(MemoryRegion::reg(lb.pd, local.data(), local.size(), access::local_write), "reg local");
  REQUIRE(lb.read(ml.sge(0, 1000), {mr.iova() + 100, mr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(local.data(), remote.data() + 100, 1000) == 0);
  CHECK(all_equal(local.data() + 1000, local.size() - 1000, 0));
}

TEST_CASE("send/recv and send-with-immediate deliver data to a posted receive", "[core]") {
  loopback lb;
  std::array<unsigned char, 512> msg{}, rbuf{};
  fill(msg.data(), msg.size(), 3);
  auto ms = need(MemoryRegion::reg(lb.pd, msg.data(), msg.size(), access::local_write), "reg msg");
  auto mr = need(MemoryRegion::reg(lb.pd, rbuf.data(), rbuf.size(), access::local_write), "reg rbuf");
  need(lb.b.post_recv(77, mr.sge()), "post_recv");
  need(lb.b.post_recv(78, mr.sge()), "post_recv");
  {
    auto batch = lb.a.start_send();
    batch.send({5, send_flag::signaled}, ms.sge(0, 300));
    need(batch.submit(), "submit send");
  }
  wait_one(lb.cq_a);
  const ibv_wc r = wait_one(lb.cq_b);
  CHECK(r.wr_id == 77);
  CHECK(r.opcode == IBV_WC_RECV);
  CHECK(r.byte_len == 300);
  CHECK(std::memcmp(rbuf.data(), msg.data(), 300) == 0);

  std::fill(rbuf.begin(), rbuf.end(), 0);
  {
    auto batch = lb.a.start_send();
    batch.send_imm({6, send_flag::signaled}, htobe32(0xC0FFEE), ms.sge(0, 16));
    need(batch.submit(), "submit send_imm");
  }
  wait_one(lb.cq_a);
  const ibv_wc ri = wait_one(lb.cq_b);
  CHECK(ri.wr_id == 78);
  CHECK((ri.wc_flags & IBV_WC_WITH_IMM) != 0);
  CHECK(be32toh(ri.imm_data) == 0xC0FFEEu);
  CHECK(std::memcmp(rbuf.data(), msg.data(), 16) == 0);
}

TEST_CASE("an inline write and a batch of several writes with one signal", "[core]") {
  loopback lb;
  std::vector<unsigned char> dst(256, 0);
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const std::array<std::byte, 8> bytes{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4},
                                       std::byte{5}, std::byte{6}, std::byte{7}, std::byte{8}};
  {
    auto batch = lb.a.start_send();
    batch.write_inline({1, {}}, {md.iova() + 0, md.rkey()}, bytes)
        .write_inline({2, {}}, {md.iova() + 100, md.rkey()}, bytes)
        .write_inline({3, send_flag::signaled}, {md.iova() + 200, md.rkey()}, bytes);
    need(batch.submit(), "submit batch");
  }
  const ibv_wc wc = wait_one(lb.cq_a);
  CHECK(wc.wr_id == 3);
  for (std::size_t off : {0u, 100u, 200u})
    CHECK(std::memcmp(dst.data() + off, bytes.data(), bytes.size()) == 0);
  CHECK(all_equal(dst.data() + 8, 92, 0));
}

TEST_CASE("a batch dropped without submit is aborted: nothing is posted", "[core]") {
  loopback lb;
  std::vector<unsigned char> src(64, 0xAB), dst(64, 0);
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  {
    auto batch = lb.a.start_send();
    batch.write({9, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge());
  } // ibv_wr_abort
  expect_no_completion(lb.cq_a);
  CHECK(all_equal(dst.data(), dst.size(), 0));
  // The QP is still usable afterwards.
  CHECK(lb.write(ms.sge(), {md.iova(), md.rkey()}) == IBV_WC_SUCCESS);
  CHECK(all_equal(dst.data(), dst.size(), 0xAB));
}

// The rxe provider's ibv_wr_set_sge_list miscounts SGE lists of unequal lengths (canary in
// [rxe-defect]); SendBatch splits gathers and scatters, and refuses what it cannot split.
TEST_CASE("multi-SGE gather write, scatter read and send of unequal SGEs are right or refused", "[core]") {
  loopback lb;
  std::vector<unsigned char> s1(300), s2(300), dst(128, 0xEE), back(128, 0xDD);
  fill(s1.data(), s1.size(), 41);
  fill(s2.data(), s2.size(), 42);
  auto m1 = need(MemoryRegion::reg(lb.pd, s1.data(), s1.size(), access::local_write), "reg s1");
  auto m2 = need(MemoryRegion::reg(lb.pd, s2.data(), s2.size(), access::local_write), "reg s2");
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  const std::vector<ibv_sge> gather = {m2.sge(17, 3), m1.sge(250, 50), m2.sge(100, 1), m1.sge(0, 6)};
  std::vector<unsigned char> expect;
  expect.insert(expect.end(), s2.begin() + 17, s2.begin() + 20);
  expect.insert(expect.end(), s1.begin() + 250, s1.begin() + 300);
  expect.push_back(s2[100]);
  expect.insert(expect.end(), s1.begin(), s1.begin() + 6);
  {
    auto batch = lb.a.start_send();
    batch.write({3, send_flag::signaled}, {md.iova() + 4, md.rkey()}, std::span<const ibv_sge>(gather));
    need(batch.submit(), "submit gather write");
  }
  // One completion, carrying the caller's wr_id (the split parts are unsignalled).
  const ibv_wc w = wait_one(lb.cq_a);
  CHECK(w.wr_id == 3);
  expect_no_completion(lb.cq_a, 100ms);
  CHECK(std::memcmp(dst.data() + 4, expect.data(), 60) == 0);
  CHECK(all_equal(dst.data(), 4, 0xEE));
  CHECK(all_equal(dst.data() + 64, 64, 0xEE));

  // Scatter read of those 60 bytes into 7 + 40 + 13 bytes of `back` at three places.
  const std::vector<ibv_sge> scatter = {mb.sge(0, 7), mb.sge(50, 40), mb.sge(100, 13)};
  {
    auto batch = lb.a.start_send();
    batch.read({4, send_flag::signaled}, {md.iova() + 4, md.rkey()}, std::span<const ibv_sge>(scatter));
    need(batch.submit(), "submit scatter read");
  }
  CHECK(wait_one(lb.cq_a).wr_id == 4);
  CHECK(std::memcmp(back.data(), expect.data(), 7) == 0);
  CHECK(std::memcmp(back.data() + 50, expect.data() + 7, 40) == 0);
  CHECK(std::memcmp(back.data() + 100, expect.data() + 47, 13) == 0);
  CHECK(all_equal(back.data() + 7, 43, 0xDD));
  CHECK(all_equal(back.data() + 90, 10, 0xDD));
  CHECK(all_equal(back.data() + 113, 15, 0xDD));

  // A send cannot be split: the batch fails, nothing of it (not even the write before it) is posted.
  std::fill(dst.begin(), dst.end(), 0xEE);
  need(lb.b.post_recv(9, md.sge(0, 128)), "post_recv");
  {
    auto batch = lb.a.start_send();
    batch.write({5, send_flag::signaled}, {md.iova(), md.rkey()}, m1.sge(0, 8));
    batch.send({6, send_flag::signaled}, std::span<const ibv_sge>(gather));
    auto r = batch.submit();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::provider_defect);
    CHECK(is_unsupported(r.error()));
  }
  expect_no_completion(lb.cq_a, 200ms);
  expect_no_completion(lb.cq_b, 50ms);
  CHECK(all_equal(dst.data(), dst.size(), 0xEE));
  // Equal lengths go through unchanged, and the QP is fine after the refusal: 2 x 8 bytes.
  const std::vector<ibv_sge> equal = {m1.sge(0, 8), m2.sge(0, 8)};
  {
    auto batch = lb.a.start_send();
    batch.send({7, send_flag::signaled}, std::span<const ibv_sge>(equal));
    need(batch.submit(), "submit equal send");
  }
  CHECK(wait_one(lb.cq_a).wr_id == 7);
  const ibv_wc rv = wait_one(lb.cq_b);
  CHECK(rv.wr_id == 9);
  CHECK(rv.byte_len == 16);
  CHECK(std::memcmp(dst.data(), s1.data(), 8) == 0);
  CHECK(std::memcmp(dst.data() + 8, s2.data(), 8) == 0);
}

TEST_CASE("a write to an rkey that does not exist fails with a remote access error and changes nothing", "[core]") {
  loopback lb;
  std::vector<unsigned char> src(128, 0x5A), dst(128, 0x11);
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto md = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const std::uint32_t bogus = md.rkey() ^ 0x00ABCD00u;
  const auto status = lb.write(ms.sge(), {md.iova(), bogus});
  CHECK(status == IBV_WC_REM_ACCESS_ERR);
  CHECK(wc_error(status) == std::errc::permission_denied);
  CHECK(all_equal(dst.data(), dst.size(), 0x11));
  // The requester QP is now in the error state.
  CHECK(need(lb.a.state(), "query a") == IBV_QPS_ERR);

  SECTION("and the QPs recover and carry traffic again") {
    lb.recover();
    CHECK(need(lb.a.state(), "query a") == IBV_QPS_RTS);
    CHECK(lb.write(ms.sge(), {md.iova(), md.rkey()}) == IBV_WC_SUCCESS);
    CHECK(all_equal(dst.data(), dst.size(), 0x5A));
  }
}

TEST_CASE("an invalid access combination is refused before verbs is called", "[core]") {
  Context ctx = open_device();
  auto pd = need(ProtectionDomain::alloc(ctx), "alloc_pd");
  std::vector<unsigned char> buf(4096);
  auto r = MemoryRegion::reg(pd, buf.data(), buf.size(), access::remote_write);
  REQUIRE_FALSE(r);
  // The code is ours, not the kernel's EINVAL: verbs never saw the call.
  CHECK(r.error() == errc::remote_write_needs_local_write);
  CHECK(r.error().category() == error_category());
  CHECK(pd.live_children() == 0);
  auto a = MemoryRegion::reg(pd, buf.data(), buf.size(), access::remote_atomic | access::remote_read);
  REQUIRE_FALSE(a);
  CHECK(a.error() == errc::remote_atomic_needs_local_write);
  CHECK(MemoryRegion::reg(pd, nullptr, 16, access::local_write).error() == errc::null_address);
  CHECK(MemoryRegion::reg(pd, buf.data(), 0, access::local_write).error() == errc::zero_length);
}

TEST_CASE("a failed transition names the transition and the attribute", "[core]") {
  loopback lb; // for a PD and CQs
  auto qp = need(QueuePair::create(lb.pd, lb.cq_a, lb.cq_a), "create qp");
  auto ep = need(qp.local_endpoint(), "local_endpoint");
  connect_options bad;
  bad.gid_index = 200; // beyond the GID table
  auto r = qp.connect(ep, bad);
  REQUIRE_FALSE(r);
  INFO(r.error().message());
  CHECK(r.error().category() == qp_transition_category());
  CHECK(r.error().message().find("INIT->RTR") != std::string::npos);
  CHECK(qp_transition_attribute(r.error()) == __builtin_ctz(IBV_QP_AV));
  // The QP stopped in INIT: it can still be connected properly after a reset.
  CHECK(need(qp.state(), "state") == IBV_QPS_INIT);
  need(qp.to_reset(), "to_reset");
  need(qp.connect(ep), "connect");
  CHECK(need(qp.state(), "state") == IBV_QPS_RTS);
}

TEST_CASE("registering at an IOVA and with allocate-and-register", "[core]") {
  loopback lb;
  std::vector<unsigned char> src(4096);
  fill(src.data(), src.size(), 4);
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");

  std::vector<unsigned char> dst(4096, 0);
  // The kernel wants the IOVA to keep the address's offset within its page.
  CHECK(MemoryRegion::reg_iova(lb.pd, dst.data(), dst.size(), 0x10000000 + ((reinterpret_cast<std::uintptr_t>(dst.data()) + 1) & 4095), remote_rw)
            .error() == errc::iova_page_offset_mismatch);
  const std::uint64_t iova = 0x10000000 + (reinterpret_cast<std::uintptr_t>(dst.data()) & 4095);
  auto mi = need(MemoryRegion::reg_iova(lb.pd, dst.data(), dst.size(), iova, remote_rw), "reg_iova");
  CHECK(mi.iova() == iova);
  CHECK(mi.kind() == mr_kind::iova);
  CHECK(lb.write(ms.sge(0, 512), {iova + 1024, mi.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(dst.data() + 1024, src.data(), 512) == 0);
  CHECK(all_equal(dst.data(), 1024, 0));

  auto ma = need(MemoryRegion::allocate(lb.pd, 1 << 20, remote_rw), "allocate");
  CHECK(ma.kind() == mr_kind::allocated);
  CHECK(ma.length() == (1u << 20));
  CHECK(reinterpret_cast<std::uintptr_t>(ma.address()) % 4096 == 0);
  CHECK(all_equal(ma.address(), ma.length(), 0)); // fresh memory is zeroed
  CHECK(lb.write(ms.sge(), {ma.iova() + 4096, ma.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(ma.data() + 4096, src.data(), src.size()) == 0);
  // Checked slices.
  CHECK(ma.slice(0, 1 << 20).has_value());
  CHECK(ma.slice(1, 1 << 20).error() == errc::out_of_range);
  CHECK(ma.slice(0, 0).error() == errc::zero_length);
}

TEST_CASE("blocking wait on a completion channel, with a timeout", "[core]") {
  Context ctx = open_device();
  auto pd = need(ProtectionDomain::alloc(ctx), "pd");
  auto ch = need(CompletionChannel::create(ctx), "channel");
  auto cq = need(CompletionQueue::create(ctx, 16, &ch), "cq with channel");
  auto cq_b = need(CompletionQueue::create(ctx, 16), "cq b");
  auto a = need(QueuePair::create(pd, cq, cq), "qp a");
  auto b = need(QueuePair::create(pd, cq_b, cq_b), "qp b");
  need(connect_loopback(a, b), "connect");
  std::vector<unsigned char> buf(64, 7), dst(64, 0);
  auto ms = need(MemoryRegion::reg(pd, buf.data(), buf.size(), access::local_write), "reg");
  auto md = need(MemoryRegion::reg(pd, dst.data(), dst.size(), remote_rw), "reg");
  ibv_wc wc[4];
  auto none = cq.wait(wc, 200);
  REQUIRE_FALSE(none);
  CHECK(none.error() == errc::timeout);
  {
    auto batch = a.start_send();
    batch.write({42, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge());
    need(batch.submit(), "submit");
  }
  auto got = need(cq.wait(wc, 10000), "wait");
  REQUIRE(got == 1);
  CHECK(wc[0].wr_id == 42);
  CHECK(wc[0].status == IBV_WC_SUCCESS);
  CHECK(all_equal(dst.data(), dst.size(), 7));
  // A CQ without a channel is waited on by a bounded busy poll: nothing there, so it times out.
  CHECK(cq_b.wait(wc, 10).error() == errc::timeout);
}

namespace {
std::vector<destroy_failure> seen;
void capture(const destroy_failure &f) noexcept { seen.push_back(f); }
} // namespace

TEST_CASE("destroying a parent before its children is diagnosed, and children stay valid", "[core]") {
  Context ctx = open_device();
  auto pd = need(ProtectionDomain::alloc(ctx), "pd");
  std::vector<unsigned char> buf(4096);
  auto mr = need(MemoryRegion::reg(pd, buf.data(), buf.size(), access::local_write), "reg");
  CHECK(pd.live_children() == 1);
  // The checked call refuses without calling ibv_dealloc_pd.
  auto r = pd.destroy();
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::busy);
  CHECK(pd);
  // Closing the context under a live PD is refused too (verbs would tear the PD down).
  CHECK(ctx.destroy().error() == errc::busy);
  need(mr.destroy(), "dereg");
  CHECK(pd.live_children() == 0);
  need(pd.destroy(), "dealloc");
  CHECK(ctx.destroy().has_value());

  // The destructor path goes to the hook with the number of children, and the PD's destruction
  // is deferred to its last child: nothing leaks.
  seen.clear();
  auto old = set_destroy_failure_handler(&capture);
  Context ctx2 = open_device();
  MemoryRegion orphan;
  {
    auto pd2 = need(ProtectionDomain::alloc(ctx2), "pd2");
    orphan = need(MemoryRegion::reg(pd2, buf.data(), buf.size(), access::local_write), "reg2");
  } // pd2 destroyed first: reported, deferred
  set_destroy_failure_handler(old);
  REQUIRE(seen.size() == 1);
  CHECK(std::string(seen[0].object) == "ProtectionDomain");
  CHECK(seen[0].live_children == 1);
  // The MR is still valid and deregisters cleanly; that also deallocates the PD.
  CHECK(orphan.lkey() != 0);
  CHECK(orphan.destroy().has_value());
  // ctx2 has no children left: the deferred ibv_dealloc_pd succeeded.
  CHECK(ctx2.destroy().has_value());
  CHECK(seen.size() == 1);
}
