/// \file
/// rdmaxx/event_channel.hpp: EventChannel, an rdma_cm event channel (rdma_create_event_channel(3))
/// with a non-blocking fd that many Connections and Listeners can share, and the machinery the
/// rdma_cm handles share: the traits of the channel and of an rdma_cm_id, one event copied and
/// acknowledged at once (rdma_get_cm_event(3), rdma_ack_cm_event(3)), the demultiplexer of a
/// shared channel and a bounded wait for a readable fd. Part of the rdma_cm support
/// (connection.hpp; needs librdmacm).
///
/// A shared channel (conn_options::channel, listen_options::channel): every rdma_cm_id on it has
/// as its context a small heap node of the Connection or Listener that owns it (detail::cm_slot),
/// so that the handle can move. Events are read from the one fd by whoever pumps it (dispatch(),
/// or any user's advance() / get_request()), copied and acknowledged at once, and queued in the
/// node of the id they belong to (CONNECT_REQUEST: of the listening id); a user with queued
/// events is put on the channel's ready list, which dispatch() hands out (cookies) in O(events).
///
/// Allocation: create() allocates the channel's node (children counter and ready list) besides
/// what librdmacm allocates; each user of a shared channel allocates one node at its creation;
/// rdma_get_cm_event mallocs one event; nothing else allocates per event.
#pragma once

#include "cm_address.hpp" // cm_private_data
#include "detail/clock.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "maybe.hpp"

#include <rdma/rdma_cma.h>

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <utility>

