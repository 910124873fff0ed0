// examples/readme_snippets: runs README's snippets (examples/snippets/*.cpp) on rxe and checks
// what they did; the GrantPool client (grant_pool_client.cpp, then grant_pool.cpp) against the
// small server below, which checks the offer and the bytes it read through the grant.
//
//   tools/rxe-vm build/examples/readme-snippets     (the peers connect to 192.0.2.1, rxe0's
//                                                    address in tools/rxe-vm)
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

// The snippets (examples/snippets/*.cpp).
rdmaxx::result<void> loopback_write() noexcept;
rdmaxx::result<void> owner(std::span<unsigned char> mem) noexcept;
rdmaxx::result<void> peer(std::span<unsigned char> src) noexcept;
rdmaxx::result<void> grant_pool_client(std::span<std::byte> buffers) noexcept;
rdmaxx::result<void> serve(rdmaxx::EventChannel &ch, const rdmaxx::ProtectionDomain &pd,
                           const rdmaxx::CompletionQueue &cq, std::vector<rdmaxx::Connection> &conns,
                           std::size_t clients) noexcept;
rdmaxx::result<void> grant_then_revoke(rdmaxx::MemoryRegion &mr,
                                       rdmaxx::result<void> (*send_to_peer)(std::uint64_t, std::uint32_t)) noexcept;
rdmaxx::result<void> window_grant(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp, rdmaxx::CompletionQueue &cq,
                                  rdmaxx::MemoryRegion &mr,
                                  std::array<std::byte, rdmaxx::remote_descriptor::encoded_size> &wire) noexcept;
rdmaxx::result<void> strict_grant(rdmaxx::ProtectionDomain &peer_pd, rdmaxx::QueuePair &qp,
                                  rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &mr) noexcept;
rdmaxx::result<rdmaxx::IndirectKey> indirect_key(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp,
                                                 rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &m1,
                                                 rdmaxx::MemoryRegion &m2, rdmaxx::MemoryRegion &m3,
                                                 std::span<std::byte, rdmaxx::ikey_descriptor::max_encoded_size> wire,
                                                 std::size_t &wire_len) noexcept;
#if RDMAXX_SNIPPETS_ASIO
rdmaxx::result<int> asio_server(int clients); // asio_server.cpp: the clients it echoed
#endif

