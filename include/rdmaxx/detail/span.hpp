/// \file
/// rdmaxx/detail/span.hpp: `span_of(p, n)`, the `std::span<T>` of n elements at p, built without
/// std::span's (iterator, count) constructor. That constructor checks
/// `std::contiguous_iterator<T *>`, a concept whose satisfaction costs every g++ translation unit
/// about as much as a small header, once per element type (bench/results/records.json, goal
/// compile-time), and the headers build spans of a dozen types of their own. Every public accessor and internal slice goes through
/// here; a span the user builds (`cq.poll({wc, n})`) is the user's.
#pragma once

#include <cstddef>
#include <span>

namespace rdmaxx::detail {

/// The span of `n` elements at `p` (p may be null when n is 0). No check: the caller's bounds.
template <class T>
[[nodiscard]] inline std::span<T> span_of(T *p, std::size_t n) noexcept {
#if defined(__GLIBCXX__) || defined(_LIBCPP_VERSION)
  // libstdc++ and libc++ both store a dynamic-extent span as (pointer, size), in that order;
  // test_span checks it both ways for the element types the headers use.
  struct parts {
    T *p;
    std::size_t n;
  };
  static_assert(sizeof(std::span<T>) == sizeof(parts) && __is_trivially_copyable(std::span<T>));
  return __builtin_bit_cast(std::span<T>, parts{p, n});
#else
  return std::span<T>(p, n);
#endif
}

/// `s` from element `k` on (k <= s.size()): `s.subspan(k)` without its constructor.
template <class T>
[[nodiscard]] inline std::span<T> span_from(std::span<T> s, std::size_t k) noexcept {
  return span_of(s.data() + k, s.size() - k);
}

} // namespace rdmaxx::detail
