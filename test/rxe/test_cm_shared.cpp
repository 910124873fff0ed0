// [cm][shared-channel]: many Connections and Listeners on one rdma_cm EventChannel per end
// (conn_options::channel, listen_options::channel) on a real rxe device (tools/rxe-vm: rxe0 on
// dummy0, 192.0.2.1/24). The client ends share one channel, the server's listener and accepted
// connections another; one thread drives both through EventChannel::dispatch(). Each case checks
// the bytes that arrived, the states each connection reached (and that the others did not move),
// and that fds (/proc/self/fd) and kernel objects (`rdma resource show`) are back at the end.
#include "cm_fixture.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {
using namespace rxe;

constexpr const char *local_ip = "192.0.2.1";
constexpr std::size_t slot = 4096;          // server bytes granted to each client
constexpr std::uint64_t listener_cookie = 1u << 20;
constexpr std::uint64_t server_base = 1000; // server connection of client i: cookie 1000 + i

address addr(const std::string &s) { return need(address::parse(s), "address::parse"); }

// What a client sends after its write: its index and a tag (16 bytes: the size rdma-core's
// rdma_client sends, which the raw peer's receive takes too).
struct hello {
  std::uint32_t index, magic, pad[2];
};
constexpr std::uint32_t hello_magic = 0x5ca1ab1e;

// N client connections on `cch` to a listener on `sch`, server connections on `sch`; shared PD
// and CQ per end. One thread: poll both fds, dispatch both channels, advance whom they name.
struct mesh {
  std::size_t n;
  Context dev = open_device();
  ProtectionDomain cpd = need(ProtectionDomain::alloc(dev), "client pd");
  ProtectionDomain spd = need(ProtectionDomain::alloc(dev), "server pd");
  CompletionQueue ccq = need(CompletionQueue::create(dev, 256), "client cq");
  CompletionQueue scq = need(CompletionQueue::create(dev, 256), "server cq");
  EventChannel cch = need(EventChannel::create(), "client channel");
  EventChannel sch = need(EventChannel::create(), "server channel");
  std::vector<unsigned char> area, src;
  std::vector<hello> inbox;
  hello outbox[256]{};
  MemoryRegion area_mr, src_mr, inbox_mr, out_mr;
  Listener l;
  std::vector<Connection> cli, srv;
  std::vector<conn_state> cli_seen, srv_seen;   // the last state advance() returned
  std::vector<int> cli_reported, srv_reported;  // how often dispatch() named each
  std::map<std::uint32_t, std::size_t> srv_by_qp;
  std::vector<std::string> errors;
  // A request whose private data is not a client index of ours (the raw peer): accepted here.
  Connection extra;
  conn_state extra_seen = conn_state::failed;

  explicit mesh(std::size_t count)
      : n(count), area(count * slot), src(count * slot), inbox(count + 2), cli(count), srv(count),
        cli_seen(count, conn_state::failed), srv_seen(count, conn_state::failed), cli_reported(count),
        srv_reported(count) {
    area_mr = need(MemoryRegion::reg(spd, area.data(), area.size(), access::local_write | access::remote_write), "area");
    inbox_mr = need(MemoryRegion::reg(spd, inbox.data(), inbox.size() * sizeof(hello), access::local_write), "inbox");
    for (std::size_t i = 0; i < n; ++i) fill(src.data() + i * slot, slot, unsigned(40 + i));
    src_mr = need(MemoryRegion::reg(cpd, src.data(), src.size(), access::local_write), "src");
    out_mr = need(MemoryRegion::reg(cpd, outbox, sizeof outbox, access::local_write), "outbox");
    l = need(Listener::listen(addr(std::string(local_ip) + ":0"), {.backlog = 64, .channel = &sch,
                                                                   .cookie = listener_cookie}),
             "listen on the shared channel");
    REQUIRE(l.port() != 0);
    REQUIRE(l.fd() == sch.fd());
  }
  address target() const { return addr(std::string(local_ip) + ":" + std::to_string(l.port())); }

