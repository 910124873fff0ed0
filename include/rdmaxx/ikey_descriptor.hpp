/// \file
/// rdmaxx/ikey_descriptor.hpp: what a peer needs to write or read through an indirect key (its
/// segments, total length and rights), as a bounded value type with a versioned, big-endian
/// encoding of kind `indirect_key` under the common descriptor header (remote_descriptor.hpp).
///
/// Encoding (after the 8-byte header: magic "RDXD", version 1, kind 2, body_length = 16 + 16 n):
/// ```
///   offset size field
///        8    1 rights        wire rights (remote_descriptor.hpp), not 0
///        9    1 reserved      0
///       10    2 count         n segments, 1 .. max_segments
///       12    4 reserved      0
///       16    8 total_length  the sum of the segment lengths
///       24  16n segments      each: u64 addr, u32 length (> 0), u32 rkey
/// ```
/// The decoder checks everything and never reads past its input.
///
/// Allocation: none (a fixed-size value; encode() writes into the caller's buffer).
#pragma once

#include "access.hpp"
#include "detail/span.hpp"
#include "detail/wire.hpp"
#include "error.hpp"
#include "remote_descriptor.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaxx {

/// One segment of a key as a peer addresses it.
struct remote_segment {
  /// Remote address of the segment's first byte (0 for an mlx5 key, which is zero-based).
  std::uint64_t addr = 0;
  /// Bytes in the segment (> 0).
  std::uint32_t length = 0;
  /// The key that grants access to the segment (a window's rkey, or the mlx5 mkey's rkey).
  std::uint32_t rkey = 0;
  /// Field-wise equality.
  friend constexpr bool operator==(const remote_segment &, const remote_segment &) noexcept = default;
};

/// The segments (in address-space order) and rights of an indirect key, for a peer.
class ikey_descriptor {
public:
  /// Segments a descriptor holds at most.
  static constexpr std::size_t max_segments = 256;
  /// Encoded bytes of the body before the segments.
  static constexpr std::size_t body_header_size = 16;
  /// Encoded bytes per segment.
  static constexpr std::size_t segment_size = 16;
  /// Encoded bytes (header included) of a descriptor of `n` segments.
  [[nodiscard]] static constexpr std::size_t encoded_size(std::size_t n) noexcept {
    return descriptor_header::size + body_header_size + n * segment_size;
  }
  /// Encoded bytes of a descriptor of max_segments segments (a buffer that always fits).
  static constexpr std::size_t max_encoded_size =
      descriptor_header::size + body_header_size + max_segments * segment_size;
  /// The rights a descriptor can carry.
  static constexpr access_flags remote_rights =
      access::remote_read | access::remote_write | access::remote_atomic;

  /// An empty descriptor (no segments: encode() refuses it).
  ikey_descriptor() noexcept = default;

  /// Build from segments and remote rights.
  /// \errors
  /// - errc::zero_length: no segment, or an empty one.
  /// - errc::too_many_entries: more than max_segments.
  /// - errc::unknown_access_flag: rights other than remote read/write/atomic.
  /// - errc::missing_access: no right at all.
  /// - errc::out_of_range: the total length overflows.
  /// \mallocs None.
  [[nodiscard]] static result<ikey_descriptor> make(std::span<const remote_segment> segs,
                                                    access_flags rights) noexcept {
    if (segs.empty()) return make_error_code(errc::zero_length);
    if (segs.size() > max_segments) return make_error_code(errc::too_many_entries);
    if (!rights.subset_of(remote_rights)) return make_error_code(errc::unknown_access_flag);
    if (rights.empty()) return make_error_code(errc::missing_access);
    ikey_descriptor d;
    for (const auto &s : segs) {
      if (s.length == 0) return make_error_code(errc::zero_length);
      if (__builtin_add_overflow(d.length_, std::uint64_t(s.length), &d.length_))
        return make_error_code(errc::out_of_range);
      d.s_[d.n_++] = s;
    }
    d.rights_ = rights;
    return d;
  }

  /// Total bytes of the segments (the key's address space).
  [[nodiscard]] std::uint64_t length() const noexcept { return length_; }
  /// The remote rights granted.
  [[nodiscard]] access_flags rights() const noexcept { return rights_; }
  /// The segments, in address-space order.
  [[nodiscard]] std::span<const remote_segment> segments() const noexcept { return detail::span_of(s_.data(), n_); }

  /// Encode into the front of `out`; returns the bytes written (encoded_size of the segments).
  /// \errors
  /// - errc::zero_length: an empty descriptor.
  /// - errc::buffer_too_small: `out` is shorter than encoded_size (nothing is written).
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> encode(std::span<std::byte> out) const noexcept;

  /// Decode exactly one indirect-key descriptor from a peer's bytes.
  /// \errors
  /// - errc::malformed_input: truncated, wrong magic, a body length that does not match the
  ///   count, unknown rights bits or no rights, reserved bytes set, no or empty segments, lengths
  ///   that do not add up to the total.
  /// - descriptor_trailing_error() (malformed_input in descriptor_category()): bytes after a
  ///   complete descriptor (e.g. padded rdma_cm private data); the message points to
  ///   descriptor_header::peek().
  /// - errc::wrong_version: another encoding version.
  /// - descriptor_kind_error() (wrong_type in descriptor_category()): a valid header of another
  ///   kind; the message names the kind expected and the kind found.
  /// - errc::too_many_entries: more than max_segments.
  /// \mallocs None; never reads past `in`.
  [[nodiscard]] static result<ikey_descriptor> decode(std::span<const std::byte> in) noexcept;

  /// Same segments, total length and rights.
  friend bool operator==(const ikey_descriptor &a, const ikey_descriptor &b) noexcept {
    if (a.n_ != b.n_ || a.length_ != b.length_ || a.rights_ != b.rights_) return false;
    for (std::size_t i = 0; i < a.n_; ++i)
      if (!(a.s_[i] == b.s_[i])) return false;
    return true;
  }

private:
  std::array<remote_segment, max_segments> s_{};
  std::size_t n_ = 0;
  std::uint64_t length_ = 0;
  access_flags rights_{};
};

} // namespace rdmaxx

#include "impl/ikey_descriptor.ipp"
