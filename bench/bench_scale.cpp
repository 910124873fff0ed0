// bench/bench_scale: how cost grows with connections and with pool slots (issue 24 §3).
//
// Connections over rdma_cm to 192.0.2.1 (rxe0 in tools/rxe-vm), each with a GrantPool of 16 slots
// of 4 KiB on the client's end. A request is the GrantPool pattern of bench_grant_pool's arm (b):
// the client grants a slot (bind) and, fenced behind it in the same post, sends the request; the
// server RDMA-reads the 4 KiB through the key and replies; the client revokes (unbind, signaled)
// and the request is over when the pool has the revoke's completion (lease ready). Every
// connection keeps one request in flight (a closed loop), one thread polls everything.
//
// Three ways to build a connection's end, measured side by side:
//   own     conn_options defaults plus cq_channel: each Connection opens its own Context, PD, CQ
//           and completion channel (what a server waiting on each connection's events gets);
//   shared  one Context, PD, CQ and completion channel per end, given to every Connection
//           (conn_options::pd, send_cq, recv_cq);
//   shared+channel  as shared, and one rdma_cm EventChannel per end shared by every Connection
//           and the Listener (conn_options::channel, listen_options::channel): the server learns
//           which connections have cm events from EventChannel::dispatch().
// Per connection (both ends in one process unless run as `server` / `client`): setup time
// (connect + accept + the client's buffer, MR and pool), kernel objects (`rdma resource show`:
// the system's, the VM runs nothing else), pinned pages (/proc/self/status VmPin; VmLck), file
// descriptors (/proc/self/fd), RSS; then request throughput and latency (p50, p99) as all
// connections run at once. After each round every resource is released and the counts must be
// back at the baseline (exit 1 otherwise).
//
// Then one connection with pools of 16 .. 4096 slots (create time, MRs and pinned pages per slot,
// throughput), each size twice: slots made at create() (mode "shared") and made at their first
// lease (grant_pool_options::lazy_slots, mode "lazy"); and the limits: what fails first as connections are added under a lowered fd
// limit (RLIMIT_NOFILE) and as pools are created under a lowered pinned-memory limit
// (RLIMIT_MEMLOCK, with CAP_IPC_LOCK dropped from the effective set), the error the library
// returns, and the counts after the failure against those before (no leak).
//
//   bench_scale                          everything in one process (smoke: RDMAXX_BENCH_SCALE<1
//                                        shrinks the lists and the run time)
//   bench_scale conns [N...]             the connection sweep only
//   bench_scale slots [S...]             the slot sweep only
//   bench_scale limits                   the limits only
//   bench_scale server ADDR:PORT [MODE [ROUNDS]]  the server end alone (two VMs): serves ROUNDS
//                                        rounds (0: until killed), MODE own|shared|shared+channel
//                                        (default shared)
//   bench_scale client ADDR:PORT [N...]  the client end alone: a warm-up connection, then one round
//                                        per N (RDMAXX_SCALE_MODE=own|shared|shared+channel,
//                                        default shared)
// RDMAXX_SCALE_JSON=path appends one JSON object per measured row (tools/bench scale).
#include "common.hpp"
#include "harness.hpp"

#include <rdmaxx/connection.hpp>
#include <rdmaxx/grant_pool.hpp>

#include <dirent.h>
#include <linux/capability.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

using namespace rdmaxx;

