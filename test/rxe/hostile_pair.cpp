// test/rxe/hostile_pair: the [hostile] checks across two hosts (issue 16). The owner grants 3001
// bytes at an unaligned offset of a 16 KiB buffer through the library's default grant
// (StrictGrant::create without a type) and sends the descriptor over TCP; the peer, posting with
// plain libibverbs (ibv_post_send), writes and reads inside it, then tries reads, writes and
// atomics just outside and across it, send-with-invalidate naming its key (twice) and its
// neighbours, and, after the owner revokes, the old key. Before each step both sides reset and
// reconnect their QPs (a denied access moves both to ERR). The owner checks after every step that
// its memory outside the grant is byte-identical; every denial must be a remote-access or
// remote-invalid-request completion (for send-with-invalidate: the owner's receive).
//
//   tools/rxe-vm --pair 'build/test/hostile-pair owner 7472' 'build/test/hostile-pair peer $RXE_VM_PEER 7472'
//   build/test/hostile-pair            (both roles in one host: forks the peer, 127.0.0.1)
// Exit 0 only if every step went as expected on both sides; prints attempts, denied, breaches.
#include <rdmaxx/rdmaxx.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

constexpr std::size_t mem_size = 16384, grant_off = 4097, grant_len = 3001;

// ---- TCP: fixed-size messages, blocking, 60 s timeouts ----
bool send_all(int fd, const void *p, std::size_t n) {
  auto *b = static_cast<const char *>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= std::size_t(k);
  }
  return true;
}
bool recv_all(int fd, void *p, std::size_t n) {
  auto *b = static_cast<char *>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= std::size_t(k);
  }
  return true;
}
void timeouts(int fd) {
  timeval tv{60, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}
int listen_on(const char *host, std::uint16_t port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host, &a.sin_addr);
  if (::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(s, 1) != 0) return -1;
  return s;
}
int connect_to(const char *host, const char *port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  for (int attempt = 0; attempt < 600; ++attempt) {
    addrinfo *ai = nullptr;
    if (::getaddrinfo(host, port, &hints, &ai) == 0) {
      const int s = ::socket(AF_INET, SOCK_STREAM, 0);
      const int rc = ::connect(s, ai->ai_addr, ai->ai_addrlen);
      ::freeaddrinfo(ai);
      if (rc == 0) {
        timeouts(s);
        return s;
      }
      ::close(s);
    }
    std::this_thread::sleep_for(100ms);
  }
  return -1;
}

