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
/// truncated, padded, malformed or unknown-version input is refused, never half-decoded (for
/// rdma_cm private data, padded with zeros by the transport: remote_descriptor::
/// decode_private_data() accepts zeros after the descriptor and nothing else, grant_offer::decode()
/// ignores what follows the offer).
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
#include <cstdio>
#include <span>
#include <string>

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

/// The name of a descriptor_kind value ("window", "indirect key", ...; "unknown" otherwise).
[[nodiscard]] inline const char *descriptor_kind_name(std::uint8_t k) noexcept {
  switch (k) {
  case 1: return "window";
  case 2: return "indirect key";
  case 3: return "endpoint";
  case 4: return "grant list";
  case 5: return "grant offer";
  default: return "unknown";
  }
}

namespace detail {
// value layout: bits 0..7 rdmaxx::errc; wrong_type: bits 8..15 the kind expected, 16..23 the kind
// found; malformed_input: bits 8..23 the bytes past the descriptor (0: not that reason);
// bits 24..27 the reason (1: wrong kind, 2: trailing bytes).
class descriptor_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "rdmaxx.descriptor"; }
  std::string message(int v) const override;
  std::error_condition default_error_condition(int v) const noexcept override {
    return rdmaxx::error_category().default_error_condition(v & 0xff);
  }
};
} // namespace detail

/// The category of decoding errors that say more than their rdmaxx::errc: a descriptor of
/// another kind (expected and found kind), bytes after a descriptor. descriptor_errc() gives
/// the errc inside; each compares equal to that errc's std::errc condition.
inline const std::error_category &descriptor_category() noexcept {
  static const detail::descriptor_category_impl c;
  return c;
}
/// errc::wrong_type naming the kind expected and the kind found.
[[nodiscard]] inline std::error_code descriptor_kind_error(std::uint8_t expected, std::uint8_t found) noexcept {
  return {int(errc::wrong_type) | (int(expected) << 8) | (int(found) << 16) | (1 << 24),
          descriptor_category()};
}
/// errc::malformed_input for `extra` bytes after a complete descriptor.
[[nodiscard]] inline std::error_code descriptor_trailing_error(std::size_t extra) noexcept {
  const int n = extra > 0xffff ? 0xffff : int(extra);
  return {int(errc::malformed_input) | (n << 8) | (2 << 24), descriptor_category()};
}
/// The rdmaxx::errc inside a descriptor_category() code or a plain rdmaxx code; errc{} otherwise.
[[nodiscard]] inline errc descriptor_errc(const std::error_code &ec) noexcept {
  if (ec.category() == descriptor_category()) return errc(ec.value() & 0xff);
  if (ec.category() == error_category()) return errc(ec.value());
  return errc{};
}

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
    return peek(in.data(), in.size());
  }
  /// peek() of the `n` bytes at `in` (for the decoders, which reach a prefix of their input
  /// without building a std::span of it).
  [[nodiscard]] static result<descriptor_header> peek(const std::byte *in, std::size_t n) noexcept {
    detail::wire_reader r(in, n);
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
    detail::wire_writer w(out.data(), out.size());
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
  /// - errc::malformed_input: truncated, wrong magic or body length, unknown rights or flag
  ///   bits, reserved bits set, no rights, zero length, a range that wraps the 64-bit address
  ///   space.
  /// - descriptor_trailing_error() (malformed_input in descriptor_category()): bytes after a
  ///   complete descriptor; the message points to descriptor_header::peek().
  /// - errc::wrong_version: another encoding version.
  /// - descriptor_kind_error() (wrong_type in descriptor_category()): a valid header of another
  ///   descriptor kind; the message names the kind expected and the kind found.
  /// \mallocs None.
  [[nodiscard]] static result<remote_descriptor> decode(std::span<const std::byte> in) noexcept {
    return decode(in.data(), in.size());
  }
  /// decode() of the `n` bytes at `in`.
  [[nodiscard]] static result<remote_descriptor> decode(const std::byte *in, std::size_t n) noexcept;

  /// Decode one window descriptor from rdma_cm private data (Connection::peer_private_data(),
  /// ConnectRequest::private_data()): rdma_cm transmits no length, so the receiver gets the bytes
  /// sent followed by zeros up to the transport's limit (56 bytes on connect, 196 on accept).
  /// The descriptor must start at in[0]; the bytes after its 32 must all be zero. Unlike
  /// decode(), which refuses any byte after the descriptor, so that one input has one meaning.
  /// \errors
  /// - those of decode() for the first encoded_size bytes (fewer: errc::malformed_input).
  /// - errc::malformed_input: a non-zero byte after the descriptor (something else was sent
  ///   after it: the sender's format is not a lone descriptor).
  /// \mallocs None.
  [[nodiscard]] static result<remote_descriptor> decode_private_data(std::span<const std::byte> in) noexcept {
    if (in.size() <= encoded_size) return decode(in);
    for (std::size_t i = encoded_size; i < in.size(); ++i)
      if (in[i] != std::byte{0}) {
        // The descriptor's own errors first (another kind, a bad header): they say more.
        RDMAXX_TRYV(decode(in.data(), encoded_size));
        return make_error_code(errc::malformed_input);
      }
    return decode(in.data(), encoded_size);
  }

  /// Field-wise equality.
  friend constexpr bool operator==(const remote_descriptor &, const remote_descriptor &) noexcept = default;
};

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/remote_descriptor.ipp"