namespace {

constexpr std::uint32_t slot_size = 4096;
constexpr std::size_t default_slots = 16;
// The slot sweep's second pass: pools with grant_pool_options::lazy_slots (each slot made at its
// first lease), row mode "lazy".
bool g_lazy_slots = false;
constexpr std::size_t recvs = 4;          // receives posted per end (one request in flight)
constexpr std::size_t msg = 64;           // receive buffer bytes
constexpr std::uint64_t k_recv = 1, k_send = 2, k_read = 3; // wr_id = index << 8 | kind
const char *const server_ip = "192.0.2.1";

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- what the process and the device hold ----

struct counts {
  long fds = 0, vmpin_kb = 0, vmlck_kb = 0, rss_kb = 0;
  std::map<std::string, long> res; // rdma resource show: pd cq qp cm_id mr ctx srq
  long get(const char *k) const {
    auto i = res.find(k);
    return i == res.end() ? 0 : i->second;
  }
};

long count_fds() {
  long n = 0;
  if (DIR *d = ::opendir("/proc/self/fd")) {
    while (dirent *e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    --n; // the directory's own fd
  }
  return n;
}

counts sample() {
  counts c;
  c.fds = count_fds(); // before popen's pipe
  if (FILE *f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      long v = 0;
      if (std::sscanf(line, "VmPin: %ld", &v) == 1) c.vmpin_kb = v;
      else if (std::sscanf(line, "VmLck: %ld", &v) == 1) c.vmlck_kb = v;
      else if (std::sscanf(line, "VmRSS: %ld", &v) == 1) c.rss_kb = v;
    }
    std::fclose(f);
  }
  // "0: rxe0: pd 2 cq 3 qp 2 cm_id 3 mr 5 ctx 2 srq 0": summed over devices.
  if (FILE *p = ::popen("rdma resource show 2>/dev/null", "r")) {
    char word[64];
    std::string key;
    while (std::fscanf(p, "%63s", word) == 1) {
      char *end = nullptr;
      const long v = std::strtol(word, &end, 10);
      if (!key.empty() && end && *end == 0) {
        c.res[key] += v;
        key.clear();
      } else {
        key = word;
        if (!key.empty() && key.back() == ':') key.clear();
      }
    }
    ::pclose(p);
  }
  return c;
}

const char *const res_keys[] = {"ctx", "pd", "cq", "qp", "cm_id", "mr"};

// "what": the counts that differ from the baseline, or "" when none.
std::string leaked(const counts &before, const counts &after) {
  std::string s;
  auto chk = [&](const char *k, long a, long b) {
    if (a != b) s += std::string(" ") + k + " " + std::to_string(a) + "->" + std::to_string(b);
  };
  chk("fds", before.fds, after.fds);
  chk("VmPin", before.vmpin_kb, after.vmpin_kb);
  for (const char *k : res_keys) chk(k, before.get(k), after.get(k));
  return s;
}

// The counts after a teardown, sampled again (up to 2 s) while they differ from `base`: the kernel
// may finish releasing an object just after the call that released it returned.
counts settled(const counts &base) {
  counts c = sample();
  for (int i = 0; i < 10 && !leaked(base, c).empty(); ++i) {
    ::usleep(200000);
    c = sample();
  }
  return c;
}

// ---- JSON rows ----

struct row {
  std::string s = "{";
  row &kv(const char *k, const std::string &v) {
    if (s.size() > 1) s += ", ";
    s += "\"" + std::string(k) + "\": \"" + v + "\"";
    return *this;
  }
  row &kv(const char *k, double v) {
    if (s.size() > 1) s += ", ";
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", v);
    s += "\"" + std::string(k) + "\": " + b;
    return *this;
  }
  void emit() {
    s += "}";
    if (const char *path = std::getenv("RDMAXX_SCALE_JSON"))
      if (FILE *f = std::fopen(path, "a")) {
        std::fprintf(f, "%s\n", s.c_str());
        std::fclose(f);
      }
  }
};

std::string json_escape(std::string m) {
  std::string o;
  for (char ch : m) {
    if (ch == '"' || ch == '\\') o += '\\';
    o += ch;
  }
  return o;
}

// Page-aligned bytes: an unaligned 4 KiB slot spans two pages, and its exact region pins both.
struct pages {
  std::byte *p = nullptr;
  std::size_t n = 0;
  pages() = default;
  explicit pages(std::size_t bytes, std::byte fill = std::byte{0}) : n(bytes) {
    p = static_cast<std::byte *>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    if (!p) std::abort();
    std::memset(p, int(fill), bytes);
  }
  pages(pages &&o) noexcept : p(std::exchange(o.p, nullptr)), n(o.n) {}
  pages &operator=(pages &&o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~pages() { std::free(p); }
  std::byte *data() const { return p; }
  std::size_t size() const { return n; }
};

// How a connection's end is built (the row's "mode").
enum class res { own, shared, channel };
const char *name(res m) { return m == res::own ? "own" : m == res::shared ? "shared" : "shared+channel"; }
res parse_res(const std::string &s) { return s == "own" ? res::own : s == "shared+channel" ? res::channel : res::shared; }

// ---- one end's shared resources (modes shared and shared+channel) ----

struct shared_end {
  EventChannel cm; // shared+channel: the end's one rdma_cm channel
  Context ctx;
  ProtectionDomain pd;
  CompletionChannel ch;
  CompletionQueue cq;
  result<void> open(int cqe, bool channel) noexcept {
    if (channel) {
      RDMAXX_TRY(e, EventChannel::create());
      cm = std::move(e);
    }
    RDMAXX_TRY(c, Context::open("rxe0"));
    ctx = std::move(c);
    RDMAXX_TRY(p, ProtectionDomain::alloc(ctx));
    pd = std::move(p);
    RDMAXX_TRY(h, CompletionChannel::create(ctx));
    ch = std::move(h);
    RDMAXX_TRY(q, CompletionQueue::create(ctx, cqe, &ch));
    cq = std::move(q);
    return success();
  }
};

qp_caps caps() {
  qp_caps c;
  c.max_send_wr = 16;
  c.max_recv_wr = recvs;
  return c;
}

conn_options options(bool shared, shared_end &e, std::uint64_t cookie = 0) {
  conn_options o;
  o.caps = caps();
  o.responder_resources = 1;
  o.initiator_depth = 1;
  o.timeout_ms = 20000;
  if (shared) {
    o.pd = &e.pd;
    o.send_cq = o.recv_cq = &e.cq;
    if (e.cm) {
      o.channel = &e.cm;
      o.cookie = cookie;
    }
  } else {
    o.cq_entries = 32;
    o.cq_channel = true;
  }
  return o;
}

struct wire_req {
  std::uint64_t addr;
  std::uint32_t rkey, length;
};

// ---- the server end ----

struct srv_conn {
  Connection c;
  pages staging = pages(slot_size);
  pages rx = pages(recvs * msg);
  MemoryRegion staging_mr, rx_mr;
  std::size_t recv_seen = 0;
  bool gone = false;
};

constexpr std::uint64_t listener_cookie = ~std::uint64_t(0);

struct server_end {
  bool shared = false, channel = false;
  shared_end sh;
  Listener l;
  std::vector<std::unique_ptr<srv_conn>> conns;
  std::unordered_map<std::uint32_t, std::uint32_t> by_qp;
  std::error_code error; // the first failure (accepting, serving)
  std::uint32_t announced = 0; // connections the client said it makes (private data)

