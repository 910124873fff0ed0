// [bad-input] Bad inputs of every public call of connection.hpp (bad_inputs.hpp): one test case
// per type (Connection, Listener, ConnectRequest, address), each row the call, the input and the
// exact code with a real message; afterwards the objects the rows used still connect and carry
// a send. EventChannel has no call to refuse (create() takes nothing, destroy() cannot fail):
// its null form is checked in the Connection case. Also the cm_category messages and conditions.
// On a real rxe device (rdma_cm needs rdma_ucm: tools/rxe-vm loads it).
#include "bad_inputs.hpp"

#include <rdmaxx/connection.hpp>

#include <thread>

using namespace rxe;
using namespace rxe::bad_input;

namespace {

constexpr const char *local_ip = "192.0.2.1";

address at(const std::string &s) { return need(address::parse(s), "address::parse"); }

/// Exactly this portable condition from cm_category(), its message naming `words`.
expectation cm_is(std::errc c, std::string words) {
  return {"rdma_cm: " + std::make_error_code(c).message() + " (\"" + words + "\")",
          [c, words](const std::error_code &ec) {
            return ec.category() == cm_category() && ec == c && ec.message().find(words) != std::string::npos;
          }};
}

/// A connection to `l` from another thread, established while `serve` handles the request on
/// this one; the client then receives one send from the server. Checks that both sides work.
void connect_and_send(Listener &l, const std::function<Connection(ConnectRequest &)> &serve,
                      CompletionQueue *server_cq = nullptr) {
  const address to = at(std::string(local_ip) + ":" + std::to_string(l.port()));
  std::error_code client_ec;
  std::uint64_t got = 0;
  std::thread client([&] {
    auto c = Connection::connect(to, {.timeout_ms = 10000});
    if (!c) {
      client_ec = c.error();
      return;
    }
    auto mr = MemoryRegion::reg(c.value().pd(), &got, sizeof got, access::local_write);
    if (!mr || !c.value().qp().post_recv(1, mr.value().sge(0, sizeof got))) {
      client_ec = make_error_code(errc::wrong_state);
      return;
    }
    ibv_wc wc[1];
    for (int i = 0; i < 100000 && c.value().cq().poll(wc).value() == 0; ++i) std::this_thread::sleep_for(100us);
    (void)c.value().wait_disconnected(10000);
  });
  auto req = need(l.get_request(10000), "get_request");
  Connection server = serve(req);
  REQUIRE(server.state() == conn_state::established);
  const std::uint64_t msg = 0x5a5a1234;
  std::this_thread::sleep_for(200ms); // the client posts its receive once established
  auto b = server.qp().start_send();
  b.send_inline({7, send_flag::signaled}, std::as_bytes(std::span(&msg, 1)));
  need(b.submit(), "send");
  CHECK(wait_one(server_cq ? *server_cq : server.cq()).wr_id == 7);
  need(server.disconnect(), "disconnect");
  client.join();
  INFO("client: " << client_ec.message());
  CHECK(!client_ec);
  CHECK(got == msg);
}

} // namespace

TEST_CASE("bad inputs: every connection.hpp type has its case", "[bad-input][bad-inputs-cm][cm]") {
  const std::pair<const char *, const char *> types[] = {
      {"Connection", "[connection]"}, {"Listener", "[listener]"},
      {"ConnectRequest", "[connect-request]"}, {"address", "[address]"}};
  check_cases_registered(types);
}

