// examples/08_blocking_grant: the blocking program a new user writes first, with nothing but the
// library's calls: a server moves its region to its final buffer (rereg), grants 256 bytes of it
// and accepts a client by address with the grant in the accept's private data; the client writes
// through the grant and reads the bytes back; the server checks them, revokes (confirmed by the
// grant's own completion) and says so; the client's next write is refused and the server's memory
// stays untouched. The client connects with a deadline, so it may start before the server listens.
//
//   tools/rxe-vm build/examples/08_blocking_grant          # both roles on this host (fork)
//   08_blocking_grant server [ADDR:]PORT                   # one role each, across two hosts:
//   08_blocking_grant client ADDR:PORT
//   tools/rxe-vm --pair 'build/examples/08_blocking_grant server 7481'
//                       'build/examples/08_blocking_grant client $RXE_VM_PEER:7481'   (one line)
//
// Exit status 0 only if the client's bytes landed exactly in the granted range of the region's
// final buffer (none in the first one), read back equal, and its write after the revocation was
// refused with the server's memory unchanged.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {
using namespace rdmaxx;

constexpr window_range granted{1024, 256};
constexpr int step_ms = 20000; // each rdma_cm step and each wait is bounded

// A message to the other side: a zero-byte send (unsignaled) whose arrival is the message; the
// other side posted a zero-byte receive (wr_id 7) for it.
result<void> signal(Connection &c) noexcept {
  auto batch = c.qp().start_send();
  batch.send_inline({.id = 8}, {});
  return batch.submit();
}

result<bool> server(Listener &l) noexcept {
  RDMAXX_TRY(req, l.get_request(60000));
  RDMAXX_TRY(conn, req.prepare({.timeout_ms = step_ms}));
  std::vector<unsigned char> first(4096, '.'), mem(4096, '.');
  RDMAXX_TRY(mr, MemoryRegion::reg(conn.pd(), first.data(), first.size(), access::local_write));
  RDMAXX_TRYV(mr.rereg(change_translation(mem.data(), mem.size()))); // its final buffer
  RDMAXX_TRY(g, StrictGrant::create(conn.pd(), mr, granted));        // mr cannot move while g lives
  RDMAXX_TRY(disp, CompletionDispatcher::create(conn.cq()));
  RDMAXX_TRYV(disp.attach(g));
  RDMAXX_TRYV(conn.qp().post_recv(7, std::span<const ibv_sge>{})); // for the client's "written"
  RDMAXX_TRY(d, g.grant(conn.qp(), access::remote_write | access::remote_read));
  RDMAXX_TRYV(disp.settle(g, step_ms));
  RDMAXX_TRYV(conn.accept(d.encode()));
  RDMAXX_TRYV(conn.wait_established());

  ibv_wc wc{};
  RDMAXX_TRYV(disp.wait(std::span(&wc, 1), step_ms)); // the client: "written and read back"
  bool landed = wc.wr_id == 7 && std::count(first.begin(), first.end(), '.') == 4096;
  for (std::size_t i = 0; i < mem.size(); ++i)
    landed &= mem[i] == (i >= granted.offset && i < granted.offset + granted.length ? 0xAB : '.');
  std::printf("server: %s the client's bytes landed exactly in the granted range\n", landed ? "ok  " : "FAIL");

  RDMAXX_TRYV(g.revoke(conn.qp()));
  RDMAXX_TRYV(disp.settle(g, step_ms)); // the key is dead now
  const std::vector<unsigned char> after = mem;
  RDMAXX_TRYV(conn.qp().post_recv(7, std::span<const ibv_sge>{})); // flushed when the client's late write is refused
  RDMAXX_TRYV(signal(conn));
  RDMAXX_TRYV(disp.wait(std::span(&wc, 1), step_ms)); // flushed: the refused write moved our QP to ERR
  const bool untouched = mem == after && wc.status == IBV_WC_WR_FLUSH_ERR;
  std::printf("server: %s revoked; the late write changed nothing\n", untouched ? "ok  " : "FAIL");
  return landed && untouched;
}

result<bool> client(const address &to) noexcept {
  RDMAXX_TRY(conn, Connection::connect(to, {.timeout_ms = step_ms}, {.total_ms = 60000}));
  RDMAXX_TRY(d, remote_descriptor::decode_private_data(conn.peer_private_data()));
  std::vector<unsigned char> out(granted.length, 0xAB), back(granted.length, 0);
  RDMAXX_TRY(mo, MemoryRegion::reg(conn.pd(), out.data(), out.size(), access::local_write));
  RDMAXX_TRY(mb, MemoryRegion::reg(conn.pd(), back.data(), back.size(), access::local_write));
  RDMAXX_TRYV(conn.qp().post_recv(7, std::span<const ibv_sge>{})); // for the server's "revoked"
  auto batch = conn.qp().start_send();
  batch.write({1}, d.at(0), mo.sge()).read({2, send_flag::signaled}, d.at(0), mb.sge());
  RDMAXX_TRYV(batch.submit());
  RDMAXX_TRYV(conn.cq().wait_for(2, step_ms)); // the read completes after the write
  const bool same = back == out;
  std::printf("client: %s wrote 256 bytes through the grant and read them back\n", same ? "ok  " : "FAIL");
  RDMAXX_TRYV(signal(conn));

  RDMAXX_TRYV(conn.cq().wait_for(7, step_ms)); // the server: "revoked"
  auto late = conn.qp().start_send();
  late.write({3, send_flag::signaled}, d.at(0), mo.sge());
  RDMAXX_TRYV(late.submit());
  auto r = conn.cq().wait_for(3, step_ms);
  const bool refused = !r && r.error() == wc_error(IBV_WC_REM_ACCESS_ERR);
  std::printf("client: %s the write after the revocation was refused\n", refused ? "ok  " : "FAIL");
  return same && refused;
}

int report(const char *role, const result<bool> &r) {
  if (!r) std::fprintf(stderr, "08_blocking_grant %s: %s\n", role, r.error().message().c_str());
  return r && r.value() ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  auto at = address::parse(argc == 3 ? argv[2] : "7481");
  if (!at) return report(argc == 3 ? argv[1] : "server", at.error());
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) {
    auto l = Listener::listen(at.value());
    return l ? report("server", server(l.value())) : report("server", l.error());
  }
  if (argc == 3 && std::strcmp(argv[1], "client") == 0) return report("client", client(at.value()));
  if (argc != 1) {
    std::fprintf(stderr, "usage: 08_blocking_grant [server [ADDR:]PORT | client ADDR:PORT]\n");
    return 2;
  }
  // Both roles here: the client (forked before any verbs call) connects to the device's own
  // address and retries until the server listens.
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    auto ctx = Context::open_first();
    auto ip = ctx ? address::of_device(ctx.value()) : result<address>(ctx.error());
    const int rc = ip ? report("client", client(ip.value().with_port(7481))) : report("client", ip.error());
    std::fflush(stdout);
    ::_exit(rc);
  }
  auto l = Listener::listen(at.value());
  const int rc = l ? report("server", server(l.value())) : report("server", l.error());
  int status = 1;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
