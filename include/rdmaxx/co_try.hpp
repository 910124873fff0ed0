/// \file
/// rdmaxx/co_try.hpp: RDMAXX_CO_TRY and RDMAXX_CO_TRYV, the coroutine forms of RDMAXX_TRY and
/// RDMAXX_TRYV (error.hpp). A coroutine cannot `return`, so those do not compile in one; these
/// `co_return` the error instead:
/// ```
///   task<result<void>> client(address to, conn_options o, ibv_sge sge) {  // asio.hpp's task
///     RDMAXX_CO_TRY(conn, co_await ra::connect(to, o));  // bound to the value, or co_return
///     RDMAXX_CO_TRYV(conn.qp().post_recv(1, sge));       // a plain result works too
///     ...
///     co_return success();
///   }
/// ```
/// The coroutine's return type must accept a std::error_code in `co_return`: a result<T> of any T
/// (asio::task<result<T>>, every coroutine of asio.hpp), or a std::error_code (asio::task<
/// std::error_code>, as watch() returns). The expression gives a result<T> (typically
/// `co_await` of an awaitable of one); RDMAXX_CO_TRYV also takes a std::error_code, which fails
/// when it is non-empty (as watch() returns it: empty when stopped). The expression's result is
/// held by value in the coroutine's frame (a prvalue, as co_await gives, is not copied; pass an
/// lvalue result with std::move). Used by asio.hpp (which
/// includes this header) and example 07; nothing here needs Boost.Asio.
///
/// Allocation: none; the expression's own (a co_await allocates what its awaitable does).
#pragma once

#include "error.hpp"

#include <system_error>
#include <utility>

namespace rdmaxx::detail {
// Whether a CO_TRY expression failed, and its error: a result<T>, or a std::error_code.
template <class R>
[[nodiscard]] constexpr bool co_try_failed(const R &r) noexcept {
  return !r.has_value();
}
[[nodiscard]] inline bool co_try_failed(const std::error_code &ec) noexcept { return bool(ec); }
template <class R>
[[nodiscard]] std::error_code co_try_error(const R &r) noexcept {
  return r.error();
}
[[nodiscard]] inline std::error_code co_try_error(const std::error_code &ec) noexcept { return ec; }
} // namespace rdmaxx::detail

/// RDMAXX_CO_TRYV(expr): in a coroutine, `co_return` expr's error if it failed (expr: a result<T>
/// of any T, or a std::error_code, which fails when non-empty).
#define RDMAXX_CO_TRYV(...)                                                                     \
  do {                                                                                         \
    auto rdmaxx_co_try_r_ = (__VA_ARGS__);                                                     \
    if (::rdmaxx::detail::co_try_failed(rdmaxx_co_try_r_)) [[unlikely]]                        \
      co_return ::rdmaxx::detail::co_try_error(rdmaxx_co_try_r_);                              \
  } while (0)
/// RDMAXX_CO_TRY(var, expr): in a coroutine, `co_return` expr's error if it failed, else bind its
/// value to `var` (expr: a result<T> with a value type; for result<void> use RDMAXX_CO_TRYV).
/// As RDMAXX_TRY, one per line.
#define RDMAXX_CO_TRY(var, ...)                                                                \
  auto RDMAXX_CAT_(rdmaxx_co_try_, __LINE__) = (__VA_ARGS__);                                  \
  if (!RDMAXX_CAT_(rdmaxx_co_try_, __LINE__).has_value()) [[unlikely]]                         \
    co_return RDMAXX_CAT_(rdmaxx_co_try_, __LINE__).error();                                   \
  [[maybe_unused]] auto &&var = std::move(RDMAXX_CAT_(rdmaxx_co_try_, __LINE__)).assume_value()
