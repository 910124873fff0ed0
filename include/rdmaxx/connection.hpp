/// \file
/// rdmaxx/connection.hpp: connections by IP address over rdma_cm (librdmacm, rdma_cm(7)):
/// EventChannel (rdma_create_event_channel(3)), Listener (rdma_create_id(3), rdma_bind_addr(3),
/// rdma_listen(3)), ConnectRequest (RDMA_CM_EVENT_CONNECT_REQUEST, rdma_accept(3),
/// rdma_reject(3)) and Connection (rdma_resolve_addr(3), rdma_resolve_route(3), rdma_connect(3),
/// rdma_establish(3), rdma_disconnect(3)), which owns its rdma_cm_id and an rdmaxx QueuePair.
///
/// This header is the only one that needs librdmacm: link the `rdmaxx-cm` dependency (Meson:
/// dependency('rdmaxx-cm'); pkg-config: rdmaxx-cm; CMake: rdmaxx::cm). Programs that do not
/// include it do not link librdmacm.
///
/// Design decision: the QP is an ordinary rdmaxx QueuePair (ibv_create_qp_ex with rdmaxx's send
/// operations, on a PD of an rdmaxx Context), NOT rdma_create_qp_ex. rdmaxx moves it through
/// INIT, RTR and RTS itself with the attributes rdma_init_qp_attr(3) computes, passes its QP
/// number in rdma_conn_param, and completes the active side with rdma_establish(3). Why:
///   - rdma_create_qp_ex wants a PD of librdmacm's own device context (id->verbs); the user's
///     ProtectionDomain, MemoryRegions, windows and indirect keys live on an rdmaxx Context, and
///     a QP must share their PD. With our own QP any PD of the resolved DEVICE works.
///   - librdmacm changes the state of a QP attached to the id behind the handle's back (in
///     rdma_accept, rdma_get_cm_event, rdma_disconnect); rdmaxx's rules (never post before RTS,
///     SendBatch, windows as QP children, the rxe defect workarounds) need the QP to be a
///     QueuePair whose transitions rdmaxx makes. One QP type, one set of rules.
///   - Destruction stays in rdmaxx's hands: rdma_destroy_id never destroys our QP, and the
///     QueuePair's parent/child accounting (bound type-2 windows) is unchanged.
/// The cost: the active side sees RDMA_CM_EVENT_CONNECT_RESPONSE (not ESTABLISHED) and must call
/// rdma_establish; a Connection does that for you.
///
/// Resources: rdma_cm resolves an address to a device. A Connection either uses the user's
/// ProtectionDomain and CompletionQueue(s) (conn_options::pd, conn_options::send_cq,
/// conn_options::recv_cq; refused with errc::context_mismatch when they belong to another device
/// than the one resolved), or opens its
/// own Context on the resolved device, a PD and one CQ (optionally with a CompletionChannel),
/// reachable through context(), pd(), cq().
/// Those exist once the address is resolved, before the connect request goes out only with the
/// two-step connect: Connection::resolve() (stops with the QP in INIT, conn_state::resolved),
/// then connect_with(private_data): for private data made on the Connection's own PD, e.g. a
/// GrantPool's offer. The passive side's two steps are ConnectRequest::prepare() and
/// Connection::accept().
///
/// Events and file descriptors: every Listener and every Connection owns its own event channel
/// (an accepted connection's id is moved to a new channel by rdma_migrate_id(3) before
/// rdma_accept), whose fd is non-blocking and can be watched with poll(2)/epoll(7). Each event is
/// copied (type, status, private data) and acknowledged at once (rdma_ack_cm_event), so that
/// rdma_destroy_id never blocks on an unacknowledged event.
///
/// Bounds: every step is bounded: address and route resolution by the timeout given to the
/// kernel; connect, accept and disconnect by the Connection's deadline (conn_options::timeout_ms
/// per step), enforced both by the blocking forms and by advance() (the non-blocking form):
/// a step past its deadline fails with a cm_category() "timeout" code naming the step.
///
/// Private data: at most 56 bytes on connect, 196 on accept, 148 on reject (RC over the TCP port
/// space on InfiniBand/RoCE), refused before any verb with errc::private_data_too_long. The
/// receiver sees the transport's whole private-data area: the bytes sent followed by zeros up to
/// the limit (rdma_cm does not transmit a length): carry your own length or a self-describing
/// format (remote_descriptor: descriptor_header::peek() gives the total size).
///
/// Lifetime: a Connection's QP borrows the user's PD and CQs when given (destroy the Connection
/// first). Destroying a Connection in any state is safe: the QP is destroyed, then the id
/// (rdma_destroy_id: the kernel sends a disconnect request or a reject to the peer), then the
/// channel, then the resources it owns. A peer that disconnects or dies gives DISCONNECTED: the
/// Connection then moves its QP to ERR so that outstanding work completes as flushed.
///
/// Threads: a handle is used by one thread at a time; different handles are independent.
///
/// Allocation: creation allocates (librdmacm, verbs, the children counters); advance(), fd() and
/// the accessors do not allocate except inside rdma_get_cm_event (malloc of one event).
#pragma once

#include "access.hpp"
#include "completion_queue.hpp"
#include "detail/clock.hpp"
#include "detail/handle.hpp"
#include "device.hpp"
#include "error.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"

#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>

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
  std::atomic_flag lock = ATOMIC_FLAG_INIT;
  int n = 0;
  sockaddr_in6 a[capacity]{}; // an AF_INET address is stored in the first 16 bytes
  void acquire() noexcept {
    while (lock.test_and_set(std::memory_order_acquire)) {}
  }
  void release() noexcept { lock.clear(std::memory_order_release); }
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
  if (a.sin6_family == AF_INET) {
    sockaddr_in v4{};
    std::memcpy(&v4, &a, sizeof v4);
    ::inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(v4.sin_port));
  }
  ::inet_ntop(AF_INET6, &a.sin6_addr, buf, sizeof buf);
  return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a.sin6_port));
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

