// examples/07_asio_block_rpc: the block service of 06_block_rpc on Boost.Asio coroutines
// (rdmaxx/asio.hpp), the same wire and the same checks. The server serves every connection on
// one io_context thread: a coroutine per connection, one CQ and one completion channel for all,
// completions routed to the coroutine that waits for their wr_id; a request asked to stall is
// answered late by a coroutine of its own (an Asio timer, not a sleep) while the connection
// goes on. The client runs --connections K coroutines on one thread, each with its own
// connection and GrantPool, requests with a per-request timeout: on the timeout the grant is
// revoked and the revoke awaited; the server's late access must then be refused, the client
// recovers (revoke_all, slots checked, reconnect) and retries, as in 06.
//
//   tools/rxe-vm build/examples/07_asio_block_rpc         # both roles: forks the client
//   07_asio_block_rpc server [ADDR:]PORT
//   07_asio_block_rpc client ADDR:PORT [--requests N] [--timeout-every N] [--connections K]
//   tools/rxe-vm --pair 'build/examples/07_asio_block_rpc server 7474'
//     'build/examples/07_asio_block_rpc client $RXE_VM_PEER:7474 --timeout-every 10'  (one line)
//
// Exit status 0 only if every expected outcome happened (06's list). The client also prints its
// request rate and the heap allocations per request of its steady state.
#include <rdmaxx/asio.hpp>
#include <rdmaxx/connection.hpp>
#include <rdmaxx/grant_list.hpp>
#include <rdmaxx/grant_pool.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <vector>

// Counts heap allocations through operator new (the client's per-request figure). Not inlined,
// so the compiler does not pair a library `new` with the free() inside.
static std::atomic<std::uint64_t> g_allocs{0};
[[gnu::noinline]] void *operator new(std::size_t n) {
  ++g_allocs;
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (rdmaxx allocates its nodes with it): every form that the delete below
// frees must come from this malloc (a sanitizer's own nothrow new would not).
[[gnu::noinline]] void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
  ++g_allocs;
  return std::malloc(n ? n : 1);
}
[[gnu::noinline]] void operator delete(void *p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void *p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }

namespace {

using namespace rdmaxx;
namespace ra = rdmaxx::asio;
namespace net = boost::asio;
using ra::task;

constexpr std::size_t block_size = 4096;
constexpr std::uint32_t blocks = 8;
constexpr std::size_t slots = 4;        // per connection: one request in flight, one revoking
constexpr int step_ms = 20000;          // every rdma_cm step and completion wait is bounded
// The client's per-request timeout: long enough that only the stalls asked for time out, also
// under the sanitizers at -O0 in a loaded VM (at 200 ms an ordinary request sometimes did, was
// served before its revoke, and no late access came to break the connection: the run's checks
// count one break per timeout).
constexpr int timeout_ms = 1000;
constexpr std::uint16_t stall_ms = 2500; // how long the server sits on a request it is asked to
constexpr std::size_t recvs = 16;       // receives posted per connection
constexpr std::size_t msg_max = 64;

enum class op : std::uint8_t { write = 1, read = 2, bye = 3 };

// ---- the wire (as 06): big-endian request header and reply ----
void put(std::byte *p, std::uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = std::byte(v & 0xff);
}
std::uint64_t get(const std::byte *p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | std::uint64_t(p[i]);
  return v;
}
// op(1) flags(1) stall_ms(2) block(4) id(8), then the grant_list. A bye's block field: the
// number of byes the server is to expect (the client's connections; 0, as 06's client sends: 1).
struct request {
  static constexpr std::size_t head = 16;
  op what = op::bye;
  std::uint16_t stall = 0;
  std::uint32_t block = 0;
  std::uint64_t id = 0;
  grant_list grants;

