/// \file
/// rdmaxx/cm_error.hpp: the error category of rdma_cm failures (cm_category(): an event that ended a
/// step, a step past its deadline, a librdmacm call that failed), the codes' helpers and
/// rdma_cm's private-data limits. Part of the rdma_cm support (connection.hpp; needs librdmacm).
///
/// Allocation: none, except message() (a std::string).
#pragma once

#include "detail/atomic.hpp"
#include "error.hpp"

#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

namespace rdmaxx {

// ---------------------------------------------------------------------------------------------
// errors

/// rdma_cm's private-data limits for RC over RDMA_PS_TCP on InfiniBand and RoCE.
inline constexpr std::size_t cm_connect_private_data_max = 56;
/// The most private data an accept carries (see cm_connect_private_data_max).
inline constexpr std::size_t cm_accept_private_data_max = 196;
/// The most private data a reject carries (see cm_connect_private_data_max).
inline constexpr std::size_t cm_reject_private_data_max = 148;

/// The steps a cm "timeout" code names (the event the step waited for).
enum class cm_step : std::uint8_t {
  resolve_addr = RDMA_CM_EVENT_ADDR_RESOLVED,
  resolve_route = RDMA_CM_EVENT_ROUTE_RESOLVED,
  connect = RDMA_CM_EVENT_CONNECT_RESPONSE,
  accept = RDMA_CM_EVENT_ESTABLISHED,
  disconnect = RDMA_CM_EVENT_DISCONNECTED,
  request = RDMA_CM_EVENT_CONNECT_REQUEST,
};

/// The side a cm code's address is on: what the failing handle was doing with it.
enum class cm_role : std::uint8_t {
  none = 0,        ///< no address recorded
  connect_to = 1,  ///< a Connection connecting to the address (active side)
  accept_from = 2, ///< a connection request or accepted Connection from the address (passive side)
  listen_on = 3,   ///< a Listener on the address
};

/// The librdmacm calls whose failure a cm code names (cm_call_error()).
enum class cm_call : std::uint8_t {
  none = 0,               ///< not a failed call (an event, a timeout, another category)
  rdma_create_id = 1,     ///< rdma_create_id(3)
  rdma_resolve_addr = 2,  ///< rdma_resolve_addr(3); also a wildcard refused before it
  rdma_resolve_route = 3, ///< rdma_resolve_route(3)
  rdma_connect = 4,       ///< rdma_connect(3)
  rdma_establish = 5,     ///< rdma_establish(3)
  rdma_bind_addr = 6,     ///< rdma_bind_addr(3); EADDRINUSE: the port is in use
  rdma_listen = 7,        ///< rdma_listen(3)
  rdma_accept = 8,        ///< rdma_accept(3)
  rdma_reject = 9,        ///< rdma_reject(3)
  rdma_migrate_id = 10,   ///< rdma_migrate_id(3)
  rdma_disconnect = 11,   ///< rdma_disconnect(3)
  rdma_init_qp_attr = 12, ///< rdma_init_qp_attr(3)
  rdma_get_cm_event = 13, ///< rdma_get_cm_event(3) (not named by this header's codes yet)
  rdma_create_event_channel = 14, ///< rdma_create_event_channel(3) (EMFILE: the fd limit)
};

namespace detail {
// value layout: bits 0..7 what: rdma_cm_event_type + 1, 254 a librdmacm call failed, 255 a step
// timed out; bits 8..15 the event's status as a positive number (the reject reason for
// REJECTED, an errno otherwise), the errno of the call, or the cm_step of a timeout; bits
// 16..19 the cm_role; bits 20..23 the cm_call (call failures); bits 24..30 the address slot
// (cm_address_book; 0: none).
inline constexpr int cm_timeout_tag = 255;
inline constexpr int cm_call_tag = 254;

[[nodiscard]] inline const char *cm_call_name(int c) noexcept {
  static const char *const names[] = {"?", "rdma_create_id", "rdma_resolve_addr", "rdma_resolve_route",
                                      "rdma_connect", "rdma_establish", "rdma_bind_addr", "rdma_listen",
                                      "rdma_accept", "rdma_reject", "rdma_migrate_id", "rdma_disconnect",
                                      "rdma_init_qp_attr", "rdma_get_cm_event", "rdma_create_event_channel"};
  return c >= 0 && c <= 14 ? names[c] : "?";
}

// The addresses cm codes name. An error_code holds one int, so a code carries the slot of its
// address in this process-wide book: up to 127 distinct addresses (a process talks to few);
// codes for addresses past that say "address not recorded". Entries are never changed.
struct cm_address_book {
  static constexpr int capacity = 127;
  detail::atomic<bool> lock;
  int n = 0;
  sockaddr_in6 a[capacity]{}; // an AF_INET address is stored in the first 16 bytes
  void acquire() noexcept {
    while (lock.exchange(true, detail::order::acquire)) {}
  }
  void release() noexcept { lock.store(false, detail::order::release); }
};
inline cm_address_book &cm_addresses() noexcept {
  static cm_address_book b;
  return b;
}
// The slot of `sa` (1..127), added if new; 0 for no address or a full book.
[[nodiscard]] inline int cm_address_slot(const sockaddr *sa) noexcept {
  if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) return 0;
  sockaddr_in6 key{};
  std::memcpy(&key, sa, sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  cm_address_book &b = cm_addresses();
  b.acquire();
  int slot = 0;
  for (int i = 0; i < b.n && slot == 0; ++i)
    if (std::memcmp(&b.a[i], &key, sizeof key) == 0) slot = i + 1;
  if (slot == 0 && b.n < cm_address_book::capacity) {
    b.a[b.n] = key;
    slot = ++b.n;
  }
  b.release();
  return slot;
}
// "A.B.C.D:PORT" or "[IPV6]:PORT" of a slot (allocates; message() only).
[[nodiscard]] inline std::string cm_address_text(int slot) {
  cm_address_book &b = cm_addresses();
  sockaddr_in6 a{};
  b.acquire();
  const bool known = slot >= 1 && slot <= b.n;
  if (known) a = b.a[slot - 1];
  b.release();
  if (!known) return "(address not recorded)";
  char buf[INET6_ADDRSTRLEN] = {};
  char text[INET6_ADDRSTRLEN + 16]; // snprintf, not to_string and string +: cheaper to compile
  if (a.sin6_family == AF_INET) {
    sockaddr_in v4{};
    std::memcpy(&v4, &a, sizeof v4);
    ::inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof buf);
    std::snprintf(text, sizeof text, "%s:%u", buf, unsigned(ntohs(v4.sin_port)));
    return text;
  }
  ::inet_ntop(AF_INET6, &a.sin6_addr, buf, sizeof buf);
  std::snprintf(text, sizeof text, "[%s]:%u", buf, unsigned(ntohs(a.sin6_port)));
  return text;
}
[[nodiscard]] inline bool cm_is_wildcard(const sockaddr *sa) noexcept {
  if (sa->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in *>(sa)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (sa->sa_family == AF_INET6) {
    const in6_addr &a = reinterpret_cast<const sockaddr_in6 *>(sa)->sin6_addr;
    return IN6_IS_ADDR_UNSPECIFIED(&a);
  }
  return false;
}
// The step an event ends, for the message.
[[nodiscard]] inline const char *cm_event_step(int ev) noexcept {
  switch (static_cast<rdma_cm_event_type>(ev)) {
  case RDMA_CM_EVENT_ADDR_ERROR: return "address resolution: ";
  case RDMA_CM_EVENT_ROUTE_ERROR: return "route resolution: ";
  case RDMA_CM_EVENT_UNREACHABLE:
  case RDMA_CM_EVENT_REJECTED:
  case RDMA_CM_EVENT_CONNECT_ERROR: return "connection setup: ";
  default: return "";
  }
}

[[nodiscard]] inline const char *cm_reject_reason_name(int r) noexcept {
  switch (r) {
  case 1: return "no QP";
  case 3: return "no resources";
  case 4: return "timeout";
  case 5: return "unsupported request";
  case 8: return "invalid service ID (nobody listens on that port)";
  case 10: return "stale connection";
  case 27: return "insufficient responder resources";
  case 28: return "consumer defined (rejected by the peer application)";
  case 35: return "vendor option not supported";
  default: return "see the IBTA CM REJ reason table";
  }
}

class cm_category_impl final : public retry_hinted_category {
public:
  cm_category_impl() noexcept { register_retry_hinted(*this); }
  const char *name() const noexcept override { return "rdmaxx.cm"; }
  // What retry_hint_of() answers (documented at cm_category()).
  retry_hint retry_hint_of_value(int v) const noexcept override {
    const int ev = (v & 0xff);
    const int st = (v >> 8) & 0xff;
    if (ev == cm_timeout_tag) return retry_hint::yes;
    if (ev == cm_call_tag) return retry_hint_of(std::error_code(st, std::generic_category()));
    switch (static_cast<rdma_cm_event_type>(ev - 1)) {
    case RDMA_CM_EVENT_REJECTED: return st == 8 ? retry_hint::yes : retry_hint::no;
    case RDMA_CM_EVENT_UNREACHABLE: return retry_hint::yes;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return st == ETIMEDOUT || st == EHOSTUNREACH ? retry_hint::yes : retry_hint::no;
    default: return retry_hint::no;
    }
  }
  std::string message(int v) const override;
  std::error_condition default_error_condition(int v) const noexcept override;
};
} // namespace detail

/// The category of rdma_cm failures: the event (REJECTED, UNREACHABLE, ADDR_ERROR,
/// ROUTE_ERROR, CONNECT_ERROR, DISCONNECTED, DEVICE_REMOVAL), a step that timed out, or a
/// librdmacm call that failed with an errno; its status and, for REJECTED, the reject reason.
/// Codes from the handles of this header also name the address and the side
/// ("rdma_cm: connect to 192.0.2.1:7471: timed out waiting for RDMA_CM_EVENT_CONNECT_RESPONSE").
/// Compares equal to std::errc::connection_refused (REJECTED), host_unreachable (UNREACHABLE,
/// resolution errors), timed_out (timeouts), connection_aborted (CONNECT_ERROR),
/// connection_reset (DISCONNECTED), no_such_device (DEVICE_REMOVAL), and to the errno's
/// std::errc for a failed call (address_in_use: "port in use").
///
/// retry_hint_of() answers these codes as follows (what Connection::connect with a retry_options
/// retries; every other code ends the retrying at once):
/// - retry_hint::yes: REJECTED with reject reason 8 (nobody listens on the port: the server is
///   not up yet); UNREACHABLE (the peer's CM did not answer: its host or rdma_cm not up yet);
///   ADDR_ERROR and ROUTE_ERROR with ETIMEDOUT or EHOSTUNREACH (no neighbour answered: the peer
///   host is down or still booting); a step past its deadline (cm_timeout());
/// - retry_hint::no: REJECTED with any other reason (28: the peer application said no; the peer
///   answered, retrying asks the same question), ADDR_ERROR and ROUTE_ERROR with another status
///   (ENETUNREACH, ENODEV, EADDRNOTAVAIL: this host's own configuration), CONNECT_ERROR,
///   DISCONNECTED, DEVICE_REMOVAL;
/// - a failed librdmacm call (cm_call_error()): its errno's hint (EAGAIN, ENOMEM: yes; EADDRINUSE,
///   EDESTADDRREQ: no).
inline const std::error_category &cm_category() noexcept {
  static const detail::cm_category_impl c;
  return c;
}
/// An rdma_cm event that ended a step, as an error_code (status: the event's status field).
[[nodiscard]] inline std::error_code cm_error(rdma_cm_event_type ev, int status) noexcept {
  if (status < 0) status = -status;
  return {(int(ev) + 1) | ((status & 0xff) << 8), cm_category()};
}
/// A librdmacm call that failed with errno `err` (compares equal to that errno's std::errc).
[[nodiscard]] inline std::error_code cm_call_error(cm_call c, int err) noexcept {
  if (err < 0) err = -err;
  if (err == 0) err = EIO;
  return {detail::cm_call_tag | ((err & 0xff) << 8) | ((int(c) & 0xf) << 20), cm_category()};
}
/// `ec` naming the side and the address `sa` (a cm_category() code that names none yet);
/// other codes are returned unchanged.
[[nodiscard]] inline std::error_code cm_at(std::error_code ec, cm_role role, const sockaddr *sa) noexcept {
  if (ec.category() != cm_category() || ((ec.value() >> 16) & 0xf) != 0) return ec;
  return {ec.value() | ((int(role) & 0xf) << 16) | (detail::cm_address_slot(sa) << 24), cm_category()};
}
/// The cm_call a cm_category() code names (cm_call::none for events, timeouts, other codes).
[[nodiscard]] inline cm_call cm_call_of(const std::error_code &ec) noexcept {
  if (ec.category() != cm_category() || (ec.value() & 0xff) != detail::cm_call_tag) return cm_call::none;
  return cm_call((ec.value() >> 20) & 0xf);
}
/// The code of a step that did not complete within its bound.
[[nodiscard]] inline std::error_code cm_timeout(cm_step s) noexcept {
  return {detail::cm_timeout_tag | (int(s) << 8), cm_category()};
}
/// The rdma_cm event a cm_category() code was made from; -1 for timeouts, failed calls and other
/// categories.
[[nodiscard]] inline int cm_event_of(const std::error_code &ec) noexcept {
  if (ec.category() != cm_category() || (ec.value() & 0xff) >= detail::cm_call_tag) return -1;
  return (ec.value() & 0xff) - 1;
}
/// The reject reason of a REJECTED code (28: rejected by the peer application, 8: nobody listens
/// on that port); -1 for other codes.
[[nodiscard]] inline int cm_reject_reason(const std::error_code &ec) noexcept {
  if (cm_event_of(ec) != RDMA_CM_EVENT_REJECTED) return -1;
  return (ec.value() >> 8) & 0xff;
}
/// True for a cm "timeout" code.
[[nodiscard]] inline bool is_cm_timeout(const std::error_code &ec) noexcept {
  return ec.category() == cm_category() && (ec.value() & 0xff) == detail::cm_timeout_tag;
}

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/cm_error.ipp"
