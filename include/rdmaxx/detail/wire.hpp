/// \file
/// rdmaxx/detail/wire.hpp: byte-order-defined encoding helpers for values sent to peers
/// (remote descriptors). Big-endian (network order) integers; a bounds-checked reader that never
/// reads past its input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaxx::detail {

/// Appends big-endian integers to a caller-supplied buffer; overflow() tells if it ran out.
class wire_writer {
public:
  // By pointer and size: a std::span of bytes built in a header costs every TU that includes
  // it (libstdc++'s contiguous_iterator check), so the encoders pass their arrays this way.
  wire_writer(std::byte *out, std::size_t n) noexcept : out_(out), n_(n) {}
  explicit wire_writer(std::span<std::byte> out) noexcept : wire_writer(out.data(), out.size()) {}
  void u8(std::uint8_t v) noexcept { put(v, 1); }
  void u16(std::uint16_t v) noexcept { put(v, 2); }
  void u32(std::uint32_t v) noexcept { put(v, 4); }
  void u64(std::uint64_t v) noexcept { put(v, 8); }
  [[nodiscard]] std::size_t size() const noexcept { return pos_; }
  [[nodiscard]] bool overflow() const noexcept { return overflow_; }

private:
  void put(std::uint64_t v, std::size_t n) noexcept {
    if (n_ - pos_ < n || overflow_) {
      overflow_ = true;
      return;
    }
    for (std::size_t i = 0; i < n; ++i)
      out_[pos_ + i] = std::byte((v >> (8 * (n - 1 - i))) & 0xff);
    pos_ += n;
  }
  std::byte *out_;
  std::size_t n_;
  std::size_t pos_ = 0;
  bool overflow_ = false;
};

/// Reads big-endian integers; once a read would pass the end, every later read yields 0 and
/// failed() is true (check it once at the end).
class wire_reader {
public:
  wire_reader(const std::byte *in, std::size_t n) noexcept : in_(in), n_(n) {}
  explicit wire_reader(std::span<const std::byte> in) noexcept : wire_reader(in.data(), in.size()) {}
  // The bytes of `in` after its first `skip` (none when it is shorter).
  [[nodiscard]] static wire_reader after(std::span<const std::byte> in, std::size_t skip) noexcept {
    return skip <= in.size() ? wire_reader(in.data() + skip, in.size() - skip) : wire_reader(nullptr, 0);
  }
  std::uint8_t u8() noexcept { return std::uint8_t(get(1)); }
  std::uint16_t u16() noexcept { return std::uint16_t(get(2)); }
  std::uint32_t u32() noexcept { return std::uint32_t(get(4)); }
  std::uint64_t u64() noexcept { return get(8); }
  [[nodiscard]] bool failed() const noexcept { return failed_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return n_ - pos_; }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }

private:
  std::uint64_t get(std::size_t n) noexcept {
    if (failed_ || n_ - pos_ < n) {
      failed_ = true;
      return 0;
    }
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v = (v << 8) | std::uint64_t(in_[pos_ + i]);
    pos_ += n;
    return v;
  }
  const std::byte *in_;
  std::size_t n_;
  std::size_t pos_ = 0;
  bool failed_ = false;
};

} // namespace rdmaxx::detail