  result<std::size_t> encode(std::span<std::byte> out) const noexcept {
    if (out.size() < head) return make_error_code(errc::buffer_too_small);
    put(&out[0], std::uint8_t(what), 1);
    put(&out[1], 0, 1);
    put(&out[2], stall, 2);
    put(&out[4], block, 4);
    put(&out[8], id, 8);
    if (grants.size() == 0) return head;
    RDMAXX_TRY(n, grants.encode_to(out.subspan(head)));
    return head + n;
  }
  static result<request> decode(std::span<const std::byte> in) noexcept {
    if (in.size() < head) return make_error_code(errc::malformed_input);
    request r;
    r.what = op(get(&in[0], 1));
    r.stall = std::uint16_t(get(&in[2], 2));
    r.block = std::uint32_t(get(&in[4], 4));
    r.id = get(&in[8], 8);
    if (r.what == op::bye) return r;
    if ((r.what != op::write && r.what != op::read) || r.block >= blocks)
      return make_error_code(errc::malformed_input);
    RDMAXX_TRY(g, grant_list::decode(in.subspan(head)));
    if (g.size() != 1 || g[0].length != block_size) return make_error_code(errc::malformed_input);
    r.grants = g;
    return r;
  }
};
constexpr std::size_t reply_size = 16; // request id(8), status(4), reserved(4)
constexpr std::size_t accept_size = 8; // the server's late accesses so far: refused(4), allowed(4)

void fill_block(std::span<std::byte> out, std::uint32_t block, std::uint32_t version) {
  for (std::size_t j = 0; j < out.size(); ++j)
    out[j] = version == 0 ? std::byte{0}
                          : std::byte((block * 131u + version * 31u + j * 7u + (j >> 8)) & 0xff);
}
constexpr std::byte sentinel{0xEE};

bool expect(bool ok, const char *role, const char *what) {
  std::printf("%s: %s %s\n", role, ok ? "ok  " : "FAIL", what);
  return ok;
}
task<void> sleep_ms(int ms) {
  net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
  boost::system::error_code ec;
  co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
}

// wr_ids: connection number << 16 | kind << 8 | index (GrantPool keeps the top 16 bits).
enum : std::uint64_t { k_recv = 1, k_send = 2, k_access = 3, k_late = 4, k_drain = 5 };
constexpr std::uint64_t wr(std::uint64_t conn, std::uint64_t kind, std::uint64_t i = 0) {
  return conn << 16 | kind << 8 | i;
}

// The receive ring of one connection, a Waiter per receive; replies and requests arrive in the
// order the receives were posted (RC), so the next one to wait for is always `next`.
struct ring {
  std::array<std::byte, (recvs + 1) * msg_max> mem{}; // the receives, then the reply to send

  MemoryRegion mr;
  std::array<std::optional<ra::Waiter>, recvs> w;
  std::size_t next = 0;
  std::uint64_t conn = 0;

  result<void> post_all(ra::CompletionRouter &r, QueuePair &qp, std::uint64_t c) noexcept {
    conn = c;
    next = 0;
    for (std::size_t i = 0; i < recvs; ++i) {
      w[i].reset();
      w[i].emplace(r, wr(c, k_recv, i), qp.qp_num());
      RDMAXX_TRYV(qp.post_recv(wr(c, k_recv, i), mr.sge(std::uint32_t(i * msg_max), std::uint32_t(msg_max))));
    }
    return success();
  }
  // The next receive's completion (any status), or why none.
  task<result<ibv_wc>> take(int ms) { return w[next]->wait(ra::after_ms(ms)); } // no frame of its own
  std::span<const std::byte> bytes(const ibv_wc &wc) const {
    return {mem.data() + (wc.wr_id & 0xff) * msg_max, wc.byte_len};
  }
  // Done with the current receive: post it again, move on.
  result<void> repost(QueuePair &qp) noexcept {
    w[next]->rearm();
    RDMAXX_TRYV(qp.post_recv(wr(conn, k_recv, next), mr.sge(std::uint32_t(next * msg_max), std::uint32_t(msg_max))));
    next = (next + 1) % recvs;
    return success();
  }
};

// ---- the server ----

struct server_stats {
  std::uint64_t requests = 0, reads = 0, writes = 0, connections = 0, byes = 0;
  std::uint64_t late_refused = 0, late_allowed = 0, late_dropped = 0, errors = 0;
  std::int64_t byes_expected = -1;
  bool store_intact = true;
};

class server {
public:
  server(Listener &l, net::io_context &io) : l_(l), io_(io) {}

  result<bool> run() noexcept {
    ibv_context *dev = l_.device_context();
    RDMAXX_TRY(ctx, dev ? Context::open(dev->device) : Context::open_first());
    ctx_ = std::move(ctx);
    RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx_));
    pd_ = std::move(pd);
    RDMAXX_TRY(ch, CompletionChannel::create(ctx_));
    ch_ = std::move(ch);
    RDMAXX_TRY(cq, CompletionQueue::create(ctx_, 1024, &ch_));
    cq_ = std::move(cq);
    RDMAXX_TRY(smr, MemoryRegion::reg(pd_, store_.data(), store_.size(), access::local_write));
    store_mr_ = std::move(smr);
    RDMAXX_TRY(router, ra::CompletionRouter::create(io_.get_executor(), cq_, ch_));
    router_ = std::move(router);
    net::co_spawn(io_, accept_loop(), net::detached);
    io_.run();
    const ra::router_stats rs = router_.stats();
    router_.close();
    std::printf("server: router: %llu channel events, %llu of %llu waits suspended; %llu completions: %llu to "
                "waiters, %llu unclaimed\n",
                ull(rs.events), ull(rs.suspended), ull(rs.waits), ull(rs.completions), ull(rs.routed),
                ull(rs.unclaimed));
    std::printf("server: %llu requests (%llu writes, %llu reads served), %llu connections, late accesses: "
                "%llu refused, %llu allowed, %llu dropped with their connection\n",
                ull(st_.requests), ull(st_.writes), ull(st_.reads), ull(st_.connections),
                ull(st_.late_refused), ull(st_.late_allowed), ull(st_.late_dropped));
    bool ok = expect(st_.late_allowed == 0, "server", "no late access went through a revoked grant");
    ok &= expect(st_.store_intact, "server", "refused late reads returned nothing into the block store");
    ok &= expect(st_.connections == st_.late_refused + st_.byes, "server",
                 "one reconnect per refused late access, no other break");
    ok &= expect(st_.errors == 0 && st_.byes > 0, "server", "every other access and request succeeded");
    return ok;
  }

