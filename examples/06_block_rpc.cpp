// examples/06_block_rpc: a small block server and its client over rdma_cm, where every request
// lends the server exactly one 4 KiB buffer of the client, for that request only (GrantPool).
//
// The client owns a buffer pool (one MemoryRegion of 16 slots of 4 KiB) and a GrantPool over it
// on its connection's PD, and connects with the pool's offer (grant_offer) as private data. A
// request is one post: the grant of a slot (a window bind) and, fenced behind it, an inline send
// of the request header {op, flags, stall, block, request id, grant_list}:
//   - WRITE block b: the client fills the slot with the block's bytes and grants remote read; the
//     server RDMA-reads the 4 KiB into its block store and replies;
//   - READ block b: the client grants remote write; the server RDMA-writes the block into the
//     slot and replies.
// On the reply (or its timeout) the client revokes the grant, hands every completion to the pool
// and touches the slot only once the lease is ready again. Every READ is checked against the
// last WRITE of its block; a read-back pass of every block ends the run.
//
// --timeout-every N: the first attempt of every Nth request asks the server to sit on it for
// 600 ms, past the client's 200 ms timeout (one such request at a time). The client revokes,
// reuses the slot for the next requests; the server then makes its access anyway, which must
// fail (IBV_WC_REM_ACCESS_ERR on the server) and leave the client's slots untouched; both QPs go
// to ERR. The client drains its CQ, calls revoke_all(), checks every slot, reconnects (same PD,
// same pool) and retries what did not complete.
//
//   tools/rxe-vm build/examples/06_block_rpc               # both roles: forks the client
//   06_block_rpc server [ADDR:]PORT
//   06_block_rpc client ADDR:PORT [--requests N] [--timeout-every N]
//   tools/rxe-vm --pair 'build/examples/06_block_rpc server 7473'
//     'build/examples/06_block_rpc client $RXE_VM_PEER:7473 --timeout-every 10'   (one line)
//
// Exit status 0 only if every expected outcome happened: every request completed with the
// right bytes, every late access was refused and touched nothing, one reconnect per refused late
// access, and every slot back in the pool at the end.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/grant_list.hpp>
#include <rdmaxx/grant_pool.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace rdmaxx;

constexpr std::size_t block_size = 4096;
constexpr std::uint32_t blocks = 8;
constexpr std::size_t slots = 16;
constexpr int step_ms = 20000;      // every rdma_cm step and completion wait is bounded
constexpr int timeout_ms = 200;     // the client's per-request timeout
constexpr std::uint16_t stall_ms = 600; // how long the server sits on a request it is asked to
constexpr std::size_t recvs = 16;   // receives posted per side
constexpr std::size_t msg_max = 64; // receive buffer bytes

enum class op : std::uint8_t { write = 1, read = 2, bye = 3 };

// ---- the wire: big-endian request header and reply ----

void put(std::byte *p, std::uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = std::byte(v & 0xff);
}
std::uint64_t get(const std::byte *p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | std::uint64_t(p[i]);
  return v;
}

// op(1) flags(1) stall_ms(2) block(4) id(8), then the grant_list (1 grant: 28 bytes).
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
// The reply: request id(8), status(4: 0 done), reserved(4).
constexpr std::size_t reply_size = 16;
// The accept's private data: the server's late accesses so far, refused(4) and allowed(4).
constexpr std::size_t accept_size = 8;

// The bytes of `block` after its version-th write (version 0: never written, zeros).
void fill_block(std::span<std::byte> out, std::uint32_t block, std::uint32_t version) {
  for (std::size_t j = 0; j < out.size(); ++j)
    out[j] = version == 0 ? std::byte{0}
                          : std::byte((block * 131u + version * 31u + j * 7u + (j >> 8)) & 0xff);
}
constexpr std::byte sentinel{0xEE}; // what a READ's slot holds until the server writes it

bool expect(bool ok, const char *role, const char *what) {
  std::printf("%s: %s %s\n", role, ok ? "ok  " : "FAIL", what);
  return ok;
}
std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Receive buffers of one side: `recvs` receives of msg_max bytes, wr_id base + index.
struct receives {
  std::vector<std::byte> mem = std::vector<std::byte>(recvs * msg_max);
  MemoryRegion mr;
  std::size_t outstanding = 0;
  static constexpr std::uint64_t base = 100;

