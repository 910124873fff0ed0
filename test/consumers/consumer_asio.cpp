// test/consumers/consumer_asio.cpp: the Boost.Asio program every consumer project builds next to
// consumer.cpp (run.sh copies it as asio.cpp): rdmaxx/asio.hpp through the rdmaxx-cm dependency
// plus threads (Asio needs them). No device: a coroutine on an io_context gets rdmaxx's errors
// back as result<T> (a router over null handles, a Waiter of a null router).
#include <rdmaxx/asio.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <cstdio>

int main() {
  namespace ra = rdmaxx::asio;
  namespace net = boost::asio;
  int failures = 0;
  bool ran = false;
  net::io_context io;
  net::co_spawn(io, [&]() -> ra::task<void> {
    rdmaxx::CompletionQueue cq;
    rdmaxx::CompletionChannel ch;
    auto r = ra::CompletionRouter::create(io.get_executor(), cq, ch);
    failures += !(!r && r.error() == rdmaxx::errc::null_handle);
    ra::CompletionRouter none;
    ra::Waiter w(none, 1, 0);
    auto got = co_await w.wait(ra::after_ms(10));
    failures += !(!got && got.error() == rdmaxx::errc::null_handle);
    ran = true;
  }, net::detached);
  io.run();
  failures += !ran;
  std::printf("rdmaxx asio consumer (%s): %s\n", RDMAXX_CONSUMER_KIND, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