private:
  static unsigned long long ull(std::uint64_t v) { return v; }

  task<void> accept_loop() {
    for (std::uint64_t n = 1;; ++n) {
      auto req = co_await ra::next_request(l_, 60000);
      if (!req && is_cm_timeout(req.error()) && active_ > 0) continue; // nobody new, others busy
      if (!req) {
        std::printf("server: %s\n", req.error().message().c_str());
        ++st_.errors;
        io_.stop();
        co_return;
      }
      net::co_spawn(io_, serve(std::move(req).value(), n), net::detached);
    }
  }

  // One connection, start to end; the connection's coroutines (its watcher, a late access)
  // end before it does.
  task<void> serve(ConnectRequest req, std::uint64_t id) {
    auto offer = grant_offer::decode(req.private_data());
    if (!offer) {
      (void)req.reject();
      co_return;
    }
    auto c = req.prepare({.pd = &pd_, .send_cq = &cq_, .recv_cq = &cq_, .timeout_ms = step_ms});
    if (!c) co_return count_error("prepare", c.error());
    Connection conn = std::move(c).value();
    auto rx = std::make_unique<ring>(); // its Waiters stay where they were registered
    auto mr = MemoryRegion::reg(pd_, rx->mem.data(), rx->mem.size(), access::local_write);
    if (!mr) co_return count_error("reg", mr.error());
    rx->mr = std::move(mr).value();
    if (auto p = rx->post_all(router_, conn.qp(), id); !p) co_return count_error("post_recv", p.error());
    std::array<std::byte, accept_size> acc{};
    put(&acc[0], st_.late_refused, 4);
    put(&acc[4], st_.late_allowed, 4);
    if (auto a = co_await ra::accept(conn, acc); !a) co_return count_error("accept", a.error());
    ++st_.connections;
    ++active_;
    std::printf("server: connection %llu accepted (peer %s send-with-invalidate)\n", ull(id),
                offer.value().remote_invalidate ? "offers" : "does not offer");
    int children = 0; // late accesses of this connection still running
    ra::watch_stop stop;
    net::co_spawn(io_, [&]() -> task<void> { (void)co_await ra::watch(conn, router_, stop); }, net::detached);
    co_await serve_on(conn, *rx, id, offer.value().remote_invalidate, children);
    stop.stop(); // the watcher returns at once
    (void)co_await stop.wait_idle();
    while (children) co_await sleep_ms(10); // a late access may still be sleeping
    --active_;
    if (st_.byes_expected >= 0 && st_.byes == std::uint64_t(st_.byes_expected) && active_ == 0) io_.stop();
  }

  task<void> serve_on(Connection &conn, ring &rx, std::uint64_t id, bool remote_inv, int &children) {
    bool late_pending = false;
    for (;;) {
      auto w = co_await rx.take(step_ms);
      if (!w || w.value().status != IBV_WC_SUCCESS) co_return; // the connection broke or went quiet
      auto r = request::decode(rx.bytes(w.value()));
      if (!r || !rx.repost(conn.qp())) co_return count_error("request", r ? std::error_code{} : r.error());
      if (r.value().what == op::bye) {
        st_.byes_expected = r.value().block ? r.value().block : 1; // 06's client sends 0: one
        ++st_.byes;
        (void)reply(conn, rx, r.value(), id, false);
        co_return;
      }
      ++st_.requests;
      if (r.value().stall != 0 && !late_pending) { // answered late, by a coroutine of its own
        late_pending = true;
        ++children;
        net::co_spawn(io_, late(conn, r.value(), id, children), net::detached);
        continue;
      }
      ra::Waiter aw(router_, wr(id, k_access), conn.qp().qp_num());
      auto a = co_await access(aw, conn, r.value(), wr(id, k_access));
      // Flushed: a late access of this connection was refused meanwhile (both QPs in ERR).
      if (a && a.value().status == IBV_WC_WR_FLUSH_ERR) co_return;
      if (!a || a.value().status != IBV_WC_SUCCESS) {
        std::printf("server: access for request %llu: %s\n", ull(r.value().id),
                    a ? ibv_wc_status_str(a.value().status) : a.error().message().c_str());
        ++st_.errors;
        co_return;
      }
      ++(r.value().what == op::write ? st_.writes : st_.reads);
      if (!reply(conn, rx, r.value(), id, remote_inv)) co_return;
    }
  }

  // RDMA-read (WRITE request) or RDMA-write (READ request) the block through the grant, then its
  // completion awaited on `w` (registered for wr_id before): no coroutine of its own per request.
  task<result<ibv_wc>> access(ra::Waiter &w, Connection &conn, const request &r, std::uint64_t wr_id) {
    const remote_descriptor &d = r.grants[0];
    const ibv_sge local = store_mr_.sge(std::uint32_t(r.block * block_size), std::uint32_t(block_size));
    auto b = conn.qp().start_send();
    if (r.what == op::write) b.read({wr_id, send_flag::signaled}, {d.addr, d.rkey}, local);
    else b.write({wr_id, send_flag::signaled}, {d.addr, d.rkey}, local);
    if (auto s = b.submit(); !s) w.fail(s.error());
    return w.wait(ra::after_ms(step_ms));
  }

  // The client sends its next request only after this reply arrived: one reply buffer will do.
  result<void> reply(Connection &conn, ring &rx, const request &r, std::uint64_t id, bool remote_inv) noexcept {
    std::byte *out = rx.mem.data() + recvs * msg_max;
    std::fill(out, out + reply_size, std::byte{0});
    put(out, r.id, 8);
    auto b = conn.qp().start_send();
    if (remote_inv) { // revoke the client's grant with the reply (type-2 windows only)
      const ibv_sge sge = rx.mr.sge(std::uint32_t(recvs * msg_max), std::uint32_t(reply_size));
      b.send_inv({wr(id, k_send), {}}, r.grants[0].rkey, std::span(&sge, 1));
    } else {
      b.send_inline({wr(id, k_send), {}}, std::span<const std::byte>(out, reply_size));
    }
    return b.submit();
  }

  // The late access: the client gave up on this request long ago and revoked its grant.
  task<void> late(Connection &conn, request r, std::uint64_t id, int &children) {
    co_await sleep_ms(r.stall);
    const std::size_t at = r.block * block_size;
    const std::vector<std::byte> before(store_.begin() + long(at), store_.begin() + long(at + block_size));
    ra::Waiter lw(router_, wr(id, k_late), conn.qp().qp_num());
    auto w = co_await access(lw, conn, r, wr(id, k_late));
    const bool is_read = r.what == op::write;
    std::printf("server: late %s of request %llu through the revoked grant: %s\n",
                is_read ? "RDMA read" : "RDMA write", ull(r.id),
                w ? ibv_wc_status_str(w.value().status) : w.error().message().c_str());
    if (w && w.value().status == IBV_WC_REM_ACCESS_ERR) {
      ++st_.late_refused;
      if (is_read && !std::equal(before.begin(), before.end(), store_.begin() + long(at))) st_.store_intact = false;
    } else if (w && w.value().status == IBV_WC_SUCCESS) {
      ++st_.late_allowed; // the grant was NOT revoked: a failure
    } else {
      ++st_.late_dropped;
    }
    --children;
  }

  void count_error(const char *what, std::error_code ec) {
    std::printf("server: %s: %s\n", what, ec.message().c_str());
    ++st_.errors;
  }

  Listener &l_;
  net::io_context &io_;
  Context ctx_;
  ProtectionDomain pd_;
  CompletionChannel ch_;
  CompletionQueue cq_;
  std::vector<std::byte> store_ = std::vector<std::byte>(blocks * block_size);
  MemoryRegion store_mr_;
  ra::CompletionRouter router_;
  server_stats st_;
  int active_ = 0;
};