  result<void> start(const address &at, res m, int cqe) noexcept {
    shared = m != res::own;
    channel = m == res::channel;
    if (shared) RDMAXX_TRYV(sh.open(cqe, channel));
    RDMAXX_TRY(ls, Listener::listen(at, {.backlog = 1024, .channel = channel ? &sh.cm : nullptr,
                                         .cookie = listener_cookie}));
    l = std::move(ls);
    return success();
  }
  std::size_t established() const noexcept {
    return std::size_t(std::count_if(conns.begin(), conns.end(), [](auto &c) {
      return c->c.state() == conn_state::established;
    }));
  }
  // Take every pending request; prepare, post the receives, accept.
  void accept_pending() noexcept {
    for (;;) {
      auto r = l.get_request(0);
      if (!r) return; // none pending (a cm timeout) or an event error: both end the batch
      std::uint32_t n = 0;
      std::memcpy(&n, r.value().private_data().data(), sizeof n);
      announced = n;
      auto s = std::make_unique<srv_conn>();
      auto c = r.value().prepare(options(shared, sh, conns.size()));
      if (!c) {
        if (!error) error = c.error();
        continue;
      }
      s->c = std::move(c).value();
      auto fail = [&](std::error_code ec) {
        if (!error) error = ec;
      };
      auto smr = MemoryRegion::reg(s->c.pd(), s->staging.data(), s->staging.size(), access::local_write);
      auto rmr = MemoryRegion::reg(s->c.pd(), s->rx.data(), s->rx.size(), access::local_write);
      if (!smr) { fail(smr.error()); continue; }
      if (!rmr) { fail(rmr.error()); continue; }
      s->staging_mr = std::move(smr).value();
      s->rx_mr = std::move(rmr).value();
      const std::uint32_t i = std::uint32_t(conns.size());
      bool ok = true;
      for (std::size_t k = 0; k < recvs && ok; ++k)
        ok = s->c.qp().post_recv(std::uint64_t(i) << 8 | k_recv, s->rx_mr.sge(std::uint32_t(k * msg), msg)).has_value();
      if (!ok) { fail(std::make_error_code(std::errc::io_error)); continue; }
      if (auto a = s->c.accept(); !a) { fail(a.error()); continue; }
      by_qp[s->c.qp().qp_num()] = i;
      conns.push_back(std::move(s));
    }
  }
  void advance_one(srv_conn &s) noexcept {
    if (!s.c || s.gone) return;
    auto st = s.c.advance();
    if (!st || st.value() == conn_state::disconnected) s.gone = true;
  }
  // shared+channel: only the users dispatch() names (the listener: accept what waits).
  void dispatch() noexcept {
    std::uint64_t ready[64];
    do {
      auto n = sh.cm.dispatch(ready);
      if (!n) {
        if (!error) error = n.error();
        return;
      }
      for (std::size_t k = 0; k < n.value(); ++k) {
        if (ready[k] == listener_cookie) accept_pending();
        else if (ready[k] < conns.size()) advance_one(*conns[ready[k]]);
      }
    } while (sh.cm.has_ready());
  }
  void advance_all() noexcept {
    if (channel) return dispatch();
    for (auto &s : conns) advance_one(*s);
  }
  std::size_t gone() const noexcept {
    return std::size_t(std::count_if(conns.begin(), conns.end(), [](auto &c) { return c->gone; }));
  }
  void on_wc(const ibv_wc &wc) noexcept {
    const auto it = by_qp.find(wc.qp_num);
    if (it == by_qp.end()) return;
    srv_conn &s = *conns[it->second];
    if (wc.status != IBV_WC_SUCCESS) {
      if (!s.gone && wc.status != IBV_WC_WR_FLUSH_ERR && !error)
        error = std::make_error_code(std::errc::io_error);
      return;
    }
    const std::uint64_t kind = wc.wr_id & 0xff, i = wc.wr_id >> 8;
    if (kind == k_recv) {
      // Receives complete in the order posted and each is reposted to its own 64 B: the buffer
      // of this one is (count % recvs).
      wire_req r{};
      const std::size_t k = s.recv_seen++ % recvs;
      std::memcpy(&r, s.rx.data() + k * msg, sizeof r);
      (void)s.c.qp().post_recv(i << 8 | k_recv, s.rx_mr.sge(std::uint32_t(k * msg), msg));
      auto b = s.c.qp().start_send();
      b.read({i << 8 | k_read, send_flag::signaled}, {r.addr, r.rkey}, s.staging_mr.sge(0, r.length));
      if (auto sub = b.submit(); !sub && !error) error = sub.error();
    } else if (kind == k_read) {
      const std::array<std::byte, 16> reply{};
      auto b = s.c.qp().start_send();
      b.send_inline({i << 8 | k_send, send_flag::signaled}, reply);
      if (auto sub = b.submit(); !sub && !error) error = sub.error();
    }
  }
  // Poll every CQ once; returns the completions seen.
  std::size_t poll() noexcept {
    ibv_wc wc[32];
    std::size_t total = 0;
    auto drain = [&](CompletionQueue &cq) {
      auto n = cq.poll(wc);
      if (!n) {
        if (!error) error = n.error();
        return;
      }
      for (std::size_t k = 0; k < n.value(); ++k) on_wc(wc[k]);
      total += n.value();
    };
    if (shared) drain(sh.cq);
    else
      for (auto &s : conns)
        if (s->c) drain(s->c.cq());
    return total;
  }
  void close_all() noexcept {
    conns.clear();
    by_qp.clear();
  }
};

// ---- the client end ----

struct cli_conn {
  Connection c;
  pages buf;
  pages rx = pages(recvs * msg);
  MemoryRegion mr, rx_mr;
  GrantPool pool;
  GrantLease lease;
  enum class st : std::uint8_t { idle, wait_reply, wait_revoke } state = st::idle;
  std::int64_t t0 = 0;
  std::size_t recv_seen = 0;
};

struct client_end {
  bool shared = false;
  shared_end sh;
  std::vector<std::unique_ptr<cli_conn>> conns;
  std::unordered_map<std::uint32_t, std::uint32_t> by_qp;
  std::error_code error;
  std::vector<double> lat_us; // per request (post to revoke confirmed)
  std::uint64_t done = 0;
  bool running = false;

