/// \file
/// rdmaxx/remote_descriptor.hpp: what a peer needs to access memory granted to it (address, length,
/// rkey, rights), as a small value type with a stable, versioned, big-endian encoding.
///
/// Every encoded descriptor starts with the same 8-byte header; the kinds are this one (a window),
/// the indirect-key descriptor (ikey_descriptor.hpp) and any added later, each with its own body:
/// ```
///   offset size field
///        0    4 magic         0x52445844 ("RDXD")
///        4    1 version       1 (descriptor_version); any other value is refused (wrong_version)
///        5    1 kind          descriptor_kind (1 window, 2 indirect key, 3 endpoint,
///                             4 grant list, 5 grant offer)
///        6    2 body_length   bytes that follow the header
/// ```
/// Body of kind `window` (24 bytes, so 32 bytes in all):
/// ```
///        8    8 addr          the address the peer puts in its work requests (an offset from 0
///                             for zero-based windows)
///       16    8 length        bytes granted, > 0
///       24    4 rkey
///       28    1 rights        wire rights (below); not 0
///       29    1 flags         bit 0 zero-based
///       30    2 reserved      0
/// ```
/// Rights, the same byte in every kind (detail::rights_to_wire): bit 0 remote read, bit 1 remote
/// write, bit 2 remote atomic, other bits 0. All integers are big-endian. Decoders check everything and never read past their input: a
/// truncated, padded, malformed or unknown-version input is refused, never half-decoded.
///
/// Allocation: none (an encoding is a std::array value or goes into the caller's buffer).
#pragma once