  conn_options client_options(std::size_t i, const std::byte &idx) {
    return {.pd = &cpd, .send_cq = &ccq, .recv_cq = &ccq, .timeout_ms = 10000,
            .private_data = std::span<const std::byte>(&idx, 1), .channel = &cch, .cookie = i};
  }
  void start_clients() {
    for (std::size_t i = 0; i < n; ++i) {
      const std::byte idx{std::uint8_t(i)};
      cli[i] = need(Connection::start_connect(target(), client_options(i, idx)), "start_connect");
      REQUIRE(cli[i].shares_channel());
      REQUIRE(cli[i].fd() == cch.fd());
    }
  }

  void on_request(ConnectRequest &req) {
    const std::size_t idx = std::size_t(req.private_data()[0]);
    const bool ours = idx < n && !srv[idx];
    const remote_descriptor g{area_mr.iova() + (ours ? idx : 0) * slot, slot, area_mr.rkey(), access::remote_write, false};
    const auto wire = g.encode();
    auto c = req.prepare({.pd = &spd, .send_cq = &scq, .recv_cq = &scq, .timeout_ms = 10000,
                          .private_data = std::span<const std::byte>(wire), .channel = &sch,
                          .cookie = server_base + (ours ? idx : n)});
    if (!c) { errors.push_back("prepare: " + c.error().message()); return; }
    // One receive for a client of ours; two for the raw peer (its message, then one flushed).
    for (std::size_t k = 0; k < (ours ? 1u : 2u); ++k)
      if (auto r = c.value().qp().post_recv(ours ? idx : 200, inbox_mr.sge(std::uint32_t((ours ? idx : n + k) * sizeof(hello)), sizeof(hello))); !r)
        errors.push_back("post_recv: " + r.error().message());
    if (auto a = c.value().accept(); !a) { errors.push_back("accept: " + a.error().message()); return; }
    if (ours) {
      srv_by_qp[c.value().qp().qp_num()] = idx;
      srv[idx] = std::move(c).value();
    } else {
      extra = std::move(c).value();
    }
  }
  void on_cookie_server(std::uint64_t k) {
    if (k == listener_cookie) {
      for (;;) {
        auto r = l.get_request(0);
        if (!r) {
          if (!is_cm_timeout(r.error())) errors.push_back("get_request: " + r.error().message());
          return;
        }
        on_request(r.value());
      }
    }
    const std::size_t i = std::size_t(k - server_base);
    Connection &c = i < n ? srv[i] : extra;
    if (i < n) ++srv_reported[i];
    if (!c) { errors.push_back("dispatch named a server connection that does not exist: " + std::to_string(k)); return; }
    auto s = c.advance();
    (i < n ? srv_seen[i] : extra_seen) = s ? s.value() : conn_state::failed;
    if (!s) errors.push_back("server " + std::to_string(i) + ": " + s.error().message());
  }
  void on_cookie_client(std::uint64_t k) {
    if (k >= n || !cli[k]) { errors.push_back("dispatch named a client that does not exist: " + std::to_string(k)); return; }
    ++cli_reported[k];
    auto s = cli[k].advance();
    cli_seen[k] = s ? s.value() : conn_state::failed;
    if (!s) errors.push_back("client " + std::to_string(k) + ": " + s.error().message());
  }
  // One round: wait up to 50 ms for either fd, then dispatch both until nothing is ready.
  void turn() {
    pollfd p[2] = {{cch.fd(), POLLIN, 0}, {sch.fd(), POLLIN, 0}};
    if (!cch.has_ready() && !sch.has_ready()) (void)::poll(p, 2, 50);
    std::array<std::uint64_t, 8> ready{}; // small: more than 8 ready users take several calls
    for (int pass = 0; pass < 1000; ++pass) {
      bool any = false;
      for (EventChannel *ch : {&cch, &sch}) {
        auto got = ch->dispatch(ready);
        if (!got) { errors.push_back("dispatch: " + got.error().message()); continue; }
        std::set<std::uint64_t> once(ready.begin(), ready.begin() + got.value());
        if (once.size() != got.value()) errors.push_back("dispatch named a user twice in one call");
        for (std::size_t j = 0; j < got.value(); ++j) {
          any = true;
          if (ch == &cch) on_cookie_client(ready[j]);
          else on_cookie_server(ready[j]);
        }
      }
      if (!any && !cch.has_ready() && !sch.has_ready()) return;
    }
  }
  template <class Pred>
  bool run_until(Pred done, int timeout_ms = 20000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      turn();
    }
    return true;
  }
  bool all_established() const {
    for (std::size_t i = 0; i < n; ++i)
      if (!cli[i] || !srv[i] || cli[i].state() != conn_state::established ||
          srv[i].state() != conn_state::established)
        return false;
    return true;
  }

  // Each client in `which`: an RDMA write of its 4 KiB into its slot and, behind it, a send of
  // its hello; then the server's receives and the bytes are checked (the receive reposted).
  void traffic(const std::vector<std::size_t> &which, unsigned round) {
    for (std::size_t i : which) fill(src.data() + i * slot, slot, unsigned(40 + i + 17 * round));
    for (std::size_t i : which) {
      INFO("client " << i);
      const auto pd = cli[i].peer_private_data();
      auto d = need(remote_descriptor::decode(pd.first(remote_descriptor::encoded_size)), "descriptor");
      outbox[i] = {std::uint32_t(i), hello_magic, {}};
      auto b = cli[i].qp().start_send();
      b.write({.id = i}, d.at(0), src_mr.sge(std::uint32_t(i * slot), slot));
      b.send({.id = i, .flags = send_flag::signaled}, out_mr.sge(std::uint32_t(i * sizeof(hello)), sizeof(hello)));
      need(b.submit(), "submit");
    }
    std::set<std::uint64_t> sent;
    for (const ibv_wc &wc : wait_wc(ccq, which.size())) {
      CHECK(wc.status == IBV_WC_SUCCESS);
      sent.insert(wc.wr_id);
    }
    CHECK(sent == std::set<std::uint64_t>(which.begin(), which.end()));
    std::set<std::size_t> got;
    for (const ibv_wc &wc : wait_wc(scq, which.size())) {
      REQUIRE(wc.status == IBV_WC_SUCCESS);
      REQUIRE(wc.opcode == IBV_WC_RECV);
      const std::size_t i = srv_by_qp.at(wc.qp_num); // the server connection it arrived on
      CHECK(wc.wr_id == i);
      CHECK(inbox[i].index == i);
      CHECK(inbox[i].magic == hello_magic);
      inbox[i] = {};
      got.insert(i);
      need(srv[i].qp().post_recv(i, inbox_mr.sge(std::uint32_t(i * sizeof(hello)), sizeof(hello))), "repost");
    }
    CHECK(got == std::set<std::size_t>(which.begin(), which.end()));
    for (std::size_t i : which) {
      INFO("slot " << i);
      CHECK(std::memcmp(area.data() + i * slot, src.data() + i * slot, slot) == 0);
    }
  }
  std::vector<std::size_t> all() const {
    std::vector<std::size_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = i;
    return v;
  }
  void report_errors() {
    for (auto &e : errors) UNSCOPED_INFO(e);
    CHECK(errors.empty());
    errors.clear();
  }
};

