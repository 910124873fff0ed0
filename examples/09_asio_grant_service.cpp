// examples/09_asio_grant_service: the Asio service a new user writes, with nothing but the
// library's calls: several clients and the server on one io_context thread, one CQ and router for
// all of them. Each request, a client leases a slot of its GrantPool, grants it to the server in
// the request itself (the descriptor is the request's payload, the bind in the same batch), and
// waits for the reply with a timeout; on the reply or the timeout it revokes the grant and awaits
// the revocation's confirmation before it reads the slot and hands it back. The server writes its
// answer through the grant, then replies. Every answer is checked byte for byte.
//
//   tools/rxe-vm build/examples/09_asio_grant_service       # 3 clients x 20 requests, one process
//   09_asio_grant_service server PORT                       # one role each, across two hosts:
//   09_asio_grant_service client ADDR:PORT
//
// Exit status 0 only if every request was answered with the right bytes in the client's slot.
#include <rdmaxx/asio.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {
using namespace rdmaxx;
namespace ra = rdmaxx::asio;

constexpr int clients = 3, requests = 20, timeout_ms = 5000;
constexpr std::uint64_t slot = 4096;

// Everything the coroutines share: the device, one CQ and its router, the listener.
struct service {
  Context ctx;
  ProtectionDomain pd;
  CompletionChannel ch;
  CompletionQueue cq;
  ra::CompletionRouter router;
  conn_options opts() { return {.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = timeout_ms}; }
};

// The server's side of one connection: each request's descriptor in, the answer written through
// it (the request number in every byte), then the reply.
ra::task<result<void>> serve(service &s, ConnectRequest req) {
  RDMAXX_CO_TRY(conn, req.prepare(s.opts()));
  std::vector<unsigned char> in(remote_descriptor::encoded_size), answer(slot);
  RDMAXX_CO_TRY(in_mr, MemoryRegion::reg(s.pd, in.data(), in.size(), access::local_write));
  RDMAXX_CO_TRY(ans_mr, MemoryRegion::reg(s.pd, answer.data(), answer.size(), access::local_write));
  const std::uint32_t q = conn.qp().qp_num();
  ra::Waiter got(s.router, 1, q), sent(s.router, 3, q);
  RDMAXX_CO_TRYV(conn.qp().post_recv(1, in_mr.sge()));
  RDMAXX_CO_TRYV(co_await ra::accept(conn));
  for (int i = 0; i < requests; ++i) {
    RDMAXX_CO_TRY(wc, co_await got.wait(ra::after_ms(timeout_ms)));
    if (auto ec = wc_error(wc)) co_return ec;
    got.rearm();
    RDMAXX_CO_TRY(d, remote_descriptor::decode(std::as_bytes(std::span(in))));
    std::memset(answer.data(), 'a' + i, answer.size());
    RDMAXX_CO_TRYV(conn.qp().post_recv(1, in_mr.sge())); // the next request
    auto b = conn.qp().start_send();
    b.write({2}, d.at(0), ans_mr.sge()).send_inline({3, send_flag::signaled}, {}); // reply after it
    RDMAXX_CO_TRYV(b.submit());
    RDMAXX_CO_TRY(done, co_await sent.wait(ra::after_ms(timeout_ms)));
    if (auto ec = wc_error(done)) co_return ec;
    sent.rearm();
  }
  ra::watch_stop stop; // until the client leaves
  if (auto gone = co_await ra::watch(conn, s.router, stop); gone != std::errc::connection_reset) co_return gone;
  co_return success();
}