TEST_CASE("bad inputs: Connection", "[bad-input][connection][bad-inputs-cm][cm]") {
  const std::array<std::byte, 200> bytes{};
  const address nowhere = at("192.0.2.1:1");
  auto dev = open_device();
  auto pd = need(ProtectionDomain::alloc(dev), "pd");
  auto cq = need(CompletionQueue::create(dev, 8), "cq");
  ProtectionDomain null_pd;
  CompletionQueue null_cq;
  EventChannel null_channel;
  Connection null_c;
  auto resolving = need(Connection::start_connect(at("192.0.2.77:9"), {.timeout_ms = 200}), "start");
  REQUIRE(resolving.state() == conn_state::resolving_addr);

  table t("Connection");
  struct bad_option {
    const char *input;
    conn_options o;
    errc e;
  };
  const bad_option options[] = {
      {"private data 57 bytes", {.private_data = std::span(bytes).first(57)}, errc::private_data_too_long},
      {"private data 200 bytes", {.private_data = std::span(bytes)}, errc::private_data_too_long},
      {"timeout 0", {.timeout_ms = 0}, errc::invalid_argument},
      {"timeout -1", {.timeout_ms = -1}, errc::invalid_argument},
      {"cq_entries 0", {.cq_entries = 0}, errc::invalid_argument},
      {"a PD without CQs", {.pd = &pd}, errc::null_handle},
      {"a null PD", {.pd = &null_pd, .send_cq = &cq, .recv_cq = &cq}, errc::null_handle},
      {"a null send CQ", {.pd = &pd, .send_cq = &null_cq, .recv_cq = &cq}, errc::null_handle},
      {"CQs without a PD", {.send_cq = &cq, .recv_cq = &cq}, errc::invalid_argument},
      {"MW_BIND as a QP access right", {.qp_access = access::mw_bind}, errc::unknown_access_flag},
      {"a null shared event channel", {.channel = &null_channel}, errc::null_handle},
  };
  for (const bad_option &b : options) {
    t.add("Connection::start_connect", b.input, is(b.e), [&] { return err(Connection::start_connect(nowhere, b.o)); });
    t.add("Connection::connect", b.input, is(b.e), [&] { return err(Connection::connect(nowhere, b.o)); });
    // Not worth retrying: refused at once by the retrying form too (one attempt, no pause).
    t.add("Connection::connect (retry_options)", b.input, is(b.e),
          [&] { return err(Connection::connect(nowhere, b.o, {.total_ms = 20000})); });
  }
  const std::pair<const char *, retry_options> bad_retry[] = {
      {"retry total_ms -1", {.total_ms = -1}},
      {"retry backoff_ms 0", {.total_ms = 1000, .backoff_ms = 0}},
      {"retry backoff_ms -5", {.total_ms = 1000, .backoff_ms = -5}},
      {"retry max_backoff_ms below backoff_ms", {.total_ms = 1000, .backoff_ms = 100, .max_backoff_ms = 50}},
  };
  for (const auto &row : bad_retry)
    t.add("Connection::connect (retry_options)", row.first, is(errc::invalid_argument),
          [&, r = row.second] { return err(Connection::connect(nowhere, {.timeout_ms = 200}, r)); });
  t.add("Connection::resolve", "private data (it belongs to connect_with)", is(errc::invalid_argument),
        [&] { return err(Connection::resolve(nowhere, {.private_data = std::span(bytes).first(8)})); });
  t.add("Connection::advance", "null connection", is(errc::null_handle), [&] { return err(null_c.advance()); });
  t.add("Connection::wait_disconnected", "null connection", is(errc::null_handle),
        [&] { return err(null_c.wait_disconnected(0)); });
  t.add("Connection::disconnect", "null connection", is(errc::null_handle), [&] { return err(null_c.disconnect()); });
  t.add("Connection::accept", "null connection", is(errc::null_handle), [&] { return err(null_c.accept()); });
  t.add("Connection::connect_with", "null connection", is(errc::null_handle), [&] { return err(null_c.connect_with()); });
  t.add("Connection::wait_established", "null connection", is(errc::null_handle),
        [&] { return err(null_c.wait_established()); });
  t.add("Connection::peer_address", "null connection", is(errc::null_handle), [&] { return err(null_c.peer_address()); });
  t.add("Connection::local_address", "null connection", is(errc::null_handle),
        [&] { return err(null_c.local_address()); });
  t.add("Connection::disconnect", "resolving, never established", is(errc::wrong_state),
        [&] { return err(resolving.disconnect()); });
  t.add("Connection::wait_disconnected", "resolving, never established", is(errc::wrong_state),
        [&] { return err(resolving.wait_disconnected(0)); });
  t.add("Connection::accept", "an active connection (not a prepared passive one)", is(errc::wrong_state),
        [&] { return err(resolving.accept()); });
  t.add("Connection::connect_with", "resolving (not resolved yet)", is(errc::wrong_state),
        [&] { return err(resolving.connect_with()); });
  t.run();

  // Nothing changed: the null handles stay null, the resolving connection goes on resolving.
  CHECK(!null_c);
  CHECK(null_c.fd() == -1);
  CHECK(null_c.native_handle() == nullptr);
  CHECK(null_c.peer_private_data().empty());
  CHECK(!null_c.qp());
  CHECK(resolving.state() == conn_state::resolving_addr);
  // EventChannel: its null form answers -1, has nothing ready, refuses dispatch() and destroys
  // as a no-op; a live one with no users dispatches nothing.
  EventChannel null_ch;
  CHECK(null_ch.fd() == -1);
  CHECK(!null_ch.has_ready());
  CHECK(null_ch.live_children() == 0);
  std::array<std::uint64_t, 4> cookies{};
  CHECK(null_ch.dispatch(cookies).error() == errc::null_handle);
  CHECK(null_ch.destroy().has_value());
  auto ch = need(EventChannel::create(), "event channel");
  CHECK(ch.fd() >= 0);
  CHECK(need(ch.dispatch(cookies), "dispatch, nothing pending") == 0);
  CHECK(need(ch.dispatch({}), "dispatch into no room") == 0);
  destroyed(ch.destroy(), "event channel");
  // The caller's PD and CQs the rows were refused with connect and carry a send.
  auto l = need(Listener::listen(at(std::string(local_ip) + ":0")), "listen");
  connect_and_send(l, [&](ConnectRequest &req) {
    return need(req.accept({.pd = &pd, .send_cq = &cq, .recv_cq = &cq, .timeout_ms = 10000}), "accept on the caller's PD");
  }, &cq);
  destroyed(resolving.destroy(), "resolving connection");
}