  result<void> start(res m, int cqe) noexcept {
    shared = m != res::own;
    if (shared) RDMAXX_TRYV(sh.open(cqe, m == res::channel));
    return success();
  }
  // After the connection is established: the buffer, its MR, the pool, the receives.
  result<void> setup_conn(cli_conn &k, std::uint32_t i, std::size_t slots) noexcept {
    k.buf = pages(slots * slot_size, std::byte{1});
    RDMAXX_TRY(m, MemoryRegion::reg(k.c.pd(), k.buf.data(), k.buf.size(), access::local_write));
    k.mr = std::move(m);
    RDMAXX_TRY(r, MemoryRegion::reg(k.c.pd(), k.rx.data(), k.rx.size(), access::local_write));
    k.rx_mr = std::move(r);
    RDMAXX_TRY(p, GrantPool::create(k.c.pd(), k.mr, {.slot_size = slot_size, .slots = slots, .lazy_slots = g_lazy_slots}));
    k.pool = std::move(p);
    for (std::size_t j = 0; j < recvs; ++j)
      RDMAXX_TRYV(k.c.qp().post_recv(std::uint64_t(i) << 8 | k_recv, k.rx_mr.sge(std::uint32_t(j * msg), msg)));
    by_qp[k.c.qp().qp_num()] = i;
    return success();
  }
  void post(cli_conn &k, std::uint32_t i) noexcept {
    auto l = k.pool.acquire();
    if (!l) {
      if (!error) error = l.error();
      return;
    }
    k.lease = std::move(l).value();
    auto b = k.c.qp().start_send();
    auto d = k.pool.grant(b, k.c.qp(), k.lease, access::remote_read);
    if (!d) {
      if (!error) error = d.error();
      return;
    }
    const wire_req r{d.value().addr, d.value().rkey, slot_size};
    b.send_inline({std::uint64_t(i) << 8 | k_send, send_flag::fence | send_flag::signaled},
                  std::as_bytes(std::span(&r, 1)));
    k.t0 = now_ns();
    if (auto s = b.submit(); !s) {
      if (!error) error = s.error();
      return;
    }
    k.state = cli_conn::st::wait_reply;
  }
  void kick() noexcept {
    for (std::uint32_t i = 0; i < conns.size(); ++i)
      if (conns[i]->state == cli_conn::st::idle) post(*conns[i], i);
  }
  void on_wc(ibv_wc &wc) noexcept {
    const auto it = by_qp.find(wc.qp_num);
    if (it == by_qp.end()) return;
    const std::uint32_t i = it->second;
    cli_conn &k = *conns[i];
    if (k.pool.owns(wc)) {
      (void)k.pool.complete(std::span(&wc, 1));
      if (wc.status != IBV_WC_SUCCESS && !error) error = std::make_error_code(std::errc::io_error);
      if (k.state == cli_conn::st::wait_revoke && k.lease.state() == lease_state::ready) {
        (void)k.pool.give_back(k.lease);
        if (running) {
          lat_us.push_back(double(now_ns() - k.t0) / 1e3);
          ++done;
        }
        k.state = cli_conn::st::idle;
        if (running) post(k, i);
      }
      return;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status != IBV_WC_WR_FLUSH_ERR && !error) error = std::make_error_code(std::errc::io_error);
      return;
    }
    if ((wc.wr_id & 0xff) == k_recv) {
      const std::size_t j = k.recv_seen++ % recvs;
      (void)k.c.qp().post_recv(std::uint64_t(i) << 8 | k_recv, k.rx_mr.sge(std::uint32_t(j * msg), msg));
      if (auto r = k.pool.revoke(k.c.qp(), k.lease); !r && !error) error = r.error();
      k.state = cli_conn::st::wait_revoke;
    }
  }
  std::size_t poll() noexcept {
    ibv_wc wc[32];
    std::size_t total = 0;
    auto drain = [&](CompletionQueue &cq) {
      auto n = cq.poll(wc);
      if (!n) {
        if (!error) error = n.error();
        return;
      }
      for (std::size_t k = 0; k < n.value(); ++k) on_wc(wc[k]);
      total += n.value();
    };
    if (shared) drain(sh.cq);
    else
      for (auto &k : conns)
        if (k->c) drain(k->c.cq());
    return total;
  }
  bool quiet() const noexcept {
    return std::all_of(conns.begin(), conns.end(), [](auto &k) { return k->state == cli_conn::st::idle; });
  }
  void close_all() noexcept {
    for (auto &k : conns)
      if (k->c.state() == conn_state::established) (void)k->c.disconnect();
    conns.clear();
    by_qp.clear();
  }
};

// ---- a round: N connections, setup, counts, traffic, teardown, leak check ----

struct round_result {
  std::size_t n = 0, made = 0;
  double setup_ms_per_conn = 0, pool_ms_per_conn = 0;
  counts base, fixed, up, after; // before anything, after the per-end resources, set up, torn down
  double rps_median = 0, rps_min = 0, rps_max = 0, p50 = 0, p99 = 0;
  std::string error; // what stopped the setup, if anything
  std::string leak;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(p * double(v.size())))];
}

// Wait briefly on the given fds (the cm channels, the listener).
void nap(const std::vector<int> &fds) {
  std::vector<pollfd> p;
  for (int fd : fds)
    if (fd >= 0) p.push_back({fd, POLLIN, 0});
  (void)::poll(p.data(), nfds_t(p.size()), 2);
}

// Where the last setup failure happened (the bench's label; the library's message follows).
const char *failed_at = "";

// Connect `n` client connections (sequentially: connect, accept, establish); `srv` is null when
// the server is another process. Returns the error that stopped it, if any.
std::error_code connect_n(client_end &cli, server_end *srv, const address &to, std::size_t n, bool shared,
                          std::size_t slots, double &pool_ms) {
  pool_ms = 0;
  const std::uint32_t announce = std::uint32_t(n);
  for (std::size_t i = 0; i < n; ++i) {
    conn_options o = options(shared, cli.sh, i);
    o.private_data = std::as_bytes(std::span(&announce, 1));
    auto c = Connection::start_connect(to, o);
    failed_at = "client: Connection::start_connect";
    if (!c) return c.error();
    auto k = std::make_unique<cli_conn>();
    k->c = std::move(c).value();
    const std::int64_t deadline = detail::monotonic_ms() + 30000;
    for (;;) {
      auto st = k->c.advance();
      failed_at = "client: Connection::advance";
      if (!st) return st.error();
      if (srv && srv->channel) {
        // One cm fd: the connections dispatch() names (the listener among them).
        srv->dispatch();
        failed_at = "server: EventChannel::dispatch, ConnectRequest::prepare / accept, Connection::advance";
        if (srv->error) return srv->error;
      } else if (srv) {
        srv->accept_pending();
        failed_at = "server: ConnectRequest::prepare / accept";
        if (srv->error) return srv->error;
        for (auto &s : srv->conns)
          if (s->c.state() == conn_state::accepting) {
            failed_at = "server: Connection::advance";
            if (auto a = s->c.advance(); !a) return a.error();
          }
      }
      const bool srv_ok = !srv || srv->established() == i + 1;
      if (st.value() == conn_state::established && srv_ok) break;
      failed_at = "connect: no establishment within 30 s";
      if (detail::monotonic_ms() > deadline) return make_error_code(errc::timeout);
      std::vector<int> fds{k->c.fd()};
      if (srv) {
        fds.push_back(srv->l.fd());
        if (!srv->conns.empty()) fds.push_back(srv->conns.back()->c.fd());
      }
      if (!(srv && srv->channel && srv->sh.cm.has_ready())) nap(fds);
    }
    const std::int64_t t = now_ns();
    cli.conns.push_back(std::move(k));
    failed_at = "client: buffer MR, GrantPool::create, receives";
    if (auto r = cli.setup_conn(*cli.conns.back(), std::uint32_t(i), slots); !r) return r.error();
    pool_ms += double(now_ns() - t) / 1e6;
  }
  return {};
}