// A client on plain librdmacm: rdma-core's example rdma_client (rdmacm-utils; rdma_create_ep,
// a QP librdmacm creates, rdma_connect without private data, then a 16-byte send and a wait for
// a reply that never comes), in its own process, which the test then kills: the hostile side,
// gone without a disconnect.
pid_t raw_client(std::uint16_t port) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const std::string p = std::to_string(port);
  const int devnull = ::open("/dev/null", O_WRONLY);
  if (devnull >= 0) ::dup2(devnull, 1);
  ::execlp("rdma_client", "rdma_client", "-s", local_ip, "-p", p.c_str(), static_cast<char *>(nullptr));
  ::_exit(127);
}
} // namespace

TEST_CASE("shared channels: 12 connections established through one cm fd per end, write + send "
          "verified on each, a disconnect reaches only its connection, fds constant",
          "[cm][shared-channel]") {
  const std::string before = cm_resources_baseline();
  const long fds_before = open_fds();
  {
    mesh m(12);
    const long fds_fixed = open_fds(); // device, two cm channels
    m.start_clients();
    REQUIRE(m.run_until([&] { return m.all_established(); }));
    m.report_errors();
    // No fd per connection: the 24 ids and QPs live on the two channels and the one device.
    CHECK(open_fds() == fds_fixed);
    CHECK(m.cch.live_children() == 12);
    CHECK(m.sch.live_children() == 13); // the listener and 12 accepted connections
    for (std::size_t i = 0; i < m.n; ++i) {
      INFO("connection " << i);
      CHECK(m.cli_reported[i] >= 1); // established through dispatch()
      CHECK(m.srv_reported[i] >= 1);
      CHECK(m.srv[i].fd() == m.sch.fd());
      CHECK(need(m.srv[i].qp().state(), "qp") == IBV_QPS_RTS);
    }
    m.traffic(m.all(), 0);

    // Client 3 disconnects: its server connection alone sees DISCONNECTED.
    need(m.cli[3].disconnect(), "disconnect");
    const auto reported = m.srv_reported;
    REQUIRE(m.run_until([&] { return m.srv_seen[3] == conn_state::disconnected; }, 10000));
    m.turn();
    m.report_errors();
    CHECK(m.srv[3].state() == conn_state::disconnected);
    CHECK(need(m.srv[3].qp().state(), "qp") == IBV_QPS_ERR);
    // Its posted receive completes as flushed, on that connection's QP.
    const ibv_wc flushed = wait_one(m.scq, IBV_WC_WR_FLUSH_ERR);
    CHECK(flushed.wr_id == 3);
    CHECK(flushed.qp_num == m.srv[3].qp().qp_num());
    for (std::size_t i = 0; i < m.n; ++i) {
      if (i == 3) continue;
      INFO("connection " << i);
      CHECK(m.srv_reported[i] == reported[i]); // nothing for the others
      CHECK(m.srv[i].state() == conn_state::established);
      CHECK(m.cli[i].state() == conn_state::established);
    }
    std::vector<std::size_t> rest = m.all();
    rest.erase(rest.begin() + 3);
    m.traffic(rest, 1);
    CHECK(open_fds() == fds_fixed);
  }
  CHECK(open_fds() == fds_before);
  CHECK(kernel_resources() == before);
}

