// [cm]: connections by address over rdma_cm on a real rxe device (tools/rxe-vm: rxe0 on dummy0,
// 192.0.2.1/24, rdma_ucm loaded). Each case asserts the error code and the bytes that arrived.
#include "cm_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

namespace {
using namespace rxe;

constexpr const char *local_ip = "192.0.2.1";

address addr(const std::string &s) { return need(address::parse(s), "address::parse"); }

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  fill(v.data(), n, seed);
  return v;
}

std::int64_t now_ms() { return rdmaxx::detail::monotonic_ms(); }

// A listener on 192.0.2.1 with a port the kernel chose.
Listener listen_any_port() {
  auto l = need(Listener::listen(addr(std::string(local_ip) + ":0")), "listen");
  REQUIRE(l.port() != 0);
  return l;
}
address target(const Listener &l) { return addr(std::string(local_ip) + ":" + std::to_string(l.port())); }

// Poll `cq` for one completion (bounded).
ibv_wc one_wc(CompletionQueue &cq) { return wait_wc(cq, 1).front(); }
} // namespace

TEST_CASE("address parsing: IPv4, IPv6, port only, port 0, bad input", "[cm]") {
  auto a = need(address::parse("192.0.2.1:7471"), "v4");
  CHECK(!a.is_v6());
  CHECK(a.port() == 7471);
  CHECK(a.to_string() == "192.0.2.1:7471");
  auto b = need(address::parse("[::1]:0"), "v6");
  CHECK(b.is_v6());
  CHECK(b.port() == 0);
  CHECK(b.to_string() == "[::1]:0");
  auto c = need(address::parse("7471"), "port only");
  CHECK(c.to_string() == "0.0.0.0:7471");
  CHECK(c.with_port(9).port() == 9);
  for (const char *bad : {"", "1.2.3.4", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:12a", "300.1.1.1:5",
                          "[::1]", "[::1]5", "[zz::1]:5", "::1:5", "[fe80::1%nosuchif0]:5", "1.2.3.4:123456"}) {
    INFO(bad);
    auto r = address::parse(bad);
    REQUIRE(!r);
    CHECK(r.error() == errc::bad_address);
  }
}

TEST_CASE("connect, accept, private data at the limit both ways, verified write, disconnect", "[cm]") {
  const std::string before = cm_resources_baseline();
  {
    auto l = listen_any_port();
    const auto req_data = pattern(cm_connect_private_data_max, 1);
    const auto acc_data = pattern(cm_accept_private_data_max, 2);
    alignas(64) static unsigned char server_buf[4096];
    std::memset(server_buf, 0, sizeof server_buf);

    std::atomic<bool> server_ok{false};
    std::vector<std::byte> got_req;
    std::thread server([&] {
      auto req = l.get_request(10000);
      if (!req) return;
      got_req.assign(req.value().private_data().begin(), req.value().private_data().end());
      auto conn = req.value().accept({.timeout_ms = 10000, .private_data = acc_data});
      if (!conn) return;
      auto mr = MemoryRegion::reg(conn.value().pd(), server_buf, sizeof server_buf,
                                  access::local_write | access::remote_write);
      if (!mr) return;
      // Tell the client where to write with a send carrying the MR's address and rkey.
      std::uint64_t msg[2] = {mr.value().iova(), mr.value().rkey()};
      auto b = conn.value().qp().start_send();
      b.send_inline({.id = 7, .flags = send_flag::signaled},
                    std::as_bytes(std::span(msg)));
      if (!b.submit()) return;
      // The client disconnects after its write: DISCONNECTED within the bound.
      auto d = conn.value().wait_disconnected(10000);
      server_ok = d && d.value();
    });

    auto c = Connection::connect(target(l), {.timeout_ms = 10000, .private_data = req_data});
    INFO("connect: " << (c ? "ok" : c.error().message()));
    REQUIRE(c);
    Connection &conn = c.value();
    CHECK(conn.state() == conn_state::established);
    REQUIRE(need(conn.qp().state(), "qp state") == IBV_QPS_RTS);
    // The accept's private data: exactly 196 bytes, as sent.
    REQUIRE(conn.peer_private_data().size() == cm_accept_private_data_max);
    CHECK(std::equal(acc_data.begin(), acc_data.end(), conn.peer_private_data().begin()));
    CHECK(need(conn.peer_address(), "peer").port() == l.port());

    // Receive the server's MR address and rkey, then write 4 KiB there.
    alignas(64) static std::uint64_t msg[2];
    auto rmr = need(MemoryRegion::reg(conn.pd(), msg, sizeof msg, access::local_write), "reg msg");
    need(conn.qp().post_recv(1, rmr.sge()), "post_recv");
    auto wc = one_wc(conn.cq());
    REQUIRE(wc.status == IBV_WC_SUCCESS);
    REQUIRE(wc.opcode == IBV_WC_RECV);
    alignas(64) static unsigned char src[4096];
    fill(src, sizeof src, 3);
    auto smr = need(MemoryRegion::reg(conn.pd(), src, sizeof src, access::local_write), "reg src");
    CHECK(write_one(conn.qp(), conn.cq(), smr.sge(), {msg[0], std::uint32_t(msg[1])}) == IBV_WC_SUCCESS);
    need(conn.disconnect(), "disconnect");
    CHECK(conn.state() == conn_state::disconnected);
    CHECK(need(conn.qp().state(), "qp state") == IBV_QPS_ERR);
    server.join();
    CHECK(server_ok);
    REQUIRE(got_req.size() == cm_connect_private_data_max);
    CHECK(std::equal(req_data.begin(), req_data.end(), got_req.begin()));
    CHECK(std::memcmp(server_buf, src, sizeof src) == 0);
  }
  CHECK(kernel_resources() == before);
}

