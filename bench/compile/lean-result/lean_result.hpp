// bench/compile/lean-result/lean_result.hpp: an EXPERIMENT for issue #44, not part of rdmaxx. A
// minimal result<T> with the interface rdmaxx's headers use (construction from a value, an
// error_code or an error enum, success(), bool, value/assume_value/error), put in place of
// Boost.Outcome's std_result in a copy of include/ by ./run, to measure what Outcome's
// basic_result costs a user's translation unit. Not a proposal for the code of a lean result.
#pragma once
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>
namespace rdmaxx {
struct success_t {};
inline constexpr success_t success() noexcept { return {}; }
template <class T>
class [[nodiscard]] result {
public:
  using value_type = T;
  template <class U, std::enable_if_t<std::is_constructible_v<T, U &&> && !std::is_same_v<std::decay_t<U>, result> &&
                                          !std::is_same_v<std::decay_t<U>, std::error_code> &&
                                          !std::is_error_code_enum_v<std::decay_t<U>>, int> = 0>
  result(U &&v) noexcept(std::is_nothrow_constructible_v<T, U &&>) : ok_(true) { ::new (&v_) T(std::forward<U>(v)); }
  result(std::error_code e) noexcept : e_(e), ok_(false) {}
  result(std::errc e) noexcept : e_(std::make_error_code(e)), ok_(false) {}
  template <class E, std::enable_if_t<std::is_error_code_enum_v<E>, int> = 0>
  result(E e) noexcept : e_(make_error_code(e)), ok_(false) {}
  result(result &&o) noexcept(std::is_nothrow_move_constructible_v<T>) : e_(o.e_), ok_(o.ok_) { if (ok_) ::new (&v_) T(std::move(o.v_)); }
  result(const result &o) requires std::is_copy_constructible_v<T> : e_(o.e_), ok_(o.ok_) { if (ok_) ::new (&v_) T(o.v_); }
  result &operator=(result &&o) noexcept { if (this != &o) { this->~result(); ::new (this) result(std::move(o)); } return *this; }
  result &operator=(const result &o) requires std::is_copy_constructible_v<T> { if (this != &o) { this->~result(); ::new (this) result(o); } return *this; }
  ~result() { if (ok_) v_.~T(); }
  explicit operator bool() const noexcept { return ok_; }
  bool has_value() const noexcept { return ok_; }
  bool has_error() const noexcept { return !ok_; }
  T &value() & { check(); return v_; }
  const T &value() const & { check(); return v_; }
  T &&value() && { check(); return std::move(v_); }
  T &assume_value() & noexcept { return v_; }
  const T &assume_value() const & noexcept { return v_; }
  T &&assume_value() && noexcept { return std::move(v_); }
  std::error_code error() const noexcept { return e_; }
private:
  void check() const { if (!ok_) throw std::system_error(e_); }
  union { T v_; };
  std::error_code e_;
  bool ok_;
};
template <>
class [[nodiscard]] result<void> {
public:
  using value_type = void;
  result(success_t) noexcept : ok_(true) {}
  result() noexcept : ok_(true) {}
  result(std::error_code e) noexcept : e_(e), ok_(false) {}
  result(std::errc e) noexcept : e_(std::make_error_code(e)), ok_(false) {}
  template <class E, std::enable_if_t<std::is_error_code_enum_v<E>, int> = 0>
  result(E e) noexcept : e_(make_error_code(e)), ok_(false) {}
  explicit operator bool() const noexcept { return ok_; }
  bool has_value() const noexcept { return ok_; }
  bool has_error() const noexcept { return !ok_; }
  void value() const { if (!ok_) throw std::system_error(e_); }
  void assume_value() const noexcept {}
  std::error_code error() const noexcept { return e_; }
private:
  std::error_code e_;
  bool ok_;
};
} // namespace rdmaxx