// Traffic: every connection one request in flight, `reps` windows of `secs` (after a warm-up).
void traffic(client_end &cli, server_end *srv, double secs, int reps, round_result &r) {
  std::vector<double> rps;
  auto spin = [&](double s, bool measure) {
    cli.running = true;
    cli.done = 0;
    if (!measure) cli.lat_us.clear();
    cli.kick();
    const std::int64_t t0 = now_ns(), end = t0 + std::int64_t(s * 1e9);
    // At least 4 requests per connection, whatever the time (the smoke run).
    const std::int64_t bound = end + 60'000'000'000; // a peer that stopped answering
    while ((now_ns() < end || cli.done < 4 * cli.conns.size()) && !cli.error && (!srv || !srv->error)) {
      cli.poll();
      if (srv) srv->poll();
      if (now_ns() > bound) cli.error = make_error_code(errc::timeout);
    }
    const double el = double(now_ns() - t0) / 1e9;
    if (measure) rps.push_back(double(cli.done) / el);
  };
  spin(secs / 4, false);
  cli.lat_us.clear();
  for (int i = 0; i < reps; ++i) spin(secs, true);
  // Drain: let every request finish.
  cli.running = false;
  const std::int64_t end = now_ns() + 10'000'000'000;
  while (!cli.quiet() && now_ns() < end && !cli.error) {
    cli.poll();
    if (srv) srv->poll();
  }
  if (!rps.empty()) {
    r.rps_median = bench::median(rps);
    r.rps_min = *std::min_element(rps.begin(), rps.end());
    r.rps_max = *std::max_element(rps.begin(), rps.end());
  }
  r.p50 = pct(cli.lat_us, 0.50);
  r.p99 = pct(cli.lat_us, 0.99);
}

std::string msg_of(std::error_code ec) {
  return std::string(failed_at) + ": " + ec.message() + " [" + ec.category().name() + " " + std::to_string(ec.value()) + "]";
}

void print_counts(const char *what, const counts &c) {
  std::printf("  %-8s fds %ld VmPin %ld kB VmLck %ld kB RSS %ld kB |", what, c.fds, c.vmpin_kb, c.vmlck_kb, c.rss_kb);
  for (const char *k : res_keys) std::printf(" %s %ld", k, c.get(k));
  std::printf("\n");
}

void emit_round(const char *sweep, const char *mode, const char *ends, const round_result &r, std::size_t slots,
                double nofile = 0) {
  const double n = double(std::max<std::size_t>(1, r.made));
  if (nofile == 0) {
    rlimit l{};
    ::getrlimit(RLIMIT_NOFILE, &l);
    nofile = double(l.rlim_cur);
  }
  row j;
  j.kv("rlimit_nofile", nofile);
  j.kv("sweep", sweep).kv("mode", mode).kv("ends", ends).kv("connections", double(r.n)).kv("slots", double(slots))
      .kv("established", double(r.made)).kv("setup_ms_per_conn", r.setup_ms_per_conn)
      .kv("pool_ms_per_conn", r.pool_ms_per_conn)
      .kv("fds_per_conn", double(r.up.fds - r.fixed.fds) / n)
      .kv("vmpin_kb_per_conn", double(r.up.vmpin_kb - r.fixed.vmpin_kb) / n)
      .kv("rss_kb_per_conn", double(r.up.rss_kb - r.fixed.rss_kb) / n)
      .kv("fixed_fds", double(r.fixed.fds - r.base.fds));
  for (const char *k : res_keys) {
    j.kv((std::string(k) + "_per_conn").c_str(), double(r.up.get(k) - r.fixed.get(k)) / n);
    j.kv((std::string("fixed_") + k).c_str(), double(r.fixed.get(k) - r.base.get(k)));
  }
  j.kv("requests_per_s", r.rps_median).kv("requests_per_s_min", r.rps_min).kv("requests_per_s_max", r.rps_max)
      .kv("requests_per_s_per_conn", r.rps_median / n).kv("p50_us", r.p50).kv("p99_us", r.p99)
      .kv("error", json_escape(r.error)).kv("leak", json_escape(r.leak));
  j.emit();
  std::printf("%-6s %-6s n=%-4zu slots=%-5zu nofile %-7.0f est %-4zu setup %7.2f ms/conn (pool %6.2f) fds/conn %5.2f "
              "VmPin/conn %7.1f kB qp/conn %.2f mr/conn %.2f cq/conn %.2f ctx/conn %.2f | %9.0f req/s "
              "[%.0f..%.0f] %7.1f/conn p50 %7.1f us p99 %7.1f us%s%s%s\n",
              sweep, mode, r.n, slots, nofile, r.made, r.setup_ms_per_conn, r.pool_ms_per_conn,
              double(r.up.fds - r.fixed.fds) / n, double(r.up.vmpin_kb - r.fixed.vmpin_kb) / n,
              double(r.up.get("qp") - r.fixed.get("qp")) / n, double(r.up.get("mr") - r.fixed.get("mr")) / n,
              double(r.up.get("cq") - r.fixed.get("cq")) / n, double(r.up.get("ctx") - r.fixed.get("ctx")) / n,
              r.rps_median, r.rps_min, r.rps_max, r.rps_median / n, r.p50, r.p99,
              r.error.empty() ? "" : "  STOPPED: ", r.error.c_str(), r.leak.empty() ? "" : "  LEAK");
  std::fflush(stdout);
}

