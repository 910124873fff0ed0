/// \file
/// rdmaxx/asio/task_group.hpp: TaskGroup, the coroutines of a service spawned and counted in one
/// place, and serve(), the accept loop that spawns one coroutine per connection request.
///
/// What it replaces in a program: co_spawn with a handler per coroutine that logs its error,
/// counts it and keeps the accept loop's lambda alive. Boost 1.74 (Debian 12) has no
/// parallel_group or cancellation slots: a group counts and reports, it does not cancel; its
/// coroutines end on their own deadlines (every wait of this library takes one).
#pragma once

#include "basics.hpp"
#include "cm_steps.hpp"
#include "../listener.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace rdmaxx::asio {

/// Counters of a TaskGroup (plain integers).
struct task_counts {
  std::size_t running = 0;   ///< spawned and not ended yet
  std::size_t succeeded = 0; ///< ended with a value
  std::size_t failed = 0;    ///< ended with an error (or an exception: see TaskGroup)
};

/// Coroutines returning result<T>, spawned on one executor and counted: how many run, how many
/// ended with a value and how many with an error, the first error, and a callback per error (to
/// log it). A task's value goes to the callback given with it. The group keeps its state alive
/// for as long as a task of it runs, so it may be destroyed first (a task ending afterwards is
/// counted nowhere). Not copyable; one io_context thread, as the tasks.
///
/// An exception out of a task (only Asio's own frame allocation throws here: std::bad_alloc)
/// counts as a failure with std::errc::not_enough_memory.
class TaskGroup {
public:
  /// Spawn onto `ex`; `on_error`, when given, is called with each task's error as it ends.
  explicit TaskGroup(net::any_io_executor ex, std::function<void(std::error_code)> on_error = {})
      : ex_(std::move(ex)), s_(std::make_shared<state>()) {
    s_->on_error = std::move(on_error);
  }
  TaskGroup(const TaskGroup &) = delete;
  TaskGroup &operator=(const TaskGroup &) = delete;

  /// Run `t` in the group; its value, if any, is dropped.
  template <class T>
  void spawn(task<result<T>> t) {
    spawn(std::move(t), [](auto &&...) {});
  }
  /// Run `t` in the group and hand its value to `on_value` (called on the io_context thread;
  /// `on_value()` without argument for result<void>).
  template <class T, class F>
  void spawn(task<result<T>> t, F on_value) {
    launch(run_task(s_, std::move(t), std::move(on_value)));
  }
  /// Run the coroutine `f()` returns (a callable returning task<result<T>>), keeping `f` alive
  /// for as long as it runs: the form for a lambda coroutine with captures, whose closure would
  /// otherwise be destroyed while its coroutine still reads the captures.
  template <class F>
    requires std::invocable<F &>
  void spawn(F f) {
    launch(run_callable(s_, std::move(f)));
  }

  /// The counters.
  [[nodiscard]] task_counts counts() const noexcept { return s_->counts; }
  /// The first error a task of the group ended with (empty while none failed).
  [[nodiscard]] std::error_code first_error() const noexcept { return s_->first; }
  /// The executor the group spawns onto.
  [[nodiscard]] const net::any_io_executor &executor() const noexcept { return ex_; }

private:
  struct state {
    task_counts counts;
    std::error_code first;
    std::function<void(std::error_code)> on_error;
    void fail(std::error_code ec) {
      ++counts.failed;
      if (!first) first = ec;
      if (on_error) on_error(ec);
    }
  };

  void launch(task<void> t) {
    ++s_->counts.running;
    net::co_spawn(ex_, std::move(t), [s = s_](std::exception_ptr e) {
      --s->counts.running;
      if (e) s->fail(std::make_error_code(std::errc::not_enough_memory));
    });
  }
  template <class T, class F>
  static task<void> run_task(std::shared_ptr<state> s, task<result<T>> t, F on_value) {
    auto r = co_await std::move(t);
    if (!r) co_return s->fail(r.error());
    ++s->counts.succeeded;
    if constexpr (std::is_void_v<T>) on_value();
    else on_value(std::move(r).value());
  }
  template <class F>
  static task<void> run_callable(std::shared_ptr<state> s, F f) {
    auto r = co_await f(); // `f` lives in this frame until its coroutine ended
    if (!r) co_return s->fail(r.error());
    ++s->counts.succeeded;
  }

  net::any_io_executor ex_;
  std::shared_ptr<state> s_;
};

/// What serve() accepts.
struct serve_options {
  /// Connection requests to hand out before serve() returns; 0: without end (until a wait for
  /// the next request fails, or the io_context stops).
  std::size_t requests = 0;
  /// The longest wait for the next request, in milliseconds; 0: no limit.
  std::int64_t idle_ms = 0;
  /// The Listener's backlog and what Listener::listen takes besides the address.
  listen_options listen{};
};

/// The accept loop of a service: listen on `at`, then hand each connection request, as it
/// arrives, to `handler(request, args...)` (a callable returning task<result<T>>: it prepares,
/// accepts and serves that connection), spawned in `g`, so that the next request is taken while
/// earlier ones are served. `args` are passed by reference (e.g. the Node the connections use):
/// they must outlive every coroutine spawned, as anything a coroutine refers to. Returns once
/// `o.requests` were handed out (their coroutines may still run: the group counts them), or with
/// the error of a failed wait.
/// \errors
/// - those of Listener::listen (EADDRINUSE...): nothing was listened on.
/// - a cm timeout (cm_step::request): no request within o.idle_ms.
/// - those of next_request().
/// \mallocs The Listener's (rdma_cm), per request as next_request(), and the spawned coroutine's
///   frames.
template <class F, class... Args>
task<result<void>> serve(TaskGroup &g, address at, serve_options o, F handler, Args &...args) {
  RDMAXX_CO_TRY(l, Listener::listen(at, o.listen));
  // A wait without limit is a chain of day-long waits (a deadline past the clock's range
  // would overflow).
  constexpr std::int64_t day_ms = 86'400'000;
  for (std::size_t handed = 0; o.requests == 0 || handed < o.requests;) {
    auto req = co_await next_request(l, o.idle_ms > 0 ? o.idle_ms : day_ms);
    if (!req && o.idle_ms <= 0 && is_cm_timeout(req.error())) continue;
    if (!req) co_return req.error();
    ++handed;
    g.spawn([handler, &args..., r = std::move(req).value()]() mutable { return handler(std::move(r), args...); });
  }
  co_return success();
}

} // namespace rdmaxx::asio