// ---- RDMA: one QP each, endpoints exchanged over the socket ----
struct side {
  Context ctx;
  ProtectionDomain pd;
  CompletionQueue cq;
  QueuePair qp;
};
template <class T>
T must(result<T> r, const char *what) {
  if (!r) {
    std::fprintf(stderr, "hostile-pair: %s: %s\n", what, r.error().message().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}
void must(result<void> r, const char *what) {
  if (!r) {
    std::fprintf(stderr, "hostile-pair: %s: %s\n", what, r.error().message().c_str());
    std::exit(1);
  }
}
#define MUST(expr) must((expr), #expr)
#define MUSTV(expr) must((expr), #expr)

void make_side(side &s, int fd) {
  s.ctx = MUST(Context::open_first());
  s.pd = MUST(ProtectionDomain::alloc(s.ctx));
  s.cq = MUST(CompletionQueue::create(s.ctx, 64));
  s.qp = MUST(QueuePair::create(s.pd, s.cq, s.cq));
  connect_options o;
  o.retry_cnt = 7;
  const endpoint mine = MUST(s.qp.local_endpoint(o));
  endpoint theirs{};
  if (!send_all(fd, &mine, sizeof mine) || !recv_all(fd, &theirs, sizeof theirs)) std::exit(1);
  MUSTV(s.qp.connect(theirs, o));
}

bool wait_wc(CompletionQueue &cq, ibv_wc &wc, std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    auto n = cq.poll(std::span<ibv_wc>(&wc, 1));
    if (!n) return false;
    if (n.value() == 1) return true;
  }
  return false;
}
void drain(CompletionQueue &cq) {
  ibv_wc wc[8];
  for (;;) {
    auto n = cq.poll(wc);
    if (!n || n.value() == 0) break;
  }
}

struct step {
  ibv_wr_opcode op;
  std::int64_t off; // from the grant's first byte
  std::uint32_t len;
  int key;          // 0: the grant's key, 1: key + 1 (inc_rkey), -1: key - 1
  bool allowed;
  const char *what;
};
constexpr std::int64_t L = grant_len;
const step steps[] = {
    {IBV_WR_RDMA_WRITE, 0, grant_len, 0, true, "write the whole grant"},
    {IBV_WR_RDMA_READ, 0, grant_len, 0, true, "read the whole grant"},
    {IBV_WR_RDMA_WRITE, -1, 1, 0, false, "write 1 byte just before"},
    {IBV_WR_RDMA_WRITE, L, 1, 0, false, "write 1 byte just after"},
    {IBV_WR_RDMA_WRITE, -8, 16, 0, false, "write across the start"},
    {IBV_WR_RDMA_WRITE, L - 8, 16, 0, false, "write across the end"},
    {IBV_WR_RDMA_WRITE, 0, grant_len + 1, 0, false, "write one byte too long"},
    {IBV_WR_RDMA_READ, -1, 1, 0, false, "read 1 byte just before"},
    {IBV_WR_RDMA_READ, L, 1, 0, false, "read 1 byte just after"},
    {IBV_WR_RDMA_READ, L + 2048, 64, 0, false, "read 2 KiB past the end"},
    {IBV_WR_ATOMIC_FETCH_AND_ADD, -16, 8, 0, false, "fetch-add before (aligned)"},
    {IBV_WR_ATOMIC_CMP_AND_SWP, L + 15, 8, 0, false, "compare-swap after (aligned)"},
    {IBV_WR_SEND_WITH_INV, 0, 8, 0, false, "send-with-invalidate of the key"},
    {IBV_WR_SEND_WITH_INV, 0, 8, 0, false, "send-with-invalidate of the key, again"},
    {IBV_WR_SEND_WITH_INV, 0, 8, 1, false, "send-with-invalidate of the next key"},
    {IBV_WR_SEND_WITH_INV, 0, 8, -1, false, "send-with-invalidate of the previous key"},
    {IBV_WR_RDMA_WRITE, 0, grant_len, 0, true, "write the whole grant after all that"},
    // the owner revokes (unbind) before the steps below
    {IBV_WR_RDMA_WRITE, 0, grant_len, 0, false, "write with the revoked key"},
    {IBV_WR_RDMA_READ, 0, 64, 0, false, "read with the revoked key"},
    {IBV_WR_SEND_WITH_INV, 0, 8, 0, false, "send-with-invalidate of the revoked key"},
};
constexpr int nsteps = int(sizeof steps / sizeof steps[0]);
constexpr int revoke_before = 17;
unsigned char pattern(int i, std::size_t k) { return static_cast<unsigned char>(i * 37 + k * 11 + 1); }

struct grant_msg {
  std::uint64_t addr;
  std::uint32_t rkey;
};

int owner(int lfd) {
  const int fd = ::accept(lfd, nullptr, nullptr);
  if (fd < 0) return 1;
  timeouts(fd);
  side s;
  make_side(s, fd);
  const auto caps = MUST(s.ctx.query_capabilities({false, false}));
  std::printf("owner: grant mechanism: %s\n", caps.grant_reason);
  std::vector<unsigned char> mem(mem_size), rbuf(64);
  for (std::size_t k = 0; k < mem.size(); ++k) mem[k] = static_cast<unsigned char>(k * 7 + 3);
  std::vector<unsigned char> shadow = mem;
  auto mr = MUST(MemoryRegion::reg(s.pd, mem.data(), mem.size(), access::local_write));
  auto mrecv = MUST(MemoryRegion::reg(s.pd, rbuf.data(), rbuf.size(), access::local_write));
  auto g = MUST(StrictGrant::create(s.pd, mr, {grant_off, grant_len}));
  const auto d = MUST(g.grant(s.qp, access::remote_read | access::remote_write | access::remote_atomic));
  ibv_wc wc{};
  if (!wait_wc(s.cq, wc) || wc.status != IBV_WC_SUCCESS) return 1;
  (void)g.window().complete(wc);
  const grant_msg gm{d.addr, d.rkey};
  if (!send_all(fd, &gm, sizeof gm)) return 1;
  int bad = 0;
  for (int i = 0; i < nsteps; ++i) {
    char c = 0;
    if (!recv_all(fd, &c, 1) || c != 'S') return 1; // the peer has reconnected its QP
    if (i == revoke_before) {
      MUSTV(g.revoke(s.qp, {window_wr_id, send_flag::signaled}));
      if (!wait_wc(s.cq, wc) || wc.status != IBV_WC_SUCCESS) return 1;
      (void)g.window().complete(wc);
    }
    drain(s.cq);
    MUSTV(s.qp.reset_and_reconnect());
    MUSTV(s.qp.post_recv(5, mrecv.sge()));
    if (!send_all(fd, "r", 1)) return 1;
    char done = 0;
    if (!recv_all(fd, &done, 1)) return 1; // the peer's operation completed
    char verdict = 'k';
    if (steps[i].op == IBV_WR_SEND_WITH_INV) {
      if (!wait_wc(s.cq, wc, 10s) || wc.status != IBV_WC_REM_INV_REQ_ERR) {
        std::printf("owner: step %d (%s): receive %s\n", i, steps[i].what, ibv_wc_status_str(wc.status));
        verdict = 'x';
      }
    }
    if (steps[i].allowed && steps[i].op == IBV_WR_RDMA_WRITE)
      for (std::size_t k = 0; k < grant_len; ++k) shadow[grant_off + k] = pattern(i, k);
    if (mem != shadow) {
      std::printf("owner: step %d (%s): memory outside the grant changed\n", i, steps[i].what);
      verdict = 'b';
      shadow = mem;
    }
    bad += verdict != 'k';
    if (!send_all(fd, &verdict, 1)) return 1;
  }
  MUSTV(g.destroy());
  std::printf("owner: %d steps, %d unexpected\n", nsteps, bad);
  ::close(fd);
  return bad == 0 ? 0 : 1;
}

int peer(const char *host, const char *port) {
  const int fd = connect_to(host, port);
  if (fd < 0) return 1;
  side s;
  make_side(s, fd);
  std::vector<unsigned char> buf(8192);
  auto mb = MUST(MemoryRegion::reg(s.pd, buf.data(), buf.size(), access::local_write));
  grant_msg gm{};
  if (!recv_all(fd, &gm, sizeof gm)) return 1;
  int attempts = 0, denied = 0, breaches = 0, unexpected = 0;
  for (int i = 0; i < nsteps; ++i) {
    const step &st = steps[i];
    drain(s.cq);
    MUSTV(s.qp.reset_and_reconnect());
    char r = 0;
    if (!send_all(fd, "S", 1) || !recv_all(fd, &r, 1) || r != 'r') return 1;
    std::uint64_t raddr = std::uint64_t(std::int64_t(gm.addr) + st.off);
    if (st.op == IBV_WR_ATOMIC_FETCH_AND_ADD || st.op == IBV_WR_ATOMIC_CMP_AND_SWP) raddr &= ~7ull;
    const std::uint32_t key = st.key == 0 ? gm.rkey : st.key > 0 ? ::ibv_inc_rkey(gm.rkey) : gm.rkey - 1;
    for (std::size_t k = 0; k < buf.size(); ++k)
      buf[k] = st.op == IBV_WR_RDMA_WRITE ? pattern(i, k) : 0xA5;
    ibv_sge sge = mb.sge(0, st.len);
    ibv_send_wr w{};
    w.wr_id = std::uint64_t(i);
    w.opcode = st.op;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = &sge;
    w.num_sge = 1;
    if (st.op == IBV_WR_SEND_WITH_INV) {
      w.invalidate_rkey = key;
    } else if (st.op == IBV_WR_ATOMIC_FETCH_AND_ADD || st.op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      w.wr.atomic.remote_addr = raddr;
      w.wr.atomic.rkey = key;
    } else {
      w.wr.rdma.remote_addr = raddr;
      w.wr.rdma.rkey = key;
    }
    ibv_send_wr *badwr = nullptr;
    ++attempts;
    ibv_wc wc{};
    const bool posted = ::ibv_post_send(s.qp.native_handle(), &w, &badwr) == 0 && wait_wc(s.cq, wc);
    if (!send_all(fd, "d", 1)) return 1;
    char verdict = 0;
    if (!recv_all(fd, &verdict, 1)) return 1;
    bool ok = posted && verdict == 'k';
    if (st.op == IBV_WR_SEND_WITH_INV) {
      // Acknowledged to the peer; refused by the owner's receive (its verdict says so).
      if (verdict == 'k') ++denied;
    } else if (st.allowed) {
      ok = ok && wc.status == IBV_WC_SUCCESS;
    } else {
      const bool d = wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_REM_INV_REQ_ERR;
      if (wc.status == IBV_WC_SUCCESS) ++breaches;
      if (d) ++denied;
      ok = ok && d;
      if (st.op != IBV_WR_RDMA_WRITE)
        for (std::size_t k = 0; k < st.len; ++k) ok = ok && buf[k] == 0xA5; // nothing returned
    }
    if (verdict == 'b') ++breaches;
    if (!ok) ++unexpected;
    std::printf("peer: step %2d %-44s %-24s owner %c %s\n", i, st.what,
                posted ? ibv_wc_status_str(wc.status) : "(no completion)", verdict, ok ? "ok" : "UNEXPECTED");
  }
  std::printf("[hostile] two hosts: attempts %d, denied %d, breaches %d, unexpected %d, panics 0\n",
              attempts, denied, breaches, unexpected);
  ::close(fd);
  return unexpected == 0 && breaches == 0 ? 0 : 1;
}
} // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "owner") == 0) {
    const int l = listen_on("0.0.0.0", std::uint16_t(std::atoi(argv[2])));
    return l < 0 ? 1 : owner(l);
  }
  if (argc == 4 && std::strcmp(argv[1], "peer") == 0) return peer(argv[2], argv[3]);
  if (argc != 1) {
    std::fprintf(stderr, "usage: hostile-pair [owner PORT | peer HOST PORT]\n");
    return 2;
  }
  const int l = listen_on("127.0.0.1", 7473);
  if (l < 0) return 1;
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(l);
    const int rc = peer("127.0.0.1", "7473");
    std::fflush(stdout);
    std::_Exit(rc);
  }
  const int rc = owner(l);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