// One client: `requests` requests, each a slot granted for the request and revoked after it.
ra::task<result<int>> client(service &s, address to) {
  RDMAXX_CO_TRY(conn, co_await ra::connect(to, s.opts(), {.total_ms = 60000}));
  std::vector<unsigned char> mem(4 * slot);
  RDMAXX_CO_TRY(mr, MemoryRegion::reg(s.pd, mem.data(), mem.size(), access::local_write));
  RDMAXX_CO_TRY(pool, GrantPool::create(s.pd, mr, {.slot_size = slot}));
  RDMAXX_CO_TRYV(s.router.attach(pool, conn.qp()));
  const std::uint32_t q = conn.qp().qp_num();
  ra::Waiter reply(s.router, 1, q);
  int good = 0;
  for (int i = 0; i < requests; ++i) {
    RDMAXX_CO_TRYV(conn.qp().post_recv(1, std::span<const ibv_sge>{}));
    RDMAXX_CO_TRY(lease, pool.acquire());
    auto b = conn.qp().start_send();
    RDMAXX_CO_TRY(d, pool.grant(b, conn.qp(), lease, access::remote_write));
    const auto wire = d.encode();
    b.send_inline({3}, wire); // the request: its grant
    RDMAXX_CO_TRYV(b.submit());
    auto r = co_await reply.wait(ra::after_ms(timeout_ms)); // the reply, or the timeout
    reply.rearm();
    RDMAXX_CO_TRYV(pool.revoke(conn.qp(), lease));          // either way: the grant ends here
    RDMAXX_CO_TRYV(co_await ra::settled(s.router, pool, lease, q, ra::after_ms(timeout_ms)));
    RDMAXX_CO_TRY(bytes, lease.buffer());
    if (r && !wc_error(r.value()) &&
        std::all_of(bytes.begin(), bytes.end(), [&](std::byte x) { return x == std::byte('a' + i); }))
      ++good;
    RDMAXX_CO_TRYV(pool.release(lease));
  }
  s.router.detach(pool);
  co_return good;
}

// Both roles (`role` null), or the server on port `to`, or the clients of the server at `to`.
result<int> run(const char *role, const char *to) {
  service s;
  RDMAXX_TRY(ctx_, Context::open_first());
  s.ctx = std::move(ctx_);
  RDMAXX_TRY(pd_, ProtectionDomain::alloc(s.ctx));
  s.pd = std::move(pd_);
  RDMAXX_TRY(ch_, CompletionChannel::create(s.ctx));
  s.ch = std::move(ch_);
  RDMAXX_TRY(cq_, CompletionQueue::create(s.ctx, 1024, &s.ch));
  s.cq = std::move(cq_);
  RDMAXX_TRY(here, address::of_device(s.ctx));
  RDMAXX_TRY(at, to ? address::parse(to) : result<address>(here.with_port(7482)));
  const bool serving = !role || std::strcmp(role, "server") == 0, asking = !role || !serving;
  Listener l;
  if (serving) {
    RDMAXX_TRY(listening, Listener::listen(at));
    l = std::move(listening);
  }
  boost::asio::io_context io;
  RDMAXX_TRY(router_, ra::CompletionRouter::create(io.get_executor(), s.cq, s.ch));
  s.router = std::move(router_);
  int answered = 0, failed = 0, served = 0;
  auto note = [&](const std::error_code &ec) { ++failed, std::fprintf(stderr, "09: %s\n", ec.message().c_str()); };
  if (serving)
    boost::asio::co_spawn(io, [&]() -> ra::task<void> { // the server: one coroutine per client
      for (int i = 0; i < clients; ++i) {
        auto req = co_await ra::next_request(l, 60000);
        if (!req) co_return note(req.error());
        boost::asio::co_spawn(io, [&, r = std::move(req).value()]() mutable -> ra::task<void> {
          if (auto e = co_await serve(s, std::move(r)); !e) note(e.error());
          else ++served;
        }, boost::asio::detached);
      }
    }, boost::asio::detached);
  for (int c = 0; asking && c < clients; ++c)
    boost::asio::co_spawn(io, [&]() -> ra::task<void> {
      auto n = co_await client(s, at);
      if (!n) co_return note(n.error());
      answered += n.value();
    }, boost::asio::detached);
  io.run(); // returns once every coroutine has ended
  s.router.close();
  std::printf("09_asio_grant_service: %d of %d requests answered through their grants, %d clients "
              "served, %d failures\n", answered, asking ? clients * requests : 0, served, failed);
  const bool ok = (!asking || answered == clients * requests) && (!serving || served == clients);
  return ok && failed == 0 ? 0 : 1;
}
} // namespace

int main(int argc, char **argv) {
  if (argc != 1 && !(argc == 3 && (std::strcmp(argv[1], "server") == 0 || std::strcmp(argv[1], "client") == 0))) {
    std::fprintf(stderr, "usage: 09_asio_grant_service [server PORT | client ADDR:PORT]\n");
    return 2;
  }
  auto r = run(argc == 3 ? argv[1] : nullptr, argc == 3 ? argv[2] : nullptr);
  if (!r) std::fprintf(stderr, "09_asio_grant_service: %s\n", r.error().message().c_str());
  return r ? r.value() : 1;
}