class cm_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "rdmaxx.cm"; }
  std::string message(int v) const override {
    const int ev = (v & 0xff);
    const int st = (v >> 8) & 0xff;
    const int role = (v >> 16) & 0xf;
    std::string m = "rdma_cm: ";
    if (role != 0) {
      static const char *const roles[] = {"", "connect to ", "connection from ", "listen on "};
      m += role <= 3 ? roles[role] : "";
      m += cm_address_text((v >> 24) & 0x7f);
      m += ": ";
    }
    if (ev == cm_timeout_tag) {
      m += "timed out waiting for ";
      m += ::rdma_event_str(static_cast<rdma_cm_event_type>(st));
      return m;
    }
    if (ev == cm_call_tag) {
      const int call = (v >> 20) & 0xf;
      if (st == EDESTADDRREQ && call == int(cm_call::rdma_resolve_addr))
        return m + "a wildcard address names no peer (\"PORT\" alone, 0.0.0.0 and [::] are for "
                   "Listener::listen): connect to the peer's ADDR:PORT";
      if (st == EADDRINUSE && call == int(cm_call::rdma_bind_addr))
        return m + "port in use (rdma_bind_addr: another listener has it; choose another port, or "
                   "port 0 for one the kernel picks)";
      m += cm_call_name(call);
      m += " failed: ";
      m += std::generic_category().message(st);
      if (st == EMFILE)
        m += " (each Connection and Listener holds an rdma_cm event channel fd, and a Connection "
             "without a PD also a device context and its CQ's channel: raise the fd limit, ulimit -n, "
             "or share a PD and CQ through conn_options)";
      return m;
    }
    m += cm_event_step(ev - 1);
    m += ::rdma_event_str(static_cast<rdma_cm_event_type>(ev - 1));
    if (ev - 1 == RDMA_CM_EVENT_REJECTED) {
      m += " (reject reason ";
      m += std::to_string(st);
      m += ": ";
      m += cm_reject_reason_name(st);
      m += ")";
    } else if (st != 0) {
      m += " (";
      m += std::generic_category().message(st);
      m += ")";
    }
    return m;
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    const int ev = (v & 0xff);
    const int st = (v >> 8) & 0xff;
    if (ev == cm_timeout_tag) return std::errc::timed_out;
    if (ev == cm_call_tag) return {st, std::generic_category()};
    switch (static_cast<rdma_cm_event_type>(ev - 1)) {
    case RDMA_CM_EVENT_REJECTED: return std::errc::connection_refused;
    case RDMA_CM_EVENT_UNREACHABLE:
      return st == ETIMEDOUT ? std::errc::timed_out : std::errc::host_unreachable;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      switch (st) {
      case ETIMEDOUT: return std::errc::timed_out;
      case ENETUNREACH: return std::errc::network_unreachable;
      case ENODEV: return std::errc::no_such_device;
      case EADDRNOTAVAIL: return std::errc::address_not_available;
      default: return std::errc::host_unreachable;
      }
    case RDMA_CM_EVENT_CONNECT_ERROR: return std::errc::connection_aborted;
    case RDMA_CM_EVENT_DISCONNECTED: return std::errc::connection_reset;
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return std::errc::no_such_device;
    default: return std::errc::protocol_error;
    }
  }
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

// ---------------------------------------------------------------------------------------------
// addresses and private data

/// An IPv4 or IPv6 address and port (a sockaddr_in / sockaddr_in6). No name resolution.
class address {
public:
  address() noexcept = default;

  /// Parse "A.B.C.D:PORT", "[IPV6]:PORT", "[IPV6%IFNAME]:PORT" or "PORT" (any IPv4 address;
  /// `[::]:PORT` for any IPv6).
  /// \errors
  /// - errc::bad_address: no port, port above 65535, an address inet_pton refuses, an unknown
  ///   interface name.
  /// \mallocs None.
  [[nodiscard]] static result<address> parse(std::string_view s) noexcept {
    address a;
    std::string_view host, port = s;
    if (!s.empty() && s.front() == '[') {
      const auto close = s.find(']');
      if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
        return make_error_code(errc::bad_address);
      host = s.substr(1, close - 1);
      port = s.substr(close + 2);
      a.v6_ = true;
    } else if (const auto colon = s.rfind(':'); colon != std::string_view::npos) {
      host = s.substr(0, colon);
      port = s.substr(colon + 1);
      if (host.find(':') != std::string_view::npos) return make_error_code(errc::bad_address);
    }
    unsigned p = 0;
    if (port.empty() || port.size() > 5) return make_error_code(errc::bad_address);
    for (char c : port) {
      if (c < '0' || c > '9') return make_error_code(errc::bad_address);
      p = p * 10 + unsigned(c - '0');
    }
    if (p > 65535) return make_error_code(errc::bad_address);
    char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {};
    std::string_view scope;
    if (const auto pct = host.find('%'); a.v6_ && pct != std::string_view::npos) {
      scope = host.substr(pct + 1);
      host = host.substr(0, pct);
    }
    if (host.size() >= INET6_ADDRSTRLEN) return make_error_code(errc::bad_address);
    host.copy(buf, host.size());
    if (a.v6_) {
      sockaddr_in6 &in = a.s_.v6;
      in.sin6_family = AF_INET6;
      in.sin6_port = htons(std::uint16_t(p));
      if (::inet_pton(AF_INET6, buf, &in.sin6_addr) != 1) return make_error_code(errc::bad_address);
      if (!scope.empty()) {
        char ifn[IF_NAMESIZE] = {};
        if (scope.size() >= IF_NAMESIZE) return make_error_code(errc::bad_address);
        scope.copy(ifn, scope.size());
        in.sin6_scope_id = ::if_nametoindex(ifn);
        if (in.sin6_scope_id == 0) return make_error_code(errc::bad_address);
      }
    } else {
      sockaddr_in &in = a.s_.v4;
      in.sin_family = AF_INET;
      in.sin_port = htons(std::uint16_t(p));
      if (host.empty())
        in.sin_addr.s_addr = htonl(INADDR_ANY);
      else if (::inet_pton(AF_INET, buf, &in.sin_addr) != 1)
        return make_error_code(errc::bad_address);
    }
    return a;
  }
  /// Copy a sockaddr (AF_INET or AF_INET6).
  /// \errors
  /// - errc::bad_address: `sa` is null, or of another family.
  /// \mallocs None.
  [[nodiscard]] static result<address> from(const sockaddr *sa) noexcept {
    address a;
    if (!sa) return make_error_code(errc::bad_address);
    if (sa->sa_family == AF_INET) {
      std::memcpy(&a.s_.v4, sa, sizeof(sockaddr_in));
    } else if (sa->sa_family == AF_INET6) {
      std::memcpy(&a.s_.v6, sa, sizeof(sockaddr_in6));
      a.v6_ = true;
    } else {
      return make_error_code(errc::bad_address);
    }
    return a;
  }