#include "access.hpp"
#include "detail/wire.hpp"
#include "error.hpp"
#include "work_request.hpp" // remote_addr

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaxx {

/// What a descriptor describes. Values are part of the wire format: never renumber.
enum class descriptor_kind : std::uint8_t {
  window = 1,       ///< one contiguous range behind one rkey (a memory window or an MR)
  indirect_key = 2, ///< the segments of an indirect key (ikey_descriptor.hpp)
  endpoint = 3,     ///< a QP's connection endpoint (queue_pair.hpp: endpoint::encode)
  grant_list = 4,   ///< the grants of one request (grant_list.hpp)
  grant_offer = 5,  ///< what a GrantPool's owner lets its peer do (grant_pool.hpp)
  // 6 and up: reserved for other kinds.
};

/// The first 4 bytes of every encoded descriptor: "RDXD".
inline constexpr std::uint32_t descriptor_magic = 0x52445844u; // "RDXD"
/// The encoding version this library writes and accepts.
inline constexpr std::uint8_t descriptor_version = 1;

namespace detail {
/// The remote rights of every descriptor kind as one wire byte (our own bits, independent of the
/// IBV_ACCESS_* values): bit 0 remote read, bit 1 remote write, bit 2 remote atomic.
inline constexpr std::uint8_t wire_rights_mask = 0x7;
[[nodiscard]] constexpr std::uint8_t rights_to_wire(access_flags a) noexcept {
  return std::uint8_t((a.any(access::remote_read) ? 1 : 0) | (a.any(access::remote_write) ? 2 : 0) |
                      (a.any(access::remote_atomic) ? 4 : 0));
}
/// The rights of a wire byte; bits outside wire_rights_mask are ignored (decoders refuse them).
[[nodiscard]] constexpr access_flags rights_from_wire(std::uint8_t b) noexcept {
  access_flags a;
  if (b & 1) a |= access::remote_read;
  if (b & 2) a |= access::remote_write;
  if (b & 4) a |= access::remote_atomic;
  return a;
}
} // namespace detail

/// The common header of every encoded descriptor.
struct descriptor_header {
  /// Encoded bytes of the header.
  static constexpr std::size_t size = 8;
  /// Encoding version (peek() refuses any other than descriptor_version).
  std::uint8_t version = descriptor_version;
  std::uint8_t kind = 0;          ///< a descriptor_kind value (kept raw: it may be a newer kind)
  /// Bytes of the body that follows the header.
  std::uint16_t body_length = 0;

  /// Header plus body: how many bytes the whole descriptor takes.
  [[nodiscard]] constexpr std::size_t total_size() const noexcept { return size + body_length; }

  /// Read and check the header at the start of `in` (the body need not be there yet: use
  /// total_size() to know how much more to receive).
  /// \errors
  /// - errc::malformed_input: fewer than 8 bytes, wrong magic.
  /// - errc::wrong_version: a version other than descriptor_version.
  /// \mallocs None.
  [[nodiscard]] static result<descriptor_header> peek(std::span<const std::byte> in) noexcept {
    detail::wire_reader r(in);
    const std::uint32_t magic = r.u32();
    descriptor_header h;
    h.version = r.u8();
    h.kind = r.u8();
    h.body_length = r.u16();
    if (r.failed() || magic != descriptor_magic) return make_error_code(errc::malformed_input);
    if (h.version != descriptor_version) return make_error_code(errc::wrong_version);
    return h;
  }

  /// Append the 8 encoded header bytes (descriptor_magic first) to `w` (used by the encoders).
  void write(detail::wire_writer &w) const noexcept {
    w.u32(descriptor_magic);
    w.u8(version);
    w.u8(kind);
    w.u16(body_length);
  }
};

/// Access to one contiguous range of a peer's memory: where, how much, with which key and which
/// rights. MemoryWindow::bind() returns one; send it with encode() and rebuild it with decode().
struct remote_descriptor {
  /// Encoded bytes of a window body.
  static constexpr std::size_t body_size = 24;
  /// Encoded bytes of a whole window descriptor (header and body: 32).
  static constexpr std::size_t encoded_size = descriptor_header::size + body_size;

  std::uint64_t addr = 0;   ///< what the peer puts in its work requests (offset if zero_based)
  std::uint64_t length = 0; ///< bytes granted
  /// The remote key of the window (or MR) that grants the access.
  std::uint32_t rkey = 0;
  access_flags rights;      ///< remote_read / remote_write / remote_atomic
  /// True when addr is an offset from the start of the range (a zero-based window).
  bool zero_based = false;

  /// The remote address `offset` bytes into the range (unchecked: fast path).
  [[nodiscard]] remote_addr at(std::uint64_t offset) const noexcept { return {addr + offset, rkey}; }

  /// The remote address of [offset, offset+len), checked against the granted length.
  /// \errors
  /// - errc::zero_length: `len` is 0.
  /// - errc::out_of_range: [offset, offset+len) is not inside the granted length.
  /// \mallocs None.
  [[nodiscard]] result<remote_addr> slice(std::uint64_t offset, std::uint64_t len) const noexcept {
    if (len == 0) return make_error_code(errc::zero_length);
    if (offset > length || len > length - offset) return make_error_code(errc::out_of_range);
    return at(offset);
  }

  /// The 32-byte big-endian encoding (layout at the top of this header). Never fails.
  [[nodiscard]] std::array<std::byte, encoded_size> encode() const noexcept {
    std::array<std::byte, encoded_size> out{};
    detail::wire_writer w(out);
    descriptor_header{descriptor_version, std::uint8_t(descriptor_kind::window), body_size}.write(w);
    w.u64(addr);
    w.u64(length);
    w.u32(rkey);
    w.u8(detail::rights_to_wire(rights));
    w.u8(zero_based ? 1 : 0);
    w.u16(0);
    return out;
  }
  /// Encode into the front of `out`; returns the bytes written.
  /// \errors
  /// - errc::buffer_too_small: `out` is shorter than encoded_size (nothing is written).
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> encode_to(std::span<std::byte> out) const noexcept {
    if (out.size() < encoded_size) return make_error_code(errc::buffer_too_small);
    const auto a = encode();
    for (std::size_t i = 0; i < encoded_size; ++i) out[i] = a[i];
    return encoded_size;
  }

  /// Decode exactly one window descriptor; `in` must be exactly encoded_size bytes.
  /// \errors
  /// - errc::malformed_input: truncated, trailing bytes, wrong magic or body length, unknown
  ///   rights or flag bits, reserved bits set, no rights, zero length, a range that wraps the
  ///   64-bit address space.
  /// - errc::wrong_version: another encoding version.
  /// - errc::wrong_type: a valid header of another descriptor kind.
  /// \mallocs None.
  [[nodiscard]] static result<remote_descriptor> decode(std::span<const std::byte> in) noexcept {
    RDMAXX_TRY(h, descriptor_header::peek(in));
    if (h.kind != std::uint8_t(descriptor_kind::window)) return make_error_code(errc::wrong_type);
    if (h.body_length != body_size || in.size() != encoded_size)
      return make_error_code(errc::malformed_input);
    detail::wire_reader r(in.subspan(descriptor_header::size));
    remote_descriptor d;
    d.addr = r.u64();
    d.length = r.u64();
    d.rkey = r.u32();
    const std::uint8_t rights = r.u8();
    const std::uint8_t fl = r.u8();
    const std::uint16_t reserved = r.u16();
    if (r.failed() || r.remaining() != 0) return make_error_code(errc::malformed_input);
    if ((rights & ~detail::wire_rights_mask) != 0 || rights == 0 || (fl & ~0x1u) != 0 || reserved != 0)
      return make_error_code(errc::malformed_input);
    if (d.length == 0 || d.addr + d.length < d.addr) return make_error_code(errc::malformed_input);
    d.rights = detail::rights_from_wire(rights);
    d.zero_based = (fl & 1) != 0;
    return d;
  }

  /// Field-wise equality.
  friend constexpr bool operator==(const remote_descriptor &, const remote_descriptor &) noexcept = default;
};

} // namespace rdmaxx
