/// \file
/// rdmaxx/asio/router.hpp: CompletionRouter (one CQ and its channel served on an io_context),
/// Waiter, Route, settled() and watch() (see rdmaxx/asio.hpp for the rules they share).
#pragma once

#include "basics.hpp"
#include "cm_steps.hpp"
#include "../completion_queue.hpp"
#include "../detail/completion_targets.hpp"
#include "../detail/span.hpp"
#include "../grant_pool.hpp"
#include "../queue_pair.hpp"
#include "../route.hpp"

#include <fcntl.h>

#include <memory>
#include <new>
#include <type_traits>

namespace rdmaxx::asio {

// ---------------------------------------------------------------- completions

/// What CompletionRouter::create needs.
struct router_options {
  /// Events acknowledged at once (ibv_ack_cq_events takes a mutex per call); 1 .. 1024.
  unsigned ack_batch = 16;
  /// Buckets of the wr_id table (rounded up to a power of two); more than the waiters at once.
  std::size_t buckets = 256;
  /// GrantPools that can be attached at once.
  std::size_t max_pools = 64;
  /// MemoryWindows, StrictGrants and IndirectKeys that can be attached at once.
  std::size_t max_targets = 64;
};

/// Counters of a router (plain integers, never reset).
struct router_stats {
  std::uint64_t events = 0;      ///< channel events taken (ibv_get_cq_event)
  std::uint64_t acks = 0;        ///< ibv_ack_cq_events calls
  /// events of another CQ on the channel (acknowledged on that CQ; the router stopped)
  std::uint64_t foreign_events = 0;
  std::uint64_t completions = 0; ///< completions polled
  std::uint64_t routed = 0;      ///< delivered to a Waiter
  std::uint64_t to_pools = 0;    ///< taken by an attached GrantPool
  std::uint64_t to_objects = 0;  ///< taken by an attached window, grant or key
  std::uint64_t unclaimed = 0;   ///< no waiter, no pool: dropped (see unclaimed handler)
  std::uint64_t waits = 0;       ///< Waiter::wait() and settled() calls
  std::uint64_t suspended = 0;   ///< of these, the ones that found nothing by polling and suspended
};

namespace detail {

struct waiter_node {
  enum class kind : std::uint8_t { wr, lease, object };
  waiter_node *prev = nullptr, *next = nullptr;
  router_core *core = nullptr;
  std::uint64_t wr_id = 0;
  std::uint32_t qp_num = 0;
  kind what = kind::wr;
  bool linked = false;
  bool done = false;
  std::error_code failed;
  ibv_wc wc{};
  const GrantPool *pool = nullptr;
  const GrantLease *lease = nullptr;
  // kind::object: the attached object waited for (its table key) and whether it is unconfirmed.
  const void *obj = nullptr;
  const void *key = nullptr;
  bool (*unconfirmed)(const void *) noexcept = nullptr;
  // A suspended wait: the coroutine's handler, kept here until it is resumed (router_core).
  enum class where : std::uint8_t { idle, suspended, ready } at = where::idle;
  bool expired = false;
  deadline until{};
  waiter_node *sprev = nullptr, *snext = nullptr; // the suspended list, or the ready queue (snext)
  void (*resume)(waiter_node &) = nullptr;        // moves the handler out and invokes it
  void (*drop)(waiter_node &) = nullptr;          // moves the handler out and destroys it
  alignas(std::max_align_t) unsigned char handler[128];
};

struct pool_entry {
  GrantPool *pool = nullptr;
  std::uint32_t qp_num = 0;
};

struct router_core {
  net::posix::stream_descriptor sd;
  net::steady_timer timer; // one for the deadlines of every suspended wait
  bool timer_set = false;
  deadline timer_at{};
  std::uint64_t timer_gen = 0;
  waiter_node *susp = nullptr;                     // suspended waits
  waiter_node *ready_head = nullptr, *ready_tail = nullptr; // routed, failed or expired: to resume
  bool dispatching = false, flush_posted = false;
  CompletionQueue *cq = nullptr;
  CompletionChannel *ch = nullptr;
  std::unique_ptr<waiter_node *[]> buckets; // heads, null-terminated lists
  std::size_t mask = 0;
  waiter_node *leases = nullptr; // settled() waiters (leases and attached objects)
  std::unique_ptr<pool_entry[]> pools;
  std::size_t max_pools = 0, n_pools = 0;
  ::rdmaxx::detail::completion_targets targets; // attached windows, grants and keys (CompletionDispatcher's table)
  unsigned ack_batch = 16, unacked = 0;
  bool armed = false; // ibv_req_notify_cq since the last event: the next completion raises one
  bool event_pending = false; // the fd turned readable: an event to take (take_event())
  int fd_flags = -1; // the channel fd's flags before create() made it non-blocking
  ::rdmaxx::detail::ref_count<> refs; // the router, every linked waiter, each pending handler (fd, timer, flush)
  bool open = true;
  bool waiting = false;
  std::error_code error; // a failed poll or event: every wait fails with it
  router_stats stats;
  void (*unclaimed)(void *, const ibv_wc &) = nullptr;
  void *unclaimed_ctx = nullptr;

  explicit router_core(const net::any_io_executor &ex) : sd(ex), timer(ex) {}

