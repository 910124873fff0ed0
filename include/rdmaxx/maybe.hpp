/// \file
/// rdmaxx/maybe.hpp: maybe<T>, a T or nothing, for the small trivially copyable values the API
/// may leave unset (rereg_changes' fields, invalidated_rkey()).
///
/// What std::optional<T> is for such a T, with its names: has_value(), `bool`, `*`, `->`,
/// value_or(), reset(), `==` against a T. rdmaxx's own (CHANGELOG, 0.4) because `<optional>`
/// and each std::optional<T> instantiated cost every translation unit that includes rdmaxx.hpp
/// (bench/results/records.json, goal compile-time); this one is a T and a flag.
///
/// Contracts: `*` and `->` on an empty maybe give the T it holds (value-initialized, or the last
/// value before reset()): check has_value() first. Allocation: none; trivially copyable.
#pragma once

namespace rdmaxx {

/// A T, or nothing (default). T: trivially copyable and default-constructible.
template <class T>
class maybe {
  static_assert(__is_trivially_copyable(T), "maybe<T> holds trivially copyable values");

public:
  using value_type = T; ///< what it may hold

  /// Nothing.
  constexpr maybe() noexcept = default;
  /// `v` (implicit, as std::optional's).
  constexpr maybe(const T &v) noexcept : v_(v), has_(true) {}

  /// Whether it holds a value.
  [[nodiscard]] constexpr bool has_value() const noexcept { return has_; }
  /// Whether it holds a value.
  constexpr explicit operator bool() const noexcept { return has_; }
  /// The value held (has_value() first).
  [[nodiscard]] constexpr const T &operator*() const noexcept { return v_; }
  /// The value held (has_value() first).
  [[nodiscard]] constexpr T &operator*() noexcept { return v_; }
  /// The value held (has_value() first).
  constexpr const T *operator->() const noexcept { return &v_; }
  /// The value held (has_value() first).
  constexpr T *operator->() noexcept { return &v_; }
  /// The value held, or `otherwise` when empty.
  [[nodiscard]] constexpr T value_or(const T &otherwise) const noexcept { return has_ ? v_ : otherwise; }
  /// Empty it.
  constexpr void reset() noexcept { has_ = false; }

  /// Holds a value equal to `v` (std::optional's `opt == v`; `v == opt` too).
  [[nodiscard]] friend constexpr bool operator==(const maybe &m, const T &v) noexcept
    requires requires(const T &a) { a == a; }
  {
    return m.has_ && m.v_ == v;
  }

private:
  T v_{};
  bool has_ = false;
};

} // namespace rdmaxx