TEST_CASE("prepare() + accept(): conn_options::private_data is sent (copied at prepare), accept's own "
          "data replaces it, over 196 bytes refused at prepare with the request still usable", "[cm]") {
  auto l = listen_any_port();
  for (int round = 0; round < 2; ++round) {
    const auto prep_data = pattern(40, 11);
    const auto own_data = pattern(24, 12);
    std::atomic<bool> server_ok{false};
    std::thread server([&] {
      auto req = l.get_request(10000);
      if (!req) return;
      if (round == 0) {
        const auto over = pattern(cm_accept_private_data_max + 1, 13);
        auto refused = req.value().prepare({.private_data = over});
        if (refused || refused.error() != errc::private_data_too_long || !req.value()) return;
      }
      std::vector<std::byte> scratch = prep_data; // gone before accept(): prepare copied it
      auto conn = req.value().prepare({.timeout_ms = 10000, .private_data = scratch});
      if (!conn) return;
      std::fill(scratch.begin(), scratch.end(), std::byte{0});
      scratch.clear();
      scratch.shrink_to_fit();
      auto a = round == 0 ? conn.value().accept() : conn.value().accept(own_data);
      if (!a) return;
      if (!conn.value().wait_established()) return;
      auto d = conn.value().wait_disconnected(10000);
      server_ok = d && d.value();
    });
    auto c = Connection::connect(target(l), {.timeout_ms = 10000});
    INFO("round " << round << " connect: " << (c ? "ok" : c.error().message()));
    REQUIRE(c);
    const auto &want = round == 0 ? prep_data : own_data;
    REQUIRE(c.value().peer_private_data().size() >= want.size());
    CHECK(std::equal(want.begin(), want.end(), c.value().peer_private_data().begin()));
    need(c.value().disconnect(), "disconnect");
    server.join();
    CHECK(server_ok);
  }
}

TEST_CASE("private data one byte over the limit is refused before verbs", "[cm]") {
  auto l = listen_any_port();
  const auto over_connect = pattern(cm_connect_private_data_max + 1, 4);
  auto r = Connection::start_connect(target(l), {.private_data = over_connect});
  REQUIRE(!r);
  CHECK(r.error() == errc::private_data_too_long);
  CHECK(r.error() == std::errc::message_size);
  // Nothing reached the listener.
  auto none = l.get_request(300);
  REQUIRE(!none);
  CHECK(is_cm_timeout(none.error()));

  // Accept with 197 bytes and reject with 149 are refused; the request stays usable.
  const auto small = pattern(8, 5);
  std::thread client_thread;
  std::error_code client_ec;
  cm_private_data rej;
  const address to = target(l); // Catch2 macros (in target()) only on the test's own thread
  client_thread = std::thread([&] {
    auto c = Connection::connect(to, {.timeout_ms = 10000, .private_data = small,
                                             .reject_data = &rej});
    client_ec = c ? std::error_code{} : c.error();
  });
  auto req = need(l.get_request(10000), "get_request");
  CHECK(std::equal(small.begin(), small.end(), req.private_data().begin()));
  CHECK(std::all_of(req.private_data().begin() + 8, req.private_data().end(),
                    [](std::byte b) { return b == std::byte{0}; }));
  const auto over_accept = pattern(cm_accept_private_data_max + 1, 6);
  auto a = req.accept({.private_data = over_accept});
  REQUIRE(!a);
  CHECK(a.error() == errc::private_data_too_long);
  REQUIRE(req);
  const auto over_reject = pattern(cm_reject_private_data_max + 1, 7);
  auto j = req.reject(over_reject);
  REQUIRE(!j);
  CHECK(j.error() == errc::private_data_too_long);
  REQUIRE(req);
  // At the limit the reject goes through, with its bytes.
  const auto at_reject = pattern(cm_reject_private_data_max, 8);
  need(req.reject(at_reject), "reject");
  CHECK(!req);
  client_thread.join();
  INFO("client: " << client_ec.message());
  REQUIRE(client_ec);
  CHECK(client_ec == std::errc::connection_refused);
  CHECK(cm_event_of(client_ec) == RDMA_CM_EVENT_REJECTED);
  CHECK(cm_reject_reason(client_ec) == 28); // consumer defined
  REQUIRE(rej.size >= cm_reject_private_data_max);
  CHECK(std::equal(at_reject.begin(), at_reject.end(), rej.bytes.begin()));
}

TEST_CASE("checked destroy of every cm handle: Connection stops at its first failure and "
          "finishes later; Listener, ConnectRequest, EventChannel", "[cm]") {
  const std::string before = cm_resources_baseline();
  {
    auto l = listen_any_port();
    const std::uint16_t port = l.port();
    std::atomic<bool> server_ok{false};
    std::thread server([&] {
      // First request: destroyed unanswered (the kernel rejects it).
      auto r1 = l.get_request(10000);
      if (!r1 || !r1.value().destroy() || r1.value()) return;
      // Second: accepted, held until the client destroyed its side.
      auto r2 = l.get_request(10000);
      if (!r2) return;
      auto conn = r2.value().accept({.timeout_ms = 10000});
      if (!conn) return;
      auto d = conn.value().wait_disconnected(10000);
      server_ok = d && d.value() && conn.value().destroy() && !conn.value();
    });
    auto refused = Connection::connect(target(l), {.timeout_ms = 10000});
    REQUIRE_FALSE(refused);
    CHECK(refused.error() == std::errc::connection_refused);
    auto c = need(Connection::connect(target(l), {.timeout_ms = 10000}), "connect");
    std::vector<unsigned char> mem(4096);
    auto mr = need(MemoryRegion::reg(c.pd(), mem.data(), mem.size(), access::local_write), "mr on its PD");
    need(c.disconnect(), "disconnect");
    auto r = c.destroy();
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::busy); // the PD: the caller's region is on it
    CHECK(c);                       // the PD, Context, id and channel stay
    CHECK(c.state() == conn_state::failed);
    need(mr.destroy(), "dereg");
    need(c.destroy(), "destroy again");
    CHECK_FALSE(c);
    need(c.destroy(), "null: nothing to do");
    server.join();
    CHECK(server_ok);
    need(l.destroy(), "listener destroy");
    CHECK_FALSE(l);
    auto after = Connection::connect(addr(std::string(local_ip) + ":" + std::to_string(port)),
                                     {.timeout_ms = 10000});
    REQUIRE_FALSE(after);
    CHECK(after.error() == std::errc::connection_refused); // nobody listens there now
    auto ch = need(EventChannel::create(), "event channel");
    need(ch.destroy(), "event channel destroy");
    CHECK_FALSE(ch);
    CHECK(ch.fd() == -1);
  }
  CHECK(kernel_resources() == before);
}