  static void unref(router_core *c) noexcept {
    if (c && c->refs.drop() == 0) delete c;
  }
  waiter_node *&head(std::uint64_t wr_id) noexcept {
    return buckets[std::size_t((wr_id * 0x9E3779B97F4A7C15ull) >> 32) & mask];
  }
  void link(waiter_node &n) noexcept {
    waiter_node *&h = n.what == waiter_node::kind::wr ? head(n.wr_id) : leases;
    n.prev = nullptr;
    n.next = h;
    if (h) h->prev = &n;
    h = &n;
    n.linked = true;
    if (error && !n.failed) n.failed = error; // a stopped router: the wait fails at once
    refs.add();
  }
  void unlink(waiter_node &n) noexcept {
    if (!n.linked) return;
    if (n.prev) n.prev->next = n.next;
    else (n.what == waiter_node::kind::wr ? head(n.wr_id) : leases) = n.next;
    if (n.next) n.next->prev = n.prev;
    n.prev = n.next = nullptr;
    n.linked = false;
    unref(this);
  }
  template <class F>
  void each(F &&f) noexcept {
    for (std::size_t b = 0; buckets && b <= mask; ++b) // none: create() could not allocate them
      for (waiter_node *n = buckets[b], *nx; n; n = nx) {
        nx = n->next;
        f(*n);
      }
    for (waiter_node *n = leases, *nx; n; n = nx) {
      nx = n->next;
      f(*n);
    }
  }
  void fail(std::uint32_t qp_num, bool all, std::error_code ec) noexcept {
    each([&](waiter_node &n) {
      if ((all || n.qp_num == qp_num) && !n.done && !n.failed) {
        n.failed = ec;
        wake(n);
      }
    });
  }
  // Stop handing completions to the pool at `p` (absent: nothing changes).
  void remove_pool(const void *p) noexcept {
    for (std::size_t i = 0; i < n_pools; ++i)
      if (pools[i].pool == p) {
        pools[i] = pools[--n_pools];
        return;
      }
  }
  void check_leases(const GrantPool *p) noexcept {
    for (waiter_node *n = leases; n; n = n->next)
      if (n->what == waiter_node::kind::lease && n->pool == p && !n->done &&
          n->lease->state() == lease_state::ready) {
        n->done = true;
        wake(*n);
      }
  }
  // An attached object (table key `key`) took `wc`: wake its settled() waiters once it has
  // nothing unconfirmed, or with the error of its failed completion.
  void check_objects(const void *key, const ibv_wc &wc) noexcept {
    for (waiter_node *n = leases; n; n = n->next) {
      if (n->what != waiter_node::kind::object || n->key != key || n->done || n->failed) continue;
      if (wc.status != IBV_WC_SUCCESS) n->failed = wc_error(wc);
      else if (!n->unconfirmed(n->obj)) n->done = true;
      else continue;
      wake(*n);
    }
  }