  /// The IPv4 address of a device's port, port 0, read from its GID table (the first IPv4-mapped
  /// RoCE GID): "loopback" for RDMA, since rxe sits on a real or dummy interface, not on lo.
  /// \errors
  /// - errc::null_handle: `ctx` is null.
  /// - errc::no_device: the port has no IPv4 address (no IPv4-mapped GID).
  /// - the errno of ibv_query_port.
  /// \mallocs None.
  [[nodiscard]] static result<address> of_device(const Context &ctx, std::uint8_t port_num = 1) noexcept {
    if (!ctx) return make_error_code(errc::null_handle);
    RDMAXX_TRY(pa, ctx.query_port(port_num));
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
      auto g = ctx.query_gid(port_num, i);
      if (!g || !detail::gid_is_v4_mapped(g.value())) continue;
      address a;
      a.s_.v4.sin_family = AF_INET;
      std::memcpy(&a.s_.v4.sin_addr, g.value().raw + 12, 4);
      return a;
    }
    return make_error_code(errc::no_device);
  }

  /// The port (host byte order); 0 for "any".
  [[nodiscard]] std::uint16_t port() const noexcept {
    return ntohs(v6_ ? s_.v6.sin6_port : s_.v4.sin_port);
  }
  /// True for IPv6.
  [[nodiscard]] bool is_v6() const noexcept { return v6_; }
  /// The same address with another port.
  [[nodiscard]] address with_port(std::uint16_t p) const noexcept {
    address a = *this;
    (v6_ ? a.s_.v6.sin6_port : a.s_.v4.sin_port) = htons(p);
    return a;
  }
  /// The sockaddr, for rdma_cm calls.
  [[nodiscard]] sockaddr *native() noexcept { return &s_.sa; }
  /// The sockaddr, read-only.
  [[nodiscard]] const sockaddr *native() const noexcept { return &s_.sa; }
  /// "A.B.C.D:PORT" or "[IPV6]:PORT" (allocates).
  [[nodiscard]] std::string to_string() const {
    char buf[INET6_ADDRSTRLEN] = {};
    if (v6_) {
      ::inet_ntop(AF_INET6, &s_.v6.sin6_addr, buf, sizeof buf);
      return "[" + std::string(buf) + "]:" + std::to_string(port());
    }
    ::inet_ntop(AF_INET, &s_.v4.sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port());
  }

private:
  union storage {
    sockaddr sa;
    sockaddr_in v4;
    sockaddr_in6 v6;
  } s_{};
  bool v6_ = false;
};

/// Private data received with an rdma_cm event: the transport's whole area (the bytes the peer
/// sent, then zeros up to the transport's limit).
struct cm_private_data {
  /// The transport's whole area.
  std::array<std::byte, cm_accept_private_data_max> bytes{};
  /// Bytes of the area in use: the transport's limit for the event (the peer's, then zeros).
  std::uint8_t size = 0;
  /// The first `size` bytes.
  [[nodiscard]] std::span<const std::byte> span() const noexcept { return {bytes.data(), size}; }
};

// ---------------------------------------------------------------------------------------------
// handles

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