TEST_CASE("connect to a port nobody listens on is refused", "[cm]") {
  std::uint16_t port = 0;
  {
    auto l = listen_any_port();
    port = l.port();
  } // closed again: nobody listens there now
  const auto t0 = now_ms();
  auto c = Connection::connect(addr(std::string(local_ip) + ":" + std::to_string(port)),
                               {.timeout_ms = 10000});
  REQUIRE(!c);
  INFO(c.error().message());
  CHECK(c.error() == std::errc::connection_refused);
  CHECK(cm_reject_reason(c.error()) == 8); // invalid service ID
  CHECK(now_ms() - t0 < 10000);
  // The message names the side, the address, the step and the reason.
  const std::string m = c.error().message();
  CHECK(m.find("connect to " + std::string(local_ip) + ":" + std::to_string(port) + ": ") != std::string::npos);
  CHECK(m.find("connection setup: RDMA_CM_EVENT_REJECTED") != std::string::npos);
  CHECK(m.find("nobody listens on that port") != std::string::npos);
}

TEST_CASE("connect to a wildcard address is refused before any rdma_cm call", "[cm]") {
  // What a client given a server-style "7471" would do (it used to fail with "No such device").
  for (const char *s : {"7471", "0.0.0.0:7471", "[::]:7471"}) {
    INFO(s);
    auto c = Connection::connect(addr(s), {.timeout_ms = 2000});
    REQUIRE(!c);
    INFO(c.error().message());
    CHECK(c.error() == std::errc::destination_address_required);
    CHECK(cm_call_of(c.error()) == cm_call::rdma_resolve_addr);
    CHECK(c.error().message().find("a wildcard address names no peer") != std::string::npos);
    CHECK(c.error().message().find(":7471: ") != std::string::npos);
    CHECK(!Connection::start_connect(addr(s)));
  }
}

TEST_CASE("a moved-from Connection answers null_handle", "[cm]") {
  auto l = listen_any_port();
  const std::uint16_t port = l.port();
  std::error_code server_ec;
  std::thread server([&] {
    auto req = l.get_request(20000);
    if (!req) { server_ec = req.error(); return; }
    auto c = req.value().accept({.timeout_ms = 20000});
    if (!c) { server_ec = c.error(); return; }
    (void)c.value().wait_disconnected(20000);
  });
  auto c = Connection::connect(addr(std::string(local_ip) + ":" + std::to_string(port)), {.timeout_ms = 20000});
  REQUIRE(c);
  Connection moved = std::move(c).value();
  Connection &from = c.value();
  CHECK(!from);
  CHECK(!from.qp());
  std::byte b[8]{};
  auto mr = need(MemoryRegion::reg(moved.pd(), b, sizeof b, access::local_write), "reg");
  CHECK(from.qp().post_recv(1, mr.sge()).error() == errc::null_handle);
  auto closed = from.qp().start_send(); // a batch of the moved-from QP: null_handle, not wrong_state
  closed.write({.id = 1, .flags = send_flag::signaled}, {0, 0}, mr.sge());
  CHECK(closed.submit().error() == errc::null_handle);
  CHECK(from.advance().error() == errc::null_handle);
  CHECK(from.disconnect().error() == errc::null_handle);
  CHECK(from.peer_address().error() == errc::null_handle);
  // The moved-to connection works.
  CHECK(moved.qp());
  CHECK(moved.state() == conn_state::established);
  CHECK(moved.disconnect());
  // A move assignment onto it (the default one) destroys its parts in the destructor's order: QP,
  // CQ, PD, Context, id, channel. Another order would be reported (a Context with its PD alive;
  // rdma_destroy_id failing once the id's channel is gone).
  mr = MemoryRegion{}; // the test's own child of the connection's PD goes first
  static std::atomic<int> reports{0};
  const destroy_failure_handler old = set_destroy_failure_handler([](const destroy_failure &) noexcept { ++reports; });
  moved = Connection{};
  set_destroy_failure_handler(old);
  CHECK(!moved);
  CHECK(reports == 0);
  server.join();
  INFO(server_ec.message());
  CHECK(!server_ec);
}

TEST_CASE("resolve + connect_with: a GrantPool on the connection's own PD, its offer in the request", "[cm][grants]") {
  const std::string before = cm_resources_baseline();
  {
    auto l = listen_any_port();
    std::error_code server_ec;
    std::vector<std::byte> got;
    std::thread server([&] {
      auto req = l.get_request(20000);
      if (!req) { server_ec = req.error(); return; }
      got.assign(req.value().private_data().begin(), req.value().private_data().end());
      auto c = req.value().accept({.timeout_ms = 20000});
      if (!c) { server_ec = c.error(); return; }
      (void)c.value().wait_disconnected(20000);
    });
    const std::byte some[4]{};
    CHECK(Connection::resolve(target(l), {.timeout_ms = 20000, .private_data = some}).error() ==
          errc::invalid_argument);
    // Default options: the Connection's own Context, PD and CQ exist before the request is sent.
    auto r = Connection::resolve(target(l), {.timeout_ms = 20000});
    INFO("resolve: " << (r ? "ok" : r.error().message()));
    REQUIRE(r);
    Connection &c = r.value();
    CHECK(c.state() == conn_state::resolved);
    REQUIRE(c.pd());
    CHECK(c.cq());
    CHECK(need(c.qp().state(), "qp state") == IBV_QPS_INIT);
    CHECK(c.wait_established().error() == errc::wrong_state);
    CHECK(c.advance().value() == conn_state::resolved); // waits for nothing, no timeout later
    alignas(4096) static std::byte mem[4 * 4096];
    auto mr = need(MemoryRegion::reg(c.pd(), mem, sizeof mem, access::local_write), "reg");
    auto pool = need(GrantPool::create(c.pd(), mr, {.slot_size = 4096}), "pool on the connection's PD");
    const auto offer = pool.offer().encode();
    const std::vector<std::byte> too_long(cm_connect_private_data_max + 1);
    CHECK(c.connect_with(too_long).error() == errc::private_data_too_long);
    CHECK(c.state() == conn_state::resolved); // nothing sent: call again with less
    need(c.connect_with(offer), "connect_with");
    CHECK(c.connect_with(offer).error() == errc::wrong_state);
    need(c.wait_established(), "wait_established");
    CHECK(c.state() == conn_state::established);
    CHECK(need(c.qp().state(), "qp state") == IBV_QPS_RTS);
    // The pool grants on this connection's QP (its PD): a grant, then its revocation.
    auto lease = need(pool.acquire(), "acquire");
    auto b = c.qp().start_send();
    auto d = pool.grant(b, c.qp(), lease, access::remote_read);
    REQUIRE(d);
    need(b.submit(), "submit");
    CHECK(lease.state() == lease_state::granted);
    CHECK(lease.buffer().error() == errc::grant_outstanding);
    need(pool.revoke(c.qp(), lease), "revoke");
    for (int i = 0; i < 100 && lease.state() != lease_state::ready; ++i) {
      ibv_wc wcs[4];
      const auto n = need(c.cq().wait(wcs, 5000), "wait");
      CHECK(pool.complete(std::span(wcs, n)).empty());
    }
    CHECK(lease.state() == lease_state::ready);
    CHECK(need(lease.buffer(), "buffer").size() == 4096);
    need(pool.give_back(lease), "release");
    need(c.disconnect(), "disconnect");
    server.join();
    INFO(server_ec.message());
    CHECK(!server_ec);
    // The server received the offer the pool made, as the first 12 bytes of the request.
    REQUIRE(got.size() == cm_connect_private_data_max);
    CHECK(std::equal(offer.begin(), offer.end(), got.begin()));
    auto o = grant_offer::decode(got);
    REQUIRE(o);
    CHECK(o.value().remote_invalidate == pool.offer().remote_invalidate);
  }
  CHECK(kernel_resources() == before);
}

