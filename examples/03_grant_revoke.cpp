// examples/03_grant_revoke: grant a peer write access to part of your memory through a memory
// window, then revoke it; two processes.
//
// The owner registers a buffer (no remote rights on the region itself), grants 256 bytes of it with
// remote write through the library's default grant (StrictGrant: on rxe a type-1 window over a
// region of exactly those bytes, which no peer can remotely invalidate or reach past), and sends
// the peer a descriptor (address, length, rkey). The peer RDMA-writes through it. The owner
// revokes the grant (deallocates the window and deregisters the exact region: synchronous)
// and tells the peer, whose next write with the same descriptor fails with a remote access error;
// the owner shows its memory untouched. QP information and the descriptor go over plain TCP.
//
//   tools/rxe-vm build/examples/03_grant_revoke          # both roles: forks the peer, 127.0.0.1
//   03_grant_revoke owner PORT                           # one role each, across two hosts:
//   03_grant_revoke peer HOST PORT
//   tools/rxe-vm --pair 'build/examples/03_grant_revoke owner 7471'
//                       'build/examples/03_grant_revoke peer $RXE_VM_PEER 7471'   (one line)
//
// Exit status 0 only if every expected outcome happened: the peer's write landed exactly in the
// granted range, its write after the revocation failed with a remote access error, and the owner's
// memory was untouched by it.
#include <rdmaxx/memory_window.hpp>
#include <rdmaxx/remote_descriptor.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace rdmaxx;
using namespace std::chrono_literals;

constexpr std::size_t buffer_size = 4096;
constexpr window_range granted{1024, 256};
constexpr unsigned char fill_owner = '.';
constexpr unsigned char fill_grant = 0xAB;   // what the peer writes while granted
constexpr unsigned char fill_revoked = 0xCD; // what it tries to write after the revocation

// ---- a TCP stream of fixed-size messages ----

class Socket {
public:
  explicit Socket(int fd = -1) noexcept : fd_(fd) {}
  Socket(Socket &&o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket &operator=(Socket &&o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int fd() const noexcept { return fd_; }

  result<void> send_all(std::span<const std::byte> b) noexcept {
    while (!b.empty()) {
      const ssize_t n = ::send(fd_, b.data(), b.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return last_errno();
      b = b.subspan(std::size_t(n));
    }
    return success();
  }
  result<void> recv_all(std::span<std::byte> b) noexcept {
    while (!b.empty()) {
      const ssize_t n = ::recv(fd_, b.data(), b.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return make_error_code(errc::malformed_input); // peer closed early
      if (n < 0) return last_errno();
      b = b.subspan(std::size_t(n));
    }
    return success();
  }
  result<void> send_byte(char c) noexcept {
    const std::byte b{static_cast<unsigned char>(c)};
    return send_all({&b, 1});
  }
  result<char> recv_byte() noexcept {
    std::byte b{};
    RDMAXX_TRYV(recv_all({&b, 1}));
    return static_cast<char>(b);
  }

private:
  int fd_;
};

void set_timeout(int fd) noexcept {
  timeval tv{60, 0}; // an emulated VM is slow, but nothing waits forever
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

result<Socket> listen_on(const char *host, std::uint16_t port) noexcept {
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.fd() < 0) return last_errno();
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host, &a.sin_addr) != 1) return make_error_code(errc::invalid_argument);
  if (::bind(s.fd(), reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) return last_errno();
  if (::listen(s.fd(), 1) != 0) return last_errno();
  return s;
}

result<std::uint16_t> port_of(const Socket &s) noexcept {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr *>(&a), &len) != 0) return last_errno();
  return ntohs(a.sin_port);
}

result<Socket> accept_one(const Socket &l) noexcept {
  Socket s(::accept(l.fd(), nullptr, nullptr));
  if (s.fd() < 0) return last_errno();
  set_timeout(s.fd());
  return s;
}

// The owner may not be listening yet (two hosts start together): retry for a while.
result<Socket> connect_to(const char *host, const char *port) noexcept {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::error_code last = make_error_code(errc::timeout);
  for (int attempt = 0; attempt < 300; ++attempt) {
    addrinfo *ai = nullptr;
    if (::getaddrinfo(host, port, &hints, &ai) == 0) {
      Socket s(::socket(AF_INET, SOCK_STREAM, 0));
      const int rc = s.fd() >= 0 ? ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) : -1;
      const int err = errno;
      ::freeaddrinfo(ai);
      if (rc == 0) {
        set_timeout(s.fd());
        return s;
      }
      last = errno_code(err);
    }
    std::this_thread::sleep_for(100ms);
  }
  return last;
}

// ---- what the two sides exchange ----