[[nodiscard]] inline bool same_device(ibv_context *a, ibv_context *b) noexcept {
  if (!a || !b) return false;
  if (a->device == b->device) return true;
  return ::ibv_get_device_guid(a->device) == ::ibv_get_device_guid(b->device) &&
         std::strcmp(::ibv_get_device_name(a->device), ::ibv_get_device_name(b->device)) == 0;
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
  [[nodiscard]] static result<EventChannel> create() noexcept {
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

/// What a connection is made of and how it behaves (connect and accept).
struct conn_options {
  /// The PD the QP is created on; nullptr: the Connection opens a Context on the resolved
  /// device and allocates its own PD. A PD of another device: errc::context_mismatch.
  const ProtectionDomain *pd = nullptr;
  /// CQs of the QP (required with `pd`: errc::null_handle without them); nullptr: the Connection
  /// creates one CQ of cq_entries entries for both.
  const CompletionQueue *send_cq = nullptr;
  /// The receive CQ of the QP (as send_cq).
  const CompletionQueue *recv_cq = nullptr;
  /// Entries of the CQ the Connection creates.
  int cq_entries = 128;
  /// Attach the created CQ to a CompletionChannel of its own (for CompletionQueue::wait and
  /// epoll: Connection::completion_channel()).
  bool cq_channel = false;
  /// Queue sizes and send operations of the QP (QueuePair::create).
  qp_caps caps{};
  /// Send operations of the QP (QueuePair::create).
  send_ops ops = all_send_ops;
  /// Remote operations the QP accepts (as connect_options::qp_access: local write, remote
  /// write/read/atomic; any other bit: errc::unknown_access_flag).
  access_flags qp_access = access::local_write | access::remote_write | access::remote_read |
                           access::remote_atomic;
  /// Outstanding RDMA reads/atomics this side accepts (responder_resources) and initiates
  /// (initiator_depth); clipped to the device's limits by rdma_cm.
  std::uint8_t responder_resources = 1;
  /// Outstanding RDMA reads/atomics this side initiates (see responder_resources).
  std::uint8_t initiator_depth = 1;
  /// RNR retries the peer should make (7: without limit).
  std::uint8_t rnr_retry_count = 7;
  /// Bound of each step (address, route, connect, accept), in milliseconds.
  int timeout_ms = 5000;
  /// Private data sent with rdma_connect (at most 56 bytes) or rdma_accept (at most 196).
  std::span<const std::byte> private_data{};
  /// When not null, receives the private data of a REJECTED event (connect).
  cm_private_data *reject_data = nullptr;
};

/// State of a Connection.
enum class conn_state : std::uint8_t {
  resolving_addr,  ///< rdma_resolve_addr posted
  resolving_route, ///< rdma_resolve_route posted
  resolved,        ///< active side (Connection::resolve): route resolved, QP in INIT on pd(),
                   ///< rdma_connect not called yet (connect_with())
  connecting,      ///< rdma_connect posted, waiting for the response
  prepared,        ///< accepting side: QP in RTS, rdma_accept not called yet (accept())
  accepting,       ///< rdma_accept posted, waiting for ESTABLISHED
  established,     ///< connected: the QP is in RTS
  disconnected,    ///< DISCONNECTED seen or disconnect() called: the QP is in ERR
  failed,          ///< a step failed (advance() returned the reason)
};

class ConnectRequest;
class Listener;

/// A connection by address (rdma_cm) with its own rdmaxx QueuePair. Move-only, null after move.
/// Destruction order of its parts: QP, CQ, PD, Context (those it owns), cm id, event channel.
class Connection {
public:
  Connection() noexcept = default;
  /// Moves the connection; `o` is left null.
  Connection(Connection &&) noexcept = default;
  /// Destroys what this connection holds (in the order above), then takes `o`'s. Not the
  /// member-wise default: that would destroy the old channel before the old id (rdma_destroy_id
  /// then fails with EBADF) and the old Context before its PD.
  Connection &operator=(Connection &&o) noexcept {
    if (this != &o) {
      this->~Connection();
      ::new (static_cast<void *>(this)) Connection(std::move(o));
    }
    return *this;
  }

  /// Active side, non-blocking: rdma_create_id and rdma_resolve_addr towards `to`; then watch
  /// fd() and call advance() until it returns conn_state::established.
  /// \errors
  /// - errc::private_data_too_long: more than 56 bytes.
  /// - errc::invalid_argument: a timeout <= 0 (or cq_entries <= 0).
  /// - errc::null_handle: a PD without CQs.
  /// - cm_call_error(cm_call::rdma_resolve_addr, EDESTADDRREQ) (std::errc::
  ///   destination_address_required): `to` is a wildcard address (0.0.0.0, [::], "PORT"), which
  ///   names no peer; checked before any call.
  /// - cm_call_error() codes naming `to` for rdma_create_event_channel (EMFILE: the fd limit;
  ///   ENODEV: rdma_ucm not loaded), rdma_create_id / rdma_resolve_addr (EADDRNOTAVAIL, ENODEV: no
  ///   RDMA device reaches it, EINVAL).
  /// \mallocs The event channel and the id, inside librdmacm.
  [[nodiscard]] static result<Connection> start_connect(const address &to, const conn_options &o = {}) noexcept {
    if (o.private_data.size() > cm_connect_private_data_max)
      return make_error_code(errc::private_data_too_long);
    RDMAXX_TRYV(check_options(o));
    if (detail::cm_is_wildcard(to.native()))
      return cm_at(cm_call_error(cm_call::rdma_resolve_addr, EDESTADDRREQ), cm_role::connect_to, to.native());
    Connection c;
    c.opts_ = o;
    c.peer_ = to;
    RDMAXX_TRY(ch, c.new_channel());
    c.channel_ = std::move(ch);
    rdma_cm_id *id = nullptr;
    if (::rdma_create_id(c.channel_.native_handle(), &id, nullptr, RDMA_PS_TCP))
      return c.call_failed(cm_call::rdma_create_id);
    c.id_ = detail::handle<detail::cm_id_traits>(id, nullptr, nullptr);
    c.connect_data_len_ = std::uint8_t(o.private_data.size());
    if (!o.private_data.empty()) std::memcpy(c.connect_data_.data(), o.private_data.data(), o.private_data.size());
    c.state_ = conn_state::resolving_addr;
    c.deadline_ = detail::monotonic_ms() + o.timeout_ms;
    address dst = to;
    if (::rdma_resolve_addr(id, nullptr, dst.native(), o.timeout_ms))
      return c.call_failed(cm_call::rdma_resolve_addr);
    return c;
  }

  /// Active side, first half, blocking: resolve the address and the route and create the QP
  /// and its resources (on o.pd, or the Connection's own Context, PD and CQ on the resolved
  /// device, as connect() does), without sending the connect request. The Connection is then
  /// in conn_state::resolved: pd(), cq() and qp() (in INIT) exist, so that what the request
  /// carries can be made on them first, e.g. a GrantPool on pd() and its offer(). Then
  /// connect_with(private_data) and wait_established(). The mirror of ConnectRequest::prepare()
  /// + Connection::accept() on the passive side.
  /// \errors
  /// - errc::invalid_argument: o.private_data is not empty (give the bytes to connect_with()).
  /// - those of start_connect() and advance() (a cm timeout naming the address or route step).
  /// \mallocs As start_connect() and advance().
  [[nodiscard]] static result<Connection> resolve(const address &to, const conn_options &o = {}) noexcept {
    if (!o.private_data.empty()) return make_error_code(errc::invalid_argument);
    RDMAXX_TRY(c, start_connect(to, o));
    c.hold_connect_ = true; // no event was processed yet: ROUTE_RESOLVED stops at resolved
    for (;;) {
      RDMAXX_TRY(s, c.advance());
      if (s == conn_state::resolved) return std::move(c);
      RDMAXX_TRY(readable, detail::wait_readable(c.fd(), c.deadline_));
      (void)readable; // advance() reports the timeout
    }
  }

  /// Second half of a connect (after resolve()): rdma_connect with `private_data` (at most 56
  /// bytes); the state becomes connecting: wait_established() or advance().
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: not resolved (not made by resolve(), or connect_with() called already).
  /// - errc::private_data_too_long: over 56 bytes; nothing is sent (call again with less).
  /// - cm_call_error(cm_call::rdma_connect, errno) naming the peer.
  /// \mallocs None.
  result<void> connect_with(std::span<const std::byte> private_data = {}) noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (state_ != conn_state::resolved) return make_error_code(errc::wrong_state);
    if (private_data.size() > cm_connect_private_data_max)
      return make_error_code(errc::private_data_too_long);
    connect_data_len_ = std::uint8_t(private_data.size());
    if (!private_data.empty()) std::memcpy(connect_data_.data(), private_data.data(), private_data.size());
    state_ = conn_state::connecting;
    deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
    rdma_conn_param p = conn_param();
    if (::rdma_connect(id_.get(), &p)) {
      state_ = conn_state::failed;
      return call_failed(cm_call::rdma_connect);
    }
    return success();
  }

  /// Active side, blocking: start_connect(), then advance() until established or failed, each
  /// step within o.timeout_ms.
  /// \errors
  /// - those of start_connect() and advance().
  /// \mallocs As start_connect() and advance().
  [[nodiscard]] static result<Connection> connect(const address &to, const conn_options &o = {}) noexcept {
    RDMAXX_TRY(c, start_connect(to, o));
    RDMAXX_TRYV(c.run_until_established());
    return std::move(c);
  }

  /// Process the pending events on this connection's channel without blocking and return the
  /// state reached (it stops right after reaching established, so that a connection that was
  /// established and then disconnected is seen as both, in two calls). Also enforces the
  /// current step's deadline. An established connection that sees DISCONNECTED returns
  /// conn_state::disconnected (not an error): its QP is moved to ERR.
  /// \errors The state is then failed, or disconnected for DISCONNECTED:
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: the connection had already failed.
  /// - cm_category() codes: REJECTED with the reject reason, its private data copied to
  ///   conn_options::reject_data; UNREACHABLE; ADDR_ERROR; ROUTE_ERROR; CONNECT_ERROR;
  ///   DISCONNECTED before establishment; DEVICE_REMOVAL; a timeout naming the step.
  /// - errc::context_mismatch: the user's PD is of another device than the one resolved.
  /// - the errno of the rdma_cm calls and QP transitions (qp_transition codes).
  /// - those of the resources created (Context::open, ProtectionDomain::alloc,
  ///   CompletionQueue::create, QueuePair::create).
  /// \mallocs One event per rdma_get_cm_event (malloc, inside librdmacm); once the route is
  /// resolved, the resources created (their nodes, besides what verbs allocates).
  [[nodiscard]] result<conn_state> advance() noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    for (;;) {
      if (state_ == conn_state::failed) return make_error_code(errc::wrong_state);
      RDMAXX_TRY(ev, detail::next_cm_event(channel_.native_handle()));
      if (!ev) break;
      const conn_state was = state_;
      if (auto ec = on_event(*ev)) {
        if (state_ != conn_state::disconnected) state_ = conn_state::failed;
        return named(ec);
      }
      // Reaching established is reported on its own: later events (a DISCONNECTED that is
      // already queued) are left for the next call.
      if (state_ == conn_state::established && was != conn_state::established) return state_;
    }
    if (state_ != conn_state::established && state_ != conn_state::disconnected &&
        state_ != conn_state::prepared && state_ != conn_state::resolved &&
        detail::monotonic_ms() >= deadline_) {
      const cm_step s = step();
      state_ = conn_state::failed;
      return named(cm_timeout(s));
    }
    return state_;
  }

  /// Wait up to `timeout_ms` for the connection to end (DISCONNECTED), processing events.
  /// Returns true when disconnected, false when still established at the deadline.
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: not established or disconnected.
  /// - those of advance().
  /// \mallocs As advance().
  [[nodiscard]] result<bool> wait_disconnected(int timeout_ms) noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (state_ != conn_state::established && state_ != conn_state::disconnected)
      return make_error_code(errc::wrong_state);
    const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
    for (;;) {
      RDMAXX_TRY(s, advance());
      if (s == conn_state::disconnected) return true;
      RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline));
      if (!readable) return false;
    }
  }

  /// Second half of an accept (after ConnectRequest::prepare()): rdma_accept with
  /// `private_data` (at most 196 bytes), or, when it is empty, with the conn_options::private_data
  /// given to prepare() (copied there); the state becomes accepting: advance() or
  /// wait_established().
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: not prepared.
  /// - errc::private_data_too_long: nothing is sent (accept again with less).
  /// - the errno of rdma_accept.
  /// \mallocs None.
  result<void> accept(std::span<const std::byte> private_data = {}) noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (state_ != conn_state::prepared) return make_error_code(errc::wrong_state);
    if (private_data.size() > cm_accept_private_data_max)
      return make_error_code(errc::private_data_too_long);
    if (!private_data.empty()) {
      connect_data_len_ = std::uint8_t(private_data.size());
      std::memcpy(connect_data_.data(), private_data.data(), private_data.size());
    }
    rdma_conn_param p = conn_param();
    p.responder_resources = opts_.responder_resources < resp_res_ ? opts_.responder_resources : resp_res_;
    p.initiator_depth = opts_.initiator_depth < init_depth_ ? opts_.initiator_depth : init_depth_;
    state_ = conn_state::accepting;
    deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
    if (::rdma_accept(id_.get(), &p)) {
      state_ = conn_state::failed;
      return call_failed(cm_call::rdma_accept);
    }
    return success();
  }

  /// Blocking: advance() until established, within the current step's bound (conn_options::
  /// timeout_ms).
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: prepared (accept() first) or resolved (connect_with() first).
  /// - those of advance(); DISCONNECTED when the peer went away first.
  /// \mallocs As advance().
  result<void> wait_established() noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (state_ == conn_state::prepared || state_ == conn_state::resolved)
      return make_error_code(errc::wrong_state);
    return run_until_established();
  }

  /// rdma_disconnect: move the QP to ERR (outstanding work completes as flushed) and send a
  /// disconnect request; the peer sees DISCONNECTED. Idempotent once disconnected.
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: never established.
  /// - the errno of rdma_disconnect.
  /// \mallocs None.
  result<void> disconnect() noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (state_ == conn_state::disconnected) return success();
    if (state_ != conn_state::established) return make_error_code(errc::wrong_state);
    (void)qp_.to_error();
    state_ = conn_state::disconnected;
    if (::rdma_disconnect(id_.get())) return call_failed(cm_call::rdma_disconnect);
    return success();
  }

  /// The QueuePair (in RTS once established): SendBatch, windows and keys work on it as on any.
  [[nodiscard]] QueuePair &qp() noexcept { return qp_; }
  /// The QueuePair, read-only.
  [[nodiscard]] const QueuePair &qp() const noexcept { return qp_; }
  /// The Context the Connection opened (null when the user gave a PD).
  [[nodiscard]] const Context &context() const noexcept { return ctx_; }
  /// The PD of the QP: the user's or the Connection's own (null before the address resolved).
  [[nodiscard]] const ProtectionDomain &pd() const noexcept { return user_pd_ ? *user_pd_ : pd_; }
  /// The CQ the Connection created (null when the user gave CQs).
  [[nodiscard]] CompletionQueue &cq() noexcept { return cq_; }
  /// The CompletionChannel of the created CQ (with conn_options::cq_channel), else null.
  [[nodiscard]] const CompletionChannel &completion_channel() const noexcept { return cq_ch_; }
  /// The current state.
  [[nodiscard]] conn_state state() const noexcept { return state_; }
  /// The private data the peer sent: the accept's on the active side, the connect request's
  /// on the passive side (see the top of this header: padded to the transport's limit).
  [[nodiscard]] std::span<const std::byte> peer_private_data() const noexcept { return peer_data_.span(); }
  /// The fd of the connection's event channel (non-blocking; readable: call advance()).
  [[nodiscard]] int fd() const noexcept { return channel_.fd(); }
  /// The rdma_cm_id (owned), or nullptr.
  [[nodiscard]] rdma_cm_id *native_handle() const noexcept { return id_.get(); }
  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return bool(id_); }
  /// Destroy now, checked, in the destructor's order: the QP, the CQ and its completion channel,
  /// the PD and the Context where the connection owns them, the cm id (rdma_destroy_id), the
  /// event channel. No disconnect is sent first (disconnect() ends a connection gracefully; a
  /// destroyed established connection looks to the peer like a vanished one). Stops at the first
  /// failure: what was destroyed stays destroyed, the rest stays with the connection (state
  /// failed), and its destructor finishes it. Null afterwards on success.
  /// \errors
  /// - those of QueuePair::destroy (errc::busy: a type-2 window still bound through it),
  ///   CompletionQueue::destroy, ProtectionDomain::dealloc (errc::busy: the caller's regions,
  ///   windows or grants on the connection's PD: destroy them first) and Context::close.
  /// - the errno of rdma_destroy_id.
  /// \mallocs None.
  result<void> destroy() noexcept {
    if (!id_ && !qp_) return success();
    state_ = conn_state::failed;
    RDMAXX_TRYV(qp_.destroy());
    RDMAXX_TRYV(cq_.destroy());
    RDMAXX_TRYV(cq_ch_.destroy());
    RDMAXX_TRYV(pd_.dealloc());
    RDMAXX_TRYV(ctx_.close());
    RDMAXX_TRYV(id_.destroy());
    return channel_.destroy();
  }
  /// The peer's address (rdma_get_peer_addr).
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::bad_address: not resolved yet.
  /// \mallocs None.
  [[nodiscard]] result<address> peer_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_peer_addr(id_.get()));
  }
  /// Our address (rdma_get_local_addr).
  /// \errors
  /// - those of peer_address().
  /// \mallocs None.
  [[nodiscard]] result<address> local_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_local_addr(id_.get()));
  }