TEST_CASE("connect to an unreachable address fails within the bound", "[cm]") {
  // 192.0.2.77 is on dummy0's subnet but nobody answers there.
  const int bound = 1500;
  const auto t0 = now_ms();
  auto c = Connection::connect(addr("192.0.2.77:7471"), {.timeout_ms = bound});
  const auto took = now_ms() - t0;
  REQUIRE(!c);
  INFO(c.error().message() << " after " << took << " ms");
  CHECK((c.error() == std::errc::timed_out || c.error() == std::errc::host_unreachable));
  CHECK(c.error().category() == cm_category());
  CHECK(c.error().message().find("connect to 192.0.2.77:7471: ") != std::string::npos);
  // Each of the three steps (address, route, connect) is bounded by `bound`.
  CHECK(took < 3 * bound + 1000);
  // And a non-blocking start reports the same through advance().
  auto s = need(Connection::start_connect(addr("192.0.2.77:7471"), {.timeout_ms = 300}), "start");
  std::error_code ec;
  const auto t1 = now_ms();
  while (now_ms() - t1 < 5000) {
    auto st = s.advance();
    if (!st) {
      ec = st.error();
      break;
    }
    pollfd p{s.fd(), POLLIN, 0};
    (void)::poll(&p, 1, 50);
  }
  INFO(ec.message());
  CHECK((ec == std::errc::timed_out || ec == std::errc::host_unreachable));
  CHECK(ec.message().find("connect to 192.0.2.77:7471: ") != std::string::npos);
  CHECK(s.state() == conn_state::failed);
}

TEST_CASE("listener on an address without an RDMA device, and on an address of no interface", "[cm]") {
  // An interface with an address but no rxe on it.
  (void)shell_output("ip link add rdmaxxcm0 type dummy 2>&1; ip addr add 198.51.100.1/24 dev rdmaxxcm0 2>&1;"
            " ip link set rdmaxxcm0 up 2>&1");
  const bool have_if = shell_output("ip -4 addr show rdmaxxcm0 2>&1").find("198.51.100.1") != std::string::npos;
  if (have_if) {
    auto l = Listener::listen(addr("198.51.100.1:0"));
    REQUIRE(!l);
    INFO(l.error().message());
    CHECK(l.error() == std::errc::no_such_device);
  } else {
    WARN("cannot create a dummy interface (not root?): the no-device case is not run");
  }
  auto n = Listener::listen(addr("203.0.113.9:0"));
  REQUIRE(!n);
  INFO(n.error().message());
  CHECK(n.error() == std::errc::address_not_available);
  CHECK(n.error().message() == "rdma_cm: listen on 203.0.113.9:0: rdma_bind_addr failed: " +
                                   std::generic_category().message(EADDRNOTAVAIL));
  if (have_if) {
    // A PD of another device (rxe1 on that interface) is refused with context_mismatch.
    const bool rxe1 = shell_output("rdma link add rdmaxxcm1 type rxe netdev rdmaxxcm0 2>&1; echo rc=$?")
                          .find("rc=0") != std::string::npos;
    if (rxe1) {
      {
        auto other = need(Context::open("rdmaxxcm1"), "open rdmaxxcm1");
        auto pd = need(ProtectionDomain::alloc(other), "pd");
        auto cq = need(CompletionQueue::create(other, 16), "cq");
        auto l = listen_any_port();
        auto c = Connection::connect(target(l), {.pd = &pd, .send_cq = &cq, .recv_cq = &cq,
                                                 .timeout_ms = 5000});
        REQUIRE(!c);
        INFO(c.error().message());
        CHECK(c.error() == errc::context_mismatch);
      }
      (void)shell_output("rdma link delete rdmaxxcm1 2>&1");
    } else {
      WARN("cannot add a second rxe device: the context_mismatch case is not run");
    }
    (void)shell_output("ip link delete rdmaxxcm0 2>&1");
  }
}

TEST_CASE("IPv6 wildcard listener, port 0, accepts an IPv4 client", "[cm]") {
  auto l = need(Listener::listen(addr("[::]:0")), "listen [::]:0");
  REQUIRE(l.port() != 0);
  CHECK(need(l.local_address(), "local").is_v6());
  std::thread server([&] {
    auto req = l.get_request(10000);
    if (!req) return;
    auto c = req.value().accept({.timeout_ms = 10000});
    if (c) (void)c.value().wait_disconnected(10000);
  });
  auto c = Connection::connect(addr(std::string(local_ip) + ":" + std::to_string(l.port())),
                               {.timeout_ms = 10000});
  INFO((c ? "ok" : c.error().message()));
  CHECK(c);
  c = Connection{};
  server.join();
}