// ---- the client ----

struct client_stats {
  std::uint64_t done = 0, bytes_verified = 0, slot_bytes_checked = 0, timeouts = 0, stalls = 0;
  std::uint64_t reconnects = 0, mismatches = 0, slot_damage = 0;
  std::uint32_t server_refused = 0, server_allowed = 0;
};

struct job {
  op what;
  std::uint32_t block;
  std::uint64_t id;
  bool first = true;
};

class client {
public:
  client(address to, int every, int conns) : to_(to), every_(every), conns_(conns) {}

  result<bool> run(int n) noexcept {
    n_ = n;
    RDMAXX_TRY(ctx, Context::open_first());
    ctx_ = std::move(ctx);
    RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx_));
    pd_ = std::move(pd);
    RDMAXX_TRY(ch, CompletionChannel::create(ctx_));
    ch_ = std::move(ch);
    RDMAXX_TRY(cq, CompletionQueue::create(ctx_, 1024, &ch_));
    cq_ = std::move(cq);
    net::io_context io{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE}; // one thread, no other: no locking
    RDMAXX_TRY(router, ra::CompletionRouter::create(io.get_executor(), cq_, ch_));
    router_ = std::move(router);
    for (int c = 0; c < conns_; ++c) {
      std::deque<job> todo;
      std::vector<std::uint32_t> own; // the blocks of this connection: READs check its WRITEs
      for (std::uint32_t b = std::uint32_t(c); b < blocks; b += std::uint32_t(conns_)) own.push_back(b);
      for (int i = c; i < n; i += conns_)
        todo.push_back({i % 3 == 1 ? op::read : op::write, own[std::size_t(i / conns_ * 5) % own.size()],
                        std::uint64_t(i)});
      for (std::uint32_t b : own) todo.push_back({op::read, b, std::uint64_t(n) + b, false});
      net::co_spawn(io, link_body(std::uint64_t(c), std::move(todo)), net::detached);
    }
    io.run(); // returns once every connection's coroutine has ended
    rs_ = router_.stats();
    router_.close();
    std::printf("client: router: %llu channel events, %llu of %llu waits suspended; %llu completions: %llu to "
                "waiters, %llu to pools, %llu unclaimed\n",
                ull(rs_.events), ull(rs_.suspended), ull(rs_.waits), ull(rs_.completions), ull(rs_.routed),
                ull(rs_.to_pools), ull(rs_.unclaimed));
    const double secs = double(end_ms_ - start_ms_) / 1000.0;
    std::printf("client: %llu requests done in %.3f s (%.1f requests/s, %d connections), %llu bytes verified, "
                "%llu slot bytes checked after breaks, %llu timeouts (%llu asked stalls), late accesses refused "
                "(server's count): %u, %llu reconnects; steady state: %.2f heap allocations per request\n",
                ull(st_.done), secs, secs > 0 ? double(st_.done) / secs : 0.0, conns_, ull(st_.bytes_verified),
                ull(st_.slot_bytes_checked), ull(st_.timeouts), ull(st_.stalls), st_.server_refused,
                ull(st_.reconnects), steady_reqs_ ? double(steady_allocs_) / double(steady_reqs_) : 0.0);
    bool ok = expect(st_.done == std::uint64_t(n) + blocks && st_.mismatches == 0 && failed_ == 0, "client",
                     "every request completed and every READ returned the last WRITE's bytes");
    ok &= expect(st_.slot_damage == 0, "client", "no slot was touched after its grant was revoked");
    ok &= expect(st_.timeouts >= st_.stalls && st_.reconnects == st_.server_refused && st_.server_allowed == 0,
                 "client", "every stall timed out, every late access was refused, one reconnect each");
    if (every_ > 0 && std::uint64_t(n) >= std::uint64_t(every_))
      ok &= expect(st_.stalls > 0 && st_.reconnects > 0, "client", "the timeout path was exercised");
    return ok;
  }

