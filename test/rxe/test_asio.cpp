// [asio] rdmaxx/asio.hpp on a real rxe device, one io_context thread: many coroutines waiting on
// one CQ and channel with completions arriving in another order than they wait, a request timeout
// while a grant is live (revoked, confirmed, the late access refused, the slot untouched), and a
// peer killed mid-request (its waiters fail with the connection's error); the kernel's resource
// counts are the same afterwards.
#include "fixture.hpp"

#include <rdmaxx/asio.hpp>
#include <rdmaxx/connection.hpp>
#include <rdmaxx/grant_pool.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <vector>

using namespace rxe;
namespace ra = rdmaxx::asio;
namespace net = boost::asio;

namespace {

std::int64_t now_ms() { return rdmaxx::detail::monotonic_ms(); }

constexpr int ops = 64;
constexpr std::size_t chunk = 64;

} // namespace

TEST_CASE("[asio] 64 waiters on one CQ and channel, 4 QPs, completions in another order", "[asio]") {
  const std::string before = kernel_resources();
  {
    device_pd d;
    auto ch = need(CompletionChannel::create(d.ctx), "channel");
    auto cq = need(CompletionQueue::create(d.ctx, 256, &ch), "cq");
    auto cq_b = need(CompletionQueue::create(d.ctx, 256), "cq b");
    std::vector<QueuePair> a, b;
    for (int i = 0; i < 4; ++i) {
      a.push_back(need(QueuePair::create(d.pd, cq, cq), "qp a"));
      b.push_back(need(QueuePair::create(d.pd, cq_b, cq_b), "qp b"));
      need(connect_loopback(a.back(), b.back()), "connect");
    }
    static unsigned char src[ops * chunk], dst[ops * chunk], rbuf[16 * chunk];
    fill(src, sizeof src, 5);
    std::memset(dst, 0, sizeof dst);
    std::memset(rbuf, 0, sizeof rbuf);
    auto smr = need(MemoryRegion::reg(d.pd, src, sizeof src, access::local_write), "src");
    auto dmr = need(MemoryRegion::reg(d.pd, dst, sizeof dst, remote_rw), "dst");
    auto rmr = need(MemoryRegion::reg(d.pd, rbuf, sizeof rbuf, access::local_write), "rbuf");
    // 16 receives on a[0], answered by b[0]'s sends.
    for (std::uint64_t i = 0; i < 16; ++i)
      need(a[0].post_recv(2000 + i, rmr.sge(std::uint32_t(i * chunk), std::uint32_t(chunk))), "post_recv");

    net::io_context io;
    auto router = need(ra::CompletionRouter::create(io.get_executor(), cq, ch), "router");
    std::array<int, ops> got{};     // 1: own completion, success, right bytes
    std::array<int, 16> recvd{};
    std::vector<int> finish_order;
    for (int k = 0; k < ops; ++k)
      net::co_spawn(io, [&, k]() -> ra::task<void> {
        QueuePair &qp = a[std::size_t(k % 4)];
        ra::Waiter w(router, 1000 + std::uint64_t(k), qp.qp_num());
        auto r = co_await w.wait(ra::after_ms(20000));
        if (r && r.value().wr_id == 1000 + std::uint64_t(k) && r.value().status == IBV_WC_SUCCESS &&
            std::memcmp(dst + k * chunk, src + k * chunk, chunk) == 0)
          got[std::size_t(k)] = 1;
        finish_order.push_back(k);
      }, net::detached);
    for (int i = 0; i < 16; ++i)
      net::co_spawn(io, [&, i]() -> ra::task<void> {
        ra::Waiter w(router, 2000 + std::uint64_t(i), a[0].qp_num());
        auto r = co_await w.wait(ra::after_ms(20000));
        if (r && r.value().status == IBV_WC_SUCCESS && r.value().opcode == IBV_WC_RECV &&
            r.value().byte_len == 8 && rbuf[i * chunk] == std::uint8_t(i) && rbuf[i * chunk + 7] == 0xA5)
          recvd[std::size_t(i)] = 1;
      }, net::detached);
    // The poster: writes in reverse order of the waiters, round-robin over the QPs, in batches
    // of 8 with a yield between them; then the 16 sends in order.
    net::co_spawn(io, [&]() -> ra::task<void> {
      for (int k = ops - 1; k >= 0;) {
        for (int j = 0; j < 8 && k >= 0; ++j, --k) {
          auto bt = a[std::size_t(k % 4)].start_send();
          bt.write({1000 + std::uint64_t(k), send_flag::signaled},
                   {dmr.iova() + std::uint64_t(k) * chunk, dmr.rkey()},
                   smr.sge(std::uint32_t(k * chunk), std::uint32_t(chunk)));
          need(bt.submit(), "write");
        }
        co_await net::post(io, net::use_awaitable);
      }
      for (int i = 0; i < 16; ++i) {
        std::array<std::byte, 8> m{};
        m[0] = std::byte(i);
        m[7] = std::byte{0xA5};
        auto bt = b[0].start_send();
        bt.send_inline({std::uint64_t(i), {}}, m);
        need(bt.submit(), "send");
      }
    }, net::detached);
    io.run_for(std::chrono::seconds(30));
    int ok = 0, ok_r = 0;
    for (int v : got) ok += v;
    for (int v : recvd) ok_r += v;
    CHECK(ok == ops);
    CHECK(ok_r == 16);
    REQUIRE(finish_order.size() == std::size_t(ops));
    CHECK(finish_order.front() == ops - 1); // the last waiter's write was posted first
    CHECK(router.stats().routed == std::uint64_t(ops + 16));
    CHECK(router.stats().unclaimed == 0);
    CHECK(router.stats().events >= 1);
    CHECK(router.stats().completions == std::uint64_t(ops + 16));
    router.close();
    // b's sends were unsignaled: nothing on cq_b; every wr done, nothing left in cq.
    ibv_wc wc[4];
    CHECK(need(cq.poll(wc), "poll") == 0);
  }
  CHECK(kernel_resources() == before);
}