TEST_CASE("a server killed mid-handshake: the client fails within the bound", "[cm]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto l = Listener::listen(addr(std::string(local_ip) + ":0"));
    std::uint16_t port = l ? l.value().port() : 0;
    (void)!::write(fds[1], &port, sizeof port);
    if (!l) ::_exit(1);
    auto req = l.value().get_request(20000);
    ::kill(::getpid(), SIGKILL); // dies holding the request, before accepting
    ::_exit(2);
  }
  ::close(fds[1]);
  std::uint16_t port = 0;
  REQUIRE(::read(fds[0], &port, sizeof port) == sizeof port);
  ::close(fds[0]);
  REQUIRE(port != 0);
  const auto t0 = now_ms();
  auto c = Connection::connect(addr(std::string(local_ip) + ":" + std::to_string(port)),
                               {.timeout_ms = 4000});
  const auto took = now_ms() - t0;
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st));
  REQUIRE(!c);
  INFO(c.error().message() << " after " << took << " ms");
  CHECK((c.error() == std::errc::connection_refused || c.error() == std::errc::timed_out));
  CHECK(took < 3 * 4000 + 1000);
}

TEST_CASE("a client killed mid-transfer: DISCONNECTED and flushed completions within the bound", "[cm]") {
  auto l = listen_any_port();
  alignas(64) static unsigned char buf[4096];
  std::memset(buf, 0, sizeof buf);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: connect, learn the window from the accept's private data, write, then hang.
    ::close(fds[0]);
    auto c = Connection::connect(target(l), {.timeout_ms = 10000});
    if (!c) ::_exit(1);
    auto d = remote_descriptor::decode(c.value().peer_private_data().first(remote_descriptor::encoded_size));
    if (!d) ::_exit(2);
    static unsigned char src[4096];
    fill(src, sizeof src, 9);
    auto mr = MemoryRegion::reg(c.value().pd(), src, sizeof src, access::local_write);
    if (!mr) ::_exit(3);
    auto b = c.value().qp().start_send();
    b.write({.id = 1, .flags = send_flag::signaled}, d.value().at(0), mr.value().sge());
    if (!b.submit()) ::_exit(4);
    ibv_wc wc{};
    for (int i = 0; i < 100000; ++i) {
      auto n = c.value().cq().poll(std::span(&wc, 1));
      if (n && n.value() == 1) break;
      ::usleep(100);
    }
    const char ok = wc.status == IBV_WC_SUCCESS ? 'w' : 'f';
    (void)!::write(fds[1], &ok, 1);
    for (;;) ::pause(); // killed here, mid-transfer
  }
  ::close(fds[1]);
  auto dev = open_device();
  auto pd = need(ProtectionDomain::alloc(dev), "pd");
  auto cq = need(CompletionQueue::create(dev, 64), "cq");
  auto mr = need(MemoryRegion::reg(pd, buf, sizeof buf, access::local_write | access::remote_write), "mr");
  const remote_descriptor grant{mr.iova(), sizeof buf, mr.rkey(), access::remote_write, false};
  const auto wire = grant.encode();
  auto req = need(l.get_request(10000), "get_request");
  auto conn = need(req.accept({.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = 10000,
                               .private_data = std::span<const std::byte>(wire)}),
                   "accept");
  // A receive that will be flushed when the peer dies.
  alignas(64) static unsigned char rbuf[64];
  auto rmr = need(MemoryRegion::reg(pd, rbuf, sizeof rbuf, access::local_write), "rmr");
  need(conn.qp().post_recv(42, rmr.sge()), "post_recv");
  char ok = 0;
  REQUIRE(::read(fds[0], &ok, 1) == 1);
  ::close(fds[0]);
  CHECK(ok == 'w');
  unsigned char expect[4096];
  fill(expect, sizeof expect, 9);
  CHECK(std::memcmp(buf, expect, sizeof buf) == 0);
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  const auto t0 = now_ms();
  auto d = need(conn.wait_disconnected(10000), "wait_disconnected");
  INFO("after " << now_ms() - t0 << " ms");
  CHECK(d);
  CHECK(conn.state() == conn_state::disconnected);
  const ibv_wc wc = one_wc(cq);
  CHECK(wc.wr_id == 42);
  CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
  CHECK(wc_error(wc) == std::errc::operation_canceled);
}

