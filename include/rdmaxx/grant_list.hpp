/// \file
/// rdmaxx/grant_list.hpp: grant_list, the grants of one request (up to eight window descriptors,
/// e.g. an input and an output buffer) in one compact encoding for a request header.
///
/// Kind 4 under the common descriptor header (remote_descriptor.hpp):
/// ```
///   offset size field
///        0    8 header        "RDXD", version 1, kind 4, body_length = 2 + 18 * count
///        8    1 count         1..8
///        9    1 reserved      0
///   per grant, 18 bytes:
///        0    8 addr          the address the peer puts in its work requests (offset if zero-based)
///        8    4 length        bytes granted, > 0 (a grant of 4 GiB or more does not fit: use
///                             remote_descriptor)
///       12    4 rkey
///       16    1 rights        wire rights (detail::rights_to_wire); not 0
///       17    1 flags         bit 0 zero-based
/// ```
/// Two grants take 46 bytes, so a request header with both fits in rdma_cm's 56 bytes of connect
/// private data too. Big-endian; the decoder checks everything and never reads past its input.
///
/// Allocation: none (a fixed array of descriptors).
#pragma once

#include "detail/span.hpp"
#include "detail/wire.hpp"
#include "error.hpp"
#include "remote_descriptor.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaxx {

/// The grants of one request, in the order they were added.
struct grant_list {
  /// Most grants in one list.
  static constexpr std::size_t max_grants = 8;
  /// Encoded bytes of one grant.
  static constexpr std::size_t entry_size = 18;
  /// Value of descriptor_header::kind for a grant list.
  static constexpr std::uint8_t kind = std::uint8_t(descriptor_kind::grant_list);

  /// Encoded bytes of a list of `n` grants (header included).
  [[nodiscard]] static constexpr std::size_t encoded_size(std::size_t n) noexcept {
    return descriptor_header::size + 2 + entry_size * n;
  }

  /// Append a grant.
  /// \errors
  /// - errc::too_many_entries: max_grants already.
  /// - errc::zero_length: `d.length` is 0.
  /// - errc::out_of_range: `d.length` does not fit 32 bits.
  /// - errc::bad_grant_rights: no remote right, or rights other than remote read/write/atomic.
  /// \mallocs None.
  result<void> push(const remote_descriptor &d) noexcept {
    if (count_ == max_grants) return make_error_code(errc::too_many_entries);
    if (d.length == 0) return make_error_code(errc::zero_length);
    if (d.length > 0xFFFFFFFFull) return make_error_code(errc::out_of_range);
    const access_flags remote = access::remote_read | access::remote_write | access::remote_atomic;
    if (!d.rights.subset_of(remote) || !d.rights.any(remote)) return make_error_code(errc::bad_grant_rights);
    grants_[count_++] = d;
    return success();
  }

  /// The grants.
  [[nodiscard]] std::span<const remote_descriptor> grants() const noexcept { return detail::span_of(grants_.data(), count_); }
  /// Number of grants.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  /// Grant `i` (unchecked).
  [[nodiscard]] const remote_descriptor &operator[](std::size_t i) const noexcept { return grants_[i]; }

  /// Encode into the front of `out`; returns the bytes written (encoded_size(size())).
  /// \errors
  /// - errc::zero_length: the list is empty.
  /// - errc::buffer_too_small: `out` is shorter than encoded_size(size()) (nothing is written).
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> encode_to(std::span<std::byte> out) const noexcept;

  /// Decode exactly one grant list; `in` must be exactly its encoded size (descriptor_header::peek
  /// gives it from the first 8 bytes).
  /// \errors
  /// - errc::malformed_input: truncated, wrong magic, a body length that does not match the
  ///   count, a count of 0 or above max_grants, reserved bits set, unknown rights or flag bits,
  ///   no rights, zero length, a range that wraps the 64-bit address space.
  /// - descriptor_trailing_error() (malformed_input in descriptor_category()): bytes after the
  ///   list its header announces (e.g. a receive buffer passed whole); the message points to
  ///   descriptor_header::peek().
  /// - errc::wrong_version: another encoding version.
  /// - descriptor_kind_error() (wrong_type in descriptor_category()): a valid header of another
  ///   descriptor kind; the message names the kind expected and the kind found.
  /// \mallocs None.
  [[nodiscard]] static result<grant_list> decode(std::span<const std::byte> in) noexcept;

  /// Grant-wise equality.
  friend bool operator==(const grant_list &a, const grant_list &b) noexcept {
    if (a.count_ != b.count_) return false;
    for (std::size_t i = 0; i < a.count_; ++i)
      if (!(a.grants_[i] == b.grants_[i])) return false;
    return true;
  }

private:
  std::array<remote_descriptor, max_grants> grants_{};
  std::size_t count_ = 0;
};

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/grant_list.ipp"