TEST_CASE("bad inputs: Listener", "[bad-input][listener][bad-inputs-cm][cm]") {
  const address any = at(std::string(local_ip) + ":0");
  auto l = need(Listener::listen(any), "listen");
  const std::string port = std::to_string(l.port());
  Listener null_l;

  table t("Listener");
  t.add("Listener::listen", "backlog 0", is(errc::invalid_argument), [&] { return err(Listener::listen(any, 0)); });
  t.add("Listener::listen", "backlog -5", is(errc::invalid_argument), [&] { return err(Listener::listen(any, -5)); });
  t.add("Listener::listen", "a port in use on the same address", cm_is(std::errc::address_in_use, "port in use"), [&] {
    auto r = Listener::listen(at(std::string(local_ip) + ":" + port));
    if (!r) CHECK(r.error().message().find("listen on 192.0.2.1:" + port + ": port in use") != std::string::npos);
    if (!r) CHECK(cm_call_of(r.error()) == cm_call::rdma_bind_addr);
    return err(r);
  });
  // The kernel's EADDRNOTAVAIL (every address, a port one address uses) is reported as in use.
  t.add("Listener::listen", "a port in use, on every address", cm_is(std::errc::address_in_use, "listen on 0.0.0.0:"),
        [&] { return err(Listener::listen(at(port))); });
  t.add("Listener::get_request", "timeout -1", is(errc::invalid_argument), [&] { return err(l.get_request(-1)); });
  t.add("Listener::get_request", "timeout 0, no request", cm_is(std::errc::timed_out, "CONNECT_REQUEST"), [&] {
    auto r = l.get_request(0);
    if (!r) CHECK(is_cm_timeout(r.error()));
    return err(r);
  });
  t.add("Listener::get_request", "null listener", is(errc::null_handle), [&] { return err(null_l.get_request(0)); });
  EventChannel null_channel;
  t.add("Listener::listen", "a null shared event channel", is(errc::null_handle),
        [&] { return err(Listener::listen(any, {.channel = &null_channel})); });
  t.add("Listener::listen", "backlog 0 on a shared channel", is(errc::invalid_argument),
        [&] { return err(Listener::listen(any, {.backlog = 0, .channel = &null_channel})); });
  t.add("Listener::local_address", "null listener", is(errc::null_handle), [&] { return err(null_l.local_address()); });
  t.run();

  CHECK(null_l.port() == 0);
  CHECK(null_l.fd() == -1);
  CHECK(std::to_string(l.port()) == port);
  // The listener the rows used still accepts, and the connection carries a send.
  connect_and_send(l, [&](ConnectRequest &req) { return need(req.accept({.timeout_ms = 10000}), "accept"); });
  destroyed(l.destroy(), "listener");
}