// One round in one process: both ends.
round_result local_round(const address &at, std::size_t n, res mode, std::size_t slots, double secs, int reps) {
  const bool shared = mode != res::own;
  round_result r;
  r.n = n;
  r.base = sample();
  {
    server_end srv;
    client_end cli;
    const int cqe = int(std::max<std::size_t>(64, n * (recvs + 8)));
    auto fail = [&](std::error_code ec) { r.error = msg_of(ec); };
    failed_at = "listener and per-end resources";
    if (auto s = srv.start(at, mode, cqe); !s) fail(s.error());
    else if (auto c = cli.start(mode, cqe); !c) fail(c.error());
    else {
      r.fixed = sample();
      const auto lp = srv.l.local_address();
      const address to = lp ? lp.value() : at;
      const std::int64_t t0 = now_ns();
      double pool_ms = 0;
      if (auto ec = connect_n(cli, &srv, to, n, shared, slots, pool_ms)) fail(ec);
      r.made = cli.conns.size();
      const double total_ms = double(now_ns() - t0) / 1e6;
      r.setup_ms_per_conn = total_ms / double(std::max<std::size_t>(1, r.made));
      r.pool_ms_per_conn = pool_ms / double(std::max<std::size_t>(1, r.made));
      r.up = sample();
      if (r.error.empty()) {
        traffic(cli, &srv, secs, reps, r);
        failed_at = "traffic";
        if (cli.error) fail(cli.error);
        else if (srv.error) fail(srv.error);
      }
    }
    cli.close_all();
    srv.close_all();
  }
  r.after = settled(r.base);
  r.leak = leaked(r.base, r.after);
  return r;
}

// ---- environment ----

double scale_ = 1;
bool smoke() { return scale_ < 0.05; }

std::vector<std::size_t> list_args(int argc, char **argv, int from, std::vector<std::size_t> def) {
  std::vector<std::size_t> v;
  for (int i = from; i < argc; ++i) v.push_back(std::size_t(std::strtoul(argv[i], nullptr, 10)));
  return v.empty() ? def : v;
}

void print_device_limits() {
  auto ctx = Context::open("rxe0");
  if (!ctx) return;
  ibv_device_attr a{};
  if (::ibv_query_device(ctx.value().native_handle(), &a)) return;
  std::printf("device limits: max_qp %d max_cq %d max_mr %d max_mw %d max_pd %d max_cqe %d max_mr_size %llu\n",
              a.max_qp, a.max_cq, a.max_mr, a.max_mw, a.max_pd, a.max_cqe, (unsigned long long)a.max_mr_size);
  rlimit nf{}, ml{};
  ::getrlimit(RLIMIT_NOFILE, &nf);
  ::getrlimit(RLIMIT_MEMLOCK, &ml);
  std::printf("process limits: RLIMIT_NOFILE %llu, RLIMIT_MEMLOCK %lld\n", (unsigned long long)nf.rlim_cur,
              ml.rlim_cur == RLIM_INFINITY ? -1LL : (long long)ml.rlim_cur);
  row j;
  j.kv("sweep", "device").kv("max_qp", a.max_qp).kv("max_cq", a.max_cq).kv("max_mr", a.max_mr)
      .kv("max_mw", a.max_mw).kv("max_pd", a.max_pd).kv("max_cqe", a.max_cqe)
      .kv("rlimit_nofile", double(nf.rlim_cur));
  j.emit();
}

int sweep_conns(const address &at, std::vector<std::size_t> ns) {
  int rc = 0;
  const double secs = std::max(0.01, 2.0 * scale_);
  const int reps = smoke() ? 1 : 3;
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  for (const res mode : {res::own, res::shared, res::channel})
    for (std::size_t n : ns) {
      auto r = local_round(at, n, mode, default_slots, secs, reps);
      emit_round("conns", name(mode), "both", r, default_slots);
      if (!r.leak.empty()) {
        std::printf("LEAK after the round:%s\n", r.leak.c_str());
        rc = 1;
      }
      // A round stopped by a limit is a finding, not a failure; the smoke run must not stop.
      if (!r.error.empty() && smoke()) rc = 1;
      // Stopped by the fd limit: the same round again with the soft limit raised to the hard one
      // (what a server's operator does), so that the curve goes on.
      if (r.error.find("Too many open files") != std::string::npos && nofile.rlim_cur < nofile.rlim_max) {
        rlimit raised = nofile;
        raised.rlim_cur = nofile.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &raised);
        auto r2 = local_round(at, n, mode, default_slots, secs, reps);
        emit_round("conns", name(mode), "both", r2, default_slots, double(raised.rlim_cur));
        ::setrlimit(RLIMIT_NOFILE, &nofile);
        if (!r2.leak.empty()) {
          std::printf("LEAK after the round:%s\n", r2.leak.c_str());
          rc = 1;
        }
      }
    }
  return rc;
}

int sweep_slots(const address &at, std::vector<std::size_t> ss) {
  int rc = 0;
  const double secs = std::max(0.01, 1.0 * scale_);
  for (bool lazy : {false, true}) {
    g_lazy_slots = lazy;
    for (std::size_t s : ss) {
      auto r = local_round(at, 1, res::shared, s, secs, smoke() ? 1 : 3);
      emit_round("slots", lazy ? "lazy" : "shared", "both", r, s);
      if (!r.leak.empty()) {
        std::printf("LEAK after the round:%s\n", r.leak.c_str());
        rc = 1;
      }
      if (!r.error.empty() && smoke()) rc = 1;
    }
  }
  g_lazy_slots = false;
  return rc;
}

// ---- limits ----

