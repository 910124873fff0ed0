/// \file
/// rdmaxx/result.hpp: result<T>, what every fallible rdmaxx call returns: a T, or the
/// std::error_code of why there is none. [[nodiscard]].
///
/// rdmaxx's own type, with the names and meanings of Boost.Outcome's result, which it replaced
/// (CHANGELOG, 0.4): has_value(), value(), assume_value(), error(), as_failure(), success().
/// Outcome's basic_result cost every translation unit about a third of what rdmaxx added to it
/// (docs/performance.md, compile time); this one is a union and a flag. It interoperates with
/// Outcome, which it no longer needs:
///   - BOOST_OUTCOME_TRY works on it in a function returning an Outcome result (as_failure()
///     gives the error_code, which Outcome's result takes);
///   - an Outcome result is explicitly constructible from it (Outcome's "ValueOrError"
///     conversion: has_value(), value(), error(), value_type, error_type).
///
/// Contracts: value() on a failed result throws std::system_error(error()) (without exceptions:
/// std::terminate); assume_value() and assume_error() require the state they name; error() of a
/// result that holds a value is an empty error_code. rdmaxx never calls value() on a failure.
///
/// Allocation: none. A result of a trivially copyable T is trivially copyable itself.
#pragma once

#include <exception>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

namespace rdmaxx {

/// What success() gives: converts to a successful result<void>.
struct success_type {};
/// success(): what a function returning result<void> returns when it succeeds.
[[nodiscard]] constexpr success_type success() noexcept { return {}; }

namespace detail {
// value() of a failed result.
[[noreturn]] inline void result_value_of_failure(const std::error_code &e) {
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  throw std::system_error(e);
#else
  (void)e;
  std::terminate();
#endif
}

// The traits below are the compilers' builtins (what <type_traits> is made of on g++ and clang)
// and concepts, not std traits: every return statement of every rdmaxx function picks a
// constructor here, and the std traits' helper classes, instantiated per type pair, cost every
// translation unit more than result itself.

// An enum that makes an error_code by ADL (std::errc, rdmaxx::errc, ...).
template <class E>
concept error_code_enum = __is_enum(E) && requires(E e) {
  requires __is_same(decltype(make_error_code(e)), std::error_code);
};
// Implicit conversion of a U&& to T (std::is_convertible, as a concept).
template <class T>
void result_accepts(T) noexcept;
template <class U, class T>
concept converts_to = requires(U &&u) { result_accepts<T>(static_cast<U &&>(u)); };

// Trivially copyable: trivial copies, moves and destructor. The compiler's builtin (what
// std::is_trivially_copyable is made of on g++ and clang) rather than five std traits: each
// result<T> instantiates this once, and the traits' helpers were most of its cost.
template <class T>
inline constexpr bool result_trivial = __is_trivially_copyable(T);

struct value_tag {};
struct error_tag {};

// The storage: a T or an error_code, and which. Trivial special members for a trivial T (the
// base is chosen rather than constrained members, which clang 14 does not make trivial).
template <class T, bool = result_trivial<T>>
class result_storage {
protected:
  template <class... A>
  constexpr explicit result_storage(value_tag, A &&...a) noexcept(__is_nothrow_constructible(T, A &&...))
      : v_(std::forward<A>(a)...), ok_(true) {}
  constexpr result_storage(error_tag, const std::error_code &e) noexcept : e_(e), ok_(false) {}
  union {
    T v_;
    std::error_code e_;
  };
  bool ok_;
};

template <class T>
class result_storage<T, false> {
protected:
  template <class... A>
  explicit result_storage(value_tag, A &&...a) noexcept(__is_nothrow_constructible(T, A &&...))
      : v_(std::forward<A>(a)...), ok_(true) {}
  result_storage(error_tag, const std::error_code &e) noexcept : e_(e), ok_(false) {}

public:
  result_storage(const result_storage &o) noexcept(__is_nothrow_constructible(T, const T &))
    requires __is_constructible(T, const T &)
  {
    construct(o);
  }
  result_storage(result_storage &&o) noexcept(__is_nothrow_constructible(T, T &&)) { construct(std::move(o)); }
  result_storage &operator=(const result_storage &o) noexcept(__is_nothrow_constructible(T, const T &) &&
                                                              __is_nothrow_assignable(T &, const T &))
    requires __is_constructible(T, const T &) && __is_assignable(T &, const T &)
  {
    return assign(o);
  }
  result_storage &operator=(result_storage &&o) noexcept(__is_nothrow_constructible(T, T &&) &&
                                                         __is_nothrow_assignable(T &, T &&)) {
    return assign(std::move(o));
  }
  ~result_storage() { clear(); }

protected:
  void clear() noexcept {
    if (ok_) v_.~T();
  }
  // The copy and the move: S is const result_storage & or result_storage.
  template <class S>
  void construct(S &&o) {
    ok_ = o.ok_;
    if (ok_) ::new (static_cast<void *>(&v_)) T(std::forward<S>(o).v_);
    else ::new (static_cast<void *>(&e_)) std::error_code(o.e_);
  }
  template <class S>
  result_storage &assign(S &&o) {
    if (ok_ && o.ok_) v_ = std::forward<S>(o).v_;
    else if (this != &o) {
      clear();
      construct(std::forward<S>(o));
    }
    return *this;
  }
  union {
    T v_;
    std::error_code e_;
  };
  bool ok_;
};
} // namespace detail

/// A T, or the std::error_code of why there is none.
template <class T>
class [[nodiscard]] result : public detail::result_storage<T> {
  using base = detail::result_storage<T>;
  template <class U>
  static constexpr bool value_like = !__is_same(std::remove_cvref_t<U>, result) &&
                                     !__is_same(std::remove_cvref_t<U>, std::error_code) &&
                                     !detail::error_code_enum<std::remove_cvref_t<U>> &&
                                     !__is_same(std::remove_cvref_t<U>, success_type);

public:
  using value_type = T;               ///< what a successful result holds
  using error_type = std::error_code; ///< what a failed result holds