  result<void> post(QueuePair &qp, std::size_t i) noexcept {
    ibv_sge s = mr.sge(std::uint32_t(i * msg_max), std::uint32_t(msg_max));
    RDMAXX_TRYV(qp.post_recv(base + i, s));
    ++outstanding;
    return success();
  }
  result<void> post_all(QueuePair &qp) noexcept {
    outstanding = 0;
    for (std::size_t i = 0; i < recvs; ++i) RDMAXX_TRYV(post(qp, i));
    return success();
  }
  [[nodiscard]] static bool is_recv(const ibv_wc &wc) { return wc.wr_id >= base && wc.wr_id < base + recvs; }
  [[nodiscard]] std::span<const std::byte> bytes(const ibv_wc &wc) const {
    return {mem.data() + (wc.wr_id - base) * msg_max, wc.byte_len};
  }
};

// Poll `cq` until every receive of `r` came back (a QP in ERR flushes them) and nothing more
// arrives for a moment; completions of other QPs than `qp_num` are dropped (stale).
template <class F>
result<void> drain(const char *role, CompletionQueue &cq, receives &r, std::uint32_t qp_num, F &&each) noexcept {
  ibv_wc wc[16];
  const std::int64_t end = now_ms() + 5000;
  for (;;) {
    auto n = cq.wait(wc, r.outstanding ? 100 : 30);
    if (!n && n.error() != make_error_code(errc::timeout)) return n.error();
    if (!n) {
      if (r.outstanding == 0) return success();
      if (now_ms() > end) {
        // rxe does not flush a receive posted after its QP went to ERR (e.g. the repost after
        // the last reply): the Connection's destruction takes it.
        std::printf("%s: %zu receive(s) not flushed by the QP in ERR; going on\n", role, r.outstanding);
        r.outstanding = 0;
        return success();
      }
      continue;
    }
    for (std::size_t k = 0; k < n.value(); ++k) {
      if (wc[k].qp_num != qp_num) continue;
      if (receives::is_recv(wc[k]) && r.outstanding) --r.outstanding;
      each(wc[k]);
    }
  }
}

// ---- the server ----

struct server_stats {
  std::uint64_t requests = 0, reads = 0, writes = 0, connections = 0;
  std::uint64_t late_refused = 0, late_allowed = 0, late_dropped = 0, errors = 0;
  bool store_intact = true; // every refused late read left the store as it was
};

struct server_state {
  Context ctx;
  ProtectionDomain pd;
  CompletionChannel ch;
  CompletionQueue cq;
  std::vector<std::byte> store = std::vector<std::byte>(blocks * block_size);
  MemoryRegion store_mr;
  std::array<std::byte, msg_max> reply{};
  MemoryRegion reply_mr;
  receives rx;
  server_stats st;
};

enum class served { bye, broken };
constexpr std::uint64_t access_wr = 7, reply_wr = 8, late_wr = 9;

// RDMA-read (WRITE request) or RDMA-write (READ request) the block through the grant, wait for
// its completion; other completions that arrive meanwhile go to `later`.
result<ibv_wc> access(server_state &s, Connection &c, const request &r, std::uint64_t wr_id,
                      std::deque<ibv_wc> &later) noexcept {
  const remote_descriptor &d = r.grants[0];
  const ibv_sge local = s.store_mr.sge(std::uint32_t(r.block * block_size), std::uint32_t(block_size));
  auto b = c.qp().start_send();
  if (r.what == op::write) b.read({wr_id, send_flag::signaled}, {d.addr, d.rkey}, local);
  else b.write({wr_id, send_flag::signaled}, {d.addr, d.rkey}, local);
  RDMAXX_TRYV(b.submit());
  ibv_wc wc[16];
  for (;;) {
    RDMAXX_TRY(n, s.cq.wait(wc, step_ms));
    std::optional<ibv_wc> mine;
    for (std::size_t k = 0; k < n; ++k) {
      if (wc[k].qp_num != c.qp().qp_num()) continue;
      if (wc[k].wr_id == wr_id && !mine) mine = wc[k];
      else later.push_back(wc[k]);
    }
    if (mine) return *mine;
  }
}

result<void> reply(server_state &s, Connection &c, const request &r, bool remote_invalidate) noexcept {
  std::array<std::byte, reply_size> out{};
  put(&out[0], r.id, 8);
  auto b = c.qp().start_send();
  if (remote_invalidate) { // revoke the client's grant with the reply (type-2 windows only)
    std::memcpy(s.reply.data(), out.data(), out.size());
    const ibv_sge sge = s.reply_mr.sge(0, std::uint32_t(reply_size));
    b.send_inv({reply_wr, {}}, r.grants[0].rkey, std::span(&sge, 1));
  } else {
    b.send_inline({reply_wr, {}}, out);
  }
  return b.submit();
}