namespace {
using namespace rdmaxx;

int failures = 0;
void report(const char *what, const std::error_code &ec) {
  std::printf("%s: %s\n", what, ec ? ec.message().c_str() : "ok");
  if (ec) ++failures;
}
void report(const char *what, bool ok, const char *saw) {
  std::printf("%s: %s (%s)\n", what, ok ? "ok" : "FAIL", saw);
  if (!ok) ++failures;
}

std::uint32_t sent_rkey = 0;
result<void> record(std::uint64_t, std::uint32_t rkey) noexcept {
  sent_rkey = rkey;
  return success();
}

// The server of grant_pool_client.cpp: the offer from the connect request, then the request
// (a grant list), an RDMA read of the granted slot, its bytes checked ('x' from grant_pool.cpp),
// the reply; then the client disconnects.
struct pool_server_saw {
  bool offer = false, remote_invalidate = false, bytes = false, gone = false;
};
result<void> grant_pool_server(pool_server_saw &saw) noexcept {
  RDMAXX_TRY(at, address::parse("192.0.2.1:7472"));
  RDMAXX_TRY(l, Listener::listen(at));
  RDMAXX_TRY(req, l.get_request(60000));
  RDMAXX_TRY(offer, grant_offer::decode(req.private_data())); // padded: decoded from the front
  saw.offer = true;
  saw.remote_invalidate = offer.remote_invalidate;
  RDMAXX_TRY(conn, req.prepare({.timeout_ms = 20000}));
  static std::array<std::byte, 64> rx{};
  RDMAXX_TRY(rxmr, MemoryRegion::reg(conn.pd(), rx.data(), rx.size(), access::local_write));
  RDMAXX_TRYV(conn.qp().post_recv(7, rxmr.sge()));
  RDMAXX_TRYV(conn.accept());
  RDMAXX_TRYV(conn.wait_established());
  RDMAXX_TRY(wc, conn.cq().wait_for(7, 20000));
  const auto got = std::span<const std::byte>(rx).first(wc.byte_len);
  RDMAXX_TRY(h, descriptor_header::peek(got));
  if (h.total_size() > got.size()) return make_error_code(errc::malformed_input);
  RDMAXX_TRY(g, grant_list::decode(got.first(h.total_size())));
  static std::array<std::byte, 4096> slot{};
  RDMAXX_TRY(smr, MemoryRegion::reg(conn.pd(), slot.data(), slot.size(), access::local_write));
  RDMAXX_TRY(where, g[0].slice(0, slot.size()));
  auto b = conn.qp().start_send();
  b.read({.id = 8, .flags = send_flag::signaled}, where, smr.sge());
  RDMAXX_TRYV(b.submit());
  RDMAXX_TRYV(conn.cq().wait_for(8, 20000));
  saw.bytes = std::all_of(slot.begin(), slot.end(), [](std::byte x) { return x == std::byte{'x'}; });
  const std::byte done[8]{};
  auto r = conn.qp().start_send();
  r.send_inline({.id = 9, .flags = send_flag::signaled}, done);
  RDMAXX_TRYV(r.submit());
  RDMAXX_TRYV(conn.cq().wait_for(9, 20000));
  RDMAXX_TRY(gone, conn.wait_disconnected(20000));
  saw.gone = gone;
  return success();
}

#if RDMAXX_SNIPPETS_ASIO
// A client of asio_server.cpp (port 7475): connect (retried until the server listens), send a
// message, check that the same bytes come back, disconnect.
result<bool> echo_client(int i) noexcept {
  RDMAXX_TRY(to, address::parse("192.0.2.1:7475"));
  RDMAXX_TRY(c, Connection::connect(to, {.timeout_ms = 20000}, {.total_ms = 120000, .backoff_ms = 100}));
  std::array<char, 64> in{}, out{};
  const int len = std::snprintf(out.data(), out.size(), "hello from client %d", i);
  RDMAXX_TRY(mr, MemoryRegion::reg(c.pd(), in.data(), in.size(), access::local_write));
  RDMAXX_TRYV(c.qp().post_recv(1, mr.sge()));
  auto b = c.qp().start_send();
  b.send_inline({.id = 2, .flags = send_flag::signaled}, std::as_bytes(std::span(out.data(), std::size_t(len))));
  RDMAXX_TRYV(b.submit());
  bool same = false;
  for (int k = 0; k < 2; ++k) { // the send's completion and the echo, in either order
    ibv_wc wc{};
    RDMAXX_TRY(n, c.cq().wait(std::span(&wc, 1), 20000));
    (void)n;
    if (auto ec = wc_error(wc)) return ec;
    if (wc.wr_id == 1) same = wc.byte_len == unsigned(len) && std::memcmp(in.data(), out.data(), std::size_t(len)) == 0;
  }
  RDMAXX_TRYV(c.disconnect());
  return same;
}
#endif

// The snippets that take a PD, a QP and a CQ get them here, over two loopback-connected QPs.
result<void> local_snippets() noexcept {
  RDMAXX_TRY(ctx, Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(cq, CompletionQueue::create(ctx, 64));
  RDMAXX_TRY(a, QueuePair::create(pd, cq, cq));
  RDMAXX_TRY(b, create_indirect_key_qp(pd, cq, cq));
  RDMAXX_TRYV(connect_loopback(a, b));
  static unsigned char mem[16384];
  RDMAXX_TRY(mr, MemoryRegion::reg(pd, mem, sizeof mem, access::local_write | access::mw_bind));

  static unsigned char rmem[4096];
  RDMAXX_TRY(rr, MemoryRegion::reg(pd, rmem, sizeof rmem, access::local_write));
  auto r1 = grant_then_revoke(rr, &record);
  report("rereg.cpp", r1 ? std::error_code{} : r1.error());
  report("rereg.cpp: an rkey was handed out, and remote write is gone after", sent_rkey != 0 &&
         !rr.access().any(access::remote_write), "the rkey sent and the MR's access afterwards");

  std::array<std::byte, remote_descriptor::encoded_size> wire{};
  auto r2 = window_grant(pd, a, cq, mr, wire);
  report("memory_window.cpp", r2 ? std::error_code{} : r2.error());
  auto d = remote_descriptor::decode(wire);
  report("memory_window.cpp: descriptor of 256 bytes at offset 1024",
         d && d.value().length == 256 && d.value().addr == mr.iova() + 1024 &&
             d.value().rights.any(access::remote_write),
         d ? "decoded" : d.error().message().c_str());

  auto r3 = strict_grant(pd, a, cq, mr);
  report("strict_grant.cpp", r3 ? std::error_code{} : r3.error());

  std::memset(mem, '.', sizeof mem);
  RDMAXX_TRY(m1, MemoryRegion::reg(pd, mem, 100, access::local_write | access::remote_write | access::mw_bind));
  RDMAXX_TRY(m2, MemoryRegion::reg(pd, mem + 200, 64, access::local_write | access::remote_write | access::mw_bind));
  RDMAXX_TRY(m3, MemoryRegion::reg(pd, mem + 400, 200, access::local_write | access::remote_write | access::mw_bind));
  std::array<std::byte, ikey_descriptor::max_encoded_size> kw{};
  std::size_t kw_len = 0;
  auto r4 = indirect_key(pd, b, cq, m1, m2, m3, kw, kw_len);
  report("indirect_key.cpp", r4 ? std::error_code{} : r4.error());
  if (r4) {
    auto kd = ikey_descriptor::decode(std::span<const std::byte>(kw.data(), kw_len));
    report("indirect_key.cpp: descriptor of 20 bytes in 3 segments",
           kd && kd.value().length() == 20 && kd.value().segments().size() == 3,
           kd ? "decoded" : kd.error().message().c_str());
  }
  return success();
}
} // namespace

int main() {
  // The peer in a child forked before any verbs or rdma_cm call; it retries until the owner
  // listens (reject reason 8: nobody listens yet).
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) return 1;
  if (child == 0) {
    std::vector<unsigned char> src(256, 0xAB);
    auto r = peer(src); // its connect retries until the owner listens
    std::printf("connect_peer.cpp: %s\n", r ? "ok" : r.error().message().c_str());
    std::fflush(stdout);
    ::_exit(r ? 0 : 1);
  }
  // The GrantPool client in a second child, forked before any verbs call too; it retries until
  // the server below listens.
  const pid_t pool_child = ::fork();
  if (pool_child < 0) return 1;
  if (pool_child == 0) {
    alignas(4096) static std::byte buffers[4 * 4096];
    for (int attempt = 0;; ++attempt) {
      auto r = grant_pool_client(buffers);
      if (r || cm_reject_reason(r.error()) != 8 || attempt == 300) {
        std::printf("grant_pool_client.cpp + grant_pool.cpp: %s\n", r ? "ok" : r.error().message().c_str());
        std::fflush(stdout);
        ::_exit(r ? 0 : 1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
#if RDMAXX_SNIPPETS_ASIO
  // Two clients of the Asio server (asio_server.cpp) in a child of their own, one after the other.
  const pid_t asio_child = ::fork();
  if (asio_child < 0) return 1;
  if (asio_child == 0) {
    bool ok = true;
    for (int i = 0; i < 2; ++i) {
      auto r = echo_client(i);
      std::printf("asio_server.cpp client %d: %s\n", i,
                  !r ? r.error().message().c_str() : r.value() ? "its message came back" : "WRONG echo");
      ok = ok && r && r.value();
    }
    std::fflush(stdout);
    ::_exit(ok ? 0 : 1);
  }
#endif
  // Three clients of the shared-channel server (shared_channel.cpp) in a third child; each retries
  // until the server listens, and the child waits until the server drops them.
  const pid_t shared_child = ::fork();
  if (shared_child < 0) return 1;
  if (shared_child == 0) {
    std::vector<Connection> cs;
    while (cs.size() < 3) {
      auto c = Connection::connect(address::parse("192.0.2.1:7473").value(), {.timeout_ms = 20000},
                                   {.total_ms = 60000}); // retried until the server listens
      if (!c) break;
      cs.push_back(std::move(c).value());
    }
    bool gone = cs.size() == 3;
    for (auto &c : cs) {
      auto d = c.wait_disconnected(30000);
      gone = gone && d && d.value();
    }
    std::printf("shared_channel.cpp clients: %s\n", gone ? "ok" : "FAILED");
    std::fflush(stdout);
    ::_exit(gone ? 0 : 1);
  }
  std::vector<unsigned char> mem(4096, '.');
  auto o = owner(mem);
  report("connect_owner.cpp", o ? std::error_code{} : o.error());
  bool landed = true;
  for (std::size_t i = 0; i < mem.size(); ++i)
    landed = landed && mem[i] == (i >= 1024 && i < 1280 ? 0xAB : '.');
  report("connect_owner.cpp: the peer's 256 bytes landed exactly at [1024, 1280)", landed, "owner memory checked");
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;

  pool_server_saw saw;
  auto ps = grant_pool_server(saw);
  report("grant_pool server", ps ? std::error_code{} : ps.error());
  report("grant_pool_client.cpp: the pool's offer arrived in the connect request", saw.offer,
         saw.remote_invalidate ? "remote invalidation offered" : "no remote invalidation (type-1 windows)");
  report("grant_pool.cpp: the server read the slot's 4096 'x' bytes through the grant", saw.bytes,
         "server's RDMA read checked");
  report("grant_pool_client.cpp: the client disconnected after its request", saw.gone, "DISCONNECTED seen");
  status = 0;
  while (::waitpid(pool_child, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;

  {
    auto ctx = Context::open_first();
    auto pd = ctx ? ProtectionDomain::alloc(ctx.value()) : result<ProtectionDomain>(ctx.error());
    auto cq = ctx ? CompletionQueue::create(ctx.value(), 64) : result<CompletionQueue>(ctx.error());
    auto ch = EventChannel::create();
    std::vector<Connection> conns;
    auto r = pd && cq && ch ? serve(ch.value(), pd.value(), cq.value(), conns, 3)
                            : result<void>(!pd ? pd.error() : !cq ? cq.error() : ch.error());
    report("shared_channel.cpp", r ? std::error_code{} : r.error());
    const bool all = conns.size() == 3 && std::all_of(conns.begin(), conns.end(), [&](const Connection &c) {
      return c.state() == conn_state::established && c.fd() == ch.value().fd();
    });
    report("shared_channel.cpp: 3 connections established on the one shared cm fd", all, "states and fds checked");
    conns.clear(); // the clients see DISCONNECTED (the ids are destroyed), then the channel goes
    status = 0;
    while (::waitpid(shared_child, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
#if RDMAXX_SNIPPETS_ASIO
  {
    auto echoed = asio_server(2);
    report("asio_server.cpp", echoed ? std::error_code{} : echoed.error());
    report("asio_server.cpp: 2 clients echoed, then io_context::run() returned", echoed && echoed.value() == 2,
           "the router left open until run() returned");
    status = 0;
    while (::waitpid(asio_child, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
#endif
  report("loopback_write.cpp", [] { auto r = loopback_write(); return r ? std::error_code{} : r.error(); }());
  if (auto r = local_snippets(); !r) report("setup", r.error());
  std::printf("readme-snippets: %s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
