/// \file
/// rdmaxx/asio/pump.hpp: EventPump (one shared rdma_cm EventChannel for many Connections and
/// Listeners) and the steps awaited through it; connect() with retries, on either kind of fd.
#pragma once

#include "basics.hpp"
#include "cm_steps.hpp"
#include "router.hpp"

namespace rdmaxx::asio {

// ---------------------------------------------------------------- a shared rdma_cm channel

/// Counters of an EventPump (plain integers, never reset).
struct pump_stats {
  std::uint64_t readable = 0; ///< the channel's fd found readable
  std::uint64_t cookies = 0;  ///< users with events handed out by EventChannel::dispatch()
  std::uint64_t wakeups = 0;  ///< waits woken by an event (any user's: each re-checks its own)
  std::uint64_t waits = 0;    ///< waits that suspended
};

namespace detail {
struct pump_core;
// One suspended wait: in its coroutine's frame, on the pump's list while it sleeps.
struct pump_waiter {
  pump_core *core = nullptr;
  net::steady_timer *timer = nullptr;
  pump_waiter *prev = nullptr, *next = nullptr;
  bool linked = false, woken = false;
  ~pump_waiter();
};

struct pump_core {
  net::posix::stream_descriptor sd;
  EventChannel *ch = nullptr;
  pump_waiter *head = nullptr;
  ::rdmaxx::detail::ref_count<> refs; // the pump, every linked waiter, each pending handler (fd, kick)
  bool open = true, waiting = false, kick_posted = false;
  std::error_code error; // a failed rdma_get_cm_event: every wait fails with it
  pump_stats stats;

