// examples/03_grant_revoke: grant a peer write access to part of your memory through a memory
// window, then revoke it; two processes connected by address over rdma_cm (no socket code, no
// GID index, no endpoint exchange).
//
// The owner listens; for the peer's connection request it prepares the connection (QP in RTS),
// registers a buffer (no remote rights on the region itself), grants 256 bytes of it with remote
// write through the library's default grant (StrictGrant: on rxe a type-1 window over a region of
// exactly those bytes, which no peer can remotely invalidate or reach past), and accepts with the
// grant's 32-byte descriptor as the accept's private data. The peer RDMA-writes through it and
// tells the owner with a send. The owner checks the bytes, revokes the grant (deallocates the
// window and deregisters the exact region: synchronous) and tells the peer, whose next write with
// the same descriptor fails with a remote access error (both QPs go to ERR: the owner sees its
// pending receive flushed); the owner shows its memory untouched.
//
//   tools/rxe-vm build/examples/03_grant_revoke          # both roles: forks the peer, this host
//   03_grant_revoke owner [ADDR:]PORT                    # one role each, across two hosts:
//   03_grant_revoke peer ADDR:PORT
//   tools/rxe-vm --pair 'build/examples/03_grant_revoke owner 7471'
//                       'build/examples/03_grant_revoke peer $RXE_VM_PEER:7471'   (one line)
//
// Exit status 0 only if every expected outcome happened: the peer's write landed exactly in the
// granted range, its write after the revocation failed with a remote access error, and the owner's
// memory was untouched by it.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/memory_window.hpp>
#include <rdmaxx/strict_grant.hpp>
#include <rdmaxx/rdmaxx.hpp>
#include <rdmaxx/remote_descriptor.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace rdmaxx;

constexpr std::size_t buffer_size = 4096;
constexpr window_range granted{1024, 256};
constexpr unsigned char fill_owner = '.';
constexpr unsigned char fill_grant = 0xAB;   // what the peer writes while granted
constexpr unsigned char fill_revoked = 0xCD; // what it tries to write after the revocation
constexpr int step_ms = 20000;               // every rdma_cm step and completion wait is bounded

bool expect(bool ok, const char *role, const char *what) {
  std::printf("%s: %s %s\n", role, ok ? "ok  " : "FAIL", what);
  return ok;
}

// A one-byte message over the connection (an inline send) and its receive buffers.
struct messages {
  unsigned char in[2] = {};
  MemoryRegion mr;
  static result<messages *> make(messages &m, const ProtectionDomain &pd) noexcept {
    RDMAXX_TRY(mr, MemoryRegion::reg(pd, m.in, sizeof m.in, access::local_write));
    m.mr = std::move(mr);
    return &m;
  }
  result<void> post(QueuePair &qp, int slot) noexcept {
    ibv_sge s = mr.sge();
    s.addr += std::uint64_t(slot);
    s.length = 1;
    return qp.post_recv(std::uint64_t(100 + slot), s);
  }
};
result<void> send_byte(QueuePair &qp, char c) noexcept {
  const std::byte b{static_cast<unsigned char>(c)};
  auto batch = qp.start_send();
  batch.send_inline({.id = 9}, std::span(&b, 1)); // unsignalled: completes silently
  return batch.submit();
}

// ---- the owner ----