constexpr std::size_t endpoint_size = 4 + 4 + 16 + 2 + 1;

result<void> send_endpoint(Socket &s, const endpoint &e) noexcept {
  std::array<std::byte, endpoint_size> b{};
  detail::wire_writer w(b);
  w.u32(e.qpn);
  w.u32(e.psn);
  for (auto g : e.gid.raw) w.u8(g);
  w.u16(e.lid);
  w.u8(std::uint8_t(e.mtu));
  return s.send_all(b);
}

result<endpoint> recv_endpoint(Socket &s) noexcept {
  std::array<std::byte, endpoint_size> b{};
  RDMAXX_TRYV(s.recv_all(b));
  detail::wire_reader r(b);
  endpoint e;
  e.qpn = r.u32();
  e.psn = r.u32();
  for (auto &g : e.gid.raw) g = r.u8();
  e.lid = r.u16();
  const std::uint8_t mtu = r.u8();
  if (r.failed() || mtu < IBV_MTU_256 || mtu > IBV_MTU_4096 || e.qpn == 0 || e.qpn > 0xffffff)
    return make_error_code(errc::malformed_input);
  e.mtu = ibv_mtu(mtu);
  return e;
}

/// One completion within 10 s.
result<ibv_wc> wait_wc(CompletionQueue &cq) noexcept {
  ibv_wc wc{};
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    RDMAXX_TRY(n, cq.poll(std::span<ibv_wc>(&wc, 1)));
    if (n == 1) return wc;
  }
  return make_error_code(errc::timeout);
}

/// The RDMA side of either role: device, PD, CQ, QP, connected over `sock`.
struct rdma {
  Context ctx;
  ProtectionDomain pd;
  CompletionQueue cq;
  QueuePair qp;

  static result<rdma> connect(Socket &sock) noexcept {
    rdma r;
    RDMAXX_TRY(ctx, Context::open_first());
    r.ctx = std::move(ctx);
    RDMAXX_TRY(pd, ProtectionDomain::alloc(r.ctx));
    r.pd = std::move(pd);
    RDMAXX_TRY(cq, CompletionQueue::create(r.ctx, 16));
    r.cq = std::move(cq);
    RDMAXX_TRY(qp, QueuePair::create(r.pd, r.cq, r.cq));
    r.qp = std::move(qp);
    connect_options o;
    o.psn = std::uint32_t(::getpid()) & 0xffffff;
    RDMAXX_TRY(mine, r.qp.local_endpoint(o));
    RDMAXX_TRYV(send_endpoint(sock, mine));
    RDMAXX_TRY(theirs, recv_endpoint(sock));
    RDMAXX_TRYV(r.qp.connect(theirs, o));
    return r;
  }
  // Members destroyed in reverse order: QP, CQ, PD, context.
};

bool expect(bool ok, const char *role, const char *what) {
  std::printf("%s: %s %s\n", role, ok ? "ok  " : "FAIL", what);
  return ok;
}

// ---- the owner ----

result<bool> owner(Socket &listener) noexcept {
  RDMAXX_TRY(sock, accept_one(listener));
  RDMAXX_TRY(r, rdma::connect(sock));
  std::vector<unsigned char> mem(buffer_size, fill_owner);
  // The region grants nothing remotely by itself: only the window will.
  RDMAXX_TRY(mr, MemoryRegion::reg(r.pd, mem.data(), mem.size(), access::local_write));
  // The grant mechanism the library chose for this device (Capabilities::grant).
  RDMAXX_TRY(g, StrictGrant::create(r.pd, mr, granted));

  // Grant: bind through the QP connected to the peer.
  RDMAXX_TRY(desc, g.bind(r.qp, access::remote_write, {1, send_flag::signaled}));
  RDMAXX_TRY(bound, wait_wc(r.cq));
  (void)g.window().complete(bound);
  if (auto ec = wc_error(bound)) return ec;
  std::printf("owner: granted %llu bytes at offset %llu, rkey 0x%x; sending the descriptor\n",
              static_cast<unsigned long long>(granted.length),
              static_cast<unsigned long long>(granted.offset), desc.rkey);
  RDMAXX_TRYV(sock.send_all(desc.encode()));

  RDMAXX_TRY(wrote, sock.recv_byte());
  bool ok = expect(wrote == 'W', "owner", "peer reports its write through the window completed");
  bool landed = true;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    const bool inside = i >= granted.offset && i < granted.offset + granted.length;
    landed = landed && mem[i] == (inside ? fill_grant : fill_owner);
  }
  ok &= expect(landed, "owner", "the peer's bytes landed exactly in the granted range");

  // Revoke for good: ibv_dealloc_mw is synchronous, the key is dead when it returns.
  RDMAXX_TRYV(g.revoke());
  const std::vector<unsigned char> snapshot = mem;
  std::printf("owner: revoked (window deallocated, exact region deregistered); telling the peer\n");
  RDMAXX_TRYV(sock.send_byte('R'));

  RDMAXX_TRY(verdict, sock.recv_byte());
  ok &= expect(verdict == 'D', "owner",
               "peer reports its write after the revocation failed with a remote access error");
  ok &= expect(mem == snapshot, "owner", "owner memory untouched after the revocation");
  RDMAXX_TRYV(sock.send_byte('.')); // done: the peer may tear down
  return ok;
}

