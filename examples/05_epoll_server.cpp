// examples/05_epoll_server: one thread serves an rdma_cm listener, every accepted connection's
// events, one CompletionQueue shared by all their QPs (through its CompletionChannel) and the
// device's asynchronous events, from a single epoll set. No thread per connection, no busy poll.
//
//   tools/rxe-vm build/examples/05_epoll_server          # server + 3 forked clients, this host
//   05_epoll_server server [ADDR:]PORT CLIENTS           # serve CLIENTS clients, then exit
//   05_epoll_server client ADDR:PORT ID                  # send "hello ID", expect it echoed
//
// The server accepts without blocking (ConnectRequest::prepare, post a receive, accept), echoes
// each message back with an inline send, and exits 0 once every client has disconnected.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace rdmaxx;
constexpr std::size_t msg_size = 32;
constexpr int bound_ms = 30000;

// epoll data: what became readable.
enum : std::uint64_t { tag_listener = 1ull << 62, tag_cq = 1ull << 61, tag_async = 1ull << 60 };

struct client_slot {
  Connection conn;
  unsigned char buf[msg_size] = {};
  MemoryRegion mr;
  bool done = false;
};

result<void> watch(int ep, int fd, std::uint64_t data) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = data;
  if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) return last_errno();
  return success();
}