private:
  friend class ConnectRequest;

  [[nodiscard]] static result<void> check_options(const conn_options &o) noexcept {
    if (o.timeout_ms <= 0 || o.cq_entries <= 0) return make_error_code(errc::invalid_argument);
    if (o.pd && (!*o.pd || !o.send_cq || !o.recv_cq || !*o.send_cq || !*o.recv_cq))
      return make_error_code(errc::null_handle);
    if (!o.pd && (o.send_cq || o.recv_cq)) return make_error_code(errc::invalid_argument);
    if (!o.qp_access.subset_of(access::local_write | access::remote_write | access::remote_read |
                               access::remote_atomic))
      return make_error_code(errc::unknown_access_flag);
    return success();
  }

  [[nodiscard]] cm_step step() const noexcept {
    switch (state_) {
    case conn_state::resolving_addr: return cm_step::resolve_addr;
    case conn_state::resolving_route: return cm_step::resolve_route;
    case conn_state::connecting: return cm_step::connect;
    default: return cm_step::accept;
    }
  }

  result<void> run_until_established() noexcept {
    for (;;) {
      RDMAXX_TRY(s, advance());
      if (s == conn_state::established) return success();
      if (s == conn_state::disconnected) return named(cm_error(RDMA_CM_EVENT_DISCONNECTED, 0));
      RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline_));
      (void)readable; // advance() reports the timeout
    }
  }

  // The QP and its resources on the device the id resolved to.
  result<void> make_qp(ibv_context *resolved) noexcept {
    if (!resolved) return make_error_code(errc::no_device);
    const ProtectionDomain *pd = opts_.pd;
    const CompletionQueue *scq = opts_.send_cq, *rcq = opts_.recv_cq;
    if (pd) {
      if (!detail::same_device(pd->context(), resolved) ||
          !detail::same_device(scq->native_handle()->context, resolved) ||
          !detail::same_device(rcq->native_handle()->context, resolved))
        return make_error_code(errc::context_mismatch);
      user_pd_ = pd;
    } else {
      RDMAXX_TRY(ctx, Context::open(resolved->device));
      ctx_ = std::move(ctx);
      RDMAXX_TRY(p, ProtectionDomain::alloc(ctx_));
      pd_ = std::move(p);
      if (opts_.cq_channel) {
        RDMAXX_TRY(ch, CompletionChannel::create(ctx_));
        cq_ch_ = std::move(ch);
      }
      RDMAXX_TRY(cq, CompletionQueue::create(ctx_, opts_.cq_entries, cq_ch_ ? &cq_ch_ : nullptr));
      cq_ = std::move(cq);
      pd = &pd_;
      scq = rcq = &cq_;
    }
    RDMAXX_TRY(qp, QueuePair::create(*pd, *scq, *rcq, opts_.caps, opts_.ops));
    qp_ = std::move(qp);
    return success();
  }

  // ibv_modify_qp to `to` with the attributes rdma_init_qp_attr computes.
  result<void> move_qp(ibv_qp_state to) noexcept {
    ibv_qp_attr a{};
    int mask = 0;
    a.qp_state = to;
    if (::rdma_init_qp_attr(id_.get(), &a, &mask)) return call_failed(cm_call::rdma_init_qp_attr);
    // Only attributes userspace verbs knows (librdmacm masks the same legacy kernel bits).
    mask &= (IBV_QP_DEST_QPN << 1) - 1;
    if (to == IBV_QPS_INIT) a.qp_access_flags = opts_.qp_access.native();
    const ibv_qp_state from = to == IBV_QPS_INIT ? IBV_QPS_RESET
                              : to == IBV_QPS_RTR ? IBV_QPS_INIT
                                                  : IBV_QPS_RTR;
    if (const int rc = ::ibv_modify_qp(qp_.native_handle(), &a, mask))
      return qp_transition_error(from, to, -1, rc);
    return success();
  }

  rdma_conn_param conn_param() const noexcept {
    rdma_conn_param p{};
    p.private_data = connect_data_len_ ? connect_data_.data() : nullptr;
    p.private_data_len = connect_data_len_;
    p.responder_resources = opts_.responder_resources;
    p.initiator_depth = opts_.initiator_depth;
    p.retry_count = 7;
    p.rnr_retry_count = opts_.rnr_retry_count;
    p.qp_num = qp_.qp_num();
    return p;
  }

  // A cm code naming this connection's side and peer (other codes unchanged).
  [[nodiscard]] std::error_code named(std::error_code ec) const noexcept {
    return cm_at(ec, passive_ ? cm_role::accept_from : cm_role::connect_to, peer_.native());
  }
  // The errno of a failed librdmacm call, naming it, the side and the peer.
  [[nodiscard]] std::error_code call_failed(cm_call c) const noexcept {
    return named(cm_call_error(c, errno));
  }
  // EventChannel::create, its errno named as rdma_create_event_channel's (EMFILE says which fd).
  [[nodiscard]] result<EventChannel> new_channel() const noexcept {
    auto ch = EventChannel::create();
    if (!ch && ch.error().category() == std::generic_category())
      return named(cm_call_error(cm_call::rdma_create_event_channel, ch.error().value()));
    return ch;
  }

  // One event of this connection's id.
  std::error_code on_event(const detail::cm_event_copy &ev) noexcept {
    const auto fail = [&] { return cm_error(ev.type, ev.status); };
    switch (ev.type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (state_ != conn_state::resolving_addr) return make_error_code(errc::wrong_state);
      if (ev.status) return fail();
      if (auto r = make_qp(id_.get()->verbs); !r) return r.error();
      if (::rdma_resolve_route(id_.get(), opts_.timeout_ms)) return call_failed(cm_call::rdma_resolve_route);
      state_ = conn_state::resolving_route;
      deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
      return {};
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (state_ != conn_state::resolving_route) return make_error_code(errc::wrong_state);
      if (ev.status) return fail();
      if (auto r = move_qp(IBV_QPS_INIT); !r) return r.error();
      if (hold_connect_) { // resolve(): connect_with() sends the request
        state_ = conn_state::resolved;
        return {};
      }
      rdma_conn_param p = conn_param();
      if (::rdma_connect(id_.get(), &p)) return call_failed(cm_call::rdma_connect);
      state_ = conn_state::connecting;
      deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
      return {};
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      if (state_ != conn_state::connecting) return make_error_code(errc::wrong_state);
      if (ev.status) return fail();
      peer_data_ = ev.data;
      if (auto r = move_qp(IBV_QPS_RTR); !r) return r.error();
      if (auto r = move_qp(IBV_QPS_RTS); !r) return r.error();
      if (::rdma_establish(id_.get())) return call_failed(cm_call::rdma_establish);
      state_ = conn_state::established;
      return {};
    case RDMA_CM_EVENT_ESTABLISHED:
      if (state_ == conn_state::established) return {};
      if (state_ != conn_state::accepting) return make_error_code(errc::wrong_state);
      if (ev.status) return fail();
      state_ = conn_state::established; // the QP reached RTS before rdma_accept
      return {};
    case RDMA_CM_EVENT_DISCONNECTED:
      if (qp_) (void)qp_.to_error();
      if (state_ == conn_state::established || state_ == conn_state::disconnected) {
        state_ = conn_state::disconnected;
        return {};
      }
      state_ = conn_state::disconnected;
      return fail();
    case RDMA_CM_EVENT_REJECTED:
      if (opts_.reject_data) *opts_.reject_data = ev.data;
      return fail();
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
    case RDMA_CM_EVENT_ADDR_CHANGE: return {};
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      if (qp_) (void)qp_.to_error();
      return fail();
    default: // ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR, UNREACHABLE, ...
      return fail();
    }
  }

  // Members in construction order; destroyed in reverse: QP, CQ, channel, PD, Context, id, channel.
  EventChannel channel_;
  detail::handle<detail::cm_id_traits> id_;
  Context ctx_;
  ProtectionDomain pd_;
  CompletionChannel cq_ch_;
  CompletionQueue cq_;
  QueuePair qp_;
  const ProtectionDomain *user_pd_ = nullptr;
  conn_options opts_{};
  conn_state state_ = conn_state::failed;
  std::int64_t deadline_ = 0;
  std::array<std::byte, cm_accept_private_data_max> connect_data_{}; // what we send
  std::uint8_t connect_data_len_ = 0;
  cm_private_data peer_data_{};
  std::uint8_t resp_res_ = 0;   // the client's offer (CONNECT_REQUEST), passive side
  std::uint8_t init_depth_ = 0;
  address peer_{};              // what error codes name
  bool passive_ = false;
  bool hold_connect_ = false;   // resolve(): stop at conn_state::resolved
};