  // ---- suspension: no timer and no post per wait ----
  // A wait that found nothing stores its coroutine's handler in its node (suspend) and joins
  // the suspended list; the router's one timer runs at the earliest deadline. A completion,
  // failure or deadline moves the node to the ready queue; the router's own handlers (channel
  // readable, timer) resume the queue inline once they are done routing, one round at a time
  // (dispatch()); a wake from inside a coroutine (a poll before suspending that finds another
  // waiter's completion, fail(), close()) posts one flush for the queue.
  void unlink_susp(waiter_node &n) noexcept {
    if (n.sprev) n.sprev->snext = n.snext;
    else susp = n.snext;
    if (n.snext) n.snext->sprev = n.sprev;
    n.sprev = n.snext = nullptr;
  }
  void push_ready(waiter_node &n) noexcept {
    n.at = waiter_node::where::ready;
    n.snext = nullptr;
    if (ready_tail) ready_tail->snext = &n;
    else ready_head = &n;
    ready_tail = &n;
  }
  void wake(waiter_node &n) noexcept {
    if (n.at != waiter_node::where::suspended) return; // not suspended: wait() sees it itself
    unlink_susp(n);
    push_ready(n);
    if (!dispatching) post_flush();
  }
  template <class H>
  void suspend(waiter_node &n, H &&h) noexcept;
  // Resume the waiters ready now, in order (each runs until it suspends again or ends). What
  // they ready meanwhile waits for the next round, posted: the reactor and other handlers get
  // their turn in between (two coroutines answering each other must not keep the thread).
  void dispatch();
  // The io_context was destroyed (or shut down) with waits suspended: destroy their handlers
  // (Asio then unwinds their coroutines), nothing will resume them.
  void orphaned() noexcept {
    while (waiter_node *n = susp) {
      unlink_susp(*n);
      n->at = waiter_node::where::idle;
      n->drop(*n);
    }
    while (waiter_node *n = ready_head) {
      ready_head = n->snext;
      if (!ready_head) ready_tail = nullptr;
      n->snext = nullptr;
      n->at = waiter_node::where::idle;
      n->drop(*n);
    }
  }
  void route(ibv_wc &wc) noexcept;
  // Poll until the CQ is empty; with `arm`, until it is empty and armed (the drain-after-event
  // rule of CompletionQueue::poll_and_arm): armed once, when first found empty, then polled
  // until empty again. Never armed twice: an event the first arm raised is taken first.
  std::error_code drain(bool arm) noexcept;
  // A wait begins: poll; if that did not make it ready and the CQ is not armed, arm it and poll
  // again (as CompletionQueue::wait does before it sleeps). The CQ is armed only while someone
  // may suspend: completions that nobody waits for (a bind's, a send's) raise no event.
  // Counts the waits and those that found nothing: they suspend.
  template <class Ready>
  void poll_now(Ready &&ready) noexcept {
    ++stats.waits;
    if (open && !error && !ready())
      if (auto ec = drain(false)) return stop(ec);
    if (open && !error && !ready() && !armed)
      if (auto ec = drain(true)) return stop(ec);
    if (!ready()) ++stats.suspended;
  }
  void stop(std::error_code ec) noexcept {
    error = ec;
    fail(0, true, ec);
  }
  // A reference held by a handler: dropped when the handler object goes, whether it ran or was
  // destroyed unrun (an io_context stopped before the cancelled wait completed, or destroyed:
  // then no suspended wait will ever be resumed, their handlers are destroyed).
  struct ref {
    router_core *c;
    bool ran = false;
    explicit ref(router_core *p) noexcept : c(p) { c->refs.add(); }
    ref(ref &&o) noexcept : c(std::exchange(o.c, nullptr)), ran(o.ran) {}
    ref &operator=(ref &&) = delete;
    ~ref() {
      if (c && !ran) c->orphaned();
      unref(c);
    }
  };
  void post_flush() noexcept {
    if (flush_posted) return;
    flush_posted = true;
    net::post(sd.get_executor(), [this, hold = ref(this)]() mutable {
      hold.ran = true;
      flush_posted = false;
      dispatch();
      after_round();
    });
  }
  // The one timer: at the earliest deadline of the suspended waits (re-armed only when a new
  // wait's deadline is earlier, or when it fires).
  void arm_timer(deadline t) noexcept {
    timer_set = true;
    timer_at = t;
    const std::uint64_t g = ++timer_gen;
    timer.expires_at(t); // cancels the wait before (its handler sees operation_aborted)
    timer.async_wait([this, g, hold = ref(this)](const boost::system::error_code &e) mutable {
      hold.ran = true;
      if (open && !e && g == timer_gen) on_timer();
    });
  }
  void on_timer();
  // After a handler of the router resumed the coroutines it readied: wait for the channel's fd
  // while a wait is suspended, else hold no Asio operation (idle()).
  void after_round() noexcept {
    if (!open) return;
    if (susp && !error) {
      if (!waiting) wait();
    } else {
      idle(); // (a stopped router: every wait fails at once, none needs the fd)
    }
  }
  // Nobody waits: cancel the fd wait and the timer, so that the router keeps nothing of the
  // io_context busy and run() can return once the program's own work is done. The CQ may stay
  // armed: an event it raises meanwhile makes the fd readable, seen by the next fd wait (a wait
  // that suspends starts it).
  void idle() noexcept {
    if (susp || ready_head || flush_posted) return;
    if (timer_set) {
      timer_set = false;
      ++timer_gen; // its handler, run with operation_aborted, does nothing
      timer.cancel();
    }
    if (waiting) {
      boost::system::error_code ignored;
      sd.cancel(ignored); // its handler sees operation_aborted and does not wait again
    }
  }
  // One wait for the channel's fd at a time; its handler keeps the core alive.
  void wait() noexcept;
  // The fd is readable: the CQ's event fired (it disarmed the CQ). Route what is there; the
  // caller resumes the ready waiters (dispatch()), then after_dispatch(), then waits for the fd
  // again if that returns true (false: the router stopped). The event itself is taken later
  // (take_event()): its read is then not between a completion and the work request that the
  // completion's coroutine posts next.
  bool on_readable() noexcept {
    event_pending = true;
    armed = false;
    if (auto ec = drain(false)) {
      stop(ec);
      return false;
    }
    return true;
  }
  // After the woken coroutines ran: take the event if none of them did (arming takes it first),
  // and arm again if a wait is still suspended (a wait that begins later arms before it suspends).
  bool after_dispatch() noexcept {
    std::error_code ec;
    if (event_pending) ec = take_event();
    if (!ec && open && !error && susp && !armed) ec = drain(true);
    if (ec) stop(ec);
    return open && !error;
  }
  // Take the event the fd announced: one non-blocking read (ibv_get_cq_event). Always before
  // the CQ is armed again (drain(true)): mlx4 and mlx5 count their arm sequence in its cq_event
  // hook. The channel serves only this CQ, armed at most once between events, so at most one
  // event is pending (and Asio's next wait re-checks the fd's level: EPOLL_CTL_MOD); a spurious
  // wake-up reads EAGAIN instead of blocking the thread.
  std::error_code take_event() noexcept;

