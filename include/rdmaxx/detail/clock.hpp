/// \file
/// rdmaxx/detail/clock.hpp: a monotonic millisecond clock for the bounded waits.
///
/// clock_gettime(CLOCK_MONOTONIC) instead of std::chrono::steady_clock: with libstdc++ in C++20,
/// `<chrono>` drags in `<sstream>` and the locale machinery (its cost is in README's compile
/// table).
/// Timeouts in the API are int milliseconds, the convention of poll(2) and of the verbs.
#pragma once

#include <time.h>

#include <cstdint>

namespace rdmaxx::detail {

/// Milliseconds on CLOCK_MONOTONIC (never jumps with the wall clock).
[[nodiscard]] inline std::int64_t monotonic_ms() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return std::int64_t(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

} // namespace rdmaxx::detail