result<bool> owner(Listener &l) noexcept {
  RDMAXX_TRY(req, l.get_request(60000));
  // The connection brings its own Context, PD and CQ on the device the request arrived on.
  RDMAXX_TRY(conn, req.prepare({.timeout_ms = step_ms}));
  std::vector<unsigned char> mem(buffer_size, fill_owner);
  // The region grants nothing remotely by itself: only the window will.
  RDMAXX_TRY(mr, MemoryRegion::reg(conn.pd(), mem.data(), mem.size(), access::local_write));
  // The grant mechanism the library chose for this device (Capabilities::grant).
  RDMAXX_TRY(g, StrictGrant::create(conn.pd(), mr, granted));
  messages msg;
  RDMAXX_TRYV(messages::make(msg, conn.pd()));
  RDMAXX_TRYV(msg.post(conn.qp(), 0)); // the peer's "written"
  RDMAXX_TRYV(msg.post(conn.qp(), 1)); // flushed when the peer's late write is denied

  // Grant: bind through the connection's QP, then accept with the descriptor as private data.
  // The dispatcher hands the grant its own completion (and gives us only ours).
  RDMAXX_TRY(disp, CompletionDispatcher::create(conn.cq()));
  RDMAXX_TRYV(disp.attach(g));
  RDMAXX_TRY(desc, g.grant(conn.qp(), access::remote_write));
  RDMAXX_TRYV(disp.settle(g, step_ms));
  disp.detach(g); // destroyed below; the rest of the CQ's completions are ours
  ibv_wc wc{};
  std::printf("owner: granted %llu bytes at offset %llu, rkey 0x%x; accepting with the descriptor\n",
              static_cast<unsigned long long>(granted.length),
              static_cast<unsigned long long>(granted.offset), desc.rkey);
  const auto wire = desc.encode();
  RDMAXX_TRYV(conn.accept(wire));
  RDMAXX_TRYV(conn.wait_established());

  RDMAXX_TRY(n1, conn.cq().wait(std::span(&wc, 1), step_ms));
  (void)n1;
  bool ok = expect(wc.status == IBV_WC_SUCCESS && wc.wr_id == 100 && msg.in[0] == 'W', "owner",
                   "peer's message says its write through the window completed");
  bool landed = true;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    const bool inside = i >= granted.offset && i < granted.offset + granted.length;
    landed = landed && mem[i] == (inside ? fill_grant : fill_owner);
  }
  ok &= expect(landed, "owner", "the peer's bytes landed exactly in the granted range");

  // Revoke for good: ibv_dealloc_mw is synchronous, the key is dead when it returns.
  RDMAXX_TRYV(g.destroy());
  const std::vector<unsigned char> snapshot = mem;
  std::printf("owner: revoked (window deallocated, exact region deregistered); telling the peer\n");
  RDMAXX_TRYV(send_byte(conn.qp(), 'R'));

  // The peer's write with the dead key is refused: the QP goes to ERR and flushes our receive.
  RDMAXX_TRY(n2, conn.cq().wait(std::span(&wc, 1), step_ms));
  (void)n2;
  // What the owner can see is its own QP: a refused access moves it to ERR and flushes the
  // receive. A peer that just disconnects does that too; the peer's side reports its write.
  std::printf("owner: after the revocation: completion wr_id %llu, %s\n",
              static_cast<unsigned long long>(wc.wr_id), ibv_wc_status_str(wc.status));
  ok &= expect(wc.wr_id == 101 && wc.status == IBV_WC_WR_FLUSH_ERR, "owner",
               "our pending receive was flushed after the revocation (our QP went to ERR, as a "
               "refused access does)");
  ok &= expect(mem == snapshot, "owner", "owner memory byte-for-byte unchanged since the revocation");
  return ok;
}

// ---- the peer ----

