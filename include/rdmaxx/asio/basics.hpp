/// \file
/// rdmaxx/asio/basics.hpp: what every part of rdmaxx/asio.hpp builds on: task<T> (asio::awaitable),
/// deadlines, the one conversion of Asio error codes, watch_stop, and the fd wait of a step.
#pragma once

#include "../co_try.hpp"
#include "../detail/counted.hpp"
#include "../error.hpp"

#include <utility> // before Boost 1.74's awaitable.hpp, which uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>

#if !defined(BOOST_ASIO_HAS_CO_AWAIT)
#error "rdmaxx/asio.hpp needs Boost.Asio with C++20 coroutines (BOOST_ASIO_HAS_CO_AWAIT)"
#endif

namespace rdmaxx::asio {


namespace net = ::boost::asio;
/// Coroutines of this header: asio::awaitable on the io_context's executor.
template <class T>
using task = net::awaitable<T>;
/// The clock of deadlines.
using clock = std::chrono::steady_clock;
/// A point in time a wait gives up at.
using deadline = clock::time_point;

/// `ms` milliseconds from now.
[[nodiscard]] inline deadline after_ms(std::int64_t ms) noexcept {
  return clock::now() + std::chrono::milliseconds(ms);
}

/// The one place Asio error codes become rdmaxx's std::error_code: operation_aborted is the
/// caller's own cancellation (never returned by this header), anything else keeps its value.
[[nodiscard]] inline std::error_code from_asio(const boost::system::error_code &ec) noexcept {
  return std::error_code(ec);
}

namespace detail {

// A descriptor over an fd someone else owns: released, never closed, also when the frame is
// destroyed with the io_context.
struct borrowed_fd {
  net::posix::stream_descriptor sd;
  ~borrowed_fd() {
    if (sd.is_open()) (void)sd.release();
  }
};

struct stop_access;
struct idle_waiter;
} // namespace detail

/// Ends a watch() at once, from any coroutine or handler of its io_context thread: Boost 1.74 has
/// no per-operation cancellation slots. stop() cancels the watch's wait (its fd wait, or its sleep
/// on an EventPump), and the watch returns an empty error_code. One watch per object; the
/// object must outlive the watch. Not copyable.
class watch_stop {
public:
  watch_stop() noexcept = default;
  watch_stop(const watch_stop &) = delete;
  watch_stop &operator=(const watch_stop &) = delete;
  /// Wake the watch now (or, if it is not waiting yet, make it return before it waits).
  void stop() noexcept {
    stopped_ = true;
    if (cancel_) cancel_(target_);
  }
  /// stop() was called.
  [[nodiscard]] bool stopped() const noexcept { return stopped_; }
  /// The watch using this object has returned (or none started).
  [[nodiscard]] bool idle() const noexcept { return !running_; }
  /// Wait (without blocking the thread) until the watch using this object has returned
  /// (idle()), or `until`: after stop(), `co_await s.wait_idle()` before the connection or the
  /// router is destroyed. Returns at once when idle already (also before the watch's coroutine
  /// started: co_spawn runs it later). Any number of coroutines may wait at once; the object must
  /// outlive their waits.
  /// \errors
  /// - errc::timeout: the watch still runs at `until` (stop() it first, or wait for its
  ///   connection to disconnect).
  /// \mallocs None when idle; else Asio's coroutine frame and timer operation.
  task<result<void>> wait_idle(deadline until = deadline::max());

private:
  friend struct detail::stop_access;
  bool stopped_ = false, running_ = false;
  detail::idle_waiter *idle_ = nullptr; // the coroutines in wait_idle()
  // What stop() cancels: the current wait of the watch, set while it waits.
  void (*cancel_)(void *) noexcept = nullptr;
  void *target_ = nullptr;
};

namespace detail {
// How a watch marks its watch_stop: each a guard, undone when its scope ends or its frame is
// destroyed unrun.
struct stop_access {
  // The watch runs (idle() false).
  struct running {
    watch_stop &s;
    explicit running(watch_stop &x) noexcept : s(x) { s.running_ = true; }
    running(const running &) = delete;
    running &operator=(const running &) = delete;
    ~running() {
      s.running_ = false;
      wake_idle(s);
    }
  };
  static void wake_idle(watch_stop &s) noexcept;
  static void link(watch_stop &s, idle_waiter &w) noexcept;
  static void unlink(watch_stop &s, idle_waiter &w) noexcept;
  // One wait that stop() cancels (null `s`: a wait without a stop).
  struct hook {
    watch_stop *s;
    hook(watch_stop *x, void (*cancel)(void *) noexcept, void *target) noexcept : s(x) {
      if (s) s->cancel_ = cancel, s->target_ = target;
    }
    hook(const hook &) = delete;
    hook &operator=(const hook &) = delete;
    ~hook() {
      if (s) s->cancel_ = nullptr, s->target_ = nullptr;
    }
  };
};

// A coroutine in watch_stop::wait_idle(): on the stop's list while it sleeps on its timer, which
// the watch's end cancels.
struct idle_waiter {
  watch_stop *s = nullptr;
  net::steady_timer *timer = nullptr;
  idle_waiter *prev = nullptr, *next = nullptr;
  bool linked = false, woken = false;
  idle_waiter(watch_stop &x, net::steady_timer &t) noexcept : s(&x), timer(&t) { stop_access::link(x, *this); }
  idle_waiter(const idle_waiter &) = delete;
  idle_waiter &operator=(const idle_waiter &) = delete;
  ~idle_waiter() { stop_access::unlink(*s, *this); } // also when its frame is destroyed unrun
};
inline void stop_access::link(watch_stop &s, idle_waiter &w) noexcept {
  w.prev = nullptr;
  w.next = s.idle_;
  if (s.idle_) s.idle_->prev = &w;
  s.idle_ = &w;
  w.linked = true;
}
inline void stop_access::unlink(watch_stop &s, idle_waiter &w) noexcept {
  if (!w.linked) return;
  if (w.prev) w.prev->next = w.next;
  else s.idle_ = w.next;
  if (w.next) w.next->prev = w.prev;
  w.prev = w.next = nullptr;
  w.linked = false;
}
// The watch returned: each sleeper's timer is cancelled (its coroutine resumes, sees idle()).
inline void stop_access::wake_idle(watch_stop &s) noexcept {
  for (idle_waiter *w = s.idle_; w; w = w->next) {
    w->woken = true;
    w->timer->cancel();
  }
}
} // namespace detail

inline task<result<void>> watch_stop::wait_idle(deadline until) {
  if (!running_) co_return success();
  net::steady_timer t(co_await net::this_coro::executor, until);
  detail::idle_waiter w(*this, t);
  boost::system::error_code ec;
  co_await t.async_wait(net::redirect_error(net::use_awaitable, ec));
  if (w.woken || !running_) co_return success();
  co_return make_error_code(errc::timeout);
}

namespace detail {
// Wait until `fd` is readable (true) or `until` passed (false), without blocking the thread;
// until == deadline::max(): no timer. The fd is borrowed: registered with the reactor for this
// wait only, released before return. The timer's handler cancels the descriptor; the coroutine
// returns only once that handler ran (pending == 0), so neither handler ever sees a destroyed
// frame. With `stop`, watch_stop::stop() cancels the descriptor too (then true: the caller checks
// the stop itself).
inline task<result<bool>> wait_readable(int fd, deadline until, watch_stop *stop = nullptr) {
  auto ex = co_await net::this_coro::executor;
  boost::system::error_code ec;
  borrowed_fd b{net::posix::stream_descriptor(ex)};
  net::posix::stream_descriptor &sd = b.sd;
  sd.assign(fd, ec);
  if (ec) co_return from_asio(ec);
  if (stop && stop->stopped()) co_return true;
  net::steady_timer t(ex);
  int pending = 0;
  bool expired = false;
  if (until != deadline::max()) {
    pending = 1;
    t.expires_at(until);
    t.async_wait([&](const boost::system::error_code &e) {
      if (!e) {
        expired = true;
        boost::system::error_code ignored;
        sd.cancel(ignored);
      }
      --pending;
    });
  }
  {
    stop_access::hook g(stop, [](void *p) noexcept {
      boost::system::error_code ignored;
      static_cast<net::posix::stream_descriptor *>(p)->cancel(ignored);
    }, &sd);
    co_await sd.async_wait(net::posix::stream_descriptor::wait_read, net::redirect_error(net::use_awaitable, ec));
  }
  if (pending) t.cancel();
  while (pending) co_await net::post(ex, net::use_awaitable);
  if (ec && ec != net::error::operation_aborted) co_return from_asio(ec);
  co_return !ec || !expired;
}

struct waiter_node;
struct router_core;
} // namespace detail

} // namespace rdmaxx::asio