/// A connection request received by a Listener (RDMA_CM_EVENT_CONNECT_REQUEST): accept() it or
/// reject() it. Move-only, null after move; dropped without either, its id is destroyed
/// (rdma_destroy_id), which rejects the request.
class ConnectRequest {
public:
  ConnectRequest() noexcept = default;

  /// The private data the client sent (56 bytes: the sent bytes, then zeros).
  [[nodiscard]] std::span<const std::byte> private_data() const noexcept { return data_.span(); }
  /// The device the request arrived on (rdma_cm's context; compare with your PD's).
  [[nodiscard]] ibv_context *device_context() const noexcept { return id_ ? id_.get()->verbs : nullptr; }
  /// The client's address (rdma_get_peer_addr).
  /// \errors
  /// - errc::null_handle: the request is null.
  /// \mallocs None.
  [[nodiscard]] result<address> peer_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_peer_addr(id_.get()));
  }
  /// The new rdma_cm_id (owned), or nullptr.
  [[nodiscard]] rdma_cm_id *native_handle() const noexcept { return id_.get(); }
  /// True unless null (moved from, accepted or rejected).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(id_); }
  /// Destroy now, checked (rdma_destroy_id: the kernel rejects the request, without private
  /// data; reject() sends some). Null afterwards on success; nothing to do when null.
  /// \errors
  /// - the errno of rdma_destroy_id (the request stays).
  /// \mallocs None.
  result<void> destroy() noexcept { return id_.destroy(); }

  /// First half of an accept: create the QP (conn_options as for connect), move the id to a
  /// new event channel (rdma_migrate_id) and bring the QP to INIT, RTR and RTS
  /// (rdma_init_qp_attr), without answering the client yet. The returned Connection is in
  /// conn_state::prepared: post local work now (e.g. bind the memory window whose descriptor
  /// goes into the accept's private data), then call Connection::accept(). Nothing may be sent
  /// to the peer before it is established. o.private_data is copied now and sent by accept()
  /// unless accept() is given data of its own. The request becomes null, whatever the outcome
  /// (except for the first two errors).
  /// \errors
  /// - errc::null_handle: the request is null.
  /// - errc::private_data_too_long: o.private_data over 196 bytes (the request stays usable).
  /// - errc::invalid_argument / errc::unknown_access_flag: the options.
  /// - errc::context_mismatch: a PD of another device.
  /// - cm_call_error() codes for rdma_create_event_channel (EMFILE: the fd limit), rdma_migrate_id
  ///   and rdma_init_qp_attr.
  /// - qp_transition codes.
  /// - the errors of the resources created.
  /// \mallocs A new event channel (librdmacm) and the resources created (their nodes, besides
  /// what verbs allocates).
  [[nodiscard]] result<Connection> prepare(const conn_options &o = {}) noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (o.private_data.size() > cm_accept_private_data_max)
      return make_error_code(errc::private_data_too_long);
    RDMAXX_TRYV(Connection::check_options(o));
    Connection c;
    c.opts_ = o;
    c.opts_.private_data = {}; // copied: the caller's bytes need not outlive this call
    c.connect_data_len_ = std::uint8_t(o.private_data.size());
    if (!o.private_data.empty())
      std::memcpy(c.connect_data_.data(), o.private_data.data(), o.private_data.size());
    c.peer_data_ = data_;
    c.resp_res_ = resp_res_;
    c.init_depth_ = init_depth_;
    c.id_ = std::move(id_);
    c.passive_ = true;
    if (auto a = address::from(::rdma_get_peer_addr(c.id_.get()))) c.peer_ = a.value();
    RDMAXX_TRY(ch, c.new_channel());
    c.channel_ = std::move(ch);
    if (::rdma_migrate_id(c.id_.get(), c.channel_.native_handle()))
      return c.call_failed(cm_call::rdma_migrate_id);
    RDMAXX_TRYV(c.make_qp(c.id_.get()->verbs));
    RDMAXX_TRYV(c.move_qp(IBV_QPS_INIT));
    RDMAXX_TRYV(c.move_qp(IBV_QPS_RTR));
    // RTS now, as librdmacm does for its own QPs: once the client's DREQ may have arrived
    // (a client that writes and disconnects at once), rdma_init_qp_attr refuses RTS (EINVAL).
    RDMAXX_TRYV(c.move_qp(IBV_QPS_RTS));
    c.state_ = conn_state::prepared;
    c.deadline_ = detail::monotonic_ms() + o.timeout_ms;
    return c;
  }

  /// Non-blocking accept: prepare(o), then Connection::accept(o.private_data); the returned
  /// Connection is in conn_state::accepting: advance() it until established (the client's
  /// RTU).
  /// \errors
  /// - errc::private_data_too_long: over 196 bytes (checked first: nothing is sent and the
  ///   request stays usable: reject it or accept again).
  /// - those of prepare() and Connection::accept().
  /// \mallocs As prepare().
  [[nodiscard]] result<Connection> start_accept(const conn_options &o = {}) noexcept {
    RDMAXX_TRY(c, prepare(o)); // checks and copies o.private_data first
    RDMAXX_TRYV(c.accept());
    return std::move(c);
  }
  /// Blocking accept: start_accept(), then advance() until established within o.timeout_ms.
  /// \errors
  /// - those of start_accept() and Connection::advance() (a cm timeout naming the accept step).
  /// \mallocs As start_accept() and Connection::advance().
  [[nodiscard]] result<Connection> accept(const conn_options &o = {}) noexcept {
    RDMAXX_TRY(c, start_accept(o));
    RDMAXX_TRYV(c.run_until_established());
    return std::move(c);
  }
  /// rdma_reject with private data (at most 148 bytes): the client's connect fails with a
  /// REJECTED code (reject reason 28, consumer defined) carrying these bytes.
  /// \errors
  /// - errc::null_handle: the request is null.
  /// - errc::private_data_too_long: nothing is sent; the request stays usable.
  /// - the errno of rdma_reject (the request is null afterwards either way).
  /// \mallocs None.
  result<void> reject(std::span<const std::byte> data = {}) noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (data.size() > cm_reject_private_data_max) return make_error_code(errc::private_data_too_long);
    const int rc = ::rdma_reject(id_.get(), data.empty() ? nullptr : data.data(), std::uint8_t(data.size()));
    const auto ec = rc ? cm_at(cm_call_error(cm_call::rdma_reject, errno), cm_role::accept_from,
                               ::rdma_get_peer_addr(id_.get()))
                       : std::error_code{};
    id_.reset();
    if (ec) return ec;
    return success();
  }