result<served> serve_on(server_state &s, Connection &c, bool remote_invalidate,
                        std::deque<ibv_wc> &backlog) noexcept;
// Serve one connection; completions taken from the CQ and not handled yet are accounted for
// before a broken connection is drained.
result<served> serve(server_state &s, Connection &c, bool remote_invalidate) noexcept {
  std::deque<ibv_wc> backlog;
  auto r = serve_on(s, c, remote_invalidate, backlog);
  for (const ibv_wc &e : backlog)
    if (receives::is_recv(e) && s.rx.outstanding) --s.rx.outstanding;
  return r;
}

result<served> serve_on(server_state &s, Connection &c, bool remote_invalidate,
                        std::deque<ibv_wc> &backlog) noexcept {
  struct deferred {
    request r;
    std::int64_t due;
  };
  std::optional<deferred> late;
  ibv_wc wc[16];
  for (;;) {
    if (backlog.empty()) {
      const int wait = late ? int(std::max<std::int64_t>(0, late->due - now_ms())) : step_ms;
      auto n = s.cq.wait(wc, wait);
      if (!n && n.error() != make_error_code(errc::timeout)) return n.error();
      if (!n && !late) return make_error_code(errc::timeout); // the client went quiet
      for (std::size_t k = 0; n && k < n.value(); ++k)
        if (wc[k].qp_num == c.qp().qp_num()) backlog.push_back(wc[k]);
    }
    if (late && now_ms() >= late->due) {
      // The late access: the client gave up on this request long ago and revoked its grant.
      const std::size_t at = late->r.block * block_size;
      const std::vector<std::byte> before(s.store.begin() + long(at), s.store.begin() + long(at + block_size));
      RDMAXX_TRY(w, access(s, c, late->r, late_wr, backlog));
      const bool is_read = late->r.what == op::write;
      std::printf("server: late %s of request %llu through the revoked grant: %s\n",
                  is_read ? "RDMA read" : "RDMA write",
                  static_cast<unsigned long long>(late->r.id), ibv_wc_status_str(w.status));
      if (w.status == IBV_WC_REM_ACCESS_ERR) {
        ++s.st.late_refused;
        if (is_read && !std::equal(before.begin(), before.end(), s.store.begin() + long(at)))
          s.st.store_intact = false;
        late.reset();
        return served::broken; // both QPs are in ERR now
      }
      if (w.status == IBV_WC_SUCCESS) ++s.st.late_allowed; // the grant was NOT revoked: a failure
      else ++s.st.late_dropped;
      late.reset();
      if (w.status != IBV_WC_SUCCESS) return served::broken;
      continue;
    }
    if (backlog.empty()) continue;
    const ibv_wc e = backlog.front();
    backlog.pop_front();
    if (!receives::is_recv(e)) {
      if (e.status != IBV_WC_SUCCESS) return served::broken; // our send flushed: the QP is in ERR
      continue;
    }
    --s.rx.outstanding;
    if (e.status != IBV_WC_SUCCESS) return served::broken; // flushed: the connection went down
    auto r = request::decode(s.rx.bytes(e));
    RDMAXX_TRYV(s.rx.post(c.qp(), e.wr_id - receives::base));
    if (!r) {
      std::printf("server: malformed request: %s\n", r.error().message().c_str());
      ++s.st.errors;
      return served::broken;
    }
    if (r.value().what == op::bye) {
      RDMAXX_TRYV(reply(s, c, r.value(), false));
      return served::bye;
    }
    ++s.st.requests;
    if (r.value().stall != 0 && !late) { // sit on it past the client's timeout
      late = deferred{r.value(), now_ms() + r.value().stall};
      continue;
    }
    RDMAXX_TRY(w, access(s, c, r.value(), access_wr, backlog));
    if (w.status != IBV_WC_SUCCESS) {
      std::printf("server: access for request %llu: %s\n", static_cast<unsigned long long>(r.value().id),
                  ibv_wc_status_str(w.status));
      ++s.st.errors;
      return served::broken;
    }
    ++(r.value().what == op::write ? s.st.writes : s.st.reads);
    RDMAXX_TRYV(reply(s, c, r.value(), remote_invalidate));
  }
}