TEST_CASE("8 concurrent clients, each with its own QP, each doing verified writes", "[cm]") {
  constexpr int clients = 8;
  constexpr std::size_t slot = 4096;
  const std::string before = cm_resources_baseline();
  {
    auto dev = open_device();
    auto pd = need(ProtectionDomain::alloc(dev), "pd");
    auto cq = need(CompletionQueue::create(dev, 256), "cq");
    alignas(4096) static unsigned char area[clients * slot];
    std::memset(area, 0, sizeof area);
    auto mr = need(MemoryRegion::reg(pd, area, sizeof area,
                                     access::local_write | access::remote_write), "mr");
    auto l = listen_any_port();
    std::vector<Connection> accepted;
    std::atomic<int> accept_failures{0};
    std::vector<std::string> accept_errors;
    std::thread server([&] {
      for (int i = 0; i < clients; ++i) {
        auto req = l.get_request(20000);
        if (!req) { ++accept_failures; accept_errors.push_back("get_request: " + req.error().message()); continue; }
        // The client's index is in its connect private data; grant it its slot.
        const int idx = int(req.value().private_data()[0]);
        const remote_descriptor g{mr.iova() + idx * slot, slot, mr.rkey(), access::remote_write, false};
        const auto wire = g.encode();
        auto c = req.value().accept({.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = 20000,
                                     .private_data = std::span<const std::byte>(wire)});
        if (!c) { ++accept_failures; accept_errors.push_back("accept: " + c.error().message()); continue; }
        accepted.push_back(std::move(c).value());
      }
    });
    std::array<std::error_code, clients> errs{};
    std::array<int, clients> statuses{};
    std::vector<std::thread> ts;
    const address to = target(l); // Catch2 is not thread-safe: no macro runs in the threads
    for (int i = 0; i < clients; ++i)
      ts.emplace_back([&, i] {
        const std::byte idx{std::uint8_t(i)};
        auto c = Connection::connect(to, {.timeout_ms = 20000,
                                                 .private_data = std::span<const std::byte>(&idx, 1)});
        if (!c) { errs[i] = c.error(); return; }
        auto d = remote_descriptor::decode(c.value().peer_private_data().first(remote_descriptor::encoded_size));
        if (!d) { errs[i] = d.error(); return; }
        std::vector<unsigned char> src(slot);
        fill(src.data(), slot, unsigned(100 + i));
        auto smr = MemoryRegion::reg(c.value().pd(), src.data(), slot, access::local_write);
        if (!smr) { errs[i] = smr.error(); return; }
        // Two writes of half a slot each.
        auto b = c.value().qp().start_send();
        ibv_sge lo = smr.value().sge(), hi = smr.value().sge();
        lo.length = hi.length = slot / 2;
        hi.addr += slot / 2;
        b.write({.id = 1}, d.value().at(0), lo);
        b.write({.id = 2, .flags = send_flag::signaled}, d.value().at(slot / 2), hi);
        if (auto s = b.submit(); !s) { errs[i] = s.error(); return; }
        ibv_wc wc{};
        for (int k = 0; k < 200000; ++k) {
          auto n = c.value().cq().poll(std::span(&wc, 1));
          if (n && n.value() == 1) break;
          std::this_thread::sleep_for(50us);
        }
        statuses[i] = wc.wr_id == 2 ? int(wc.status) : -1;
        (void)c.value().disconnect();
      });
    for (auto &t : ts) t.join();
    server.join();
    for (auto &e : accept_errors) UNSCOPED_INFO(e);
    CHECK(accept_failures == 0);
    CHECK(accepted.size() == std::size_t(clients));
    for (int i = 0; i < clients; ++i) {
      INFO("client " << i << ": " << errs[i].message());
      CHECK(!errs[i]);
      CHECK(statuses[i] == IBV_WC_SUCCESS);
      std::vector<unsigned char> expect(slot);
      fill(expect.data(), slot, unsigned(100 + i));
      CHECK(std::memcmp(area + i * slot, expect.data(), slot) == 0);
    }
    // Each accepted connection has its own QP, and each sees the client's disconnect.
    std::vector<std::uint32_t> qpns;
    for (auto &c : accepted) {
      qpns.push_back(c.qp().qp_num());
      auto d = c.wait_disconnected(10000);
      CHECK((d && d.value()));
    }
    std::sort(qpns.begin(), qpns.end());
    CHECK(std::adjacent_find(qpns.begin(), qpns.end()) == qpns.end());
    accepted.clear();
  }
  // Nothing leaked: the same resource counts as before.
  CHECK(kernel_resources() == before);
}

TEST_CASE("address::of_device: the device's IPv4 address from its GID table", "[cm]") {
  auto ctx = open_device();
  const auto a = need(address::of_device(ctx), "of_device");
  CHECK(a.to_string() == std::string(local_ip) + ":0"); // rxe0 sits on dummy0, 192.0.2.1
  CHECK_FALSE(a.is_v6());
  CHECK(address::of_device(Context{}).error() == errc::null_handle);
  CHECK_FALSE(address::of_device(ctx, 7)); // no such port: ibv_query_port's errno
  // What the examples connect to: a listener there accepts.
  auto l = need(Listener::listen(a), "listen on the device address");
  CHECK(l.port() != 0);
}

TEST_CASE("at the fd limit: the event channel's EMFILE names the call and the peer; nothing leaks", "[cm]") {
  const std::string before = cm_resources_baseline();
  auto l = listen_any_port();
  const address to = target(l);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  // The lowest free fd is the next one rdma_create_event_channel gets: a limit just at it leaves none.
  const int probe = ::dup(0);
  REQUIRE(probe >= 0);
  ::close(probe);
  rlimit low = old;
  low.rlim_cur = rlim_t(probe);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto c = Connection::start_connect(to);
  auto l2 = Listener::listen(addr(std::string(local_ip) + ":0"));
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
  REQUIRE(!c);
  INFO(c.error().message());
  CHECK(c.error() == std::errc::too_many_files_open);
  CHECK(cm_call_of(c.error()) == cm_call::rdma_create_event_channel);
  CHECK(c.error().message().rfind("rdma_cm: connect to " + to.to_string() +
                                      ": rdma_create_event_channel failed: " +
                                      std::generic_category().message(EMFILE) + " (",
                                  0) == 0);
  REQUIRE(!l2);
  INFO(l2.error().message());
  CHECK(l2.error() == std::errc::too_many_files_open);
  CHECK(cm_call_of(l2.error()) == cm_call::rdma_create_event_channel);
  CHECK(l2.error().message().find("listen on 192.0.2.1:0: rdma_create_event_channel failed") != std::string::npos);
  // With the limit back, the same connect works, and nothing was left behind.
  {
    auto ok = Connection::start_connect(to);
    CHECK(ok.has_value());
  }
  l = Listener{};
  CHECK(kernel_resources() == before);
}

namespace {
std::atomic<int> cm_reports{0};
void count_report(const destroy_failure &) noexcept { ++cm_reports; }
} // namespace