TEST_CASE("shared channels: a peer on plain librdmacm (rdma_client) killed without a disconnect: only its "
          "connection sees DISCONNECTED, the others keep working", "[cm][shared-channel]") {
  const std::string before = cm_resources_baseline();
  const long fds_before = open_fds();
  {
    mesh m(8);
    m.start_clients();
    REQUIRE(m.run_until([&] { return m.all_established(); }));
    m.report_errors();
    const pid_t pid = raw_client(m.l.port());
    REQUIRE(pid > 0);
    const auto cli_reported = m.cli_reported, srv_reported = m.srv_reported;
    REQUIRE(m.run_until([&] { return m.extra_seen == conn_state::established; }, 20000));
    // Its 16-byte send arrived on its own connection; it now waits for a reply.
    const ibv_wc msg = wait_one(m.scq);
    CHECK(msg.wr_id == 200);
    CHECK(msg.byte_len == 16);
    CHECK(msg.qp_num == m.extra.qp().qp_num());
    int alive = 0;
    CHECK(::waitpid(pid, &alive, WNOHANG) == 0); // still running
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    REQUIRE(m.run_until([&] { return m.extra_seen == conn_state::disconnected; }, 20000));
    m.turn();
    m.report_errors();
    CHECK(m.extra.state() == conn_state::disconnected);
    CHECK(need(m.extra.qp().state(), "qp") == IBV_QPS_ERR);
    const ibv_wc flushed = wait_one(m.scq, IBV_WC_WR_FLUSH_ERR); // its receive, flushed
    CHECK(flushed.wr_id == 200);
    CHECK(flushed.qp_num == m.extra.qp().qp_num());
    CHECK(m.cli_reported == cli_reported); // nobody else was named
    CHECK(m.srv_reported == srv_reported);
    CHECK(m.all_established());
    m.traffic(m.all(), 2);
    m.extra = Connection{};
  }
  CHECK(open_fds() == fds_before);
  CHECK(kernel_resources() == before);
}