private:
  friend class Listener;
  detail::handle<detail::cm_id_traits> id_;
  cm_private_data data_{};
  std::uint8_t resp_res_ = 0;
  std::uint8_t init_depth_ = 0;
};

/// A listening rdma_cm id bound to an address (rdma_bind_addr(3), rdma_listen(3)), with its own
/// event channel. Move-only, null after move.
class Listener {
public:
  Listener() noexcept = default;
  /// Moves the listener; `o` is left null.
  Listener(Listener &&) noexcept = default;
  /// Destroys the old id before its channel (see Connection's move assignment).
  Listener &operator=(Listener &&o) noexcept {
    if (this != &o) {
      this->~Listener();
      ::new (static_cast<void *>(this)) Listener(std::move(o));
    }
    return *this;
  }

  /// rdma_create_id (RDMA_PS_TCP), rdma_bind_addr to `at` (port 0: the kernel chooses, read it
  /// with port()), rdma_listen with `backlog`.
  /// \errors
  /// - errc::invalid_argument: `backlog` <= 0.
  /// - cm_call_error() codes naming `at` for rdma_create_event_channel (ENODEV: rdma_ucm not
  ///   loaded; EMFILE: the fd limit), rdma_create_id, rdma_bind_addr (EADDRINUSE, "port in use";
  ///   EADDRNOTAVAIL: no local interface has that address; ENODEV: the address's interface has
  ///   no RDMA device) and rdma_listen. The kernel's rdma_cm answers a port in use with
  ///   EADDRNOTAVAIL, as for an address of no interface: when the address is a wildcard or one
  ///   a UDP socket can bind, the port is what is taken, and the code says EADDRINUSE.
  /// \mallocs The event channel and the id, inside librdmacm.
  [[nodiscard]] static result<Listener> listen(const address &at, int backlog = 64) noexcept {
    if (backlog <= 0) return make_error_code(errc::invalid_argument);
    Listener l;
    const auto failed = [&](cm_call c, int err) {
      return cm_at(cm_call_error(c, err), cm_role::listen_on, at.native());
    };
    auto ch = EventChannel::create();
    if (!ch && ch.error().category() == std::generic_category())
      return failed(cm_call::rdma_create_event_channel, ch.error().value());
    if (!ch) return ch.error();
    l.channel_ = std::move(ch).value();
    rdma_cm_id *id = nullptr;
    if (::rdma_create_id(l.channel_.native_handle(), &id, nullptr, RDMA_PS_TCP))
      return failed(cm_call::rdma_create_id, errno);
    l.id_ = detail::handle<detail::cm_id_traits>(id, nullptr, nullptr);
    address a = at;
    if (::rdma_bind_addr(id, a.native())) {
      int err = errno;
      if (err == EADDRNOTAVAIL && address_is_local(at)) err = EADDRINUSE;
      return failed(cm_call::rdma_bind_addr, err);
    }
    if (::rdma_listen(id, backlog)) return failed(cm_call::rdma_listen, errno);
    return l;
  }