TEST_CASE("a request taken from a listener outlives it: destroyed, or accepted, after the listener "
          "went (destroy(), move assignment, destructor; its id stays on the listener's own channel "
          "until then: no EBADF, no report)",
          "[cm]") {
  const std::string before = cm_resources_baseline();
  const long fds_before = open_fds();
  const destroy_failure_handler old = set_destroy_failure_handler(&count_report);
  cm_reports = 0;
  // Ended by its checked destroy(), or replaced by a move assignment (the default assignment: the
  // old id, then the old channel, deferred without a report until the request goes), while the
  // request lives: the request's own checked destroy() succeeds (it failed with EBADF when the
  // channel went with the listener) and the client sees the reject.
  for (const bool by_assignment : {false, true}) {
    INFO("the listener ended by " << (by_assignment ? "a move assignment" : "destroy()"));
    auto l = listen_any_port();
    const address to = target(l);
    std::atomic<int> client_rc{-1};
    std::thread client([&] {
      auto c = Connection::connect(to, {.timeout_ms = 10000});
      client_rc = c ? 0 : 1;
    });
    auto req = need(l.get_request(10000), "get_request");
    if (by_assignment) l = Listener{};
    else need(l.destroy(), "listener destroy");
    CHECK(!l);
    auto d = req.destroy();
    INFO("request destroy: " << (d ? "ok" : d.error().message()));
    CHECK(d);
    client.join();
    CHECK(client_rc == 1); // rejected
  }
  {
    // Accepted after the listener's destructor ran: the connection is established and carries
    // data; the listener's channel goes once the id has moved to the connection's own channel.
    std::optional<Listener> l{listen_any_port()};
    const address to = target(*l);
    alignas(64) static std::uint64_t word = 0;
    std::atomic<bool> client_ok{false};
    std::thread client([&] {
      auto c = Connection::connect(to, {.timeout_ms = 10000});
      if (!c) return;
      auto mr = MemoryRegion::reg(c.value().pd(), &word, sizeof word, access::local_write);
      if (!mr || !c.value().qp().post_recv(1, mr.value().sge())) return;
      // No Catch2 macro (wait_wc's INFO/REQUIRE) off the test's thread: Catch2 is not
      // thread-safe (under ASan its message stack was read after free).
      ibv_wc wc[1];
      const std::int64_t until = now_ms() + 10000;
      std::size_t got = 0;
      while (got == 0 && now_ms() < until) {
        auto p = c.value().cq().poll(wc);
        if (!p) return;
        got = p.value();
      }
      client_ok = got == 1 && wc[0].status == IBV_WC_SUCCESS && word == 0x5eed;
      (void)c.value().disconnect();
    });
    auto req = need(l->get_request(10000), "get_request");
    l.reset(); // the listener's destructor, with the request alive
    auto conn = need(req.accept({.timeout_ms = 10000}), "accept after the listener went");
    CHECK(conn.state() == conn_state::established);
    const std::uint64_t v = 0x5eed;
    auto b = conn.qp().start_send();
    b.send_inline({.id = 9, .flags = send_flag::signaled}, std::as_bytes(std::span(&v, 1)));
    need(b.submit(), "send");
    CHECK(one_wc(conn.cq()).status == IBV_WC_SUCCESS);
    client.join();
    CHECK(client_ok);
  }
  set_destroy_failure_handler(old);
  CHECK(cm_reports == 0);
  CHECK(open_fds() == fds_before);
  CHECK(kernel_resources() == before);
}

TEST_CASE("retry_hint_of for cm codes: nobody listens, unreachable, a resolution timeout and a step "
          "timeout retry; an application's reject and local errors do not", "[cm]") {
  struct row {
    std::error_code ec;
    retry_hint want;
    const char *what;
  };
  const row rows[] = {
      {cm_error(RDMA_CM_EVENT_REJECTED, 8), retry_hint::yes, "REJECTED 8: nobody listens yet"},
      {cm_error(RDMA_CM_EVENT_REJECTED, 28), retry_hint::no, "REJECTED 28: the peer application"},
      {cm_error(RDMA_CM_EVENT_REJECTED, 3), retry_hint::no, "REJECTED 3: no resources"},
      {cm_error(RDMA_CM_EVENT_UNREACHABLE, ETIMEDOUT), retry_hint::yes, "UNREACHABLE"},
      {cm_error(RDMA_CM_EVENT_ADDR_ERROR, ETIMEDOUT), retry_hint::yes, "ADDR_ERROR ETIMEDOUT"},
      {cm_error(RDMA_CM_EVENT_ADDR_ERROR, EHOSTUNREACH), retry_hint::yes, "ADDR_ERROR EHOSTUNREACH"},
      {cm_error(RDMA_CM_EVENT_ADDR_ERROR, ENETUNREACH), retry_hint::no, "ADDR_ERROR ENETUNREACH"},
      {cm_error(RDMA_CM_EVENT_ADDR_ERROR, ENODEV), retry_hint::no, "ADDR_ERROR ENODEV"},
      {cm_error(RDMA_CM_EVENT_ROUTE_ERROR, ETIMEDOUT), retry_hint::yes, "ROUTE_ERROR ETIMEDOUT"},
      {cm_error(RDMA_CM_EVENT_CONNECT_ERROR, 0), retry_hint::no, "CONNECT_ERROR"},
      {cm_error(RDMA_CM_EVENT_DISCONNECTED, 0), retry_hint::no, "DISCONNECTED"},
      {cm_error(RDMA_CM_EVENT_DEVICE_REMOVAL, 0), retry_hint::no, "DEVICE_REMOVAL"},
      {cm_timeout(cm_step::resolve_addr), retry_hint::yes, "address step timed out"},
      {cm_timeout(cm_step::connect), retry_hint::yes, "connect step timed out"},
      {cm_call_error(cm_call::rdma_resolve_addr, EDESTADDRREQ), retry_hint::no, "a wildcard address"},
      {cm_call_error(cm_call::rdma_bind_addr, EADDRINUSE), retry_hint::no, "port in use"},
      {cm_call_error(cm_call::rdma_create_id, ENOMEM), retry_hint::yes, "ENOMEM"},
  };
  for (const auto &r : rows) {
    INFO(r.what << ": " << r.ec.message());
    CHECK(retry_hint_of(r.ec) == r.want);
    // Naming the side and the address changes nothing.
    CHECK(retry_hint_of(cm_at(r.ec, cm_role::connect_to, addr("192.0.2.1:7471").native())) == r.want);
  }
  // The other categories keep their answers.
  CHECK(retry_hint_of(make_error_code(errc::timeout)) == retry_hint::yes);
  CHECK(retry_hint_of(make_error_code(errc::busy)) == retry_hint::after_progress);
  CHECK(retry_hint_of(std::make_error_code(std::errc::connection_refused)) == retry_hint::no);
}

