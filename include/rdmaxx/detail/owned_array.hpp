/// \file
/// rdmaxx/detail/owned_array.hpp: the owning pointer of one heap array (`new (std::nothrow) T[n]()`),
/// move-only, null after move, `delete[]` at the end: what `std::unique_ptr<T[]>` did for the library's
/// three arrays (a pool's vectors, a dispatcher's table and its stash), without `<memory>`, one of
/// the costlier standard headers to compile (bench/results/records.json, goal compile-time).
#pragma once

#include <cstddef>
#include <new>
#include <utility>

namespace rdmaxx::detail {

template <class T>
class owned_array {
public:
  owned_array() noexcept = default;
  owned_array(owned_array &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  owned_array &operator=(owned_array &&o) noexcept {
    if (this != &o) reset(std::exchange(o.p_, nullptr));
    return *this;
  }
  ~owned_array() { delete[] p_; }

  /// Frees the array held (if any) and holds p (from new T[...]) instead.
  void reset(T *p = nullptr) noexcept {
    delete[] std::exchange(p_, p);
  }
  [[nodiscard]] T *get() const noexcept { return p_; }
  [[nodiscard]] T &operator[](std::size_t i) const noexcept { return p_[i]; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

private:
  T *p_ = nullptr;
};

} // namespace rdmaxx::detail