TEST_CASE("[asio] a request timeout while a grant is live: revoked, confirmed, the late write refused", "[asio]") {
  const std::string before = kernel_resources();
  {
    Context ctx = open_device();
    auto pd_c = need(ProtectionDomain::alloc(ctx), "pd client");
    auto pd_s = need(ProtectionDomain::alloc(ctx), "pd server");
    auto ch = need(CompletionChannel::create(ctx), "channel");
    auto cq_c = need(CompletionQueue::create(ctx, 128, &ch), "cq client");
    auto cq_s = need(CompletionQueue::create(ctx, 128), "cq server");
    auto qc = need(QueuePair::create(pd_c, cq_c, cq_c), "qp client");
    auto qs = need(QueuePair::create(pd_s, cq_s, cq_s), "qp server");
    need(connect_loopback(qc, qs), "connect");
    std::vector<unsigned char> mem(4 * 4096);
    fill(mem.data(), mem.size(), 3);
    const std::vector<unsigned char> shadow = mem;
    auto mr = need(MemoryRegion::reg(pd_c, mem.data(), mem.size(), access::local_write), "mr");
    auto pool = need(GrantPool::create(pd_c, mr, {.slot_size = 4096}), "pool");
    static unsigned char rx[64], late[4096];
    fill(late, sizeof late, 77);
    auto rxmr = need(MemoryRegion::reg(pd_c, rx, sizeof rx, access::local_write), "rx");
    auto lmr = need(MemoryRegion::reg(pd_s, late, sizeof late, access::local_write), "late");
    need(qc.post_recv(77, rxmr.sge()), "post_recv reply");

    net::io_context io;
    auto router = need(ra::CompletionRouter::create(io.get_executor(), cq_c, ch), "router");
    need(router.attach(pool, qc), "attach");
    remote_descriptor granted{};
    std::int64_t waited = -1;
    std::error_code reply_err, settle_err, flushed_err;
    bool ready_after = false, untouched = false, late_refused = false, flushed = false;
    net::co_spawn(io, [&]() -> ra::task<void> {
      auto lease = need(pool.acquire(), "acquire");
      ra::Waiter reply(router, 77, qc.qp_num());
      auto bt = qc.start_send();
      granted = need(pool.grant(bt, qc, lease, access::remote_write), "grant");
      need(bt.submit(), "submit grant");
      const auto t0 = now_ms();
      auto r = co_await reply.wait(ra::after_ms(200)); // nobody answers
      waited = now_ms() - t0;
      if (!r) reply_err = r.error();
      // The timeout revokes what was granted; the revoke is confirmed through the router.
      need(pool.revoke(qc, lease), "revoke");
      auto s = co_await ra::settled(router, pool, lease, qc.qp_num(), ra::after_ms(5000));
      if (!s) settle_err = s.error();
      ready_after = lease.state() == lease_state::ready && lease.buffer() && lease.buffer().value().size() == 4096;
      // The late access with the revoked key: refused, the slot untouched.
      const ibv_wc_status st = write_one(qs, cq_s, lmr.sge(), granted.at(0));
      late_refused = is_denial(st);
      untouched = std::memcmp(mem.data(), shadow.data(), mem.size()) == 0;
      // The client's QP went to ERR with the refusal: the reply's receive is flushed.
      auto f = co_await reply.wait(ra::after_ms(5000));
      if (f) flushed = f.value().wr_id == 77 && f.value().status == IBV_WC_WR_FLUSH_ERR;
      else flushed_err = f.error();
      need(pool.release(lease), "release");
    }, net::detached);
    io.run_for(std::chrono::seconds(20));
    INFO("waited " << waited << " ms");
    CHECK(reply_err == errc::timeout);
    CHECK(waited >= 200);
    CHECK(waited < 2000);
    CHECK(!settle_err);
    CHECK(ready_after);
    CHECK(late_refused);
    CHECK(untouched);
    INFO("flush wait: " << flushed_err.message());
    CHECK(flushed);
    CHECK(pool.stats().revokes == 1);
    CHECK(pool.available() == pool.size());
    CHECK(router.stats().to_pools >= 1);
    router.close();
  }
  CHECK(kernel_resources() == before);
}