result<bool> server(Listener &l) noexcept {
  server_state s;
  ibv_context *dev = l.device_context(); // a wildcard listener: the first device
  RDMAXX_TRY(ctx, dev ? Context::open(dev->device) : Context::open_first());
  s.ctx = std::move(ctx);
  RDMAXX_TRY(pd, ProtectionDomain::alloc(s.ctx));
  s.pd = std::move(pd);
  RDMAXX_TRY(ch, CompletionChannel::create(s.ctx));
  s.ch = std::move(ch);
  RDMAXX_TRY(cq, CompletionQueue::create(s.ctx, 256, &s.ch));
  s.cq = std::move(cq);
  RDMAXX_TRY(smr, MemoryRegion::reg(s.pd, s.store.data(), s.store.size(), access::local_write));
  s.store_mr = std::move(smr);
  RDMAXX_TRY(rmr, MemoryRegion::reg(s.pd, s.reply.data(), s.reply.size(), access::local_write));
  s.reply_mr = std::move(rmr);
  RDMAXX_TRY(xmr, MemoryRegion::reg(s.pd, s.rx.mem.data(), s.rx.mem.size(), access::local_write));
  s.rx.mr = std::move(xmr);

  for (;;) {
    RDMAXX_TRY(req, l.get_request(60000));
    auto offer = grant_offer::decode(req.private_data());
    if (!offer) {
      std::printf("server: connect request without a grant offer: %s\n", offer.error().message().c_str());
      (void)req.reject();
      continue;
    }
    RDMAXX_TRY(c, req.prepare({.pd = &s.pd, .send_cq = &s.cq, .recv_cq = &s.cq, .timeout_ms = step_ms}));
    RDMAXX_TRYV(s.rx.post_all(c.qp()));
    std::array<std::byte, accept_size> acc{};
    put(&acc[0], s.st.late_refused, 4);
    put(&acc[4], s.st.late_allowed, 4);
    RDMAXX_TRYV(c.accept(acc));
    RDMAXX_TRYV(c.wait_established());
    ++s.st.connections;
    std::printf("server: connection %llu accepted (peer %s send-with-invalidate)\n",
                static_cast<unsigned long long>(s.st.connections),
                offer.value().remote_invalidate ? "offers" : "does not offer");
    RDMAXX_TRY(how, serve(s, c, offer.value().remote_invalidate));
    if (how == served::bye) {
      (void)c.wait_disconnected(step_ms); // the client disconnects after our reply
      break;
    }
    // Broken: let the QP flush what it holds, then drop the connection and wait for the next.
    RDMAXX_TRYV(drain("server", s.cq, s.rx, c.qp().qp_num(), [](const ibv_wc &) {}));
  }
  std::printf("server: %llu requests (%llu writes, %llu reads served), %llu connections, "
              "late accesses: %llu refused, %llu allowed, %llu dropped with their connection\n",
              static_cast<unsigned long long>(s.st.requests), static_cast<unsigned long long>(s.st.writes),
              static_cast<unsigned long long>(s.st.reads), static_cast<unsigned long long>(s.st.connections),
              static_cast<unsigned long long>(s.st.late_refused),
              static_cast<unsigned long long>(s.st.late_allowed),
              static_cast<unsigned long long>(s.st.late_dropped));
  bool ok = expect(s.st.late_allowed == 0, "server", "no late access went through a revoked grant");
  ok &= expect(s.st.store_intact, "server", "refused late reads returned nothing into the block store");
  ok &= expect(s.st.connections == s.st.late_refused + 1, "server",
               "one reconnect per refused late access, no other break");
  ok &= expect(s.st.errors == 0, "server", "every other access and request succeeded");
  return ok;
}

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
  client(address to, int every) : to_(to), every_(every) {}

  result<bool> run(int n) noexcept {
    RDMAXX_TRY(ctx, Context::open_first());
    ctx_ = std::move(ctx);
    RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx_));
    pd_ = std::move(pd);
    RDMAXX_TRY(ch, CompletionChannel::create(ctx_));
    ch_ = std::move(ch);
    RDMAXX_TRY(cq, CompletionQueue::create(ctx_, 256, &ch_));
    cq_ = std::move(cq);
    RDMAXX_TRY(mr, MemoryRegion::reg(pd_, buffers_.data(), buffers_.size(), access::local_write));
    mr_ = std::move(mr);
    RDMAXX_TRY(pool, GrantPool::create(pd_, mr_, {.slot_size = block_size, .slots = slots}));
    pool_ = std::move(pool);
    RDMAXX_TRY(xmr, MemoryRegion::reg(pd_, rx_.mem.data(), rx_.mem.size(), access::local_write));
    rx_.mr = std::move(xmr);
    RDMAXX_TRYV(connect());
    std::printf("client: connected to %s; pool of %zu x %llu bytes, %s\n", to_.to_string().c_str(),
                pool_.size(), static_cast<unsigned long long>(pool_.slot_size()),
                pool_.mechanism() == grant_mechanism::type1_exact_region
                    ? "type-1 windows over exact regions (no remote invalidation offered)"
                    : "type-2 windows (remote invalidation offered)");

    std::deque<job> todo;
    for (int i = 0; i < n; ++i)
      todo.push_back({i % 3 == 1 ? op::read : op::write, std::uint32_t((i * 5) % blocks), std::uint64_t(i)});
    for (std::uint32_t b = 0; b < blocks; ++b) // read every block back at the end
      todo.push_back({op::read, b, std::uint64_t(n) + b, false});
    std::vector<job> retry;
    bool late_pending = false; // a request timed out and the server may still touch its grant
    const std::int64_t start = now_ms(); // the request loop's rate: connected, before the goodbye
    while (!todo.empty() || !retry.empty()) {
      if (todo.empty()) { // only retries left: wait for the late access that breaks the connection
        RDMAXX_TRYV(wait_for_break());
        RDMAXX_TRYV(recover());
        late_pending = false;
        for (auto it = retry.rbegin(); it != retry.rend(); ++it) todo.push_front(*it);
        retry.clear();
        continue;
      }
      job &j = todo.front();
      const bool stall = every_ > 0 && j.first && (j.id + 1) % std::uint64_t(every_) == 0 && !late_pending;
      j.first = false;
      RDMAXX_TRY(o, one(j, stall));
      if (o == outcome::done) {
        todo.pop_front();
        ++st_.done;
      } else if (o == outcome::timed_out) {
        ++st_.timeouts;
        late_pending = true;
        retry.push_back(j);
        todo.pop_front();
      } else { // broken: recover, then the retries and this request again
        RDMAXX_TRYV(recover());
        late_pending = false;
        if (cur_done_) {
          todo.pop_front();
          ++st_.done;
        }
        for (auto it = retry.rbegin(); it != retry.rend(); ++it) todo.push_front(*it);
        retry.clear();
      }
    }
    const double secs = double(now_ms() - start) / 1000.0;
    // Goodbye: the server prints its summary and exits.
    RDMAXX_TRY(bo, one({op::bye, 0, ~0ull >> 16}, false));
    bool ok = expect(bo == outcome::done, "client", "server acknowledged the end");
    (void)conn_.disconnect();
    conn_ = Connection{};
    std::printf("client: %llu requests done in %.3f s (%.1f requests/s), %llu bytes verified, %llu slot bytes "
                "checked after breaks, %llu timeouts (%llu asked stalls), late accesses refused (server's count): "
                "%u, %llu reconnects, pool %zu of %zu available\n",
                static_cast<unsigned long long>(st_.done), secs, secs > 0 ? double(st_.done) / secs : 0.0,
                static_cast<unsigned long long>(st_.bytes_verified),
                static_cast<unsigned long long>(st_.slot_bytes_checked),
                static_cast<unsigned long long>(st_.timeouts), static_cast<unsigned long long>(st_.stalls),
                st_.server_refused, static_cast<unsigned long long>(st_.reconnects), pool_.available(),
                pool_.size());
    ok &= expect(st_.done == std::uint64_t(n) + blocks && st_.mismatches == 0, "client",
                 "every request completed and every READ returned the last WRITE's bytes");
    ok &= expect(st_.slot_damage == 0, "client",
                 "every slot without a reply held the client's bytes when checked (unserved "
                 "requests' slots, and every idle slot after each break)");
    ok &= expect(st_.timeouts >= st_.stalls && st_.reconnects == st_.server_refused &&
                     st_.server_allowed == 0,
                 "client", "every stall timed out, every late access was refused, one reconnect each");
    if (every_ > 0 && std::uint64_t(n) >= std::uint64_t(every_))
      ok &= expect(st_.stalls > 0 && st_.reconnects > 0, "client", "the timeout path was exercised");
    ok &= expect(pool_.available() == pool_.size(), "client", "every slot is back in the pool");
    return ok;
  }