  void ack() noexcept {
    if (unacked) {
      (void)cq->ack_events(unacked);
      ++stats.acks;
      unacked = 0;
    }
  }
};

template <class H>
inline void router_core::suspend(waiter_node &n, H &&h) noexcept {
  using handler = std::decay_t<H>;
  static_assert(sizeof(handler) <= sizeof(n.handler) && alignof(handler) <= alignof(std::max_align_t));
  ::new (static_cast<void *>(n.handler)) handler(std::move(h));
  n.resume = [](waiter_node &x) {
    handler *p = std::launder(reinterpret_cast<handler *>(x.handler));
    handler local(std::move(*p));
    p->~handler();
    local();
  };
  n.drop = [](waiter_node &x) {
    handler *p = std::launder(reinterpret_cast<handler *>(x.handler));
    handler local(std::move(*p));
    p->~handler();
  };
  if (!armed && open && !error) // (poll_now() armed it just before: this is a safety net)
    if (auto ec = drain(true)) stop(ec);
  if (n.done || n.failed || !open) { // nothing to wait for after all: resume soon
    push_ready(n);
    if (!dispatching) post_flush();
    return;
  }
  n.at = waiter_node::where::suspended;
  n.sprev = nullptr;
  n.snext = susp;
  if (susp) susp->sprev = &n;
  susp = &n;
  if (!timer_set || n.until < timer_at) arm_timer(n.until);
  // The channel's fd is waited for only while a wait is suspended (what keeps the io_context
  // running): from here, unless a router handler runs the coroutines now (it waits for the fd
  // at its end, after the event is taken: see wait()).
  if (!waiting && !dispatching) wait();
}

inline void router_core::dispatch() {
  if (dispatching) return; // the outer call's caller resumes them (or posts the next round)
  dispatching = true;
  struct round {
    router_core *c;
    waiter_node *batch;
    ~round() {
      if (batch) { // an exception left some unresumed: first in the next round
        waiter_node *last = batch;
        while (last->snext) last = last->snext;
        last->snext = c->ready_head;
        if (!c->ready_head) c->ready_tail = last;
        c->ready_head = batch;
      }
      c->dispatching = false;
      if (c->ready_head) c->post_flush();
    }
  } r{this, std::exchange(ready_head, nullptr)};
  ready_tail = nullptr;
  while (waiter_node *n = r.batch) {
    r.batch = n->snext;
    n->snext = nullptr;
    n->at = waiter_node::where::idle;
    n->resume(*n);
  }
}

inline void router_core::route(ibv_wc &wc) noexcept {
  ++stats.completions;
  for (std::size_t i = 0; i < n_pools; ++i) {
    pool_entry &e = pools[i];
    if (e.pool->owns(wc)) { // its bind, unbind or invalidate, from any QP it posted on
      (void)e.pool->complete(rdmaxx::detail::span_of(&wc, 1));
      check_leases(e.pool);
      ++stats.to_pools;
      return;
    }
    if (e.qp_num == wc.qp_num && e.pool->mechanism() == grant_mechanism::type2_window) {
      const std::uint64_t inv = e.pool->stats().remote_invalidations;
      (void)e.pool->complete(rdmaxx::detail::span_of(&wc, 1)); // the peer's send-with-invalidate
      if (e.pool->stats().remote_invalidations != inv) check_leases(e.pool);
    }
  }
  if (const void *by = targets.route(wc)) { // a window's, grant's or key's own operation
    ++stats.to_objects;
    check_objects(by, wc);
    return;
  }
  // The QP number too: after a reconnect the old QP's flushed completions carry the wr_ids
  // the new QP's waiters registered (one CQ for many connections), and must not wake them.
  for (waiter_node *n = head(wc.wr_id); n; n = n->next)
    if (n->wr_id == wc.wr_id && n->qp_num == wc.qp_num && !n->done) {
      n->wc = wc;
      n->done = true;
      ++stats.routed;
      wake(*n);
      return;
    }
  ++stats.unclaimed;
  if (unclaimed) unclaimed(unclaimed_ctx, wc);
}

inline std::error_code router_core::drain(bool arm) noexcept {
  if (arm && event_pending)
    if (auto ec = take_event()) return ec;
  ibv_wc wc[16];
  bool did_arm = false;
  for (;;) {
    auto n = cq->poll(wc);
    if (!n) return n.error();
    for (std::size_t i = 0; i < n.value(); ++i) route(wc[i]);
    if (n.value() == std::size(wc)) continue;
    if (!arm || did_arm) break;
    if (auto a = cq->arm(); !a) return a.error();
    did_arm = true; // and poll again: a completion before the arm raised no event
  }
  if (arm) armed = true;
  return {};
}

inline void router_core::on_timer() {
  timer_set = false;
  const deadline now = clock::now();
  deadline next = deadline::max();
  for (waiter_node *n = susp, *nx; n; n = nx) {
    nx = n->snext;
    if (n->until <= now) {
      n->expired = true;
      unlink_susp(*n);
      push_ready(*n);
    } else if (n->until < next) {
      next = n->until;
    }
  }
  if (susp) arm_timer(next);
  dispatch();
  after_round();
}

inline void router_core::wait() noexcept {
  if (!open || waiting) return;
  waiting = true;
  sd.async_wait(net::posix::stream_descriptor::wait_read,
                [this, hold = ref(this)](const boost::system::error_code &e) mutable {
                  hold.ran = true;
                  waiting = false;
                  // The fd is waited for again only after the woken coroutines ran (also
                  // when one throws): the reactor's registration (epoll_ctl) is then not
                  // between a completion and the work request its coroutine posts next.
                  struct again {
                    router_core *c;
                    bool on = false;
                    ~again() {
                      if (on && c->after_dispatch()) c->after_round();
                    }
                  } g{this};
                  dispatching = true; // wakes queue up for the dispatch() below
                  if (open && !e) g.on = on_readable();
                  else if (open && e != net::error::operation_aborted) stop(from_asio(e));
                  dispatching = false;
                  dispatch();
                });
}

inline std::error_code router_core::take_event() noexcept {
  event_pending = false;
  if (!open) return {}; // closed meanwhile (by a woken coroutine): an event never read needs no ack
  ibv_cq *ev_cq = nullptr;
  void *ev_ctx = nullptr;
  if (::ibv_get_cq_event(ch->native_handle(), &ev_cq, &ev_ctx) == 0) {
    if (ev_cq != cq->native_handle()) {
      // The channel serves another CQ too: its event is acknowledged on its own CQ (counted
      // against ours, ibv_destroy_cq of both would wait forever), and the router stops rather
      // than swallow another owner's events.
      ::ibv_ack_cq_events(ev_cq, 1);
      ++stats.foreign_events;
      return make_error_code(errc::invalid_argument);
    }
    ++stats.events;
    if (++unacked >= ack_batch) ack();
    return {};
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {};
  return last_errno();
}


// Suspend the calling coroutine on `n` until it is routed, failed or `until` passed (its
// handler is kept in the node: no timer and no operation of its own).
inline auto suspend_on(router_core &c, waiter_node &n, deadline until) {
  n.until = until;
  n.expired = false;
  return net::async_initiate<decltype(net::use_awaitable), void()>(
      [&c, &n](auto h) { c.suspend(n, std::move(h)); }, net::use_awaitable);
}

// What a Waiter's wait gives once it is not suspended (routed, failed, or past its deadline).
inline result<ibv_wc> wait_result(const waiter_node &n) noexcept {
  if (n.done) return n.wc;
  if (n.failed) return n.failed;
  return make_error_code(errc::timeout);
}

// An awaitable already holding its value (a wait that found its completion by polling).
template <class T>
task<T> ready_value(T v) {
  co_return v;
}

} // namespace detail

class Waiter;
class CompletionRouter;

/// A CompletionRouter's scoped attach (CompletionRouter::route): rdmaxx::Route, the same handle
/// as CompletionDispatcher::route's. It keeps the router's core (not its CQ) alive.
using Route = ::rdmaxx::Route;

/// One CompletionQueue with its CompletionChannel, served on an io_context: completions routed
/// by QP and wr_id to Waiters, GrantPool completions to their pools. Move-only, null after move.
/// The CQ must be attached to the channel, and the channel serve only this CQ (an event of
/// another CQ is acknowledged on that CQ and stops the router: every wait fails with
/// errc::invalid_argument). It keeps io_context::run() running only while a wait on it is
/// suspended (see the top of this header): a client whose coroutines have all ended sees run()
/// return with the router still open; close() it before its CQ and channel are destroyed.
class CompletionRouter {
public:
  CompletionRouter() noexcept = default;
  /// Takes over `o`'s CQ, channel and waiters; `o` is left null.
  CompletionRouter(CompletionRouter &&o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  /// Closes this router, then takes over `o`'s.
  CompletionRouter &operator=(CompletionRouter &&o) noexcept {
    if (this != &o) {
      close();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  /// close().
  ~CompletionRouter() { close(); }

  /// Serve `cq` (attached to `ch`) on `ex`: makes the channel's fd non-blocking (fcntl, undone by
  /// close()) and registers it with the reactor; the channel is waited for while a wait is
  /// suspended. Completions already in the CQ stay there until the first wait polls it (after
  /// the Waiters and pools are registered for them); the CQ is armed by the first wait that may
  /// suspend.
  /// \errors
  /// - errc::null_handle: `cq` or `ch` is null.
  /// - errc::invalid_argument: `cq` is not attached to `ch`, ack_batch 0 or above 1024, no bucket.
  /// - ENOMEM when the core cannot be allocated; the errno of fcntl or of registering the fd
  ///   (epoll_ctl).
  /// \mallocs The core, its buckets, pool table and object table (new(nothrow)); the reactor's
  /// descriptor state.
  [[nodiscard]] static result<CompletionRouter> create(const net::any_io_executor &ex, CompletionQueue &cq,
                                                       CompletionChannel &ch, router_options o = {}) noexcept;

  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return c_ != nullptr; }
  /// The counters.
  [[nodiscard]] const router_stats &stats() const noexcept {
    static const router_stats none{};
    return c_ ? c_->stats : none;
  }

  /// Hand `pool`'s completions on `qp` to it (GrantPool::complete) and wake settled() waiters
  /// of its leases; attach again after a reconnect (a new QP number replaces the old).
  /// \errors
  /// - errc::null_handle: a null router, pool or QP.
  /// - errc::too_many_entries: max_pools pools attached already.
  /// \mallocs None.
  result<void> attach(GrantPool &pool, const QueuePair &qp) noexcept {
    if (!c_ || !pool || !qp) return make_error_code(errc::null_handle);
    for (std::size_t i = 0; i < c_->n_pools; ++i)
      if (c_->pools[i].pool == &pool) {
        c_->pools[i].qp_num = qp.qp_num();
        return success();
      }
    if (c_->n_pools == c_->max_pools) return make_error_code(errc::too_many_entries);
    c_->pools[c_->n_pools++] = {&pool, qp.qp_num()};
    return success();
  }
  /// Stop handing completions to `pool` (before it is destroyed or moved).
  void detach(const GrantPool &pool) noexcept {
    if (c_) c_->remove_pool(&pool);
  }
  /// Hand the completions of `obj`'s own work requests to it (a MemoryWindow, StrictGrant or
  /// IndirectKey posting on QPs whose send CQ this router serves), offer it every receive (a
  /// peer's send-with-invalidate), and wake settled(r, obj, ...) waiters: the same table as
  /// CompletionDispatcher's. `obj` stays at its address until detach() or close().
  /// \errors
  /// - errc::null_handle: a null router or object.
  /// - errc::too_many_entries: router_options::max_targets objects attached already.
  /// \mallocs None.
  template <::rdmaxx::detail::completion_target_type T>
    requires(!std::same_as<T, GrantPool>)
  result<void> attach(T &obj) noexcept {
    if (!c_ || !obj) return make_error_code(errc::null_handle);
    if (auto ec = c_->targets.add(obj)) return ec;
    return success();
  }
  /// Stop handing completions to `obj` (before it is destroyed or moved).
  template <::rdmaxx::detail::completion_target_type T>
    requires(!std::same_as<T, GrantPool>)
  void detach(const T &obj) noexcept {
    if (c_) c_->targets.remove(&obj);
  }
  /// attach(pool, qp) for as long as the returned Route lives (see Route): the form to use in
  /// coroutines, where an early return would otherwise leave the pool attached after it is gone.
  /// \errors As attach(pool, qp).
  /// \mallocs None.
  [[nodiscard]] result<Route> route(GrantPool &pool, const QueuePair &qp) noexcept {
    if (auto r = attach(pool, qp); !r) return r.error();
    return make_route(&pool, true);
  }
  /// attach(obj) for as long as the returned Route lives (see Route).
  /// \errors As attach(obj).
  /// \mallocs None.
  template <::rdmaxx::detail::completion_target_type T>
    requires(!std::same_as<T, GrantPool>)
  [[nodiscard]] result<Route> route(T &obj) noexcept {
    if (auto r = attach(obj); !r) return r.error();
    return make_route(&obj, false);
  }
  /// Called for completions no waiter and no pool took (stale completions of a connection that
  /// is gone, unsignaled work's errors...); without one they are counted and dropped.
  void on_unclaimed(void (*f)(void *, const ibv_wc &), void *ctx) noexcept {
    if (!c_) return;
    c_->unclaimed = f;
    c_->unclaimed_ctx = ctx;
  }
  /// Fail every waiter of QP `qp_num` with `ec` (watch() does this on a disconnect).
  void fail(std::uint32_t qp_num, std::error_code ec) noexcept {
    if (c_) c_->fail(qp_num, false, ec);
  }
  /// Acknowledge every event taken so far (also done by close()).
  void ack() noexcept {
    if (c_) c_->ack();
  }

  /// Stop: deregister the channel's fd, acknowledge every event taken, fail every waiter with
  /// errc::null_handle, give the channel's fd its flags back. Call before the CQ and channel are
  /// destroyed. Idempotent.
  void close() noexcept {
    detail::router_core *c = std::exchange(c_, nullptr);
    if (!c) return;
    c->open = false;
    boost::system::error_code ignored;
    c->sd.cancel(ignored);
    (void)c->sd.release(); // the channel owns its fd
    c->timer.cancel();
    c->timer_set = false;
    if (c->fd_flags >= 0) (void)::fcntl(c->ch->fd(), F_SETFL, c->fd_flags);
    c->ack();
    c->n_pools = 0;
    c->fail(0, true, make_error_code(errc::null_handle));
    detail::router_core::unref(c);
  }

private:
  Route make_route(const void *obj, bool pool) noexcept;
  friend class Waiter;
  friend task<result<void>> settled(CompletionRouter &, const GrantPool &, const GrantLease &, std::uint32_t,
                                    deadline);
  template <::rdmaxx::detail::settle_type T>
    requires(!std::same_as<T, GrantLease>)
  friend task<result<void>> settled(CompletionRouter &, const T &, std::uint32_t, deadline);
  detail::router_core *c_ = nullptr;
};

inline Route CompletionRouter::make_route(const void *obj, bool pool) noexcept {
  c_->refs.add();
  // The core stays until the route ends; a closed router's tables are empty already.
  if (pool)
    return ::rdmaxx::detail::route_access::make(c_, obj, [](void *p, const void *o) noexcept {
      auto *c = static_cast<detail::router_core *>(p);
      c->remove_pool(o);
      detail::router_core::unref(c);
    });
  return ::rdmaxx::detail::route_access::make(c_, obj, [](void *p, const void *o) noexcept {
    auto *c = static_cast<detail::router_core *>(p);
    c->targets.remove(o);
    detail::router_core::unref(c);
  });
}


inline result<CompletionRouter> CompletionRouter::create(const net::any_io_executor &ex, CompletionQueue &cq,
                                                       CompletionChannel &ch, router_options o) noexcept {
  if (!cq || !ch) return make_error_code(errc::null_handle);
  if (cq.native_handle()->channel != ch.native_handle() || o.ack_batch == 0 || o.ack_batch > 1024 ||
      o.buckets == 0)
    return make_error_code(errc::invalid_argument);
  std::size_t nb = 1;
  while (nb < o.buckets) nb <<= 1;
  CompletionRouter r;
  r.c_ = new (std::nothrow) detail::router_core(ex);
  if (!r.c_) return std::make_error_code(std::errc::not_enough_memory);
  detail::router_core &c = *r.c_;
  c.buckets.reset(new (std::nothrow) detail::waiter_node *[nb]());
  c.pools.reset(new (std::nothrow) detail::pool_entry[o.max_pools ? o.max_pools : 1]());
  if (!c.buckets || !c.pools || !c.targets.allocate(o.max_targets))
    return std::make_error_code(std::errc::not_enough_memory);
  c.mask = nb - 1;
  c.max_pools = o.max_pools;
  c.ack_batch = o.ack_batch;
  c.cq = &cq;
  c.ch = &ch;
  const int fl = ::fcntl(ch.fd(), F_GETFL);
  if (fl < 0 || ::fcntl(ch.fd(), F_SETFL, fl | O_NONBLOCK) < 0) return last_errno();
  c.fd_flags = fl;
  boost::system::error_code ec;
  c.sd.assign(ch.fd(), ec);
  if (ec) return from_asio(ec);
  return r; // the fd is waited for once a wait suspends

}


/// The completion of one work request (by wr_id) on a router's CQ. Registered from
/// construction to destruction (construct it before posting: a completion that arrives before
/// wait() is kept). Not movable: it is linked into the router's table (keep it in the
/// coroutine's frame or in a fixed array). At most one waiter per (QP, wr_id) at a time; a
/// completion of another QP with the same wr_id (an old QP's flush after a reconnect) does not
/// wake it and counts as unclaimed.
class Waiter {
public:
  /// Register for `wr_id` of QP `qp_num`: only that QP's completion with that wr_id wakes it,
  /// and watch() fails it on that QP's disconnect.
  Waiter(CompletionRouter &r, std::uint64_t wr_id, std::uint32_t qp_num) noexcept {
    n_.wr_id = wr_id;
    n_.qp_num = qp_num;
    n_.core = r.c_;
    if (n_.core && n_.core->open) n_.core->link(n_);
    else n_.failed = make_error_code(errc::null_handle);
  }
  /// Register for `wr_id` of `qp` (its QP number; a null QP: wait() fails with
  /// errc::null_handle).
  Waiter(CompletionRouter &r, std::uint64_t wr_id, const QueuePair &qp) noexcept
      : Waiter(r, wr_id, qp ? qp.qp_num() : 0) {
    if (!qp && !n_.failed) n_.failed = make_error_code(errc::null_handle);
  }
  Waiter(const Waiter &) = delete;
  Waiter &operator=(const Waiter &) = delete;
  ~Waiter() {
    if (n_.core) n_.core->unlink(n_);
  }

  /// True once the completion arrived (wait() then returns at once).
  [[nodiscard]] bool done() const noexcept { return n_.done; }
  /// Forget the completion taken and wait for the next one of the same wr_id (a receive slot
  /// posted again). A failure stays.
  void rearm() noexcept { n_.done = false; }
  /// Fail this waiter with `ec` (its post failed, say): wait() returns `ec`, now or at once
  /// if it is suspended. A completion already taken, or an earlier failure, stays.
  /// \mallocs None, or for a suspended wait the post of the router's flush that resumes it
  ///   (Asio's operation, recycled per thread).
  void fail(std::error_code ec) noexcept {
    if (n_.done || n_.failed) return;
    n_.failed = ec;
    if (n_.core) n_.core->wake(n_);
  }

  /// The completion (any status: check wc.status, or wc_error()), or why none: errc::timeout at
  /// `until` (the work request is still outstanding: revoke what it was granted), the error
  /// watch() or CompletionRouter::fail() gave for the QP, or a failed channel/poll:
  /// errc::invalid_argument when the channel delivered another CQ's event (it must serve only
  /// the router's CQ: give the other CQ a channel of its own; the router has stopped), or
  /// errc::null_handle once the router is closed (also for a wait after rearm()).
  /// Polls the CQ first, at the call (and arms it, polling again, if it was not armed): a
  /// completion that is already there returns without suspending. co_await the result at once.
  /// \mallocs Asio's coroutine frames (recycled per thread): one per call, the frame of the
  ///   Asio operation a suspending wait is (its handler is handed the result) or of the ready value.
  task<result<ibv_wc>> wait(deadline until);

  /// The next successful completion of this wr_id: wait(until), then rearm() (the Waiter is
  /// ready for the next one, e.g. a receive posted again), with a completion of failed status
  /// returned as its error (wc_error(wc)). The loop form of wait().
  /// \errors Those of wait(); wc_error(wc) of a failed completion (flushed included).
  /// \mallocs As wait(), and this coroutine's frame (recycled per thread).
  task<result<ibv_wc>> next(deadline until) {
    auto r = co_await wait(until);
    if (n_.done) rearm();
    if (!r) co_return r.error();
    if (auto ec = wc_error(r.value())) co_return ec;
    co_return r.value();
  }

private:
  detail::waiter_node n_;
};

inline task<result<ibv_wc>> Waiter::wait(deadline until) {
  // Closed or stopped after this Waiter took a completion (and rearm()): nothing will route
  // another, and fail() passed it by.
  if (!n_.done && !n_.failed && (!n_.core->open || n_.core->error))
    n_.failed = n_.core->open ? n_.core->error : make_error_code(errc::null_handle);
  if (!n_.done && !n_.failed) n_.core->poll_now([this] { return n_.done || bool(n_.failed); });
  if (n_.done || n_.failed) return detail::ready_value(detail::wait_result(n_));
  // Nothing yet: suspend until routed, failed or `until` (suspend() re-checks: the state may
  // have changed before the caller's co_await ran the initiation).
  return net::async_initiate<decltype(net::use_awaitable), void(result<ibv_wc>)>(
      [this, until](auto h) {
        n_.until = until;
        n_.expired = false;
        n_.core->suspend(n_, [h = std::move(h), n = &n_]() mutable { std::move(h)(detail::wait_result(*n)); });
      },
      net::use_awaitable);
}



/// Wait until `lease`'s revocation (GrantPool::revoke) is confirmed (lease_state::ready): its
/// pool must be attached to `r`. `qp_num`: the connection whose failure ends the wait.
/// \errors
/// - errc::null_handle: a null router or lease (or the router closed).
/// - errc::timeout: not confirmed by `until`.
/// - the connection's error (watch(), CompletionRouter::fail()): the lease may stay unready:
///   call GrantPool::revoke_all() once the QP's completions were polled.
/// - the router's error once it stopped: errc::invalid_argument (the channel delivered another
///   CQ's event), or the errno of a failed poll, arm or event read.
/// \mallocs Asio's coroutine frames.
inline task<result<void>> settled(CompletionRouter &r, const GrantPool &pool, const GrantLease &lease,
                                  std::uint32_t qp_num, deadline until) {
  if (!r.c_ || !lease) co_return make_error_code(errc::null_handle);
  r.c_->poll_now([&] { return lease.state() == lease_state::ready; }); // a local revoke, often
  if (lease.state() == lease_state::ready) co_return success();
  detail::waiter_node n;
  n.what = detail::waiter_node::kind::lease;
  n.pool = &pool;
  n.lease = &lease;
  n.qp_num = qp_num;
  n.core = r.c_;
  detail::router_core *core = r.c_;
  core->link(n);
  struct unlink_at_end { // also when the frame is destroyed suspended (the io_context destroyed)
    detail::router_core *c;
    detail::waiter_node &n;
    ~unlink_at_end() { c->unlink(n); }
  } g{core, n};
  co_await detail::suspend_on(*core, n, until);
  if (n.done || lease.state() == lease_state::ready) co_return success();
  if (n.failed) co_return n.failed;
  co_return make_error_code(errc::timeout);
}

/// GrantPool::revoke(qp, lease), then settled(): the co_await form that returns once the
/// revocation is confirmed (the peer's access with the old key refused from then on) and the
/// lease's buffer is the program's again. `pool` must be attached to `r` (route() or attach()).
/// A lease already revoked or never granted returns at once.
/// \errors
/// - those of GrantPool::revoke (nothing was posted; the lease keeps its state);
/// - those of settled() for a lease: on errc::timeout or the connection's error the grant may
///   still be live: GrantPool::revoke_all() once the QP's completions were polled (or the QP
///   reset).
/// \mallocs As settled().
inline task<result<void>> revoke(CompletionRouter &r, GrantPool &pool, QueuePair &qp, GrantLease &lease,
                                 deadline until) {
  RDMAXX_CO_TRYV(pool.revoke(qp, lease));
  co_return co_await settled(r, pool, lease, qp.qp_num(), until);
}

/// Wait until `obj` (a MemoryWindow, StrictGrant or IndirectKey attached to `r`) has no
/// unconfirmed operation: the co_await twin of CompletionDispatcher::settle. Post the operation
/// (grant, revoke, configure, invalidate), then `co_await settled(r, obj, qp_num, until)`.
/// `qp_num`: the connection whose failure ends the wait.
/// \errors
/// - errc::null_handle: a null router or object (or the router closed).
/// - errc::wrong_state: `obj` is not attached to `r`: nothing could confirm it.
/// - wc_error(wc) of `obj`'s failed completion (flushed included): the object was rolled back to
///   the state before that operation.
/// - errc::timeout: not confirmed by `until` (the operation may still execute).
/// - the connection's error (watch(), CompletionRouter::fail()).
/// - the router's error once it stopped (see settled() of a lease).
/// \mallocs Asio's coroutine frames.
template <::rdmaxx::detail::settle_type T>
  requires(!std::same_as<T, GrantLease>)
task<result<void>> settled(CompletionRouter &r, const T &obj, std::uint32_t qp_num, deadline until) {
  if (!r.c_ || !obj) co_return make_error_code(errc::null_handle);
  const void *key = ::rdmaxx::detail::target_ops<T>::key(obj);
  if (!r.c_->targets.contains(key)) co_return make_error_code(errc::wrong_state);
  detail::waiter_node n;
  n.what = detail::waiter_node::kind::object;
  n.obj = &obj;
  n.key = key;
  n.unconfirmed = [](const void *o) noexcept { return ::rdmaxx::detail::target_ops<T>::unconfirmed(*static_cast<const T *>(o)); };
  n.qp_num = qp_num;
  n.core = r.c_;
  detail::router_core *core = r.c_;
  core->link(n); // before polling: a failed completion polled now reaches this waiter
  struct unlink_at_end {
    detail::router_core *c;
    detail::waiter_node &n;
    ~unlink_at_end() { c->unlink(n); }
  } g{core, n};
  core->poll_now([&] { return !n.unconfirmed(n.obj) || bool(n.failed); });
  if (!n.failed && !n.unconfirmed(n.obj)) co_return success();
  if (!n.failed) co_await detail::suspend_on(*core, n, until);
  if (n.failed) co_return n.failed;
  if (n.done || !n.unconfirmed(n.obj)) co_return success();
  co_return make_error_code(errc::timeout);
}

namespace detail {
template <class W>
task<std::error_code> watch_with(W w, Connection &c, CompletionRouter &r, watch_stop &stop) {
  stop_access::running on{stop}; // idle() again once this frame is gone
  // A refused input fails nobody: only a wait that failed on a served connection does.
  if (wrong_channel<W>(c)) co_return make_error_code(errc::invalid_argument);
  const std::uint32_t qpn = c.qp().qp_num();
  for (;;) {
    // No deadline: woken by the connection's next event or by stop() (no timer, no polling).
    // Disconnected already (another advance() took the event): no event will wake a wait.
    auto s = stop.stopped() || c.state() == conn_state::disconnected
                 ? c.advance()
                 : co_await advance_with(w, c, deadline::max(), &stop);
    std::error_code ec;
    if (!s) ec = s.error();
    else if (s.value() == conn_state::disconnected) ec = cm_error(RDMA_CM_EVENT_DISCONNECTED, 0);
    if (ec) {
      r.fail(qpn, ec);
      co_return ec;
    }
    if (stop.stopped()) co_return std::error_code{};
  }
}
} // namespace detail

/// Watch `c` until it disconnects or fails, then fail every waiter of its QP on `r` with the
/// connection's error (DISCONNECTED: a cm code equal to std::errc::connection_reset), and return
/// that error. Run it as its own coroutine (co_spawn) per connection; it waits on the
/// connection's fd with no timer. `stop.stop()` ends it at once: it then returns an empty
/// error_code (`stop.idle()` turns true when it has returned: `co_await stop.wait_idle()` before
/// destroying `c`).
/// A connection disconnected already when the watch starts fails its waiters at once.
/// \errors The connection's, as above; those of advance(). errc::invalid_argument: the
/// connection is on a shared EventChannel (use watch(pump, ...)); refused before anything is
/// done, its waiters untouched. When the watch's own wait fails (the fd cannot be registered:
/// another wait on it), the waiters are failed with that error too: nothing would report the
/// disconnect any more.
/// \mallocs As advance(), per rdma_cm event.
inline task<std::error_code> watch(Connection &c, CompletionRouter &r, watch_stop &stop) {
  return detail::watch_with(detail::own_channel{}, c, r, stop);
}

/// Wait until the peer ends `c` (its DISCONNECTED event): the last step of a server's coroutine
/// whose client leaves when it is done. Then every waiter of the QP on `r` fails with the
/// connection's error, as watch() does, and the wait returns success. The connection's own fd is
/// waited on, at most until `until`.
/// \errors
/// - errc::null_handle: a null connection.
/// - errc::timeout: still connected at `until` (nothing was failed).
/// - errc::invalid_argument: on a shared EventChannel (use watch(pump, ...)).
/// - those of advance() (a connection that fails otherwise, e.g. an rdma_cm error event).
/// \mallocs As advance(), per rdma_cm event.
inline task<result<void>> disconnected(Connection &c, CompletionRouter &r, deadline until) {
  if (!c) co_return make_error_code(errc::null_handle);
  const std::uint32_t qpn = c.qp() ? c.qp().qp_num() : 0;
  while (c.state() != conn_state::disconnected) {
    if (clock::now() >= until) co_return make_error_code(errc::timeout);
    RDMAXX_CO_TRYV(co_await advance(c, until));
  }
  r.fail(qpn, cm_error(RDMA_CM_EVENT_DISCONNECTED, 0));
  co_return success();
}

} // namespace rdmaxx::asio