private:
  static unsigned long long ull(std::uint64_t v) { return v; }
  enum class outcome { done, timed_out, broken };

  // One connection with its pool, slots and receive ring.
  struct link {
    std::uint64_t index = 0, gen = 0;
    std::vector<std::byte> buffers = std::vector<std::byte>(slots * block_size);
    MemoryRegion mr;
    GrantPool pool;
    ring rx;
    Connection conn;
    std::array<std::uint32_t, blocks> versions{};
    std::array<std::vector<std::byte>, slots> last{}; // what each slot held when given back
    // Of fixed size: the compiler vectorizes fill_block() into them (06's `want` has its size at
    // hand too), where a vector's run-time size left it a byte loop: 25,000 instructions a READ.
    std::array<std::byte, block_size> expect_now{}, want{};
    GrantLease held; // the lease of a request its connection broke under, until recover()
  };

  // One connection's requests. When the last one ends, run() returns: the router holds no Asio
  // operation while no wait is suspended on it (it is closed after run()).
  task<void> link_body(std::uint64_t index, std::deque<job> todo) {
    auto k = std::make_unique<link>();
    k->index = index;
    if (auto r = co_await setup(*k); !r) co_return fail("setup", r.error());
    if (start_ms_ == 0) start_ms_ = detail::monotonic_ms();
    std::vector<job> retry;
    bool late_pending = false; // a request timed out and the server may still touch its grant
    while (!todo.empty() || !retry.empty()) {
      if (todo.empty()) { // only retries left: wait for the late access that breaks the connection
        (void)co_await k->rx.take(step_ms);
        if (auto r = co_await recover(*k); !r) co_return fail("recover", r.error());
        late_pending = false;
        for (auto it = retry.rbegin(); it != retry.rend(); ++it) todo.push_front(*it);
        retry.clear();
        continue;
      }
      job &j = todo.front();
      const bool stall = every_ > 0 && j.first && (j.id + 1) % std::uint64_t(every_) == 0 && !late_pending;
      j.first = false;
      auto o = co_await one(*k, j, stall);
      if (!o) co_return fail("request", o.error());
      if (o.value() == outcome::done) {
        todo.pop_front();
        // The steady state: from the 50th request on (connected, Asio's frames recycled).
        if (++st_.done == 50) allocs_at_ = g_allocs;
        if (st_.done == std::uint64_t(n_) && n_ > 50) {
          steady_allocs_ = g_allocs - allocs_at_;
          steady_reqs_ = st_.done - 50;
        }
      } else if (o.value() == outcome::timed_out) {
        ++st_.timeouts;
        late_pending = true;
        retry.push_back(j);
        todo.pop_front();
      } else {
        if (auto r = co_await recover(*k); !r) co_return fail("recover", r.error());
        late_pending = false;
        for (auto it = retry.rbegin(); it != retry.rend(); ++it) todo.push_front(*it);
        retry.clear();
      }
    }
    end_ms_ = std::max(end_ms_, detail::monotonic_ms());
    // Goodbye: the block field tells the server how many byes to expect.
    auto bo = co_await one(*k, {op::bye, std::uint32_t(conns_), ~0ull >> 16}, false);
    if (!bo || bo.value() != outcome::done) ++failed_;
    (void)k->conn.disconnect();
    k->conn = Connection{};
    router_.detach(k->pool);
  }

  task<result<void>> setup(link &k) {
    RDMAXX_CO_TRY(mr, MemoryRegion::reg(pd_, k.buffers.data(), k.buffers.size(), access::local_write));
    k.mr = std::move(mr);
    RDMAXX_CO_TRY(pool, GrantPool::create(pd_, k.mr, {.slot_size = block_size, .slots = slots}));
    k.pool = std::move(pool);
    RDMAXX_CO_TRY(xmr, MemoryRegion::reg(pd_, k.rx.mem.data(), k.rx.mem.size(), access::local_write));
    k.rx.mr = std::move(xmr);
    co_return co_await connect(k);
  }

  task<result<void>> connect(link &k) {
    const auto offer = k.pool.offer().encode();
    // Across two hosts the server may not listen yet: retried for up to a minute.
    RDMAXX_CO_TRY(c, co_await ra::connect(to_, {.pd = &pd_, .send_cq = &cq_, .recv_cq = &cq_,
                                                .timeout_ms = step_ms, .private_data = offer},
                                          {.total_ms = 60000, .backoff_ms = 100}));
    k.conn = std::move(c);
    const auto acc = k.conn.peer_private_data();
    st_.server_refused = std::max(st_.server_refused, std::uint32_t(get(&acc[0], 4)));
    st_.server_allowed = std::max(st_.server_allowed, std::uint32_t(get(&acc[4], 4)));
    RDMAXX_CO_TRYV(router_.attach(k.pool, k.conn.qp()));
    co_return k.rx.post_all(router_, k.conn.qp(), k.index << 8 | (k.gen++ & 0xff));
  }

  // The request handler: acquire, grant in the request's batch, await the reply (or the
  // timeout), revoke, await the revoke, release. (README shows it: tools/docs keeps them equal.)
  // snippet-begin: handler
  task<result<outcome>> one(link &k, const job &j, bool stall) {
    QueuePair &qp = k.conn.qp();
    GrantLease lease;
    std::uint32_t version = 0;
    // Acquire, grant in the request's batch, send. A plain call: the batch and the request stay
    // off the coroutine's frame (Asio recycles frames of up to 1 KiB; a bigger one is malloc'ed).
    auto sent = [&]() -> result<void> {
      auto batch = qp.start_send();
      request r{j.what, std::uint16_t(stall ? stall_ms : 0), j.block, j.id, {}};
      if (j.what != op::bye) {
        RDMAXX_TRY(l, k.pool.acquire());
        lease = std::move(l);
        version = j.what == op::write ? k.versions[j.block] + 1 : 0;
        RDMAXX_TRY(buf, lease.buffer()); // just acquired: ready
        if (j.what == op::write) fill_block(buf, j.block, version);
        else std::fill(buf.begin(), buf.end(), sentinel);
        std::copy(buf.begin(), buf.end(), k.expect_now.begin());
        RDMAXX_TRY(d, k.pool.grant(batch, qp, lease, j.what == op::write ? access::remote_read : access::remote_write));
        RDMAXX_TRYV(r.grants.push(d));
      }
      std::array<std::byte, request::head + grant_list::encoded_size(1)> h{};
      RDMAXX_TRY(len, r.encode(h));
      batch.send_inline({wr(k.index, k_send), send_flag::fence}, std::span(h).first(len));
      return batch.submit();
    }();
    if (!sent) co_return sent.error();
    if (stall) ++st_.stalls;
    auto w = co_await k.rx.take(j.what == op::bye ? step_ms : timeout_ms);
    const bool replied = w && w.value().status == IBV_WC_SUCCESS && w.value().byte_len == reply_size &&
                         get(k.rx.bytes(w.value()).data(), 8) == j.id;
    const bool broken = (w && !replied) || (!w && w.error() != errc::timeout);
    if (replied && !k.rx.repost(qp)) co_return outcome::broken;
    if (j.what == op::bye) co_return replied ? outcome::done : outcome::broken;
    if (broken) { // recover() settles every lease (revoke_all)
      finish(k, lease, j, version, false);
      co_return broke(j, "reply", why(w));
    }
    if (!replied)
      std::printf("client: request %llu (%s block %u) timed out after %d ms: revoking, slot %u reused\n",
                  ull(j.id), j.what == op::write ? "WRITE" : "READ", j.block, timeout_ms, lease.slot());
    if (auto v = k.pool.revoke(qp, lease); !v) co_return broke(j, "revoke", v.error());
    if (auto s = co_await ra::settled(router_, k.pool, lease, qp.qp_num(), ra::after_ms(step_ms)); !s) {
      finish(k, lease, j, version, false);
      co_return broke(j, "the revoke's completion", s.error());
    }
    finish(k, lease, j, version, replied);
    co_return replied ? outcome::done : outcome::timed_out;
  }
  // snippet-end: handler

  // A request broke its connection: say why (the run's checks count the reconnect).
  outcome broke(const job &j, const char *what, std::error_code ec) {
    std::printf("client: request %llu broke its connection (%s): %s\n", ull(j.id), what, ec.message().c_str());
    return outcome::broken;
  }
  static std::error_code why(const result<ibv_wc> &w) {
    if (!w) return w.error();
    if (auto ec = wc_error(w.value())) return ec;
    return make_error_code(errc::unexpected_completion); // another size, or another request's id
  }

  // The lease is ready (or the connection is gone and recover() will make it so): check its
  // bytes, record what the slot holds, give it back.
  void finish(link &k, GrantLease &lease, const job &j, std::uint32_t version, bool served) {
    if (lease.state() != lease_state::ready) {
      k.held = std::move(lease); // recover() settles it
      return;
    }
    const std::span<std::byte> buf = lease.buffer().value(); // ready: checked above
    if (served && j.what == op::read) {
      fill_block(k.want, j.block, k.versions[j.block]);
      if (!std::equal(buf.begin(), buf.end(), k.want.begin())) ++st_.mismatches;
      st_.bytes_verified += block_size;
    } else if (served) {
      k.versions[j.block] = version;
    } else if (!std::equal(buf.begin(), buf.end(), k.expect_now.begin())) {
      ++st_.slot_damage; // not served, yet changed
    }
    k.last[lease.slot()].assign(buf.begin(), buf.end());
    (void)k.pool.give_back(lease);
  }

  // revoke_all() wants the QP in ERR and its completions polled (grant_pool.hpp). A signaled
  // marker posted on a QP in ERR is flushed after every earlier work request of its send queue
  // (RC keeps order), so once the router routed its completion, the pool had those of all its
  // binds and unbinds. (A fixed sleep instead was too short under the sanitizers at -O0.)
  task<result<void>> drain(link &k) {
    QueuePair &qp = k.conn.qp();
    RDMAXX_CO_TRYV(qp.to_error());
    const std::uint64_t marker = wr(k.index, k_drain);
    ra::Waiter w(router_, marker, qp.qp_num());
    auto b = qp.start_send();
    b.send_inline({marker, send_flag::signaled}, {});
    RDMAXX_CO_TRYV(b.submit());
    RDMAXX_CO_TRYV(co_await w.wait(ra::after_ms(step_ms)));
    co_return success();
  }

  // The connection broke (the server's late access moved both QPs to ERR): let the QP flush,
  // revoke every grant for good, check every slot, reconnect with the same pool.
  task<result<void>> recover(link &k) {
    RDMAXX_CO_TRYV(co_await drain(k));
    RDMAXX_CO_TRYV(k.pool.revoke_all());
    if (k.held) { // the request the connection broke under: not served, its slot unchanged
      const auto held = k.held.buffer(); // ready after revoke_all(), else damage
      const std::span<std::byte> b = held ? held.value() : std::span<std::byte>{};
      if (b.size() != block_size || !std::equal(b.begin(), b.end(), k.expect_now.begin())) ++st_.slot_damage;
      else k.last[k.held.slot()].assign(b.begin(), b.end());
      st_.slot_bytes_checked += block_size;
      if (!k.pool.give_back(k.held)) ++st_.slot_damage;
    }
    std::vector<GrantLease> all;
    for (auto l = k.pool.acquire(); l; l = k.pool.acquire()) all.push_back(std::move(l).value());
    for (GrantLease &l : all) {
      const std::span<std::byte> b = l.buffer().value(); // just acquired: ready
      const auto &want = k.last[l.slot()];
      const bool same = want.empty() ? std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; })
                                     : std::equal(b.begin(), b.end(), want.begin());
      if (!same) ++st_.slot_damage;
      st_.slot_bytes_checked += b.size();
      (void)k.pool.give_back(l);
    }
    k.conn = Connection{};
    RDMAXX_CO_TRYV(co_await connect(k));
    ++st_.reconnects;
    std::printf("client: connection %llu: revoked every grant (revoke_all), slots intact, reconnected "
                "(server refused %u late accesses so far)\n", ull(k.index), st_.server_refused);
    co_return success();
  }

  void fail(const char *what, std::error_code ec) {
    std::printf("client: %s: %s\n", what, ec.message().c_str());
    ++failed_;
  }

  address to_;
  int every_, conns_, n_ = 0;
  Context ctx_;
  ProtectionDomain pd_;
  CompletionChannel ch_;
  CompletionQueue cq_;
  ra::CompletionRouter router_;
  client_stats st_;
  ra::router_stats rs_;
  std::uint64_t failed_ = 0, allocs_at_ = 0, steady_allocs_ = 0, steady_reqs_ = 0;
  std::int64_t start_ms_ = 0, end_ms_ = 0;
};