private:
  enum class outcome { done, timed_out, broken };
  static constexpr std::uint64_t req_wr = 1;

  result<void> connect() noexcept {
    const auto offer = pool_.offer().encode();
    // Across two hosts the server may not listen yet: retried for up to a minute.
    RDMAXX_TRY(c, Connection::connect(to_, {.pd = &pd_, .send_cq = &cq_, .recv_cq = &cq_,
                                            .timeout_ms = step_ms, .private_data = offer},
                                      {.total_ms = 60000, .backoff_ms = 100}));
    conn_ = std::move(c);
    const auto acc = conn_.peer_private_data();
    if (acc.size() >= accept_size) {
      st_.server_refused = std::uint32_t(get(&acc[0], 4));
      st_.server_allowed = std::uint32_t(get(&acc[4], 4));
    }
    return rx_.post_all(conn_.qp());
  }

  // Hand a batch of completions to the pool, then take ours: receives (replies) and failures.
  void take(std::span<ibv_wc> wcs, std::uint64_t want, bool &replied, bool &broken) noexcept {
    const std::uint64_t failed = pool_.stats().failed_completions;
    for (ibv_wc &wc : pool_.complete(wcs)) {
      if (wc.qp_num != conn_.qp().qp_num()) continue; // of the connection before
      if (wc.status != IBV_WC_SUCCESS) {
        broken = true;
        if (receives::is_recv(wc) && rx_.outstanding) --rx_.outstanding;
        continue;
      }
      if (!receives::is_recv(wc)) continue;
      --rx_.outstanding;
      const auto b = rx_.bytes(wc);
      if (b.size() == reply_size && get(b.data(), 8) == want) replied = true;
      if (!rx_.post(conn_.qp(), wc.wr_id - receives::base)) broken = true;
    }
    if (pool_.stats().failed_completions != failed) broken = true;
  }

  // Wait until `l` is ready (its revocation confirmed) or the connection broke.
  result<bool> settle(GrantLease &l, bool &replied) noexcept {
    ibv_wc wc[16];
    bool broken = false;
    const std::int64_t end = now_ms() + step_ms;
    while (l.state() != lease_state::ready && !broken) {
      auto n = cq_.wait(wc, int(std::max<std::int64_t>(1, end - now_ms())));
      if (!n) return n.error();
      take(std::span(wc, n.value()), cur_id_, replied, broken);
    }
    return !broken;
  }

  result<outcome> one(const job &j, bool stall) noexcept {
    cur_done_ = false;
    cur_id_ = j.id;
    bool replied = false, broken = false;
    if (j.what == op::bye) {
      auto b = conn_.qp().start_send();
      std::array<std::byte, request::head> h{};
      RDMAXX_TRY(len, (request{op::bye, 0, 0, j.id, {}}).encode(h));
      b.send_inline({req_wr, {}}, std::span(h).first(len));
      RDMAXX_TRYV(b.submit());
    } else {
      RDMAXX_TRY(lease, pool_.acquire());
      cur_ = std::move(lease);
      RDMAXX_TRY(buf, cur_.buffer()); // just acquired: ready
      const std::uint32_t version = j.what == op::write ? versions_[j.block] + 1 : 0;
      if (j.what == op::write) fill_block(buf, j.block, version);
      else std::fill(buf.begin(), buf.end(), sentinel);
      cur_expect_.assign(buf.begin(), buf.end()); // what the slot holds unless the server serves us
      cur_job_ = j;
      cur_version_ = version;
      auto batch = conn_.qp().start_send();
      auto d = pool_.grant(batch, conn_.qp(), cur_, j.what == op::write ? access::remote_read : access::remote_write);
      if (!d) return d.error();
      request r{j.what, std::uint16_t(stall ? stall_ms : 0), j.block, j.id, {}};
      RDMAXX_TRYV(r.grants.push(d.value()));
      std::array<std::byte, request::head + grant_list::encoded_size(1)> h{};
      RDMAXX_TRY(len, r.encode(h));
      batch.send_inline({req_wr, send_flag::fence}, std::span(h).first(len)); // after the bind
      if (auto s = batch.submit(); !s) {
        pool_.cancel(cur_);
        return s.error();
      }
      if (stall) ++st_.stalls;
    }
    // The reply, or the timeout.
    ibv_wc wc[16];
    const std::int64_t end = now_ms() + (j.what == op::bye ? step_ms : timeout_ms);
    while (!replied && !broken) {
      const std::int64_t left = end - now_ms();
      if (left <= 0) break;
      auto n = cq_.wait(wc, int(left));
      if (!n && n.error() == make_error_code(errc::timeout)) break;
      if (!n) return n.error();
      take(std::span(wc, n.value()), j.id, replied, broken);
    }
    if (j.what == op::bye) return replied ? outcome::done : outcome::broken;
    cur_done_ = replied;
    if (broken) return outcome::broken; // recover() settles the lease
    if (!replied)
      std::printf("client: request %llu (%s block %u) timed out after %d ms: revoking, slot %u reused\n",
                  static_cast<unsigned long long>(j.id), j.what == op::write ? "WRITE" : "READ",
                  j.block, timeout_ms, cur_.slot());
    // Revoke (nothing is posted if the peer already invalidated it), then wait for the slot.
    if (auto r = pool_.revoke(conn_.qp(), cur_); !r) return outcome::broken;
    RDMAXX_TRY(fine, settle(cur_, replied));
    cur_done_ = cur_done_ || replied;
    if (!fine) return outcome::broken;
    finish();
    return replied ? outcome::done : outcome::timed_out;
  }

  // The current lease is ready: check its bytes, record what the slot holds, give it back.
  void finish() noexcept {
    const auto ready = cur_.buffer(); // ready once revoked and confirmed; else nothing to check
    const std::span<std::byte> buf = ready ? ready.value() : std::span<std::byte>{};
    if (cur_done_) {
      if (cur_job_.what == op::read) {
        std::vector<std::byte> want(block_size);
        fill_block(want, cur_job_.block, versions_[cur_job_.block]);
        if (!std::equal(buf.begin(), buf.end(), want.begin())) {
          ++st_.mismatches;
          std::printf("client: request %llu: block %u has the wrong bytes\n",
                      static_cast<unsigned long long>(cur_job_.id), cur_job_.block);
        }
        st_.bytes_verified += block_size;
      } else {
        versions_[cur_job_.block] = cur_version_;
      }
    } else if (!std::equal(buf.begin(), buf.end(), cur_expect_.begin())) {
      // Not served (no reply), yet changed. When the bytes changed cannot be seen from here:
      // while the grant was live (a server that wrote and then broke the reply) or after it.
      ++st_.slot_damage;
      std::printf("client: request %llu (%s block %u): no reply, yet slot %u changed (while "
                  "granted or after the revoke: not visible from the client)\n",
                  static_cast<unsigned long long>(cur_job_.id), cur_job_.what == op::write ? "WRITE" : "READ",
                  cur_job_.block, cur_.slot());
    }
    last_[cur_.slot()].assign(buf.begin(), buf.end());
    (void)pool_.give_back(cur_);
  }

  result<void> wait_for_break() noexcept {
    ibv_wc wc[16];
    bool replied = false, broken = false;
    const std::int64_t end = now_ms() + step_ms;
    while (!broken) {
      if (now_ms() > end) return make_error_code(errc::timeout);
      auto n = cq_.wait(wc, 100);
      if (!n && n.error() == make_error_code(errc::timeout)) continue;
      if (!n) return n.error();
      take(std::span(wc, n.value()), ~0ull, replied, broken);
    }
    return success();
  }

  // The connection broke (a late access of the server moved both QPs to ERR): drain, revoke
  // every grant for good, check every slot, reconnect on the same PD with the same pool.
  result<void> recover() noexcept {
    bool replied = false;
    RDMAXX_TRYV(drain("client", cq_, rx_, conn_.qp().qp_num(), [&](ibv_wc &wc) {
      ibv_wc one = wc;
      if (!receives::is_recv(one) || one.status != IBV_WC_SUCCESS) {
        (void)pool_.complete(std::span(&one, 1));
        return;
      }
      const auto b = rx_.bytes(one);
      if (b.size() == reply_size && get(b.data(), 8) == cur_id_) replied = true;
    }));
    RDMAXX_TRYV(pool_.revoke_all()); // every window with a grant or an unconfirmed operation
    if (cur_) {
      if (replied) cur_done_ = true;
      const bool served = cur_done_;
      std::printf("client: connection broke during request %llu (%s block %u, slot %u, %s)\n",
                  static_cast<unsigned long long>(cur_job_.id), cur_job_.what == op::write ? "WRITE" : "READ",
                  cur_job_.block, cur_.slot(), served ? "served" : "not served");
      st_.slot_bytes_checked += block_size;
      finish();
    }
    // Every other slot holds what it held when it was last given back.
    std::vector<GrantLease> all;
    for (auto l = pool_.acquire(); l; l = pool_.acquire()) all.push_back(std::move(l).value());
    for (GrantLease &l : all) {
      const auto ready = l.buffer(); // just acquired: ready
      const std::span<std::byte> b = ready ? ready.value() : std::span<std::byte>{};
      const auto &want = last_[l.slot()];
      const bool same = want.empty() ? std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; })
                                     : std::equal(b.begin(), b.end(), want.begin());
      if (!same) {
        ++st_.slot_damage;
        std::printf("client: slot %u is not what it held when it was last given back\n", l.slot());
      }
      st_.slot_bytes_checked += b.size();
      (void)pool_.give_back(l);
    }
    conn_ = Connection{}; // the QP, then the id: the server sees the disconnect
    RDMAXX_TRYV(connect());
    ++st_.reconnects;
    std::printf("client: revoked every grant (revoke_all), %zu slots intact, reconnected "
                "(server refused %u late accesses so far)\n",
                pool_.size() - std::size_t(st_.slot_damage), st_.server_refused);
    return success();
  }

  address to_;
  int every_;
  Context ctx_;
  ProtectionDomain pd_;
  CompletionChannel ch_;
  CompletionQueue cq_;
  std::vector<std::byte> buffers_ = std::vector<std::byte>(slots * block_size);
  MemoryRegion mr_;
  GrantPool pool_; // after the PD and the region it pins; before the connection below
  receives rx_;
  Connection conn_;
  GrantLease cur_;
  job cur_job_{op::bye, 0, 0};
  std::uint32_t cur_version_ = 0;
  std::uint64_t cur_id_ = 0;
  bool cur_done_ = false;
  std::vector<std::byte> cur_expect_;
  std::array<std::uint32_t, blocks> versions_{};
  std::array<std::vector<std::byte>, slots> last_{};
  client_stats st_;
};