  /// The port bound (rdma_get_src_port), host order; 0 when null.
  [[nodiscard]] std::uint16_t port() const noexcept {
    return id_ ? ntohs(::rdma_get_src_port(id_.get())) : 0;
  }
  /// The bound address (rdma_get_local_addr), with the chosen port.
  /// \errors
  /// - errc::null_handle: the listener is null.
  /// \mallocs None.
  [[nodiscard]] result<address> local_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_local_addr(id_.get()));
  }
  /// The device the listener is bound to (null when bound to a wildcard address).
  [[nodiscard]] ibv_context *device_context() const noexcept { return id_ ? id_.get()->verbs : nullptr; }
  /// The non-blocking fd of the listener's channel (readable: call get_request(0)).
  [[nodiscard]] int fd() const noexcept { return channel_.fd(); }
  /// The listening rdma_cm_id (owned), or nullptr.
  [[nodiscard]] rdma_cm_id *native_handle() const noexcept { return id_.get(); }
  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return bool(id_); }
  /// Stop listening and destroy now, checked: rdma_destroy_id of the listening id (requests
  /// already taken with get_request() stay valid), then its event channel. On failure the
  /// listener keeps both (its destructor tries again). Null afterwards on success.
  /// \errors
  /// - the errno of rdma_destroy_id.
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(id_.destroy());
    return channel_.destroy();
  }

  /// Wait up to `timeout_ms` (0: do not wait) for the next connection request. Other events on
  /// the channel (of requests that went away before being accepted) are acknowledged and
  /// skipped.
  /// \errors
  /// - errc::null_handle: the listener is null.
  /// - errc::invalid_argument: negative timeout.
  /// - a cm timeout (cm_step::request): none arrived.
  /// - the errno of rdma_get_cm_event.
  /// \mallocs One event per rdma_get_cm_event (malloc, inside librdmacm).
  [[nodiscard]] result<ConnectRequest> get_request(int timeout_ms) noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (timeout_ms < 0) return make_error_code(errc::invalid_argument);
    const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
    for (;;) {
      RDMAXX_TRY(ev, detail::next_cm_event(channel_.native_handle()));
      if (ev && ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        ConnectRequest r;
        r.id_ = detail::handle<detail::cm_id_traits>(ev->id, nullptr, nullptr);
        r.data_ = ev->data;
        r.resp_res_ = ev->responder_resources;
        r.init_depth_ = ev->initiator_depth;
        return r;
      }
      if (ev) continue; // an event of a request that went away: skipped
      RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline));
      if (!readable) return cm_at(cm_timeout(cm_step::request), cm_role::listen_on, ::rdma_get_local_addr(id_.get()));
    }
  }

private:
  // True when `at` is a wildcard or an address of this host (a UDP socket binds to it, port 0).
  [[nodiscard]] static bool address_is_local(const address &at) noexcept {
    if (detail::cm_is_wildcard(at.native())) return true;
    const int fd = ::socket(at.is_v6() ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    address probe = at.with_port(0);
    const socklen_t len = at.is_v6() ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    const bool ok = ::bind(fd, probe.native(), len) == 0;
    ::close(fd);
    return ok;
  }

  EventChannel channel_;
  detail::handle<detail::cm_id_traits> id_;
};

} // namespace rdmaxx