TEST_CASE("bad inputs: ConnectRequest", "[bad-input][connect-request][bad-inputs-cm][cm]") {
  auto l = need(Listener::listen(at(std::string(local_ip) + ":0")), "listen");
  const std::array<std::byte, cm_accept_private_data_max + 1> over{};
  ConnectRequest null_r;
  table t("ConnectRequest");
  t.add("ConnectRequest::accept", "null request", is(errc::null_handle), [&] { return err(null_r.accept()); });
  t.add("ConnectRequest::start_accept", "null request", is(errc::null_handle), [&] { return err(null_r.start_accept()); });
  t.add("ConnectRequest::prepare", "null request", is(errc::null_handle), [&] { return err(null_r.prepare()); });
  t.add("ConnectRequest::reject", "null request", is(errc::null_handle), [&] { return err(null_r.reject()); });
  t.add("ConnectRequest::peer_address", "null request", is(errc::null_handle), [&] { return err(null_r.peer_address()); });
  // A live request: each refusal leaves it usable (checked: it is accepted after the rows).
  ConnectRequest *live = nullptr;
  auto on_live = [&](const char *call, const char *input, errc e, std::function<std::error_code(ConnectRequest &)> f) {
    t.add(call, input, is(e), [&, f] {
      const auto ec = f(*live);
      CHECK(bool(*live));
      return ec;
    });
  };
  on_live("ConnectRequest::accept", "private data 197 bytes", errc::private_data_too_long,
          [&](ConnectRequest &r) { return err(r.accept({.private_data = over})); });
  on_live("ConnectRequest::start_accept", "private data 197 bytes", errc::private_data_too_long,
          [&](ConnectRequest &r) { return err(r.start_accept({.private_data = over})); });
  on_live("ConnectRequest::prepare", "private data 197 bytes", errc::private_data_too_long,
          [&](ConnectRequest &r) { return err(r.prepare({.private_data = over})); });
  on_live("ConnectRequest::reject", "private data 149 bytes", errc::private_data_too_long,
          [&](ConnectRequest &r) { return err(r.reject(std::span(over).first(cm_reject_private_data_max + 1))); });
  on_live("ConnectRequest::prepare", "timeout 0", errc::invalid_argument,
          [&](ConnectRequest &r) { return err(r.prepare({.timeout_ms = 0})); });
  on_live("ConnectRequest::accept", "cq_entries -1", errc::invalid_argument,
          [&](ConnectRequest &r) { return err(r.accept({.cq_entries = -1})); });
  on_live("ConnectRequest::start_accept", "MW_BIND as a QP access right", errc::unknown_access_flag,
          [&](ConnectRequest &r) { return err(r.start_accept({.qp_access = access::mw_bind})); });
  on_live("ConnectRequest::prepare", "unknown QP access bit", errc::unknown_access_flag,
          [&](ConnectRequest &r) { return err(r.prepare({.qp_access = access_flags(1u << 28)})); });
  EventChannel null_channel;
  on_live("ConnectRequest::prepare", "a null shared event channel", errc::null_handle,
          [&](ConnectRequest &r) { return err(r.prepare({.channel = &null_channel})); });
  on_live("ConnectRequest::accept", "a null shared event channel", errc::null_handle,
          [&](ConnectRequest &r) { return err(r.accept({.channel = &null_channel})); });
  connect_and_send(l, [&](ConnectRequest &req) {
    live = &req;
    t.run();
    REQUIRE(req);
    return need(req.accept({.timeout_ms = 10000}), "accept the request the rows were refused on");
  });
  destroyed(l.destroy(), "listener");
}

TEST_CASE("bad inputs: address", "[bad-input][address][bad-inputs-cm][cm]") {
  table t("address");
  for (const char *bad : {"", "1.2.3.4", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:12a", "300.1.1.1:5", "[::1]",
                          "[::1]5", "[zz::1]:5", "::1:5", "[fe80::1%nosuchif0]:5", "1.2.3.4:123456"})
    t.add("address::parse", bad, is(errc::bad_address), [bad] { return err(address::parse(bad)); });
  t.add("address::from", "null sockaddr", is(errc::bad_address), [] { return err(address::from(nullptr)); });
  t.add("address::from", "an AF_UNIX sockaddr", is(errc::bad_address), [] {
    sockaddr sa{};
    sa.sa_family = AF_UNIX;
    return err(address::from(&sa));
  });
  t.run();
}

