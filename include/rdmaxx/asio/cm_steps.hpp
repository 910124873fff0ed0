/// \file
/// rdmaxx/asio/cm_steps.hpp: rdma_cm steps awaited on a Connection's or Listener's own fd:
/// advance(), wait_established(), connect(), next_request(), accept().
#pragma once

#include "basics.hpp"
#include "../connection.hpp"

#include <span>

namespace rdmaxx::asio {

// ---------------------------------------------------------------- rdma_cm steps

namespace detail {
// How an rdma_cm step waits for its id's next event: here on the id's own channel fd (registered
// for the wait only); EventPump's for a shared channel (pump_steps). wait(): true when woken, false
// when `until` passed; after(): once the id's handle has read events.
struct own_channel {
  static constexpr bool shared = false;
  task<result<bool>> wait(int fd, deadline until, watch_stop *stop = nullptr) const {
    return wait_readable(fd, until, stop);
  }
  void after() const noexcept {}
};

// A step waiting on the object's own fd refuses one on a shared EventChannel: that fd is the
// channel's, whose events another object's step may take first (this wait would then sleep
// past them), and two waits at once would register it twice with the reactor.
template <class W, class T>
bool wrong_channel(const T &o) noexcept {
  return !W::shared && o.shares_channel();
}

template <class W>
task<result<conn_state>> advance_with(W w, Connection &c, deadline until, watch_stop *stop = nullptr) {
  if (!c) co_return make_error_code(errc::null_handle);
  if (wrong_channel<W>(c)) co_return make_error_code(errc::invalid_argument);
  if constexpr (W::shared) {
    // Its events may be queued already (the pump read them while nobody waited): take them
    // first, and wait only if nothing changed.
    const conn_state before = c.state();
    auto s = c.advance();
    w.after();
    if (!s || s.value() != before) co_return s;
  }
  auto r = co_await w.wait(c.fd(), until, stop);
  if (!r) co_return r.error();
  auto s = c.advance();
  w.after();
  co_return s;
}

template <class W>
task<result<void>> wait_established_with(W w, Connection &c, std::int64_t check_ms) {
  if (wrong_channel<W>(c)) co_return make_error_code(errc::invalid_argument);
  if (c && (c.state() == conn_state::prepared || c.state() == conn_state::resolved))
    co_return make_error_code(errc::wrong_state);
  auto s = c.advance();
  w.after();
  for (;; s = co_await advance_with(w, c, after_ms(check_ms))) {
    if (!s) co_return s.error();
    if (s.value() == conn_state::established) co_return success();
    if (s.value() == conn_state::disconnected) co_return make_error_code(errc::wrong_state);
  }
}

template <class W>
task<result<ConnectRequest>> next_request_with(W w, Listener &l, std::int64_t timeout_ms) {
  if (wrong_channel<W>(l)) co_return make_error_code(errc::invalid_argument);
  const deadline until = after_ms(timeout_ms);
  for (;;) {
    auto r = l.get_request(0);
    w.after();
    if (r || !is_cm_timeout(r.error())) co_return r;
    if (clock::now() >= until) co_return r.error();
    auto ok = co_await w.wait(l.fd(), until);
    if (!ok) co_return ok.error();
  }
}
} // namespace detail

/// Wait (without blocking) until the connection's channel has an rdma_cm event or `until`
/// passed, then Connection::advance() (which also enforces the current step's own deadline).
/// Returns the state reached. For a connection on a shared EventChannel use the EventPump
/// overload.
/// \errors
/// - errc::null_handle: the connection is null.
/// - errc::invalid_argument: the connection is on a shared EventChannel (conn_options::channel):
///   serve the channel with an EventPump and use advance(pump, ...).
/// - those of Connection::advance().
/// - the errno of registering the fd with the reactor (epoll_ctl).
/// \mallocs One event per rdma_get_cm_event (librdmacm), Asio's frame and operation.
inline task<result<conn_state>> advance(Connection &c, deadline until) {
  return detail::advance_with(detail::own_channel{}, c, until);
}

/// Advance `c` until established. The Connection bounds each step (conn_options::timeout_ms);
/// its deadline is checked at least every `check_ms`.
/// \errors
/// - errc::wrong_state: prepared (accept first), resolved (connect_with() first), or disconnected
///   before established.
/// - errc::invalid_argument: on a shared EventChannel (the EventPump overload serves those).
/// - those of advance().
/// \mallocs As advance().
inline task<result<void>> wait_established(Connection &c, std::int64_t check_ms = 100) {
  return detail::wait_established_with(detail::own_channel{}, c, check_ms);
}

/// Connect by address (Connection::start_connect, then the rdma_cm steps awaited). One attempt:
/// connect(to, o, retry_options) retries while nobody listens yet (the server still starting).
/// \errors
/// - errc::invalid_argument: o.channel is set (a shared EventChannel: use connect(pump, ...));
///   nothing was created.
/// - those of Connection::start_connect() and advance() (REJECTED with reason 8: nobody listens).
/// \mallocs As Connection::start_connect() and advance().
inline task<result<Connection>> connect(address to, conn_options o = {}) {
  if (o.channel) co_return make_error_code(errc::invalid_argument);
  auto c = Connection::start_connect(to, o);
  if (!c) co_return c.error();
  if (auto r = co_await wait_established(c.value()); !r) co_return r.error();
  co_return std::move(c).value();
}

/// The next connection request of `l` (Listener::get_request(0) once its fd is readable),
/// within `timeout_ms`.
/// \errors
/// - a cm timeout (cm_step::request): none arrived in time.
/// - errc::invalid_argument: the listener is on a shared EventChannel (listen_options::channel:
///   use next_request(pump, ...)).
/// - those of Listener::get_request().
/// \mallocs As Listener::get_request(), Asio's frame and operation.
inline task<result<ConnectRequest>> next_request(Listener &l, std::int64_t timeout_ms) {
  return detail::next_request_with(detail::own_channel{}, l, timeout_ms);
}

/// Second half of an accept (after ConnectRequest::prepare() and the first receives were
/// posted): Connection::accept(private_data), then the client's RTU awaited.
/// \errors
/// - errc::invalid_argument: on a shared EventChannel (use accept(pump, ...)); nothing was sent.
/// - those of Connection::accept() and wait_established().
/// \mallocs As advance().
inline task<result<void>> accept(Connection &c, std::span<const std::byte> private_data = {}) {
  if (c.shares_channel()) co_return make_error_code(errc::invalid_argument);
  if (auto r = c.accept(private_data); !r) co_return r.error();
  co_return co_await wait_established(c);
}

} // namespace rdmaxx::asio