TEST_CASE("[asio] a peer killed mid-request: its waiters fail with the connection's error", "[asio]") {
  { auto l0 = Listener::listen(address::parse("192.0.2.1:0").value()); } // rdma_cm's first id
  const std::string before = kernel_resources();
  {
    auto l = need(Listener::listen(address::parse("192.0.2.1:0").value()), "listen");
    const address to = need(l.local_address(), "local_address");
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // The client: connect, send one request, announce it, then hang (killed here).
      ::close(fds[0]);
      auto c = Connection::connect(to, {.timeout_ms = 10000});
      if (!c) ::_exit(1);
      auto bt = c.value().qp().start_send();
      std::array<std::byte, 8> m{};
      m[0] = std::byte{0x42};
      bt.send_inline({1, send_flag::signaled}, m);
      if (!bt.submit()) ::_exit(2);
      ibv_wc wc{};
      if (!c.value().cq().wait(std::span(&wc, 1), 10000) || wc.status != IBV_WC_SUCCESS) ::_exit(3);
      const char ok = 's';
      (void)!::write(fds[1], &ok, 1);
      for (;;) ::pause();
    }
    ::close(fds[1]);
    Context ctx = open_device();
    auto pd = need(ProtectionDomain::alloc(ctx), "pd");
    auto ch = need(CompletionChannel::create(ctx), "channel");
    auto cq = need(CompletionQueue::create(ctx, 64, &ch), "cq");
    static unsigned char rbuf[2 * 64];
    std::memset(rbuf, 0, sizeof rbuf);
    auto rmr = need(MemoryRegion::reg(pd, rbuf, sizeof rbuf, access::local_write), "rbuf");

    net::io_context io;
    auto router = need(ra::CompletionRouter::create(io.get_executor(), cq, ch), "router");
    bool first_ok = false, stop = false;
    std::error_code second_err, watch_err;
    std::int64_t failed_after = -1;
    Connection conn;
    net::co_spawn(io, [&]() -> ra::task<void> {
      auto req = co_await ra::next_request(l, 10000);
      if (!req) co_return;
      auto c = req.value().prepare({.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = 10000});
      if (!c) co_return;
      conn = std::move(c).value();
      need(conn.qp().post_recv(500, rmr.sge(0, 64)), "recv 0");
      need(conn.qp().post_recv(501, rmr.sge(64, 64)), "recv 1");
      ra::Waiter r0(router, 500, conn.qp().qp_num()), r1(router, 501, conn.qp().qp_num());
      if (auto a = co_await ra::accept(conn); !a) co_return;
      net::co_spawn(io, [&]() -> ra::task<void> { watch_err = co_await ra::watch(conn, router, stop); },
                    net::detached);
      auto w0 = co_await r0.wait(ra::after_ms(10000));
      first_ok = w0 && w0.value().status == IBV_WC_SUCCESS && rbuf[0] == 0x42;
      char ok = 0;
      REQUIRE(::read(fds[0], &ok, 1) == 1);
      ::kill(pid, SIGKILL); // mid-request: the second one never comes
      const auto t0 = now_ms();
      auto w1 = co_await r1.wait(ra::after_ms(20000));
      failed_after = now_ms() - t0;
      if (!w1) second_err = w1.error();
      else if (w1.value().status != IBV_WC_SUCCESS) second_err = wc_error(w1.value());
      stop = true;
    }, net::detached);
    io.run_for(std::chrono::seconds(40));
    int st = 0;
    ::waitpid(pid, &st, 0);
    ::close(fds[0]);
    INFO("failed after " << failed_after << " ms: " << second_err.message());
    CHECK(first_ok);
    CHECK(second_err == std::errc::connection_reset);
    CHECK(failed_after >= 0);
    CHECK(failed_after < 15000);
    CHECK(watch_err == std::errc::connection_reset);
    CHECK(conn.state() == conn_state::disconnected);
    router.close();
    // Flushed receives (if any) were routed or are dropped with the CQ.
    conn = Connection{};
  }
  CHECK(kernel_resources() == before);
}