// "Loopback" for RDMA: the IPv4 address of the first device (address::of_device).
result<address> device_ipv4() noexcept {
  RDMAXX_TRY(ctx, Context::open_first());
  return address::of_device(ctx);
}

int report(const char *role, const result<bool> &r) {
  if (!r) {
    std::fprintf(stderr, "06_block_rpc %s failed: %s\n", role, r.error().message().c_str());
    return 1;
  }
  return r.value() ? 0 : 1;
}

int usage() {
  std::fprintf(stderr, "usage: 06_block_rpc                      (both roles, this host)\n"
                       "       06_block_rpc server [ADDR:]PORT\n"
                       "       06_block_rpc client ADDR:PORT [--requests N] [--timeout-every N]\n");
  return 2;
}

int run_server(const address &at) {
  auto l = Listener::listen(at);
  if (!l) return report("server", l.error());
  std::printf("server: listening on port %u\n", unsigned(l.value().port()));
  std::fflush(stdout);
  return report("server", server(l.value()));
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) {
    auto at = address::parse(argv[2]);
    if (!at) return report("server", at.error());
    return run_server(at.value());
  }
  if (argc >= 3 && std::strcmp(argv[1], "client") == 0) {
    auto to = address::parse(argv[2]);
    if (!to) return report("client", to.error());
    int n = 100, every = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--requests") == 0) n = std::atoi(argv[i + 1]);
      else if (std::strcmp(argv[i], "--timeout-every") == 0) every = std::atoi(argv[i + 1]);
      else return usage();
    }
    if ((argc - 3) % 2 != 0 || n < 0 || every < 0) return usage();
    client c(to.value(), every);
    return report("client", c.run(n));
  }
  if (argc != 1) return usage();

  // Both roles on this host (the rxe suite's run): fork the client before any rdma_cm or verbs
  // call; the server listens with a port the kernel chooses and hands it over through a pipe.
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
      // 150 requests, every 25th stalled: late accesses land while later requests hold the slot.
      client c(ip.value().with_port(port), 25);
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
  const int server_rc = l ? report("server", server(l.value())) : report("server", l.error());
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  const int client_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  std::printf("06_block_rpc: server %s, client %s\n", server_rc == 0 ? "ok" : "FAILED",
              client_rc == 0 ? "ok" : "FAILED");
  return server_rc == 0 && client_rc == 0 ? 0 : 1;
}