result<address> device_ipv4() noexcept {
  RDMAXX_TRY(ctx, Context::open_first());
  return address::of_device(ctx);
}

int report(const char *role, const result<bool> &r) {
  if (!r) {
    std::fprintf(stderr, "07_asio_block_rpc %s failed: %s\n", role, r.error().message().c_str());
    return 1;
  }
  return r.value() ? 0 : 1;
}

int usage() {
  std::fprintf(stderr, "usage: 07_asio_block_rpc                      (both roles, this host)\n"
                       "       07_asio_block_rpc server [ADDR:]PORT\n"
                       "       07_asio_block_rpc client ADDR:PORT [--requests N] [--timeout-every N] "
                       "[--connections K]\n");
  return 2;
}

int run_server(Listener &l) {
  net::io_context io{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE}; // one thread, no other: no locking
  server s(l, io);
  return report("server", s.run());
}

} // namespace

int main(int argc, char **argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // lines appear in order with the forked client's
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) {
    auto at = address::parse(argv[2]);
    if (!at) return report("server", at.error());
    auto l = Listener::listen(at.value());
    if (!l) return report("server", l.error());
    std::printf("server: listening on port %u\n", unsigned(l.value().port()));
    std::fflush(stdout);
    return run_server(l.value());
  }
  if (argc >= 3 && std::strcmp(argv[1], "client") == 0) {
    auto to = address::parse(argv[2]);
    if (!to) return report("client", to.error());
    int n = 100, every = 0, conns = 4;
    for (int i = 3; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--requests") == 0) n = std::atoi(argv[i + 1]);
      else if (std::strcmp(argv[i], "--timeout-every") == 0) every = std::atoi(argv[i + 1]);
      else if (std::strcmp(argv[i], "--connections") == 0) conns = std::atoi(argv[i + 1]);
      else return usage();
    }
    if ((argc - 3) % 2 != 0 || n < 0 || every < 0 || conns < 1 || conns > int(blocks)) return usage();
    client c(to.value(), every, conns);
    return report("client", c.run(n));
  }
  if (argc != 1) return usage();

  // Both roles on this host (the rxe suite's run), as 06: the client forked before any verbs
  // call, the port handed over through a pipe.
  int fds[2];
  if (::pipe(fds) != 0) return report("server", last_errno());
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) return report("server", last_errno());
  if (child == 0) {
    ::close(fds[1]);
    std::uint16_t port = 0;
    const bool got = ::read(fds[0], &port, sizeof port) == sizeof port && port != 0;
    int rc = 1;
    auto ip = device_ipv4();
    if (!ip) rc = report("client", ip.error());
    else if (got) {
      // 150 requests over 4 connections, every 25th stalled past its timeout.
      client c(ip.value().with_port(port), 25, 4);
      rc = report("client", c.run(150));
    }
    std::fflush(stdout);
    ::_exit(rc);
  }
  ::close(fds[0]);
  auto l = Listener::listen(address::parse("0").value());
  const std::uint16_t port = l ? l.value().port() : 0;
  (void)!::write(fds[1], &port, sizeof port);
  ::close(fds[1]);
  const int server_rc = l ? run_server(l.value()) : report("server", l.error());
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  const int client_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  std::printf("07_asio_block_rpc: server %s, client %s\n", server_rc == 0 ? "ok" : "FAILED",
              client_rc == 0 ? "ok" : "FAILED");
  return server_rc == 0 && client_rc == 0 ? 0 : 1;
}