int limit_fds(const address &at, bool shared) {
  // Room for a few connections above what is open now: the limit is hit within seconds.
  const counts base = sample();
  rlimit old{};
  ::getrlimit(RLIMIT_NOFILE, &old);
  rlimit low = old;
  low.rlim_cur = rlim_t(base.fds + 3 + 24);
  std::string err;
  std::size_t made = 0;
  counts at_limit;
  bool clear = false;
  {
    server_end srv;
    client_end cli;
    std::error_code ec;
    if (auto s = srv.start(at, shared ? res::shared : res::own, 4096); !s) ec = s.error();
    else if (auto c = cli.start(shared ? res::shared : res::own, 4096); !c) ec = c.error();
    if (!ec) {
      const auto lp = srv.l.local_address();
      ::setrlimit(RLIMIT_NOFILE, &low);
      double pool_ms = 0;
      ec = connect_n(cli, &srv, lp ? lp.value() : at, 1000, shared, default_slots, pool_ms);
      made = cli.conns.size();
      ::setrlimit(RLIMIT_NOFILE, &old);
      at_limit = sample();
    }
    err = ec ? msg_of(ec) : "no limit reached";
    // The error says what ran out: EMFILE, and with shared resources (only the cm channel per
    // connection) the call that needed the fd.
    clear = ec == std::errc::too_many_files_open &&
            (!shared || cm_call_of(ec) == cm_call::rdma_create_event_channel);
    cli.close_all();
    srv.close_all();
  }
  const counts after = settled(base);
  const std::string leak = leaked(base, after);
  if (!clear) std::printf("limit fds: not the expected error (EMFILE%s)\n", shared ? " of rdma_create_event_channel" : "");
  std::printf("limit fds (%s): RLIMIT_NOFILE %llu with %ld open: %zu connections established, then: %s%s%s\n",
              shared ? "shared" : "own", (unsigned long long)low.rlim_cur, base.fds, made, err.c_str(),
              leak.empty() ? "; after teardown every count is back" : "; LEAK:", leak.c_str());
  print_counts("before", base);
  print_counts("at limit", at_limit);
  print_counts("after", after);
  row j;
  j.kv("sweep", "limit").kv("limit", "fds").kv("mode", shared ? "shared" : "own")
      .kv("rlimit", double(low.rlim_cur)).kv("fds_before", double(base.fds)).kv("connections", double(made))
      .kv("error", json_escape(err)).kv("leak", json_escape(leak));
  j.emit();
  return leak.empty() && made > 0 && clear ? 0 : 1;
}

// Root ignores RLIMIT_MEMLOCK (CAP_IPC_LOCK), and a process cannot drop the capability once it
// has rdma_cm or verbs files open (their writes check that the caller's credentials are the
// opener's: EACCES). So the pinned-memory limit runs in a fresh process: fork, drop CAP_IPC_LOCK
// from the bounding set, lower RLIMIT_MEMLOCK to 1 MiB, exec this program again.
int limit_pinned_fork(const char *self) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    (void)::prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
    rlimit low{1 << 20, 1 << 20};
    (void)::setrlimit(RLIMIT_MEMLOCK, &low);
    ::execl("/proc/self/exe", self, "limit-pinned-child", static_cast<char *>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

bool have_cap_ipc_lock() {
  std::uint64_t eff = ~0ull;
  if (FILE *f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "CapEff: %lx", &eff) == 1) break;
    std::fclose(f);
  }
  return (eff >> CAP_IPC_LOCK) & 1;
}

int limit_pinned(const address &at) {
  // One connection; pools of 16 slots on it until ibv_reg_mr refuses (RLIMIT_MEMLOCK).
  const counts base = sample();
  rlimit low{};
  ::getrlimit(RLIMIT_MEMLOCK, &low);
  const bool capped = low.rlim_cur != RLIM_INFINITY && !have_cap_ipc_lock();
  std::string err;
  std::size_t pools = 0;
  counts at_limit;
  {
    server_end srv;
    client_end cli;
    std::error_code ec;
    if (auto s = srv.start(at, res::shared, 256); !s) ec = s.error();
    else if (auto c = cli.start(res::shared, 256); !c) ec = c.error();
    double pool_ms = 0;
    if (!ec) {
      const auto lp = srv.l.local_address();
      ec = connect_n(cli, &srv, lp ? lp.value() : at, 1, true, default_slots, pool_ms);
    }
    std::vector<pages> bufs;
    std::vector<GrantPool> extra;
    if (!ec) {
      while (!ec && pools < 100000) {
        bufs.emplace_back(default_slots * slot_size);
        auto m = MemoryRegion::reg(cli.sh.pd, bufs.back().data(), bufs.back().size(), access::local_write);
        failed_at = "ibv_reg_mr of the pool's buffer (MemoryRegion::reg)";
        if (!m) { ec = m.error(); break; }
        failed_at = "GrantPool::create";
        auto p = GrantPool::create(cli.sh.pd, m.value(), {.slot_size = slot_size, .slots = default_slots});
        if (!p) { ec = p.error(); break; }
        // The pool's exact regions pin the memory: the whole-buffer region may go.
        extra.push_back(std::move(p).value());
        ++pools;
        if (!capped) break;
      }
      at_limit = sample();
    }
    err = ec ? msg_of(ec) : "no limit reached";
    extra.clear();
    cli.close_all();
    srv.close_all();
  }
  const counts after = settled(base);
  const std::string leak = leaked(base, after);
  std::printf("limit pinned memory: RLIMIT_MEMLOCK %llu B (without CAP_IPC_LOCK: %s): %zu pools of 16 x 4 KiB "
              "created, then: %s%s%s\n",
              (unsigned long long)low.rlim_cur, capped ? "yes" : "no", pools, err.c_str(),
              leak.empty() ? "; after teardown every count is back" : "; LEAK:", leak.c_str());
  print_counts("before", base);
  print_counts("at limit", at_limit);
  print_counts("after", after);
  row j;
  j.kv("sweep", "limit").kv("limit", "pinned").kv("mode", "shared").kv("rlimit", double(low.rlim_cur))
      .kv("pools", double(pools)).kv("vmpin_kb_at_limit", double(at_limit.vmpin_kb))
      .kv("error", json_escape(err)).kv("leak", json_escape(leak));
  j.emit();
  if (!capped) return leak.empty() ? 0 : 1; // cannot lower the limit here: only the leak check
  return leak.empty() && pools > 0 && err != "no limit reached" ? 0 : 1;
}

