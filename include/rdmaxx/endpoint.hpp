/// \file
/// rdmaxx/endpoint.hpp: what a peer needs to connect to a QP (endpoint, its 36-byte wire format)
/// and the choice of the source GID on a port (detail::select_gid_index: ibv_query_port(3),
/// ibv_query_gid_ex(3)).
///
/// Allocation: none.
#pragma once

#include "detail/wire.hpp"
#include "error.hpp"
#include "remote_descriptor.hpp" // descriptor_header (endpoint encoding)

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaxx {

/// What a peer needs to connect to a QP: exchange it out of band, as encode()'s bytes.
///
/// Encoding: kind 3 (descriptor_kind::endpoint) under the common 8-byte descriptor header of
/// remote_descriptor.hpp, then a 28-byte body (36 bytes in all), big-endian:
/// ```
///        8    4 qpn           1 .. 0xffffff
///       12    4 psn           0 .. 0xffffff
///       16   16 gid           the port's GID (RoCE: the address the peer sends to)
///       32    2 lid           InfiniBand LID (0 on RoCE)
///       34    1 mtu           ibv_mtu, 1 (256) .. 5 (4096)
///       35    1 reserved      0
/// ```
struct endpoint {
  /// Encoded bytes of an endpoint body.
  static constexpr std::size_t body_size = 28;
  /// Encoded bytes of a whole endpoint (header and body: 36).
  static constexpr std::size_t encoded_size = descriptor_header::size + body_size;

  /// QP number.
  std::uint32_t qpn = 0;
  /// Initial send PSN (24 bits): the receive PSN the peer expects.
  std::uint32_t psn = 0;
  /// GID of the port (required on RoCE).
  ibv_gid gid{};
  /// LID of the port (InfiniBand; 0 on RoCE).
  std::uint16_t lid = 0;
  /// Path MTU this side can use.
  ibv_mtu mtu = IBV_MTU_1024;

  /// The 36-byte encoding (layout above). Never fails.
  [[nodiscard]] std::array<std::byte, encoded_size> encode() const noexcept {
    std::array<std::byte, encoded_size> out{};
    detail::wire_writer w(out.data(), out.size());
    descriptor_header{descriptor_version, std::uint8_t(descriptor_kind::endpoint), body_size}.write(w);
    w.u32(qpn);
    w.u32(psn);
    for (auto b : gid.raw) w.u8(b);
    w.u16(lid);
    w.u8(std::uint8_t(mtu));
    w.u8(0);
    return out;
  }
  /// Decode exactly one endpoint; `in` must be exactly encoded_size bytes.
  /// \errors
  /// - errc::malformed_input: truncated, wrong magic or body length, qpn 0 or above 24 bits, psn
  ///   above 24 bits, an mtu outside 256..4096, reserved byte set.
  /// - descriptor_trailing_error() (malformed_input in descriptor_category()): bytes after a
  ///   complete endpoint; the message points to descriptor_header::peek().
  /// - errc::wrong_version: another encoding version.
  /// - descriptor_kind_error() (wrong_type in descriptor_category()): a valid header of another
  ///   kind; the message names the kind expected and the kind found.
  /// \mallocs None.
  [[nodiscard]] static result<endpoint> decode(std::span<const std::byte> in) noexcept;
  /// Field-wise equality.
  friend bool operator==(const endpoint &a, const endpoint &b) noexcept {
    for (std::size_t i = 0; i < sizeof a.gid.raw; ++i)
      if (a.gid.raw[i] != b.gid.raw[i]) return false;
    return a.qpn == b.qpn && a.psn == b.psn && a.lid == b.lid && a.mtu == b.mtu;
  }
};

namespace detail {
[[nodiscard]] inline bool gid_is_v4_mapped(const ibv_gid &g) noexcept {
  for (int i = 0; i < 10; ++i)
    if (g.raw[i] != 0) return false;
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}
[[nodiscard]] inline bool gid_is_zero(const ibv_gid &g) noexcept {
  for (auto b : g.raw)
    if (b != 0) return false;
  return true;
}
/// The GID index connect_options::gid_index == gid_auto means on `port`: on RoCE, the RoCE v2
/// GID of an IPv4 address of the port's netdev (IPv4-mapped), else a RoCE v2 GID of a global
/// IPv6 address, else any RoCE v2 GID, else the first non-zero GID; on InfiniBand index 0
/// (addressing uses the LID). Found through ibv_query_gid_ex (rdma-core 44), entry by entry.
/// \errors
/// - the errno of ibv_query_port.
/// - errc::no_device: no usable GID on the port.
/// \mallocs None.
[[nodiscard]] inline result<int> select_gid_index(ibv_context *ctx, std::uint8_t port) noexcept {
  ibv_port_attr pa{};
  if (const int rc = ::ibv_query_port(ctx, port, &pa)) return errno_code(rc);
  if (pa.link_layer == IBV_LINK_LAYER_INFINIBAND) return 0;
  int v4 = -1, v6 = -1, v2 = -1, any = -1;
  for (int i = 0; i < pa.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    if (::ibv_query_gid_ex(ctx, port, std::uint32_t(i), &e, 0) != 0) continue;
    if (gid_is_zero(e.gid)) continue;
    if (any < 0) any = i;
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    if (v2 < 0) v2 = i;
    if (gid_is_v4_mapped(e.gid)) {
      if (v4 < 0) v4 = i;
    } else if (!(e.gid.raw[0] == 0xfe && (e.gid.raw[1] & 0xc0) == 0x80) && v6 < 0) {
      v6 = i; // not link-local
    }
  }
  const int pick = v4 >= 0 ? v4 : v6 >= 0 ? v6 : v2 >= 0 ? v2 : any;
  if (pick < 0) return make_error_code(errc::no_device);
  return pick;
}
} // namespace detail

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/endpoint.ipp"