  /// A value, from anything that converts to T.
  template <class U = T>
    requires value_like<U> && detail::converts_to<U, T>
  constexpr result(U &&v) noexcept(__is_nothrow_constructible(T, U &&))
      : base(detail::value_tag{}, std::forward<U>(v)) {}
  /// A value constructed in place from `a`.
  template <class... A>
    requires __is_constructible(T, A &&...)
  constexpr explicit result(std::in_place_type_t<T>, A &&...a) noexcept(__is_nothrow_constructible(T, A &&...))
      : base(detail::value_tag{}, std::forward<A>(a)...) {}
  /// A failure. `e` should be non-empty (an empty code is kept, and reads as a failure).
  constexpr result(const std::error_code &e) noexcept : base(detail::error_tag{}, e) {}
  /// A failure, from an error-code enum (std::errc, rdmaxx::errc, ...).
  template <detail::error_code_enum E>
  result(E e) noexcept : base(detail::error_tag{}, make_error_code(e)) {}
  /// True when it holds a value.
  [[nodiscard]] constexpr explicit operator bool() const noexcept { return this->ok_; }
  /// True when it holds a value.
  [[nodiscard]] constexpr bool has_value() const noexcept { return this->ok_; }
  /// True when it holds an error.
  [[nodiscard]] constexpr bool has_error() const noexcept { return !this->ok_; }
  /// Outcome's name for has_error().
  [[nodiscard]] constexpr bool has_failure() const noexcept { return !this->ok_; }

  /// The value; a failure throws std::system_error(error()) (without exceptions: terminates).
  constexpr T &value() & {
    if (!this->ok_) detail::result_value_of_failure(this->e_);
    return this->v_;
  }
  /// The value; a failure throws std::system_error(error()) (without exceptions: terminates).
  constexpr const T &value() const & {
    if (!this->ok_) detail::result_value_of_failure(this->e_);
    return this->v_;
  }
  /// The value, moved out; a failure throws std::system_error(error()) (without exceptions:
  /// terminates).
  constexpr T &&value() && {
    if (!this->ok_) detail::result_value_of_failure(this->e_);
    return std::move(this->v_);
  }
  /// The value; a failure throws std::system_error(error()) (without exceptions: terminates).
  constexpr const T &&value() const && {
    if (!this->ok_) detail::result_value_of_failure(this->e_);
    return std::move(this->v_);
  }
  /// The value; the result must hold one.
  constexpr T &assume_value() & noexcept { return this->v_; }
  constexpr const T &assume_value() const & noexcept { return this->v_; } ///< as assume_value() &
  constexpr T &&assume_value() && noexcept { return std::move(this->v_); } ///< moved out
  constexpr const T &&assume_value() const && noexcept { return std::move(this->v_); } ///< as above

  /// The error; empty when the result holds a value.
  [[nodiscard]] std::error_code error() const noexcept { return this->ok_ ? std::error_code() : this->e_; }
  /// The error; the result must hold one.
  [[nodiscard]] constexpr const std::error_code &assume_error() const noexcept { return this->e_; }
  /// The error, to return from a function whose result takes an error_code (BOOST_OUTCOME_TRY).
  [[nodiscard]] std::error_code as_failure() const noexcept { return error(); }
};

/// result<void>: success, or the std::error_code of a failure.
template <>
class [[nodiscard]] result<void> {
public:
  using value_type = void;            ///< nothing: success carries no value
  using error_type = std::error_code; ///< what a failed result holds

  /// Success.
  result() noexcept : ok_(true) {}
  /// Success: what success() converts to.
  result(success_type) noexcept : ok_(true) {}
  /// A failure. `e` should be non-empty (an empty code is kept, and reads as a failure).
  constexpr result(const std::error_code &e) noexcept : e_(e), ok_(false) {}
  /// A failure, from an error-code enum (std::errc, rdmaxx::errc, ...).
  template <detail::error_code_enum E>
  result(E e) noexcept : e_(make_error_code(e)), ok_(false) {}
  /// Another result's failure, or success (its value dropped).
  template <class U>
  explicit result(const result<U> &o) noexcept : e_(o.error()), ok_(o.has_value()) {}

  [[nodiscard]] constexpr explicit operator bool() const noexcept { return ok_; } ///< true on success
  [[nodiscard]] constexpr bool has_value() const noexcept { return ok_; }        ///< true on success
  [[nodiscard]] constexpr bool has_error() const noexcept { return !ok_; }       ///< true on failure
  [[nodiscard]] constexpr bool has_failure() const noexcept { return !ok_; }     ///< as has_error()
  /// Nothing; a failure throws std::system_error(error()) (without exceptions: terminates).
  constexpr void value() const {
    if (!ok_) detail::result_value_of_failure(e_);
  }
  constexpr void assume_value() const noexcept {} ///< nothing (Outcome's name, for generic code)
  /// The error; empty on success.
  [[nodiscard]] std::error_code error() const noexcept { return e_; }
  /// The error; the result must hold one.
  [[nodiscard]] constexpr const std::error_code &assume_error() const noexcept { return e_; }
  /// The error, to return from a function whose result takes an error_code (BOOST_OUTCOME_TRY).
  [[nodiscard]] std::error_code as_failure() const noexcept { return e_; }

private:
  std::error_code e_;
  bool ok_;
};

} // namespace rdmaxx
