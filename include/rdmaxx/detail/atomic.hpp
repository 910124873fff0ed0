/// \file
/// rdmaxx/detail/atomic.hpp: the atomic variables of the library's headers (reference counts,
/// send-queue credits, fault-injection hooks, id allocators), on the compiler's `__atomic`
/// builtins, which g++ and clang both provide and std::atomic is made of. Not `<atomic>`: parsing
/// it is a large part of a handle header's compile cost in a user's TU (`tools/bench compile`).
/// Only the operations the library uses, with std::atomic's names and meaning.
#pragma once

#include <type_traits>

namespace rdmaxx::detail {

/// The memory orders (std::memory_order's, as the builtins number them).
enum class order : int {
  relaxed = __ATOMIC_RELAXED,
  acquire = __ATOMIC_ACQUIRE,
  release = __ATOMIC_RELEASE,
  acq_rel = __ATOMIC_ACQ_REL,
  seq_cst = __ATOMIC_SEQ_CST,
};

/// An atomic T (an integer or a pointer, 1 to 8 bytes): std::atomic<T>'s load, store, exchange,
/// compare_exchange and, for integers, fetch_add/sub/or/and. Zero (null) when default-constructed.
template <class T>
class atomic {
  static_assert(std::is_integral_v<T> || std::is_pointer_v<T>, "an integer or a pointer");
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);
  static constexpr bool integral = std::is_integral_v<T>;
  // The failure order of a compare-exchange given only its success order (as std::atomic).
  static constexpr int fail_order(order o) noexcept {
    return o == order::acq_rel ? __ATOMIC_ACQUIRE : o == order::release ? __ATOMIC_RELAXED : int(o);
  }

public:
  constexpr atomic() noexcept : v_{} {}
  constexpr atomic(T v) noexcept : v_(v) {} // NOLINT: implicit, as std::atomic's
  atomic(const atomic &) = delete;
  atomic &operator=(const atomic &) = delete;

  T load(order o = order::seq_cst) const noexcept { return __atomic_load_n(&v_, int(o)); }
  void store(T v, order o = order::seq_cst) noexcept { __atomic_store_n(&v_, v, int(o)); }
  T exchange(T v, order o = order::seq_cst) noexcept { return __atomic_exchange_n(&v_, v, int(o)); }
  bool compare_exchange_strong(T &expected, T desired, order o = order::seq_cst) noexcept {
    return __atomic_compare_exchange_n(&v_, &expected, desired, false, int(o), fail_order(o));
  }
  bool compare_exchange_weak(T &expected, T desired, order success, order failure) noexcept {
    return __atomic_compare_exchange_n(&v_, &expected, desired, true, int(success), int(failure));
  }
  T fetch_add(T d, order o = order::seq_cst) noexcept requires integral { return __atomic_fetch_add(&v_, d, int(o)); }
  T fetch_sub(T d, order o = order::seq_cst) noexcept requires integral { return __atomic_fetch_sub(&v_, d, int(o)); }
  T fetch_or(T d, order o = order::seq_cst) noexcept requires integral { return __atomic_fetch_or(&v_, d, int(o)); }
  T fetch_and(T d, order o = order::seq_cst) noexcept requires integral { return __atomic_fetch_and(&v_, d, int(o)); }

private:
  alignas(sizeof(T)) T v_;
};

/// std::atomic_ref(x).store(v, o) for a plain variable that another thread may read atomically.
template <class T>
inline void atomic_store(T &x, T v, order o) noexcept {
  __atomic_store_n(&x, v, int(o));
}

} // namespace rdmaxx::detail
