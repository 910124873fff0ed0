/// \file
/// rdmaxx/cm_address.hpp: an IPv4 or IPv6 address and port for rdma_cm (address: parse(),
/// from(), of_device()), and the private data an rdma_cm event carries (cm_private_data). Part of
/// the rdma_cm support (connection.hpp; needs librdmacm).
///
/// Allocation: none, except to_string().
#pragma once

#include "cm_error.hpp"
#include "detail/span.hpp"
#include "device.hpp"
#include "endpoint.hpp" // detail::gid_is_v4_mapped
#include "error.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace rdmaxx {

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
  [[nodiscard]] static result<address> parse(std::string_view s) noexcept;
  /// Copy a sockaddr (AF_INET or AF_INET6).
  /// \errors
  /// - errc::bad_address: `sa` is null, or of another family.
  /// \mallocs None.
  [[nodiscard]] static result<address> from(const sockaddr *sa) noexcept;

  /// The IPv4 address of a device's port, port 0, read from its GID table (the first IPv4-mapped
  /// RoCE GID): "loopback" for RDMA, since rxe sits on a real or dummy interface, not on lo.
  /// \errors
  /// - errc::null_handle: `ctx` is null.
  /// - errc::no_device: the port has no IPv4 address (no IPv4-mapped GID).
  /// - the errno of ibv_query_port.
  /// \mallocs None.
  [[nodiscard]] static result<address> of_device(const Context &ctx, std::uint8_t port_num = 1) noexcept;

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
  [[nodiscard]] std::string to_string() const;

private:
  union storage {
    sockaddr sa;
    sockaddr_in v4;
    sockaddr_in6 v6;
  } s_{};
  bool v6_ = false;
};

// ---- address: the longer bodies ----

inline result<address> address::parse(std::string_view s) noexcept {
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

inline result<address> address::from(const sockaddr *sa) noexcept {
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

inline result<address> address::of_device(const Context &ctx, std::uint8_t port_num) noexcept {
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

inline std::string address::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  char text[INET6_ADDRSTRLEN + 16]; // snprintf, not to_string and string +: cheaper to compile
  if (v6_) {
    ::inet_ntop(AF_INET6, &s_.v6.sin6_addr, buf, sizeof buf);
    std::snprintf(text, sizeof text, "[%s]:%u", buf, unsigned(port()));
    return text;
  }
  ::inet_ntop(AF_INET, &s_.v4.sin_addr, buf, sizeof buf);
  std::snprintf(text, sizeof text, "%s:%u", buf, unsigned(port()));
  return text;
}

/// Private data received with an rdma_cm event: the transport's whole area (the bytes the peer
/// sent, then zeros up to the transport's limit).
struct cm_private_data {
  /// The transport's whole area.
  std::array<std::byte, cm_accept_private_data_max> bytes{};
  /// Bytes of the area in use: the transport's limit for the event (the peer's, then zeros).
  std::uint8_t size = 0;
  /// The first `size` bytes.
  [[nodiscard]] std::span<const std::byte> span() const noexcept { return detail::span_of(bytes.data(), size); }
};

} // namespace rdmaxx
