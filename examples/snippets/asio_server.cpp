// docs/asio.md "A server skeleton": one io_context thread, a coroutine per connection, one CQ for
// all (the Node's router routes each completion to its Waiter); each client's message is echoed
// back, then the server waits until the client leaves.
#include <rdmaxx/asio.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>

namespace ra = rdmaxx::asio;

ra::task<rdmaxx::result<void>> echo(rdmaxx::ConnectRequest req, ra::Node &n) {
  using namespace rdmaxx;
  RDMAXX_CO_TRY(conn, req.prepare(n.connection_options()));
  std::array<std::byte, 64> buf{};
  RDMAXX_CO_TRY(mr, MemoryRegion::reg(n.pd(), buf.data(), buf.size(), access::local_write));
  ra::Waiter got(n.router(), 1, conn.qp());
  RDMAXX_CO_TRYV(conn.qp().post_recv(1, mr.sge()));
  RDMAXX_CO_TRYV(co_await ra::accept(conn));
  RDMAXX_CO_TRY(in, co_await got.next(ra::after_ms(20000))); // the client's message
  auto b = conn.qp().start_send();
  b.send({.id = 2}, mr.sge(0, in.byte_len)); // echo it (unsignaled: see below)
  RDMAXX_CO_TRYV(b.submit());
  // The client leaves once the echo arrived, maybe before its QP acknowledged it: the echo's own
  // completion would then come only after the transport's retries. So the server waits for the
  // client's DISCONNECTED, which moves the QP to ERR (an unacknowledged echo is flushed). No
  // deadline: a DISCONNECTED may come late (the CM retries a lost DREQ); a server that must not
  // wait on a client gives one.
  co_return co_await ra::disconnected(conn, n.router(), ra::deadline::max());
}

rdmaxx::result<int> asio_server(int clients) {
  using namespace rdmaxx;
  boost::asio::io_context io;
  RDMAXX_TRY(n, ra::Node::open(io.get_executor(), {.timeout_ms = 20000})); // device, PD, CQ, router
  RDMAXX_TRY(at, address::parse("7475"));
  ra::TaskGroup tasks(io.get_executor()); // counts the coroutines, keeps the first error
  // One coroutine echo(request, n) per connection request, spawned in the group:
  tasks.spawn(ra::serve(tasks, at, {.requests = std::size_t(clients), .idle_ms = 60000}, echo, n));
  io.run(); // returns once every coroutine has ended: an idle router keeps nothing running
  if (tasks.counts().failed) return tasks.first_error();
  return int(tasks.counts().succeeded) - 1; // the connections served (not the accept loop)
}