namespace {
struct recorded_failure {
  std::string object;
  unsigned live = 0;
  int calls = 0;
};
recorded_failure g_failure;
void record_failure(const destroy_failure &f) noexcept {
  g_failure.object = f.object;
  g_failure.live = f.live_children;
  ++g_failure.calls;
}
} // namespace

TEST_CASE("shared channels: destroyed in any order with events pending, a moved Connection keeps "
          "working, the channel refuses to go while used, counts back at the end",
          "[cm][shared-channel]") {
  const std::string before = cm_resources_baseline();
  const long fds_before = open_fds();
  {
    mesh m(8);
    m.start_clients();
    REQUIRE(m.run_until([&] { return m.all_established(); }));
    m.report_errors();

    // The channel refuses to go while used: nothing destroyed, everything keeps working.
    auto busy = m.sch.destroy();
    REQUIRE_FALSE(busy);
    CHECK(busy.error() == errc::busy);
    CHECK(m.sch);
    CHECK(m.sch.live_children() == 9);
    CHECK(::fcntl(m.sch.fd(), F_GETFD) >= 0);
    auto busy2 = m.cch.destroy();
    REQUIRE_FALSE(busy2);
    CHECK(busy2.error() == errc::busy);
    m.traffic(m.all(), 3);

    // A server connection moved (to another object and back into a new table) keeps its events.
    Connection moved = std::move(m.srv[5]);
    CHECK_FALSE(m.srv[5]);
    CHECK(m.srv[5].fd() == -1);
    CHECK(m.srv[5].advance().error() == errc::null_handle);
    std::vector<Connection> table;
    table.push_back(std::move(moved));
    m.srv[5] = std::move(table.back());
    table.clear();
    CHECK(m.sch.live_children() == 9); // moves count nothing anew
    m.traffic({5}, 4);

    // Every client disconnects: 8 DISCONNECTEDs for the server channel. One dispatch of one
    // cookie reads them all into the connections' queues; then some server connections are
    // destroyed (in no particular order) with their events queued, unreported.
    for (auto &c : m.cli) need(c.disconnect(), "disconnect");
    const std::int64_t end = rdmaxx::detail::monotonic_ms() + 10000;
    std::array<std::uint64_t, 1> one{};
    std::set<std::uint64_t> named;
    // Wait for the server's fd to hold all eight (rxe delivers them within milliseconds).
    std::size_t first = 0;
    while (rdmaxx::detail::monotonic_ms() < end) {
      pollfd p{m.sch.fd(), POLLIN, 0};
      (void)::poll(&p, 1, 100);
      ::usleep(200000);
      auto got = need(m.sch.dispatch(one), "dispatch one");
      if (got) {
        first = got;
        named.insert(one[0]);
        break;
      }
    }
    REQUIRE(first == 1);
    CHECK(m.sch.has_ready()); // the others wait in their queues
    const std::size_t kill_order[] = {6, 1, 4};
    for (std::size_t i : kill_order) {
      if (named.count(server_base + i)) continue;
      need(m.srv[i].destroy(), "destroy with an event queued");
      CHECK_FALSE(m.srv[i]);
    }
    m.srv[7] = Connection{}; // by assignment (the destructor's order)
    // What is left is named once each, never a destroyed one.
    std::array<std::uint64_t, 16> rest{};
    std::size_t k = 0;
    while (m.sch.has_ready() && k < 100) {
      const std::size_t got = need(m.sch.dispatch(rest), "dispatch the rest");
      for (std::size_t j = 0; j < got; ++j) {
        CHECK(named.insert(rest[j]).second); // each once
        const std::size_t i = std::size_t(rest[j] - server_base);
        REQUIRE(i < m.n);
        CHECK(m.srv[i]); // never a destroyed connection
        if (m.srv[i]) CHECK(need(m.srv[i].advance(), "advance") == conn_state::disconnected);
      }
      ++k;
    }
    // The server connections still alive got their DISCONNECTED (at most once: a second
    // DISCONNECTED would leave them reported twice above).
    for (std::size_t i = 0; i < m.n; ++i) {
      if (!m.srv[i]) continue;
      INFO("server " << i);
      // The one named by the first dispatch had not been advanced yet.
      if (m.srv[i].state() != conn_state::disconnected)
        CHECK(need(m.srv[i].advance(), "advance") == conn_state::disconnected);
      CHECK(m.srv[i].state() == conn_state::disconnected);
    }

    // The channel's destructor with users alive: reported and deferred; the listener goes on
    // working on it, and the last user to go takes the channel with it (its fd closes).
    const auto old = set_destroy_failure_handler(&record_failure);
    g_failure = {};
    const int fd = m.sch.fd();
    for (auto &c : m.srv) c = Connection{};
    REQUIRE(m.sch.live_children() == 1); // the listener
    m.sch = EventChannel{};
    set_destroy_failure_handler(old);
    CHECK(g_failure.calls == 1);
    CHECK(g_failure.object == "EventChannel");
    CHECK(g_failure.live == 1);
    CHECK(::fcntl(fd, F_GETFD) >= 0); // still open: the listener uses it
    auto none = m.l.get_request(0);
    REQUIRE_FALSE(none);
    CHECK(is_cm_timeout(none.error()));
    need(m.l.destroy(), "listener destroy");
    CHECK(::fcntl(fd, F_GETFD) == -1); // the last user closed it
    for (auto &c : m.cli) need(c.destroy(), "client destroy");
    need(m.cch.destroy(), "client channel destroy, unused now");
    CHECK_FALSE(m.cch);
  }
  CHECK(open_fds() == fds_before);
  CHECK(kernel_resources() == before);
}

