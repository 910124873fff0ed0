// Bad inputs of every public call of connection.hpp and of the new CompletionQueue/endpoint
// calls: each row names the call, the input, the code expected, and (where it matters) the state
// after. On a real rxe device (rdma_cm needs rdma_ucm: tools/rxe-vm loads it).
#include "fixture.hpp"

#include <rdmaxx/connection.hpp>

using namespace rxe;

TEST_CASE("bad inputs: connection.hpp", "[bad-inputs-cm][cm]") {
  const std::array<std::byte, 200> big{};
  auto any = address::parse("192.0.2.1:0").value();
  auto nowhere = address::parse("192.0.2.1:1").value();

  SECTION("Connection::start_connect / connect") {
    struct row { const char *what; conn_options o; errc e; };
    auto dev = open_device();
    auto pd = need(ProtectionDomain::alloc(dev), "pd");
    auto cq = need(CompletionQueue::create(dev, 8), "cq");
    ProtectionDomain null_pd;
    CompletionQueue null_cq;
    const row rows[] = {
        {"private data 57", {.private_data = std::span(big).first(57)}, errc::private_data_too_long},
        {"private data 200", {.private_data = std::span(big)}, errc::private_data_too_long},
        {"timeout 0", {.timeout_ms = 0}, errc::invalid_argument},
        {"timeout -1", {.timeout_ms = -1}, errc::invalid_argument},
        {"cq_entries 0", {.cq_entries = 0}, errc::invalid_argument},
        {"pd without cqs", {.pd = &pd}, errc::null_handle},
        {"null pd", {.pd = &null_pd, .send_cq = &cq, .recv_cq = &cq}, errc::null_handle},
        {"null cq", {.pd = &pd, .send_cq = &null_cq, .recv_cq = &cq}, errc::null_handle},
        {"cqs without pd", {.send_cq = &cq, .recv_cq = &cq}, errc::invalid_argument},
        {"unknown access bit", {.qp_access = access::mw_bind}, errc::unknown_access_flag},
    };
    for (const auto &r : rows) {
      INFO(r.what);
      auto c = Connection::start_connect(nowhere, r.o);
      REQUIRE(!c);
      CHECK(c.error() == r.e);
      auto b = Connection::connect(nowhere, r.o);
      REQUIRE(!b);
      CHECK(b.error() == r.e);
    }
  }
  SECTION("null Connection") {
    Connection c;
    CHECK(!c);
    CHECK(c.fd() == -1);
    CHECK(c.native_handle() == nullptr);
    CHECK(c.advance().error() == errc::null_handle);
    CHECK(c.wait_disconnected(0).error() == errc::null_handle);
    CHECK(c.disconnect().error() == errc::null_handle);
    CHECK(c.accept().error() == errc::null_handle);
    CHECK(c.wait_established().error() == errc::null_handle);
    CHECK(c.peer_address().error() == errc::null_handle);
    CHECK(c.local_address().error() == errc::null_handle);
    CHECK(c.peer_private_data().empty());
    CHECK(!c.qp());
  }
  SECTION("Connection calls in the wrong state") {
    auto c = need(Connection::start_connect(address::parse("192.0.2.77:9").value(), {.timeout_ms = 200}), "start");
    CHECK(c.state() == conn_state::resolving_addr);
    CHECK(c.disconnect().error() == errc::wrong_state);
    CHECK(c.wait_disconnected(0).error() == errc::wrong_state);
    CHECK(c.accept().error() == errc::wrong_state); // not a prepared passive connection
  }
  SECTION("Listener::listen / get_request") {
    CHECK(Listener::listen(any, 0).error() == errc::invalid_argument);
    CHECK(Listener::listen(any, -5).error() == errc::invalid_argument);
    auto l = need(Listener::listen(any), "listen");
    CHECK(l.get_request(-1).error() == errc::invalid_argument);
    auto none = l.get_request(0);
    REQUIRE(!none);
    CHECK(is_cm_timeout(none.error()));
    CHECK(none.error() == std::errc::timed_out);
    // The same port twice.
    const std::string port = std::to_string(l.port());
    auto again = Listener::listen(address::parse("192.0.2.1:" + port).value());
    REQUIRE(!again);
    INFO(again.error().message());
    CHECK(again.error() == std::errc::address_in_use);
    CHECK(cm_call_of(again.error()) == cm_call::rdma_bind_addr);
    CHECK(again.error().message().find("listen on 192.0.2.1:" + port + ": port in use") != std::string::npos);
    // Both on every address: the kernel's EADDRNOTAVAIL is reported as the port in use.
    auto twice = Listener::listen(address::parse(port).value());
    REQUIRE(!twice);
    INFO(twice.error().message());
    CHECK(twice.error() == std::errc::address_in_use);
    CHECK(twice.error().message().find("listen on 0.0.0.0:" + port + ": port in use") != std::string::npos);
    Listener null_l;
    CHECK(null_l.port() == 0);
    CHECK(null_l.fd() == -1);
    CHECK(null_l.get_request(0).error() == errc::null_handle);
    CHECK(null_l.local_address().error() == errc::null_handle);
  }
  SECTION("null ConnectRequest") {
    ConnectRequest r;
    CHECK(!r);
    CHECK(r.accept().error() == errc::null_handle);
    CHECK(r.start_accept().error() == errc::null_handle);
    CHECK(r.prepare().error() == errc::null_handle);
    CHECK(r.reject().error() == errc::null_handle);
    CHECK(r.peer_address().error() == errc::null_handle);
    CHECK(r.device_context() == nullptr);
  }
  SECTION("address::from") {
    CHECK(address::from(nullptr).error() == errc::bad_address);
    sockaddr sa{};
    sa.sa_family = AF_UNIX;
    CHECK(address::from(&sa).error() == errc::bad_address);
  }
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