// ---- two processes (two VMs) ----

int run_server(const address &at, res mode, int rounds) {
  int rc = 0;
  server_end srv;
  bench::must(srv.start(at, mode, 4096), "listen");
  std::printf("server: listening on %s (%s)\n", at.to_string().c_str(), name(mode));
  std::fflush(stdout);
  counts base = sample();
  std::int64_t t_first = 0;
  bool reported = false;
  for (;;) {
    const std::size_t before = srv.conns.size();
    srv.accept_pending();
    if (srv.conns.size() > before && before == 0) t_first = now_ns();
    std::size_t busy = 0;
    for (int i = 0; i < 200; ++i) busy += srv.poll();
    srv.advance_all();
    if (srv.error) {
      std::printf("server: %s\n", msg_of(srv.error).c_str());
      srv.error = {};
    }
    if (!reported && srv.announced && srv.established() == srv.announced) {
      round_result r;
      r.n = r.made = srv.announced;
      r.base = r.fixed = base;
      r.up = sample();
      r.setup_ms_per_conn = double(now_ns() - t_first) / 1e6 / double(r.n);
      emit_round("conns", name(mode), "server", r, default_slots);
      reported = true;
    }
    if (!srv.conns.empty() && srv.gone() == srv.conns.size()) {
      srv.close_all();
      const counts after = settled(base);
      const std::string leak = leaked(base, after);
      std::printf("server: round of %u over%s%s\n", srv.announced, leak.empty() ? ", counts back at the baseline"
                                                                               : ", LEAK:", leak.c_str());
      std::fflush(stdout);
      if (!leak.empty()) rc = 1;
      srv.announced = 0;
      reported = false;
      base = after;
      if (--rounds == 0) return rc;
    }
    if (busy == 0) {
      std::vector<int> fds{srv.l.fd()};
      nap(fds);
    }
  }
}

int run_client(const address &to, std::vector<std::size_t> ns, res mode) {
  const bool shared = mode != res::own;
  int rc = 0;
  const double secs = std::max(0.01, 2.0 * scale_);
  {
    // One untimed connection first: librdmacm opens its device context on first use and keeps
    // it, which would read as a leak of the first round (the server counts it as a round).
    client_end cli;
    bench::must(cli.start(mode, 64), "client resources");
    double pool_ms = 0;
    if (auto ec = connect_n(cli, nullptr, to, 1, shared, default_slots, pool_ms)) {
      std::printf("client: warm-up connection: %s\n", msg_of(ec).c_str());
      return 1;
    }
    cli.close_all();
    ::usleep(500000);
  }
  for (std::size_t n : ns) {
    round_result r;
    r.n = n;
    r.base = sample();
    {
      client_end cli;
      bench::must(cli.start(mode, int(std::max<std::size_t>(64, n * (recvs + 8)))), "client resources");
      r.fixed = sample();
      const std::int64_t t0 = now_ns();
      double pool_ms = 0;
      if (auto ec = connect_n(cli, nullptr, to, n, shared, default_slots, pool_ms)) r.error = msg_of(ec);
      r.made = cli.conns.size();
      r.setup_ms_per_conn = double(now_ns() - t0) / 1e6 / double(std::max<std::size_t>(1, r.made));
      r.pool_ms_per_conn = pool_ms / double(std::max<std::size_t>(1, r.made));
      r.up = sample();
      if (r.error.empty()) {
        traffic(cli, nullptr, secs, smoke() ? 1 : 3, r);
        if (cli.error) r.error = msg_of(cli.error);
      }
      cli.close_all();
    }
    r.after = settled(r.base);
    r.leak = leaked(r.base, r.after);
    emit_round("conns", name(mode), "client", r, default_slots);
    if (!r.leak.empty() || !r.error.empty()) rc = 1;
    ::usleep(500000); // the server sees the disconnects and closes its round
  }
  return rc;
}

} // namespace

int main(int argc, char **argv) {
  scale_ = bench::scale();
  const std::string cmd = argc > 1 ? argv[1] : "all";
  const char *m = std::getenv("RDMAXX_SCALE_MODE");
  const std::string mode = m ? m : "";
  const address here = bench::must(address::parse(std::string(server_ip) + ":0"), "address");
  // librdmacm opens its device contexts once, on first use, and keeps them: the baselines of
  // every round are taken after that.
  { auto l = Listener::listen(here); }
  if (cmd == "limit-pinned-child") return limit_pinned(here);
  if (cmd == "server") {
    if (argc < 3) return 2;
    const auto at = bench::must(address::parse(argv[2]), "address");
    return run_server(at, parse_res(argc > 3 ? argv[3] : "shared"), argc > 4 ? std::atoi(argv[4]) : 0);
  }
  if (cmd == "client") {
    if (argc < 3) return 2;
    const auto to = bench::must(address::parse(argv[2]), "address");
    return run_client(to, list_args(argc, argv, 3, {1, 16, 64}), parse_res(mode.empty() ? "shared" : mode));
  }
  print_device_limits();
  const std::vector<std::size_t> conns = smoke() ? std::vector<std::size_t>{1, 4}
                                                 : std::vector<std::size_t>{1, 4, 16, 64, 256};
  const std::vector<std::size_t> slots = smoke() ? std::vector<std::size_t>{16, 64}
                                                 : std::vector<std::size_t>{16, 64, 256, 1024, 4096};
  int rc = 0;
  if (cmd == "all" || cmd == "conns") rc |= sweep_conns(here, cmd == "conns" ? list_args(argc, argv, 2, conns) : conns);
  if (cmd == "all" || cmd == "slots") rc |= sweep_slots(here, cmd == "slots" ? list_args(argc, argv, 2, slots) : slots);
  if (cmd == "all" || cmd == "limits") {
    rc |= limit_fds(here, false);
    rc |= limit_fds(here, true);
    rc |= limit_pinned_fork(argv[0]);
  }
  return rc;
}