TEST_CASE("shared channels: the blocking forms (connect, get_request, accept, wait_disconnected) "
          "on a shared channel, and a listener with its own channel accepting onto a shared one",
          "[cm][shared-channel]") {
  const std::string before = cm_resources_baseline();
  {
    auto cch = need(EventChannel::create(), "client channel");
    auto sch = need(EventChannel::create(), "server channel");
    // Listener on the shared channel: accepted ids stay on it (no rdma_migrate_id).
    auto l1 = need(Listener::listen(addr(std::string(local_ip) + ":0"), {.channel = &sch, .cookie = 1}), "listen 1");
    // Listener with its own channel: accepted ids move to the shared one.
    auto l2 = need(Listener::listen(addr(std::string(local_ip) + ":0")), "listen 2");
    CHECK(l2.fd() != sch.fd());
    std::string server_error;
    std::vector<std::uint32_t> qpns;
    std::thread server([&] { // the server thread alone uses sch
      for (Listener *l : {&l1, &l2}) {
        auto req = l->get_request(20000);
        if (!req) { server_error = "get_request: " + req.error().message(); return; }
        auto c = req.value().accept({.timeout_ms = 20000, .channel = &sch, .cookie = 7});
        if (!c) { server_error = "accept: " + c.error().message(); return; }
        if (c.value().fd() != sch.fd() || !c.value().shares_channel()) { server_error = "not on the shared channel"; return; }
        qpns.push_back(c.value().qp().qp_num());
        auto d = c.value().wait_disconnected(20000);
        if (!d || !d.value()) { server_error = "wait_disconnected"; return; }
      }
    });
    // Two blocking connects on the client's shared channel, one after the other.
    for (Listener *l : {&l1, &l2}) {
      const address to = addr(std::string(local_ip) + ":" + std::to_string(l->port()));
      auto c = need(Connection::connect(to, {.timeout_ms = 20000, .channel = &cch}), "blocking connect");
      CHECK(c.state() == conn_state::established);
      CHECK(c.fd() == cch.fd());
      CHECK(cch.live_children() == 1);
      need(c.disconnect(), "disconnect");
    }
    server.join();
    INFO(server_error);
    CHECK(server_error.empty());
    CHECK(qpns.size() == 2);
    CHECK(cch.live_children() == 0);
    need(l1.destroy(), "l1");
    CHECK(sch.live_children() == 0);
    need(sch.destroy(), "server channel");
    need(cch.destroy(), "client channel");
  }
  CHECK(kernel_resources() == before);
}