// The error a retrying connect gives up with (detail::retry_schedule, both connect forms): an
// attempt that the deadline cut short and that timed out does not hide the answer before it
// (on rxe under load a last attempt started a few ms before the deadline timed out, and the
// call reported that instead of reject reason 8). No device: the schedule alone.
TEST_CASE("retry_schedule: a timeout cut short by the deadline gives way to the answer before it", "[cm]") {
  const std::error_code rejected = cm_error(RDMA_CM_EVENT_REJECTED, 8);
  const std::error_code timed_out = cm_timeout(cm_step::connect);
  REQUIRE(is_cm_timeout(timed_out));
  REQUIRE_FALSE(is_cm_timeout(rejected));
  {
    const retry_options r{.total_ms = 60000};
    rdmaxx::detail::retry_schedule s(r);
    CHECK(s.begin_attempt(100000) <= 60000); // bound: the time left, below the caller's
    CHECK(s.failed(rejected) == rejected);
    (void)s.begin_attempt(100000);
    CHECK(s.failed(timed_out) == rejected); // cut short: the reject stands
    (void)s.begin_attempt(100000);
    const std::error_code unreachable = cm_error(RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    CHECK(s.failed(unreachable) == unreachable); // a new answer replaces it
  }
  {
    const retry_options r{.total_ms = 60000};
    rdmaxx::detail::retry_schedule s(r);
    CHECK(s.begin_attempt(100) == 100); // the caller's bound: not cut short
    CHECK(s.failed(rejected) == rejected);
    CHECK(s.begin_attempt(100) == 100);
    CHECK(s.failed(timed_out) == timed_out); // its own timeout: the peer's silence, reported
  }
  {
    const retry_options r{.total_ms = 60000};
    rdmaxx::detail::retry_schedule s(r);
    (void)s.begin_attempt(100000);
    CHECK(s.failed(timed_out) == timed_out); // nothing answered before: the timeout it is
    (void)s.begin_attempt(100000);
    CHECK(s.failed(timed_out) == timed_out);
  }
}

// Connection::connect(to, o, retry_options): a listener that comes up late is waited for; nobody
// listening for the whole deadline gives reason 8 back at the deadline, after several attempts;
// a deadline of 0 is one attempt; a reject by the application and a wildcard address return at
// once; bad retry options are refused before anything. Nothing leaks across the attempts.
TEST_CASE("connect with retry_options: a late listener, the deadline, one attempt, errors not retried",
          "[cm]") {
  const std::string before = cm_resources_baseline();
  {
    std::uint16_t port = 0;
    {
      auto l = listen_any_port();
      port = l.port();
    } // closed: nobody listens there now
    const address to = addr(std::string(local_ip) + ":" + std::to_string(port));

    int attempts = -1;
    auto t0 = now_ms();
    auto one = Connection::connect(to, {.timeout_ms = 10000}, {.total_ms = 0, .attempts = &attempts});
    REQUIRE(!one);
    INFO(one.error().message());
    CHECK(cm_reject_reason(one.error()) == 8);
    CHECK(retry_hint_of(one.error()) == retry_hint::yes);
    CHECK(attempts == 1);

    t0 = now_ms();
    auto gave_up = Connection::connect(to, {.timeout_ms = 10000},
                                       {.total_ms = 1000, .backoff_ms = 50, .max_backoff_ms = 200, .attempts = &attempts});
    const auto took = now_ms() - t0;
    REQUIRE(!gave_up);
    INFO(gave_up.error().message() << " after " << took << " ms, " << attempts << " attempts");
    CHECK(cm_reject_reason(gave_up.error()) == 8); // the last attempt's error
    CHECK(gave_up.error().message().find("connect to " + std::string(local_ip)) != std::string::npos);
    CHECK(took >= 990);
    CHECK(took < 4000);
    CHECK(attempts >= 4); // 50, 100, 200, 200... ms apart
    CHECK(attempts <= 12);

    // The listener comes up 700 ms later, on the same port.
    std::atomic<bool> accepted{false};
    std::thread server([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      auto l = Listener::listen(to);
      if (!l) return;
      auto req = l.value().get_request(10000);
      if (!req) return;
      auto conn = req.value().accept({.timeout_ms = 10000});
      if (!conn) return;
      accepted = true;
      (void)conn.value().wait_disconnected(10000);
    });
    t0 = now_ms();
    auto late = Connection::connect(to, {.timeout_ms = 10000},
                                    {.total_ms = 20000, .backoff_ms = 20, .max_backoff_ms = 100, .attempts = &attempts});
    const auto waited = now_ms() - t0;
    INFO((late ? std::string("connected") : late.error().message()) << " after " << waited << " ms, " << attempts
                                                                     << " attempts");
    REQUIRE(late);
    CHECK(late.value().state() == conn_state::established);
    CHECK(attempts >= 2);
    CHECK(waited >= 600);
    CHECK(waited < 10000);
    need(late.value().disconnect(), "disconnect");
    server.join();
    CHECK(accepted);
    late = make_error_code(errc::null_handle); // the connection goes before the count below

    // A reject by the peer application is an answer: one attempt, at once.
    std::atomic<bool> listening{false};
    std::thread rejecter([&] {
      auto l = Listener::listen(to);
      listening = true;
      if (!l) return;
      auto req = l.value().get_request(10000);
      if (req) (void)req.value().reject();
    });
    while (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    t0 = now_ms();
    auto refused = Connection::connect(to, {.timeout_ms = 10000}, {.total_ms = 20000, .attempts = &attempts});
    rejecter.join();
    REQUIRE(!refused);
    INFO(refused.error().message());
    CHECK(cm_reject_reason(refused.error()) == 28);
    CHECK(attempts == 1);
    CHECK(now_ms() - t0 < 5000);

    // Not worth retrying either: a wildcard address (refused before any call).
    auto wild = Connection::connect(addr("7471"), {.timeout_ms = 2000}, {.total_ms = 20000, .attempts = &attempts});
    REQUIRE(!wild);
    CHECK(wild.error() == std::errc::destination_address_required);
    CHECK(attempts == 1);

    // Bad retry options: refused before any attempt.
    attempts = -1;
    for (const retry_options bad : {retry_options{.total_ms = -1}, retry_options{.total_ms = 100, .backoff_ms = 0},
                                    retry_options{.total_ms = 100, .backoff_ms = 500, .max_backoff_ms = 100}}) {
      retry_options r = bad;
      r.attempts = &attempts;
      auto c = Connection::connect(to, {.timeout_ms = 2000}, r);
      REQUIRE(!c);
      CHECK(c.error() == errc::invalid_argument);
      CHECK(attempts == -1);
    }
  }
  CHECK(kernel_resources() == before);
}
