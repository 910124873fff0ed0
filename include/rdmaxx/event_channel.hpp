/// \file
/// rdmaxx/event_channel.hpp: EventChannel, an rdma_cm event channel (rdma_create_event_channel(3))
/// with a non-blocking fd, and the machinery the rdma_cm handles share: the traits of the channel
/// and of an rdma_cm_id, one event copied and acknowledged at once (rdma_get_cm_event(3),
/// rdma_ack_cm_event(3)), and a bounded wait for a readable fd. Part of the rdma_cm support
/// (connection.hpp; needs librdmacm).
///
/// Allocation: create() allocates inside librdmacm; rdma_get_cm_event mallocs one event.
#pragma once

#include "cm_address.hpp" // cm_private_data
#include "detail/clock.hpp"
#include "detail/handle.hpp"
#include "error.hpp"

#include <rdma/rdma_cma.h>

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

namespace rdmaxx {

namespace detail {
struct cm_channel_traits {
  using native = rdma_event_channel;
  static constexpr const char *object = "EventChannel";
  static constexpr const char *verb = "rdma_destroy_event_channel";
  static int destroy(native *c) noexcept {
    ::rdma_destroy_event_channel(c);
    return 0;
  }
};
struct cm_id_traits {
  using native = rdma_cm_id;
  static constexpr const char *object = "rdma_cm_id";
  static constexpr const char *verb = "rdma_destroy_id";
  static int destroy(native *id) noexcept { return ::rdma_destroy_id(id) ? (errno ? errno : EIO) : 0; }
};

// One event, copied; the original is acknowledged before this returns.
struct cm_event_copy {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id *id = nullptr;     // the event's id (for CONNECT_REQUEST: the new id)
  rdma_cm_id *listen_id = nullptr;
  cm_private_data data;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
};

// rdma_get_cm_event on a non-blocking channel: nullopt when no event is pending.
[[nodiscard]] inline result<std::optional<cm_event_copy>> next_cm_event(rdma_event_channel *ch) noexcept {
  rdma_cm_event *ev = nullptr;
  if (::rdma_get_cm_event(ch, &ev)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::optional<cm_event_copy>{};
    return last_errno();
  }
  cm_event_copy c;
  c.type = ev->event;
  c.status = ev->status;
  c.id = ev->id;
  c.listen_id = ev->listen_id;
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
  return std::optional<cm_event_copy>{c};
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
} // namespace detail

/// An rdma_cm event channel (rdma_create_event_channel(3)) with a non-blocking fd for
/// poll(2)/epoll(7). Listener and Connection own one each; it is public for native use.
class EventChannel {
public:
  EventChannel() noexcept = default;
  /// rdma_create_event_channel, then O_NONBLOCK on its fd.
  /// \errors
  /// - errno: ENODEV (no rdma_cm support in the kernel, i.e. rdma_ucm not loaded); EMFILE,
  ///   ENOMEM.
  /// \mallocs What rdma_create_event_channel allocates (librdmacm).
  [[nodiscard]] static result<EventChannel> create() noexcept;
  /// The channel (owned), or nullptr.
  [[nodiscard]] rdma_event_channel *native_handle() const noexcept { return h_.get(); }
  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The non-blocking fd (readable when an event is pending), or -1 when null.
  [[nodiscard]] int fd() const noexcept { return h_ ? h_.get()->fd : -1; }
  /// Destroy now, checked (rdma_destroy_event_channel, which cannot fail; the destructor does the
  /// same). Null afterwards; nothing to do when null.
  /// \errors None.
  /// \mallocs None.
  result<void> destroy() noexcept { return h_.destroy(); }

private:
  detail::handle<detail::cm_channel_traits> h_;
};

// ---- EventChannel: the longer bodies ----

inline result<EventChannel> EventChannel::create() noexcept {
  errno = 0;
  rdma_event_channel *ch = ::rdma_create_event_channel();
  if (!ch) return errno ? last_errno() : std::make_error_code(std::errc::no_such_device);
  const int fl = ::fcntl(ch->fd, F_GETFL);
  if (fl < 0 || ::fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    const auto ec = last_errno();
    ::rdma_destroy_event_channel(ch);
    return ec;
  }
  EventChannel c;
  c.h_ = detail::handle<detail::cm_channel_traits>(ch, nullptr, nullptr);
  return c;
}

} // namespace rdmaxx