namespace rdmaxx {

namespace detail {
using cm_channel_traits = deleter<rdma_event_channel, ::rdma_destroy_event_channel, "EventChannel",
                                  "rdma_destroy_event_channel", 1, destroy_returns::nothing>;
using cm_id_traits = deleter<rdma_cm_id, ::rdma_destroy_id, "rdma_cm_id", "rdma_destroy_id", 1,
                             destroy_returns::minus_one_errno>;
/// A Listener's own channel: the requests taken from it are its children (their ids are on it)
/// and may outlive the listener by design, so its deferred destruction is not reported.
struct cm_listen_channel_traits : cm_channel_traits {
  static constexpr bool report_deferral = false;
};

// One event, copied; the original is acknowledged before this returns.
struct cm_event_copy {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id *id = nullptr;     // the event's id (for CONNECT_REQUEST: the new id)
  rdma_cm_id *listen_id = nullptr;
  void *context = nullptr;      // the context of the id (CONNECT_REQUEST: of the listening id)
  cm_private_data data;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
};

// rdma_get_cm_event on a non-blocking channel: empty when no event is pending.
[[nodiscard]] inline result<maybe<cm_event_copy>> next_cm_event(rdma_event_channel *ch) noexcept {
  rdma_cm_event *ev = nullptr;
  if (::rdma_get_cm_event(ch, &ev)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return maybe<cm_event_copy>{};
    return last_errno();
  }
  cm_event_copy c;
  c.type = ev->event;
  c.status = ev->status;
  c.id = ev->id;
  c.listen_id = ev->listen_id;
  const rdma_cm_id *owner = c.type == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id ? ev->listen_id : ev->id;
  c.context = owner ? owner->context : nullptr;
  if (c.type == RDMA_CM_EVENT_CONNECT_REQUEST || c.type == RDMA_CM_EVENT_CONNECT_RESPONSE ||
      c.type == RDMA_CM_EVENT_ESTABLISHED || c.type == RDMA_CM_EVENT_REJECTED ||
      c.type == RDMA_CM_EVENT_DISCONNECTED) {
    const rdma_conn_param &p = ev->param.conn;
    const std::size_t n = p.private_data && p.private_data_len
                              ? (p.private_data_len < c.data.bytes.size() ? p.private_data_len
                                                                          : c.data.bytes.size())
                              : 0;
    if (n) std::memcpy(c.data.bytes.data(), p.private_data, n);
    c.data.size = std::uint8_t(n);
    c.responder_resources = p.responder_resources;
    c.initiator_depth = p.initiator_depth;
  }
  ::rdma_ack_cm_event(ev);
  return maybe<cm_event_copy>{c};
}

// Wait until `fd` is readable or the deadline passes; false on timeout.
[[nodiscard]] inline result<bool> wait_readable(int fd, std::int64_t deadline_ms) noexcept {
  for (;;) {
    const std::int64_t left = deadline_ms - monotonic_ms();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, int(left > 1000000 ? 1000000 : left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return last_errno();
  }
}

// ---- the demultiplexer of a shared channel ----

struct cm_hub;

/// One user (a Connection or a Listener) of a shared channel: its rdma_cm_id's context. On the
/// heap so that the handle can move; the user's events wait here until it takes them.
struct cm_slot {
  /// Events a Connection can have waiting at once: rdma_cm reports at most three before the
  /// connection must act (its step's outcome, DISCONNECTED, DEVICE_REMOVAL); TIMEWAIT_EXIT and
  /// ADDR_CHANGE, which change nothing for a Connection, are not queued.
  static constexpr std::uint32_t connection_queue = 4;
  /// Connect requests a Listener keeps queued at most (its backlog, up to this).
  static constexpr std::uint32_t max_listener_queue = 4096;

  cm_hub *hub = nullptr;
  cm_slot *prev = nullptr, *next = nullptr; // the hub's ready list
  bool ready = false;                       // on the ready list
  bool listener = false;                    // takes CONNECT_REQUESTs only
  bool overflow = false;                    // an event found the queue full (never by rdma_cm's protocol)
  std::uint64_t cookie = 0;                 // what dispatch() hands out
  std::uint32_t cap = connection_queue, head = 0, count = 0;
  cm_event_copy *q = inline_q;              // cap events: inline_q, or an array (a Listener's)
  cm_event_copy inline_q[connection_queue];

  cm_slot() noexcept = default;
  cm_slot(const cm_slot &) = delete;
  cm_slot &operator=(const cm_slot &) = delete;
};

/// The shared channel: the rdma_cm channel and the ready list of its users (oldest first).
struct cm_hub {
  rdma_event_channel *ch = nullptr;
  cm_slot *first = nullptr, *last = nullptr;
};

// A shared channel's end: its rdma_cm channel, then the hub itself.
inline void destroy_hub(cm_hub *h) noexcept {
  ::rdma_destroy_event_channel(h->ch);
  delete h;
}
using cm_hub_traits = deleter<cm_hub, destroy_hub, "EventChannel", "rdma_destroy_event_channel", 1,
                              destroy_returns::nothing>;

/// Events one pump reads at most (the fd stays readable when more are pending).
inline constexpr std::size_t cm_pump_batch = 256;

inline void cm_mark(cm_slot &s) noexcept {
  if (s.ready) return;
  cm_hub &h = *s.hub;
  s.ready = true;
  s.next = nullptr;
  s.prev = h.last;
  (h.last ? h.last->next : h.first) = &s;
  h.last = &s;
}
inline void cm_unmark(cm_slot &s) noexcept {
  if (!s.ready) return;
  cm_hub &h = *s.hub;
  (s.prev ? s.prev->next : h.first) = s.next;
  (s.next ? s.next->prev : h.last) = s.prev;
  s.prev = s.next = nullptr;
  s.ready = false;
}

// The oldest queued event of `s`; unmarks `s` when it was the last one.
inline cm_event_copy cm_pop(cm_slot &s) noexcept {
  cm_event_copy e = s.q[s.head];
  s.head = (s.head + 1) % s.cap;
  if (--s.count == 0) cm_unmark(s);
  return e;
}

// Queue `e` for the user its id belongs to. A CONNECT_REQUEST's new id is ours to dispose of
// until a Listener has it: refused (rdma_destroy_id: the client sees a reject, as when the
// kernel's backlog is full) when no listener of this channel takes it.
inline void cm_route(cm_hub &h, const cm_event_copy &e) noexcept {
  cm_slot *s = static_cast<cm_slot *>(e.context);
  const bool request = e.type == RDMA_CM_EVENT_CONNECT_REQUEST;
  if (request) {
    if (!s || !s->listener || s->count == s->cap) {
      (void)::rdma_destroy_id(e.id);
      return;
    }
    // The new id inherited the listener's context: later events of it (a request that goes away
    // before it is accepted) are dropped, as Listener::get_request skips them on its own channel.
    e.id->context = nullptr;
  } else if (!s || s->listener || e.type == RDMA_CM_EVENT_TIMEWAIT_EXIT || e.type == RDMA_CM_EVENT_ADDR_CHANGE) {
    return; // no user (its id was handed on), or nothing a Connection acts on
  } else if (s->count == s->cap) {
    s->overflow = true;
    return;
  }
  (void)h;
  s->q[(s->head + s->count) % s->cap] = e;
  ++s->count;
  cm_mark(*s);
}

// Read up to `max` events of the hub's channel and queue each for its user; the count read.
[[nodiscard]] inline result<std::size_t> cm_pump(cm_hub &h, std::size_t max) noexcept {
  std::size_t n = 0;
  for (; n < max; ++n) {
    RDMAXX_TRY(ev, next_cm_event(h.ch));
    if (!ev) break;
    cm_route(h, *ev);
  }
  return n;
}

// The next event of `s`, pumping its hub when none waits; empty when none is pending.
[[nodiscard]] inline result<maybe<cm_event_copy>> cm_next(cm_slot &s) noexcept {
  if (!s.count) RDMAXX_TRYV(cm_pump(*s.hub, cm_pump_batch));
  if (!s.count) return maybe<cm_event_copy>{};
  return maybe<cm_event_copy>{cm_pop(s)};
}

/// A user's slot, owned: freed (off the ready list; a Listener's queued requests refused with
/// rdma_destroy_id) on destruction. Move-only, null after move.
class cm_slot_ptr {
public:
  cm_slot_ptr() noexcept = default;
  cm_slot_ptr(cm_slot_ptr &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  cm_slot_ptr &operator=(cm_slot_ptr &&o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~cm_slot_ptr() { reset(); }
  /// A slot on `h` (a Listener's with a queue of `listener_queue` requests, else a Connection's);
  /// null when out of memory.
  [[nodiscard]] static cm_slot_ptr make(cm_hub &h, std::uint64_t cookie, std::uint32_t listener_queue = 0) noexcept;
  [[nodiscard]] cm_slot *get() const noexcept { return p_; }
  [[nodiscard]] explicit operator bool() const noexcept { return p_ != nullptr; }
  void reset() noexcept {
    cm_slot *s = std::exchange(p_, nullptr);
    if (!s) return;
    cm_unmark(*s);
    if (s->listener) {
      for (std::uint32_t i = 0; i < s->count; ++i) (void)::rdma_destroy_id(s->q[(s->head + i) % s->cap].id);
      delete[] s->q;
    }
    delete s;
  }

private:
  cm_slot *p_ = nullptr;
};

// rdma_create_event_channel, then O_NONBLOCK on its fd.
[[nodiscard]] inline result<handle<cm_channel_traits>> create_cm_channel() noexcept {
  errno = 0;
  rdma_event_channel *ch = ::rdma_create_event_channel();
  if (!ch) return errno ? last_errno() : std::make_error_code(std::errc::no_such_device);
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    const auto ec = last_errno();
    ::rdma_destroy_event_channel(ch);
    return ec;
  }
  return handle<cm_channel_traits>(ch, nullptr, nullptr);
}

struct channel_access; // after EventChannel
} // namespace detail

/// An rdma_cm event channel (rdma_create_event_channel(3)) with a non-blocking fd for
/// poll(2)/epoll(7), to be shared by many Connections and Listeners (conn_options::channel,
/// listen_options::channel; also for the connections ConnectRequest::prepare() accepts), so that
/// a server holds one cm fd whatever the number of connections. Without it each Listener and
/// Connection has a channel of its own (not an EventChannel: no node, no ready list).
///
/// The loop of a server: wait for fd() to be readable, call dispatch() to learn which users have
/// events queued (their cookies), advance() those connections / get_request(0) those listeners,
/// and call dispatch() again before waiting while has_ready() (an advance() that stops early, or
/// that read other users' events from the fd, leaves them queued, not in the fd).
///
/// Lifetime: the parent of its users: Connections, Listeners and the ConnectRequests a Listener
/// on it handed out (live_children()); destroy() refuses with errc::busy while any is alive, and
/// the destructor then defers the destruction to the last of them (reported through the
/// destroy-failure hook, detail/handle.hpp). Move-only, null after move; its users keep working
/// when it moves.
///
/// Threads: the channel and all its users are used by one thread at a time (they share the
/// queues).
class EventChannel {
public:
  EventChannel() noexcept = default;
  /// rdma_create_event_channel, then O_NONBLOCK on its fd.
  /// \errors
  /// - errno: ENODEV (no rdma_cm support in the kernel, i.e. rdma_ucm not loaded); EMFILE,
  ///   ENOMEM (also: no memory for the channel's node).
  /// \mallocs The channel's node (children counter, ready list; new(nothrow)) besides what
  /// rdma_create_event_channel allocates (librdmacm).
  [[nodiscard]] static result<EventChannel> create() noexcept;
  /// The channel (owned), or nullptr.
  [[nodiscard]] rdma_event_channel *native_handle() const noexcept { return h_ ? h_.get()->ch : nullptr; }
  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The non-blocking fd (readable when an event is pending), or -1 when null.
  [[nodiscard]] int fd() const noexcept { return h_ ? h_.get()->ch->fd : -1; }
  /// Connections, Listeners and ConnectRequests that use this channel.
  [[nodiscard]] std::uint32_t live_children() const noexcept { return h_.live_children(); }
  /// True when some user has events queued that dispatch() has not handed out yet: call
  /// dispatch() again before waiting on fd().
  [[nodiscard]] bool has_ready() const noexcept { return h_ && h_.get()->first != nullptr; }
  /// Read the pending events (rdma_get_cm_event, up to 256 a call: the fd stays readable if
  /// there are more), each copied and acknowledged at once (rdma_ack_cm_event), queue each for
  /// the Connection or Listener whose rdma_cm_id it belongs to (a CONNECT_REQUEST: the
  /// listening id's), and write into `ready` the cookies (conn_options::cookie,
  /// listen_options::cookie) of users with queued events, each once, oldest first, at most
  /// ready.size() (has_ready(): more are left for the next call). O(events + cookies written):
  /// no user is visited that has none. Then advance() those connections and get_request(0)
  /// those listeners. Dropped, as on a channel of one's own: TIMEWAIT_EXIT and ADDR_CHANGE
  /// (Connection::advance ignores them), events of a request not accepted yet, of a destroyed
  /// user (rdma_destroy_id removes those still in the kernel; those queued go with the user);
  /// a CONNECT_REQUEST no Listener of the channel can queue (its backlog is full) is refused
  /// (rdma_destroy_id: the client sees a reject).
  /// \errors
  /// - errc::null_handle: the channel is null.
  /// - the errno of rdma_get_cm_event (events read before it stay queued; nothing is lost).
  /// \mallocs One event per rdma_get_cm_event (malloc, inside librdmacm); nothing else.
  [[nodiscard]] result<std::size_t> dispatch(std::span<std::uint64_t> ready) noexcept;
  /// Destroy now, checked (rdma_destroy_event_channel, which cannot fail; the destructor does
  /// the same, deferred while users are alive). Null afterwards; nothing to do when null.
  /// \errors
  /// - errc::busy: Connections, Listeners or ConnectRequests still use the channel
  ///   (live_children()); nothing is destroyed: destroy them first.
  /// \mallocs None.
  result<void> destroy() noexcept { return h_.destroy(); }

private:
  friend struct detail::handle_access;  // users register with this object's node
  friend struct detail::channel_access; // users reach the hub
  detail::handle<detail::cm_hub_traits> h_;
};

namespace detail {
/// What the users of a shared channel (Connection, Listener) reach of it: its hub.
struct channel_access {
  [[nodiscard]] static cm_hub *hub(const EventChannel &c) noexcept { return c.h_.get(); }
};
} // namespace detail

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/event_channel.ipp"
