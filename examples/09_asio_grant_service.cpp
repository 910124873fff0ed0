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

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {
using namespace rdmaxx;
namespace ra = rdmaxx::asio;

constexpr int clients = 3, requests = 20, timeout_ms = 5000;
constexpr std::uint64_t slot = 4096;

// The server's side of one connection: each request's descriptor in, the answer written through
// it (the request number in every byte), then the reply.
ra::task<result<void>> answer(ConnectRequest req, ra::Node &n) {
  RDMAXX_CO_TRY(conn, req.prepare(n.connection_options()));
  std::vector<unsigned char> in(remote_descriptor::encoded_size), answer(slot);
  RDMAXX_CO_TRY(in_mr, MemoryRegion::reg(n.pd(), in.data(), in.size(), access::local_write));
  RDMAXX_CO_TRY(ans_mr, MemoryRegion::reg(n.pd(), answer.data(), answer.size(), access::local_write));
  ra::Waiter got(n.router(), 1, conn.qp()), sent(n.router(), 3, conn.qp());
  RDMAXX_CO_TRYV(conn.qp().post_recv(1, in_mr.sge()));
  RDMAXX_CO_TRYV(co_await ra::accept(conn));
  for (int i = 0; i < requests; ++i) {
    RDMAXX_CO_TRYV(co_await got.next(ra::after_ms(timeout_ms)));
    RDMAXX_CO_TRY(d, remote_descriptor::decode(std::as_bytes(std::span(in))));
    std::memset(answer.data(), 'a' + i, answer.size());
    RDMAXX_CO_TRYV(conn.qp().post_recv(1, in_mr.sge())); // the next request
    auto b = conn.qp().start_send();
    b.write({2}, d.at(0), ans_mr.sge()).send_inline({3, send_flag::signaled}, {}); // reply after it
    RDMAXX_CO_TRYV(b.submit());
    RDMAXX_CO_TRYV(co_await sent.next(ra::after_ms(timeout_ms)));
  }
  co_return co_await ra::disconnected(conn, n.router(), ra::after_ms(60000)); // the client leaves
}

// One client: `requests` requests, each a slot granted for the request and revoked after it.
ra::task<result<int>> client(ra::Node &n, address to) {
  RDMAXX_CO_TRY(conn, co_await ra::connect(to, n.connection_options(), {.total_ms = 60000}));
  std::vector<unsigned char> mem(4 * slot);
  RDMAXX_CO_TRY(mr, MemoryRegion::reg(n.pd(), mem.data(), mem.size(), access::local_write));
  RDMAXX_CO_TRY(pool, GrantPool::create(n.pd(), mr, {.slot_size = slot}));
  RDMAXX_CO_TRY(route, n.router().route(pool, conn.qp())); // its completions go to the pool
  ra::Waiter reply(n.router(), 1, conn.qp());
  int good = 0;
  for (int i = 0; i < requests; ++i) {
    RDMAXX_CO_TRYV(conn.qp().post_recv(1, std::span<const ibv_sge>{}));
    RDMAXX_CO_TRY(lease, pool.acquire());
    auto b = conn.qp().start_send();
    RDMAXX_CO_TRY(d, pool.grant(b, conn.qp(), lease, access::remote_write));
    const auto wire = d.encode();
    b.send_inline({3}, wire); // the request: its grant
    RDMAXX_CO_TRYV(b.submit());
    const bool replied = bool(co_await reply.next(ra::after_ms(timeout_ms))); // or the timeout
    RDMAXX_CO_TRYV(co_await ra::revoke(n.router(), pool, conn.qp(), lease, ra::after_ms(timeout_ms)));
    RDMAXX_CO_TRY(bytes, lease.buffer());
    good += replied && std::all_of(bytes.begin(), bytes.end(), [i](std::byte x) { return x == std::byte('a' + i); });
    RDMAXX_CO_TRYV(pool.give_back(lease));
  }
  co_return good;
}

// Both roles (`role` null), or the server on port `to`, or the clients of the server at `to`.
result<int> run(const char *role, const char *to) {
  if (role && (!to || (std::strcmp(role, "server") && std::strcmp(role, "client")))) return errc::invalid_argument;
  boost::asio::io_context io;
  RDMAXX_TRY(n, ra::Node::open(io.get_executor(), {.timeout_ms = timeout_ms}));
  RDMAXX_TRY(at, to ? address::parse(to) : n.local_address(7482));
  ra::TaskGroup tasks(io.get_executor(), [](auto ec) { std::fprintf(stderr, "09: %s\n", ec.message().c_str()); });
  if (!role || *role == 's') tasks.spawn(ra::serve(tasks, at, {.requests = clients, .idle_ms = 60000}, answer, n));
  const int asked = role && *role == 's' ? 0 : clients * requests;
  int answered = 0;
  for (int c = 0; asked && c < clients; ++c) tasks.spawn(client(n, at), [&](int good) { answered += good; });
  io.run(); // returns once every coroutine has ended
  std::printf("09_asio_grant_service: %d of %d requests answered through their grants\n", answered, asked);
  return tasks.counts().failed == 0 && answered == asked ? 0 : 1;
}
} // namespace

int main(int argc, char **argv) { // no argument: both roles; server PORT; client ADDR:PORT
  auto r = run(argc > 1 ? argv[1] : nullptr, argc > 2 ? argv[2] : nullptr);
  if (!r) std::fprintf(stderr, "09_asio_grant_service: %s\n", r.error().message().c_str());
  return r ? r.value() : 1;
}