  explicit pump_core(const net::any_io_executor &ex) : sd(ex) {}
  static void unref(pump_core *c) noexcept {
    if (c && c->refs.drop() == 0) delete c;
  }
  struct ref { // held by a handler: dropped when the handler goes, run or not
    pump_core *c;
    explicit ref(pump_core *p) noexcept : c(p) { c->refs.add(); }
    ref(ref &&o) noexcept : c(std::exchange(o.c, nullptr)) {}
    ref &operator=(ref &&) = delete;
    ~ref() { unref(c); }
  };
  void link(pump_waiter &w) noexcept {
    w.core = this;
    w.prev = nullptr;
    w.next = head;
    if (head) head->prev = &w;
    head = &w;
    w.linked = true;
    refs.add();
  }
  void unlink(pump_waiter &w) noexcept {
    if (!w.linked) return;
    if (w.prev) w.prev->next = w.next;
    else head = w.next;
    if (w.next) w.next->prev = w.prev;
    w.prev = w.next = nullptr;
    w.linked = false;
    unref(this);
  }
  // Every sleeper re-checks its own id: the cookies dispatch() names are the user's
  // (conn_options::cookie), not ours, so a wake-up is a broadcast (O(waiters) per event burst:
  // the control path). The timer's cancel posts the sleeper's resumption.
  void wake_all() noexcept {
    for (pump_waiter *w = head; w; w = w->next)
      if (!w->woken) {
        w->woken = true;
        ++stats.wakeups;
        w->timer->cancel();
      }
  }
  // Read what the fd has into the users' queues and take the ready list (EventChannel::dispatch
  // until nothing is left), then wake the sleepers.
  void pump() noexcept {
    std::uint64_t cookies[64];
    for (;;) {
      auto n = ch->dispatch(cookies);
      if (!n) { // a failed rdma_get_cm_event (EAGAIN is no error there)
        error = n.error();
        break;
      }
      stats.cookies += n.value();
      if (!ch->has_ready() && n.value() < std::size(cookies)) break;
    }
    wake_all();
  }
  // After a user's own advance()/get_request(): it may have read other users' events from the fd
  // into their queues, where the fd's readiness no longer shows them.
  void kick() noexcept {
    if (!open || kick_posted || !ch->has_ready()) return;
    kick_posted = true;
    net::post(sd.get_executor(), [this, hold = ref(this)] {
      kick_posted = false;
      if (open) pump();
    });
  }
  void wait() noexcept;
};

inline void pump_core::wait() noexcept {
  if (!open || waiting) return;
  waiting = true;
  sd.async_wait(net::posix::stream_descriptor::wait_read,
                [this, hold = ref(this)](const boost::system::error_code &e) {
                  waiting = false;
                  if (!open) return;
                  if (e) {
                    if (e != net::error::operation_aborted) error = from_asio(e);
                    wake_all();
                    return;
                  }
                  ++stats.readable;
                  pump();
                  wait();
                });
}


inline pump_waiter::~pump_waiter() {
  if (core) core->unlink(*this);
}

// Sleep until the pump wakes every sleeper (true) or `until` passes (false); with `stop`,
// watch_stop::stop() ends the sleep too (false: the caller checks the stop itself).
inline task<result<bool>> pump_wait(pump_core *p, deadline until, watch_stop *stop = nullptr) {
  if (!p || !p->open) co_return make_error_code(errc::null_handle);
  if (p->error) co_return p->error;
  if (stop && stop->stopped()) co_return false;
  net::steady_timer t(co_await net::this_coro::executor, until);
  pump_waiter w;
  w.timer = &t;
  p->link(w);
  ++p->stats.waits;
  boost::system::error_code ec;
  {
    stop_access::hook g(stop, [](void *x) noexcept { static_cast<net::steady_timer *>(x)->cancel(); }, &t);
    co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
  const bool woken = w.woken, open = p->open;
  const std::error_code err = p->error;
  p->unlink(w); // may drop the last reference to the core (a closed pump)
  w.core = nullptr;
  if (!open) co_return make_error_code(errc::null_handle);
  if (err) co_return err;
  co_return woken;
}

struct pump_access;
struct pump_steps {
  static constexpr bool shared = true;
  pump_core *p;
  task<result<bool>> wait(int, deadline until, watch_stop *stop = nullptr) const { return pump_wait(p, until, stop); }
  void after() const noexcept {
    if (p) p->kick();
  }
};
} // namespace detail

/// One shared EventChannel (conn_options::channel, listen_options::channel) served on an
/// io_context: one registration of its fd with the reactor for all its Connections and
/// Listeners, whose steps are awaited through the overloads below (advance, wait_established,
/// connect, next_request, accept, watch with a pump). When the fd turns readable the pump reads
/// the events into their users' queues (EventChannel::dispatch) and wakes every step that
/// sleeps; each takes its own events (Connection::advance, Listener::get_request) and sleeps
/// again if it had none. Move-only, null after move.
///
/// Every user of the channel on this thread goes through the pump: a plain advance() or
/// get_request() of one of them may read the others' events from the fd (call kick() after
/// it). Lifetime: close (or destroy) the pump before its channel and before its io_context (it
/// holds a descriptor of that io_context's reactor); its sleeping steps then fail with
/// errc::null_handle. The pump keeps the channel object's address: do not move the
/// EventChannel while a pump serves it (the channel does not know its pumps).
class EventPump {
public:
  EventPump() noexcept = default;
  /// Takes over `o`'s channel and sleeping steps; `o` is left null.
  EventPump(EventPump &&o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  /// Closes this pump, then takes over `o`'s.
  EventPump &operator=(EventPump &&o) noexcept {
    if (this != &o) {
      close();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  /// close().
  ~EventPump() { close(); }

  /// Serve `ch` on `ex`: registers its fd (already non-blocking) with the reactor and waits.
  /// \errors
  /// - errc::null_handle: `ch` is null.
  /// - ENOMEM when the core cannot be allocated; the errno of registering the fd (epoll_ctl).
  /// \mallocs The core (new(nothrow)); the reactor's descriptor state.
  [[nodiscard]] static result<EventPump> create(const net::any_io_executor &ex, EventChannel &ch) noexcept {
    if (!ch) return make_error_code(errc::null_handle);
    EventPump p;
    p.c_ = new (std::nothrow) detail::pump_core(ex);
    if (!p.c_) return std::make_error_code(std::errc::not_enough_memory);
    p.c_->ch = &ch;
    boost::system::error_code ec;
    p.c_->sd.assign(ch.fd(), ec);
    if (ec) return from_asio(ec);
    p.c_->pump(); // what is pending already
    p.c_->wait();
    return p;
  }

  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return c_ != nullptr; }
  /// The channel served, or nullptr.
  [[nodiscard]] EventChannel *channel() const noexcept { return c_ ? c_->ch : nullptr; }
  /// The counters.
  [[nodiscard]] const pump_stats &stats() const noexcept {
    static const pump_stats none{};
    return c_ ? c_->stats : none;
  }
  /// After a user of the channel was advanced outside the pump (Connection::advance,
  /// Listener::get_request): wake the steps whose events it queued.
  void kick() noexcept {
    if (c_) c_->kick();
  }
  /// Stop: deregister the fd (the channel keeps it), wake every sleeping step (they fail with
  /// errc::null_handle). Idempotent.
  void close() noexcept {
    detail::pump_core *c = std::exchange(c_, nullptr);
    if (!c) return;
    c->open = false;
    boost::system::error_code ignored;
    c->sd.cancel(ignored);
    (void)c->sd.release();
    c->wake_all();
    detail::pump_core::unref(c);
  }

private:
  friend struct detail::pump_access;
  detail::pump_core *c_ = nullptr;
};

namespace detail {
// What the pump overloads reach of an EventPump.
struct pump_access {
  [[nodiscard]] static pump_steps of(const EventPump &p) noexcept { return {p.c_}; }
};
} // namespace detail

namespace detail {
// The one check of the pump overloads: a live pump, a live connection on the pump's channel.
[[nodiscard]] inline std::error_code pump_mismatch(const EventPump &p, const Connection &c) noexcept {
  if (!p || !c) return make_error_code(errc::null_handle);
  if (!c.shares_channel() || c.fd() != p.channel()->fd()) return make_error_code(errc::invalid_argument);
  return {};
}
} // namespace detail

/// advance() of a connection on the pump's channel. Takes what is queued for it first and
/// returns at once if that changed its state; else sleeps until the pump reads an event or
/// `until` passes, then Connection::advance().
/// \errors
/// - errc::null_handle: the connection or pump is null, or the pump was closed.
/// - errc::invalid_argument: the connection is not on the pump's channel.
/// - those of Connection::advance(); the errno of rdma_get_cm_event (the pump stopped).
/// \mallocs As advance(), and a timer operation per sleep (Asio's, recycled per thread).
inline task<result<conn_state>> advance(EventPump &p, Connection &c, deadline until) {
  if (auto e = detail::pump_mismatch(p, c)) co_return e;
  co_return co_await detail::advance_with(detail::pump_access::of(p), c, until);
}

/// wait_established() through the pump.
/// \errors As advance(EventPump&, ...) and wait_established().
/// \mallocs As advance(EventPump&, ...).
inline task<result<void>> wait_established(EventPump &p, Connection &c, std::int64_t check_ms = 100) {
  if (auto e = detail::pump_mismatch(p, c)) co_return e;
  co_return co_await detail::wait_established_with(detail::pump_access::of(p), c, check_ms);
}

/// connect() on the pump's channel: `o.channel` is set to it (another channel there:
/// errc::invalid_argument).
/// \errors As connect() and advance(EventPump&, ...).
/// \mallocs As connect().
inline task<result<Connection>> connect(EventPump &p, address to, conn_options o = {}) {
  if (!p) co_return make_error_code(errc::null_handle);
  if (o.channel && o.channel != p.channel()) co_return make_error_code(errc::invalid_argument);
  o.channel = p.channel();
  auto c = Connection::start_connect(to, o);
  if (!c) co_return c.error();
  if (auto r = co_await wait_established(p, c.value()); !r) co_return r.error();
  co_return std::move(c).value();
}

namespace detail {
// A retry's pause: an Asio timer, the thread is not blocked.
inline task<void> pause_ms(int ms) {
  net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(ms));
  boost::system::error_code ec;
  co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
}
// The retry loop of both connect(..., retry_options) forms (`p` null: the connection's own fd).
inline task<result<Connection>> connect_retrying(EventPump *p, address to, conn_options o, retry_options r) {
  if (auto ec = ::rdmaxx::detail::retry_schedule::check(r)) co_return ec;
  ::rdmaxx::detail::retry_schedule s(r);
  const int step_ms = o.timeout_ms;
  for (;;) {
    o.timeout_ms = s.begin_attempt(step_ms);
    result<Connection> c = make_error_code(errc::null_handle);
    if (p) c = co_await connect(*p, to, o); // (no co_await inside ?: : GCC 12 mishandles it)
    else c = co_await connect(to, o);
    if (c) co_return std::move(c).value();
    const std::error_code ec = s.failed(c.error());
    const int pause = s.pause_after(c.error());
    if (pause < 0) co_return ec;
    co_await pause_ms(pause);
    if (s.expired()) co_return ec;
  }
}
} // namespace detail

/// connect(), retrying while the passive side is not up yet, as the blocking
/// Connection::connect(to, o, r): after a failure whose retry_hint_of() is retry_hint::yes
/// (reject reason 8: nobody listens on the port yet; the peer unreachable or its address not
/// resolved in time; a step past its bound) a pause (an Asio timer: the thread goes on) and
/// another attempt, until one succeeds or r.total_ms has passed (retry_options: each attempt's
/// steps are bounded by the time left). r.total_ms 0: one attempt, as connect(to, o).
/// \errors
/// - errc::invalid_argument: r.total_ms < 0, r.backoff_ms < 1, r.max_backoff_ms below it, or
///   o.channel set (use the EventPump overload); nothing was attempted.
/// - an error not worth retrying, at once (those of connect(): e.g. REJECTED with reason 28, the
///   peer application refused); at the deadline, the last attempt's error (the one
///   before it when the deadline cut the last short and it timed out).
/// \mallocs As connect(), per attempt; Asio's frame and timer operation per pause.
inline task<result<Connection>> connect(address to, conn_options o, retry_options r) {
  if (o.channel) co_return make_error_code(errc::invalid_argument);
  co_return co_await detail::connect_retrying(nullptr, to, o, r);
}

/// connect(EventPump&, ...) retrying as connect(to, o, r) does.
/// \errors As connect(to, o, r) and connect(EventPump&, ...); a null pump: errc::null_handle.
/// \mallocs As connect(to, o, r).
inline task<result<Connection>> connect(EventPump &p, address to, conn_options o, retry_options r) {
  if (!p) co_return make_error_code(errc::null_handle);
  co_return co_await detail::connect_retrying(&p, to, o, r);
}

/// next_request() of a listener on the pump's channel.
/// \errors
/// - errc::null_handle: the listener or pump is null, or the pump was closed.
/// - errc::invalid_argument: the listener is not on the pump's channel.
/// - as next_request().
/// \mallocs As next_request().
inline task<result<ConnectRequest>> next_request(EventPump &p, Listener &l, std::int64_t timeout_ms) {
  if (!p || !l) co_return make_error_code(errc::null_handle);
  if (l.fd() != p.channel()->fd()) co_return make_error_code(errc::invalid_argument);
  co_return co_await detail::next_request_with(detail::pump_access::of(p), l, timeout_ms);
}

/// accept() of a connection prepared on the pump's channel (ConnectRequest::prepare with
/// conn_options::channel).
/// \errors As accept() and wait_established(EventPump&, ...); a null pump or connection, or one
/// of another channel, is refused before Connection::accept() (nothing sent).
/// \mallocs As advance(EventPump&, ...).
inline task<result<void>> accept(EventPump &p, Connection &c, std::span<const std::byte> private_data = {}) {
  // Checked before the accept goes out: a refused pump leaves the request unanswered, not accepted.
  if (auto e = detail::pump_mismatch(p, c)) co_return e;
  if (auto r = c.accept(private_data); !r) co_return r.error();
  co_return co_await wait_established(p, c);
}

/// watch() of a connection on the pump's channel.
/// \errors As watch(); errc::null_handle / invalid_argument as advance(EventPump&, ...).
/// \mallocs As advance(EventPump&, ...).
inline task<std::error_code> watch(EventPump &p, Connection &c, CompletionRouter &r, watch_stop &stop) {
  if (auto e = detail::pump_mismatch(p, c)) co_return e;
  co_return co_await detail::watch_with(detail::pump_access::of(p), c, r, stop);
}

} // namespace rdmaxx::asio
