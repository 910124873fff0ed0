/// \file
/// rdmaxx/detail/flags.hpp: a typed bitmask over an enum whose values are the C constants.
///
/// Allocation: none (constexpr).
#pragma once

#include <type_traits>

namespace rdmaxx {

/// A set of Bit values. The underlying value is the C bitmask, so native() can be handed to verbs.
template <class Bit>
class flags {
public:
  /// The C mask type (the enum's underlying type).
  using mask_type = std::underlying_type_t<Bit>;
  /// The empty set.
  constexpr flags() noexcept = default;
  /// One flag (implicit: a Bit converts to a set).
  constexpr flags(Bit b) noexcept : m_(static_cast<mask_type>(b)) {}
  /// From a C mask, as is (unknown bits are kept).
  constexpr explicit flags(mask_type m) noexcept : m_(m) {}

  /// The C mask, to hand to verbs.
  [[nodiscard]] constexpr mask_type native() const noexcept { return m_; }
  /// True when every flag of `o` is set (false for an empty `o`).
  [[nodiscard]] constexpr bool has(flags o) const noexcept { return (m_ & o.m_) == o.m_ && o.m_ != 0; }
  /// True when some flag of `o` is set.
  [[nodiscard]] constexpr bool any(flags o) const noexcept { return (m_ & o.m_) != 0; }
  /// True when no flag is set.
  [[nodiscard]] constexpr bool empty() const noexcept { return m_ == 0; }
  /// True when no flag outside `o` is set.
  [[nodiscard]] constexpr bool subset_of(flags o) const noexcept { return (m_ & ~o.m_) == 0; }
  /// True when some flag is set.
  constexpr explicit operator bool() const noexcept { return m_ != 0; }

  /// Union.
  friend constexpr flags operator|(flags a, flags b) noexcept { return flags(mask_type(a.m_ | b.m_)); }
  /// Intersection.
  friend constexpr flags operator&(flags a, flags b) noexcept { return flags(mask_type(a.m_ & b.m_)); }
  /// Symmetric difference.
  friend constexpr flags operator^(flags a, flags b) noexcept { return flags(mask_type(a.m_ ^ b.m_)); }
  /// Complement (every bit of mask_type, known or not).
  constexpr flags operator~() const noexcept { return flags(mask_type(~m_)); }
  /// Add the flags of `o`.
  constexpr flags &operator|=(flags o) noexcept { m_ |= o.m_; return *this; }
  /// Keep only the flags of `o`.
  constexpr flags &operator&=(flags o) noexcept { m_ &= o.m_; return *this; }
  /// Same mask.
  friend constexpr bool operator==(flags, flags) noexcept = default;

private:
  mask_type m_ = 0;
};

} // namespace rdmaxx

/// Lets `Bit | Bit` produce flags<Bit> for an enum declared with this macro.
#define RDMAXX_FLAGS_OPERATORS(Bit)                                                            \
  constexpr ::rdmaxx::flags<Bit> operator|(Bit a, Bit b) noexcept {                            \
    return ::rdmaxx::flags<Bit>(a) | ::rdmaxx::flags<Bit>(b);                                  \
  }