// ---- the peer ----

result<bool> peer(const char *host, const char *port) noexcept {
  RDMAXX_TRY(sock, connect_to(host, port));
  RDMAXX_TRY(r, rdma::connect(sock));
  std::vector<unsigned char> src(granted.length, fill_grant);
  RDMAXX_TRY(ms, MemoryRegion::reg(r.pd, src.data(), src.size(), access::local_write));

  std::array<std::byte, remote_descriptor::encoded_size> bytes{};
  RDMAXX_TRYV(sock.recv_all(bytes));
  RDMAXX_TRY(desc, remote_descriptor::decode(bytes));
  std::printf("peer: got a descriptor: %llu bytes, rkey 0x%x, %s\n",
              static_cast<unsigned long long>(desc.length), desc.rkey,
              desc.rights.any(access::remote_write) ? "writable" : "not writable");
  RDMAXX_TRY(where, desc.slice(0, src.size()));

  auto write = [&](std::uint64_t id) -> result<ibv_wc> {
    auto batch = r.qp.start_send();
    batch.write({id, send_flag::signaled}, where, ms.sge());
    RDMAXX_TRYV(batch.submit());
    return wait_wc(r.cq);
  };
  RDMAXX_TRY(first, write(1));
  bool ok = expect(first.status == IBV_WC_SUCCESS, "peer", "write through the granted window");
  RDMAXX_TRYV(sock.send_byte(first.status == IBV_WC_SUCCESS ? 'W' : 'E'));

  RDMAXX_TRY(revoked, sock.recv_byte());
  ok &= expect(revoked == 'R', "peer", "owner says the grant is revoked");
  std::memset(src.data(), fill_revoked, src.size());
  RDMAXX_TRY(second, write(2));
  std::printf("peer: write after revocation: %s\n", ibv_wc_status_str(second.status));
  const bool denied = second.status == IBV_WC_REM_ACCESS_ERR;
  ok &= expect(denied, "peer", "write after the revocation fails with a remote access error");
  RDMAXX_TRYV(sock.send_byte(denied ? 'D' : second.status == IBV_WC_SUCCESS ? 'S' : 'X'));
  (void)sock.recv_byte(); // wait for the owner to finish checking
  return ok;
}

int report(const char *role, const result<bool> &r) {
  if (!r) {
    std::fprintf(stderr, "03_grant_revoke %s failed: %s\n", role, r.error().message().c_str());
    return 1;
  }
  return r.value() ? 0 : 1;
}

int usage() {
  std::fprintf(stderr, "usage: 03_grant_revoke                 (both roles, 127.0.0.1)\n"
                       "       03_grant_revoke owner PORT\n"
                       "       03_grant_revoke peer HOST PORT\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "owner") == 0) {
    auto l = listen_on("0.0.0.0", std::uint16_t(std::atoi(argv[2])));
    if (!l) return report("owner", l.error());
    return report("owner", owner(l.value()));
  }
  if (argc == 4 && std::strcmp(argv[1], "peer") == 0) return report("peer", peer(argv[2], argv[3]));
  if (argc != 1) return usage();

  // Both roles: listen on an ephemeral port, fork the peer before any verbs call (verbs state
  // must not cross a fork), run the owner here.
  auto l = listen_on("127.0.0.1", 0);
  if (!l) return report("owner", l.error());
  auto port = port_of(l.value());
  if (!port) return report("owner", port.error());
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) return report("owner", last_errno());
  if (child == 0) {
    Socket none = std::move(l).value(); // the peer does not listen
    const std::string p = std::to_string(port.value());
    const int rc = report("peer", peer("127.0.0.1", p.c_str()));
    std::fflush(stdout);
    ::_exit(rc);
  }
  const int owner_rc = report("owner", owner(l.value()));
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  const int peer_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  std::printf("03_grant_revoke: owner %s, peer %s\n", owner_rc == 0 ? "ok" : "FAILED",
              peer_rc == 0 ? "ok" : "FAILED");
  return owner_rc == 0 && peer_rc == 0 ? 0 : 1;
}
