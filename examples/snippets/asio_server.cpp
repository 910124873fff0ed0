// README "On a Boost.Asio event loop", a server: one io_context thread, a coroutine per
// connection, one CQ for all (the CompletionRouter routes each completion to its Waiter); each
// client's message is echoed back, then the server waits until the client leaves.
#include <rdmaxx/asio.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <array>
#include <cstddef>

namespace ra = rdmaxx::asio;

ra::task<rdmaxx::result<void>> echo(rdmaxx::ConnectRequest req, rdmaxx::ProtectionDomain &pd,
                                    rdmaxx::CompletionQueue &cq, ra::CompletionRouter &router) {
  using namespace rdmaxx;
  RDMAXX_CO_TRY(conn, req.prepare({.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = 20000}));
  std::array<std::byte, 64> buf{};
  RDMAXX_CO_TRY(mr, MemoryRegion::reg(pd, buf.data(), buf.size(), access::local_write));
  ra::Waiter got(router, 1, conn.qp().qp_num()), sent(router, 2, conn.qp().qp_num());
  RDMAXX_CO_TRYV(conn.qp().post_recv(1, mr.sge()));
  RDMAXX_CO_TRYV(co_await ra::accept(conn));
  RDMAXX_CO_TRY(in, co_await got.wait(ra::after_ms(20000))); // the client's message
  if (auto ec = wc_error(in)) co_return ec;
  auto b = conn.qp().start_send();
  b.send({.id = 2, .flags = send_flag::signaled}, mr.sge(0, in.byte_len)); // echo it
  RDMAXX_CO_TRYV(b.submit());
  RDMAXX_CO_TRY(out, co_await sent.wait(ra::after_ms(20000)));
  if (auto ec = wc_error(out)) co_return ec;
  ra::watch_stop stop;                               // until the client disconnects
  auto gone = co_await ra::watch(conn, router, stop); // (stop.stop() would end it sooner)
  if (gone != std::errc::connection_reset) co_return gone;
  co_return success();
}

rdmaxx::result<int> asio_server(int clients) {
  using namespace rdmaxx;
  RDMAXX_TRY(at, address::parse("7475"));
  RDMAXX_TRY(l, Listener::listen(at));
  RDMAXX_TRY(ctx, Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(ch, CompletionChannel::create(ctx));
  RDMAXX_TRY(cq, CompletionQueue::create(ctx, 256, &ch));
  boost::asio::io_context io;
  RDMAXX_TRY(router, ra::CompletionRouter::create(io.get_executor(), cq, ch));
  int echoed = 0;
  boost::asio::co_spawn(io, [&]() -> ra::task<void> {
    for (int i = 0; i < clients; ++i) {
      auto req = co_await ra::next_request(l, 60000);
      if (!req) co_return;
      boost::asio::co_spawn(io, [&, r = std::move(req).value()]() mutable -> ra::task<void> {
        if (co_await echo(std::move(r), pd, cq, router)) ++echoed;
      }, boost::asio::detached);
    }
  }, boost::asio::detached);
  io.run();       // returns once every client was served: an idle router keeps nothing running
  router.close(); // before the CQ and the channel go
  return echoed;
}