TEST_CASE("cm_category: names, reject reasons, portable conditions", "[bad-inputs-cm][cm]") {
  struct row { std::error_code ec; std::errc cond; const char *words; };
  const row rows[] = {
      {cm_error(RDMA_CM_EVENT_REJECTED, 28), std::errc::connection_refused, "reject reason 28"},
      {cm_error(RDMA_CM_EVENT_REJECTED, 8), std::errc::connection_refused, "nobody listens"},
      {cm_error(RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT), std::errc::timed_out, "UNREACHABLE"},
      {cm_error(RDMA_CM_EVENT_UNREACHABLE, 0), std::errc::host_unreachable, "UNREACHABLE"},
      {cm_error(RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT), std::errc::timed_out, "ADDR_ERROR"},
      {cm_error(RDMA_CM_EVENT_ADDR_ERROR, -ENODEV), std::errc::no_such_device, "ADDR_ERROR"},
      {cm_error(RDMA_CM_EVENT_ROUTE_ERROR, -ENETUNREACH), std::errc::network_unreachable, "ROUTE_ERROR"},
      {cm_error(RDMA_CM_EVENT_CONNECT_ERROR, 0), std::errc::connection_aborted, "CONNECT_ERROR"},
      {cm_error(RDMA_CM_EVENT_DISCONNECTED, 0), std::errc::connection_reset, "DISCONNECTED"},
      {cm_error(RDMA_CM_EVENT_DEVICE_REMOVAL, 0), std::errc::no_such_device, "DEVICE_REMOVAL"},
      {cm_timeout(cm_step::connect), std::errc::timed_out, "timed out waiting for RDMA_CM_EVENT_CONNECT_RESPONSE"},
      {cm_timeout(cm_step::request), std::errc::timed_out, "CONNECT_REQUEST"},
      {cm_call_error(cm_call::rdma_resolve_addr, ENODEV), std::errc::no_such_device,
       "rdma_resolve_addr failed: No such device"},
      {cm_call_error(cm_call::rdma_bind_addr, EADDRINUSE), std::errc::address_in_use, "port in use"},
      {cm_at(cm_timeout(cm_step::connect), cm_role::connect_to, address::parse("192.0.2.9:7471").value().native()),
       std::errc::timed_out, "rdma_cm: connect to 192.0.2.9:7471: timed out waiting for RDMA_CM_EVENT_CONNECT_RESPONSE"},
      {cm_at(cm_error(RDMA_CM_EVENT_REJECTED, 28), cm_role::accept_from, address::parse("[fe80::1]:9").value().native()),
       std::errc::connection_refused, "rdma_cm: connection from [fe80::1]:9: connection setup: RDMA_CM_EVENT_REJECTED (reject reason 28"},
  };
  for (const auto &r : rows) {
    INFO(r.ec.message());
    CHECK(r.ec.category() == cm_category());
    CHECK(r.ec == r.cond);
    CHECK(r.ec.message().find(r.words) != std::string::npos);
  }
  CHECK(cm_reject_reason(cm_error(RDMA_CM_EVENT_REJECTED, 28)) == 28);
  CHECK(cm_reject_reason(cm_at(cm_error(RDMA_CM_EVENT_REJECTED, 8), cm_role::connect_to,
                               address::parse("192.0.2.9:1").value().native())) == 8);
  CHECK(cm_event_of(cm_call_error(cm_call::rdma_connect, EINVAL)) == -1);
  CHECK(cm_call_of(cm_error(RDMA_CM_EVENT_REJECTED, 8)) == cm_call::none);
  // A code already naming an address keeps it; other categories pass through unchanged.
  const auto named = cm_at(cm_timeout(cm_step::connect), cm_role::connect_to, address::parse("192.0.2.9:2").value().native());
  CHECK(cm_at(named, cm_role::listen_on, address::parse("192.0.2.9:3").value().native()) == named);
  CHECK(cm_at(make_error_code(errc::timeout), cm_role::connect_to, nullptr) == make_error_code(errc::timeout));
  CHECK(cm_reject_reason(cm_error(RDMA_CM_EVENT_UNREACHABLE, 28)) == -1);
  CHECK(cm_event_of(cm_timeout(cm_step::accept)) == -1);
  CHECK(cm_event_of(make_error_code(errc::timeout)) == -1);
  CHECK(is_cm_timeout(cm_timeout(cm_step::resolve_addr)));
  CHECK(!is_cm_timeout(make_error_code(errc::timeout)));
}