result<bool> peer(const address &to) noexcept {
  // Across two hosts the owner may not listen yet: the connect retries "nobody listens" (and a
  // peer host still coming up) for up to a minute.
  RDMAXX_TRY(conn, Connection::connect(to, {.timeout_ms = step_ms}, {.total_ms = 60000, .backoff_ms = 100}));
  // The accept's private data: the descriptor (the transport pads it with zeros).
  RDMAXX_TRY(desc, remote_descriptor::decode_private_data(conn.peer_private_data()));
  std::printf("peer: connected to %s; descriptor: %llu bytes, rkey 0x%x, %s\n",
              to.to_string().c_str(), static_cast<unsigned long long>(desc.length), desc.rkey,
              desc.rights.any(access::remote_write) ? "writable" : "not writable");
  std::vector<unsigned char> src(granted.length, fill_grant);
  RDMAXX_TRY(ms, MemoryRegion::reg(conn.pd(), src.data(), src.size(), access::local_write));
  messages msg;
  RDMAXX_TRYV(messages::make(msg, conn.pd()));
  RDMAXX_TRYV(msg.post(conn.qp(), 0)); // the owner's "revoked"
  RDMAXX_TRY(where, desc.slice(0, src.size()));

  ibv_wc wc{};
  auto write = [&](std::uint64_t id) -> result<ibv_wc> {
    auto batch = conn.qp().start_send();
    batch.write({id, send_flag::signaled}, where, ms.sge());
    RDMAXX_TRYV(batch.submit());
    RDMAXX_TRY(n, conn.cq().wait(std::span(&wc, 1), step_ms));
    (void)n;
    return wc;
  };
  RDMAXX_TRY(first, write(1));
  bool ok = expect(first.wr_id == 1 && first.status == IBV_WC_SUCCESS, "peer",
                   "our write through the granted window completed successfully");
  RDMAXX_TRYV(send_byte(conn.qp(), 'W'));

  RDMAXX_TRY(n1, conn.cq().wait(std::span(&wc, 1), step_ms));
  (void)n1;
  ok &= expect(wc.status == IBV_WC_SUCCESS && msg.in[0] == 'R', "peer", "owner's message says the grant is revoked");
  std::memset(src.data(), fill_revoked, src.size());
  RDMAXX_TRY(second, write(2));
  std::printf("peer: write after revocation: completion wr_id %llu, %s\n",
              static_cast<unsigned long long>(second.wr_id), ibv_wc_status_str(second.status));
  ok &= expect(second.wr_id == 2 && second.status == IBV_WC_REM_ACCESS_ERR, "peer",
               "our write after the revocation completed with a remote access error");
  return ok;
}

// "Loopback" for RDMA: the IPv4 address of the first device (address::of_device).
result<address> device_ipv4() noexcept {
  RDMAXX_TRY(ctx, Context::open_first());
  return address::of_device(ctx);
}

int report(const char *role, const result<bool> &r) {
  if (!r) {
    std::fprintf(stderr, "03_grant_revoke %s failed: %s\n", role, r.error().message().c_str());
    return 1;
  }
  return r.value() ? 0 : 1;
}

int usage() {
  std::fprintf(stderr, "usage: 03_grant_revoke                      (both roles, this host)\n"
                       "       03_grant_revoke owner [ADDR:]PORT\n"
                       "       03_grant_revoke peer ADDR:PORT\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "owner") == 0) {
    auto at = address::parse(argv[2]);
    if (!at) return report("owner", at.error());
    auto l = Listener::listen(at.value());
    if (!l) return report("owner", l.error());
    std::printf("owner: listening on port %u\n", unsigned(l.value().port()));
    std::fflush(stdout);
    return report("owner", owner(l.value()));
  }
  if (argc == 3 && std::strcmp(argv[1], "peer") == 0) {
    auto to = address::parse(argv[2]);
    if (!to) return report("peer", to.error());
    return report("peer", peer(to.value()));
  }
  if (argc != 1) return usage();

  // Both roles on this host: fork the peer before any rdma_cm or verbs call (that state must not
  // cross a fork); the owner listens on every address with a port the kernel chooses and hands
  // the port to the peer through a pipe; the peer connects to the device's own IPv4 address.
  int fds[2];
  if (::pipe(fds) != 0) return report("owner", last_errno());
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) return report("owner", last_errno());
  if (child == 0) {
    ::close(fds[1]);
    std::uint16_t port = 0;
    const bool got = ::read(fds[0], &port, sizeof port) == sizeof port && port != 0;
    int rc = 1;
    auto ip = device_ipv4();
    if (!ip) rc = report("peer", ip.error());
    else if (got) rc = report("peer", peer(ip.value().with_port(port)));
    std::fflush(stdout);
    ::_exit(rc);
  }
  ::close(fds[0]);
  auto l = Listener::listen(address::parse("0").value());
  const std::uint16_t port = l ? l.value().port() : 0;
  (void)!::write(fds[1], &port, sizeof port);
  ::close(fds[1]);
  const int owner_rc = l ? report("owner", owner(l.value())) : report("owner", l.error());
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  const int peer_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  std::printf("03_grant_revoke: owner %s, peer %s\n", owner_rc == 0 ? "ok" : "FAILED",
              peer_rc == 0 ? "ok" : "FAILED");
  return owner_rc == 0 && peer_rc == 0 ? 0 : 1;
}