TEST_CASE("shared channels: a listener queues up to its backlog; requests beyond it are refused "
          "(the client sees REJECTED), the queued ones are accepted later, nothing leaks",
          "[cm][shared-channel]") {
  const std::string before = cm_resources_baseline();
  {
    auto cch = need(EventChannel::create(), "client channel");
    auto sch = need(EventChannel::create(), "server channel");
    auto l = need(Listener::listen(addr(std::string(local_ip) + ":0"), {.backlog = 2, .channel = &sch, .cookie = 99}),
                  "listen, backlog 2");
    const address to = addr(std::string(local_ip) + ":" + std::to_string(l.port()));
    std::vector<Connection> cs;
    for (std::uint64_t i = 0; i < 4; ++i)
      cs.push_back(need(Connection::start_connect(to, {.timeout_ms = 10000, .channel = &cch, .cookie = i}), "start"));
    std::vector<std::error_code> failed(4);
    std::vector<Connection> srv; // the accepted ones, cookies 10, 11
    int listener_named = 0;
    std::array<std::uint64_t, 8> ready{};
    auto turn = [&] {
      pollfd p[2] = {{cch.fd(), POLLIN, 0}, {sch.fd(), POLLIN, 0}};
      if (!cch.has_ready() && !sch.has_ready()) (void)::poll(p, 2, 50);
      for (std::size_t k = 0, n = need(cch.dispatch(ready), "client dispatch"); k < n; ++k) {
        REQUIRE(ready[k] < 4);
        auto s = cs[ready[k]].advance();
        if (!s) failed[ready[k]] = s.error();
      }
      for (std::size_t k = 0, n = need(sch.dispatch(ready), "server dispatch"); k < n; ++k) {
        if (ready[k] == 99) {
          ++listener_named;
          continue;
        }
        REQUIRE(ready[k] - 10 < srv.size()); // before the accepts: only the listener is named
        (void)srv[ready[k] - 10].advance();
      }
    };
    // The requests are not taken: two wait in the listener's queue, two are refused.
    const auto refused = [&] { return std::count_if(failed.begin(), failed.end(), [](auto &e) { return bool(e); }); };
    const auto end = std::chrono::steady_clock::now() + 8s;
    while (refused() < 2 && std::chrono::steady_clock::now() < end) turn();
    for (int k = 0; k < 5; ++k) turn(); // and no more than two
    REQUIRE(refused() == 2);
    for (auto &e : failed)
      if (e) {
        INFO(e.message());
        CHECK(e == std::errc::connection_refused);
      }
    CHECK(listener_named >= 1);
    // The two queued requests: accepted on the shared channel, both ends established.
    for (int k = 0; k < 2; ++k) {
      auto req = need(l.get_request(0), "a queued request");
      srv.push_back(need(req.start_accept({.timeout_ms = 10000, .channel = &sch, .cookie = 10u + k}), "accept"));
    }
    auto none = l.get_request(0);
    REQUIRE_FALSE(none);
    CHECK(is_cm_timeout(none.error()));
    const auto up = [&] {
      int n = 0;
      for (std::size_t i = 0; i < 4; ++i) n += !failed[i] && cs[i].state() == conn_state::established;
      for (auto &c : srv) n += c.state() == conn_state::established;
      return n;
    };
    const auto end2 = std::chrono::steady_clock::now() + 10s;
    while (up() < 4 && std::chrono::steady_clock::now() < end2) turn();
    CHECK(up() == 4);
    CHECK(sch.live_children() == 3); // the listener and the two accepted
    CHECK(cch.live_children() == 4); // the refused ones too, until destroyed
  }
  CHECK(kernel_resources() == before);
}