result<bool> server(const address &at, int clients) noexcept {
  RDMAXX_TRY(l, Listener::listen(at));
  std::printf("server: listening on port %u for %d clients\n", unsigned(l.port()), clients);
  std::fflush(stdout);
  // The device the listener is bound to (a wildcard listener: the first device).
  ibv_context *dev = l.device_context();
  RDMAXX_TRY(ctx, dev ? Context::open(dev->device) : Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(ch, CompletionChannel::create(ctx));
  RDMAXX_TRY(cq, CompletionQueue::create(ctx, 256, &ch));
  RDMAXX_TRYV(cq.arm());
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return last_errno();
  struct closer { int fd; ~closer() { ::close(fd); } } ep_guard{ep};
  // The async fd must not block: wait_async_event(0) is called only when it is readable.
  ::fcntl(ctx.native_handle()->async_fd, F_SETFL,
          ::fcntl(ctx.native_handle()->async_fd, F_GETFL) | O_NONBLOCK);
  RDMAXX_TRYV(watch(ep, l.fd(), tag_listener));
  RDMAXX_TRYV(watch(ep, ch.fd(), tag_cq));
  RDMAXX_TRYV(watch(ep, ctx.native_handle()->async_fd, tag_async));

  std::vector<std::unique_ptr<client_slot>> slots;
  int finished = 0, echoed = 0;
  unsigned unacked = 0;
  bool ok = true;
  while (finished < clients) {
    epoll_event evs[16];
    const int n = ::epoll_wait(ep, evs, 16, bound_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return last_errno();
    if (n == 0) return make_error_code(errc::timeout);
    for (int i = 0; i < n; ++i) {
      const std::uint64_t tag = evs[i].data.u64;
      if (tag == tag_listener) {
        // A request: prepare its QP on our PD and shared CQ, post its receive, accept.
        auto req = l.get_request(0);
        if (!req) continue; // another event of the listener's channel
        auto s = std::make_unique<client_slot>();
        RDMAXX_TRY(c, req.value().prepare({.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = bound_ms}));
        s->conn = std::move(c);
        RDMAXX_TRY(mr, MemoryRegion::reg(pd, s->buf, sizeof s->buf, access::local_write));
        s->mr = std::move(mr);
        RDMAXX_TRYV(s->conn.qp().post_recv(slots.size(), s->mr.sge()));
        RDMAXX_TRYV(s->conn.accept());
        RDMAXX_TRYV(watch(ep, s->conn.fd(), slots.size()));
        slots.push_back(std::move(s));
      } else if (tag == tag_cq) {
        // One event, then the drain rule: poll until empty, re-arm, poll again (poll_and_arm).
        RDMAXX_TRY(which, ch.get_event(0));
        (void)which; // one CQ on this channel
        ++unacked;
        ibv_wc wc[8];
        for (;;) {
          RDMAXX_TRY(got, cq.poll_and_arm(wc));
          for (std::size_t k = 0; k < got; ++k) {
            if (wc[k].status != IBV_WC_SUCCESS) {
              std::printf("server: completion %s\n", ibv_wc_status_str(wc[k].status));
              continue;
            }
            if (wc[k].opcode != IBV_WC_RECV) continue;
            client_slot &s = *slots.at(wc[k].wr_id);
            std::printf("server: from client %llu: \"%.*s\"\n",
                        static_cast<unsigned long long>(wc[k].wr_id), int(wc[k].byte_len), s.buf);
            auto b = s.conn.qp().start_send();
            b.send_inline({.id = wc[k].wr_id, .flags = send_flag::signaled},
                          std::as_bytes(std::span(s.buf, wc[k].byte_len)));
            RDMAXX_TRYV(b.submit());
            ++echoed;
          }
          if (got < std::size(wc)) break;
        }
        if (unacked >= 16) { // batched acknowledgement
          RDMAXX_TRYV(cq.ack_events(unacked));
          unacked = 0;
        }
      } else if (tag == tag_async) {
        auto ev = ctx.wait_async_event(0);
        if (ev) std::printf("server: async event %s\n", ibv_event_type_str(ev.value().event_type));
      } else {
        client_slot &s = *slots.at(tag);
        auto st = s.conn.advance();
        if (!st) {
          std::printf("server: connection %llu: %s\n", static_cast<unsigned long long>(tag),
                      st.error().message().c_str());
          ok = false;
        }
        if ((!st || st.value() == conn_state::disconnected) && !s.done) {
          s.done = true;
          ++finished;
          ::epoll_ctl(ep, EPOLL_CTL_DEL, s.conn.fd(), nullptr);
        }
      }
    }
  }
  RDMAXX_TRYV(cq.ack_events(unacked)); // every event acknowledged before the CQ goes
  std::printf("server: %d clients served, %d messages echoed\n", finished, echoed);
  slots.clear(); // connections (their QPs) before the CQ and PD
  return ok && echoed == clients;
}

result<bool> client(const address &to, int id) noexcept {
  // The server may not listen yet: the connect retries "nobody listens" for up to 30 s.
  RDMAXX_TRY(c, Connection::connect(to, {.timeout_ms = bound_ms}, {.total_ms = 30000, .backoff_ms = 100}));
  char out[msg_size] = {};
  const int len = std::snprintf(out, sizeof out, "hello %d", id);
  unsigned char in[msg_size] = {};
  RDMAXX_TRY(mr, MemoryRegion::reg(c.pd(), in, sizeof in, access::local_write));
  RDMAXX_TRYV(c.qp().post_recv(1, mr.sge()));
  auto b = c.qp().start_send();
  b.send_inline({.id = 2, .flags = send_flag::signaled}, std::as_bytes(std::span(out, std::size_t(len))));
  RDMAXX_TRYV(b.submit());
  bool got_reply = false;
  for (int k = 0; k < 2; ++k) { // our send's completion and the echo, in either order
    ibv_wc wc{};
    RDMAXX_TRY(n, c.cq().wait(std::span(&wc, 1), bound_ms));
    (void)n;
    if (wc.status != IBV_WC_SUCCESS) return wc_error(wc);
    if (wc.wr_id == 1) got_reply = wc.byte_len == unsigned(len) && std::memcmp(in, out, std::size_t(len)) == 0;
  }
  std::printf("client %d: %s\n", id, got_reply ? "echo ok" : "echo WRONG");
  RDMAXX_TRYV(c.disconnect());
  return got_reply;
}

// "Loopback" for RDMA: the IPv4 address of the first device (address::of_device).
result<address> device_ipv4() noexcept {
  RDMAXX_TRY(ctx, Context::open_first());
  return address::of_device(ctx);
}

int report(const char *role, const result<bool> &r) {
  if (!r) {
    std::fprintf(stderr, "05_epoll_server %s failed: %s\n", role, r.error().message().c_str());
    return 1;
  }
  return r.value() ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::strcmp(argv[1], "server") == 0) {
    auto at = address::parse(argv[2]);
    if (!at) return report("server", at.error());
    return report("server", server(at.value(), std::atoi(argv[3])));
  }
  if (argc == 4 && std::strcmp(argv[1], "client") == 0) {
    auto to = address::parse(argv[2]);
    if (!to) return report("client", to.error());
    return report("client", client(to.value(), std::atoi(argv[3])));
  }
  if (argc != 1) {
    std::fprintf(stderr, "usage: 05_epoll_server | server [ADDR:]PORT CLIENTS | client ADDR:PORT ID\n");
    return 2;
  }
  // Server and 3 clients on this host; the clients are forked before any rdma_cm or verbs call.
  constexpr int clients = 3;
  auto ip = device_ipv4();
  if (!ip) return report("server", ip.error());
  const address at = ip.value().with_port(7473);
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int i = 0; i < clients; ++i) {
    const pid_t p = ::fork();
    if (p == 0) {
      const int rc = report("client", client(at, i));
      std::fflush(stdout);
      ::_exit(rc);
    }
    kids.push_back(p);
  }
  const int server_rc = report("server", server(at, clients));
  int bad = 0;
  for (pid_t p : kids) {
    int st = 0;
    while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {}
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  std::printf("05_epoll_server: server %s, %d of %d clients ok\n", server_rc == 0 ? "ok" : "FAILED",
              clients - bad, clients);
  return server_rc == 0 && bad == 0 ? 0 : 1;
}
