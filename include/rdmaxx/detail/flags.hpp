// rdmaxx/detail/flags.hpp: a typed bitmask over an enum whose values are the C constants.
#pragma once

#include <type_traits>

namespace rdmaxx {

/// A set of Bit values. The underlying value is the C bitmask, so native() can be handed to verbs.
template <class Bit>
class flags {
public:
  using mask_type = std::underlying_type_t<Bit>;
  constexpr flags() noexcept = default;
  constexpr flags(Bit b) noexcept : m_(static_cast<mask_type>(b)) {}
  constexpr explicit flags(mask_type m) noexcept : m_(m) {}

  [[nodiscard]] constexpr mask_type native() const noexcept { return m_; }
  [[nodiscard]] constexpr bool has(flags o) const noexcept { return (m_ & o.m_) == o.m_ && o.m_ != 0; }
  [[nodiscard]] constexpr bool any(flags o) const noexcept { return (m_ & o.m_) != 0; }
  [[nodiscard]] constexpr bool empty() const noexcept { return m_ == 0; }
  [[nodiscard]] constexpr bool subset_of(flags o) const noexcept { return (m_ & ~o.m_) == 0; }
  constexpr explicit operator bool() const noexcept { return m_ != 0; }

  friend constexpr flags operator|(flags a, flags b) noexcept { return flags(mask_type(a.m_ | b.m_)); }
  friend constexpr flags operator&(flags a, flags b) noexcept { return flags(mask_type(a.m_ & b.m_)); }
  friend constexpr flags operator^(flags a, flags b) noexcept { return flags(mask_type(a.m_ ^ b.m_)); }
  constexpr flags operator~() const noexcept { return flags(mask_type(~m_)); }
  constexpr flags &operator|=(flags o) noexcept { m_ |= o.m_; return *this; }
  constexpr flags &operator&=(flags o) noexcept { m_ &= o.m_; return *this; }
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
