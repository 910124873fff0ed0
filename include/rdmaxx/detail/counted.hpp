/// \file
/// rdmaxx/detail/counted.hpp: the one counted core of rdmaxx. An object that several holders keep
/// alive (a parent handle's node: the handle and each live child; a GrantPool's state: the pool
/// and each live lease; asio.hpp's router and pump cores: the public object and each suspended
/// coroutine) carries a ref_count, starting at 1 for its creator; whoever drops the last
/// reference finishes the object, and nobody touches it after its own drop.
///
/// The count is plain (one thread: a pool, an io_context's objects) or atomic (any thread: a
/// parent's node, whose children may go on other threads). counted_ptr is the owning pointer of
/// one reference, for the plain case: move-only, null after move, `share()` to count another
/// holder; the last one deletes the object (or calls its finish(T *) where it has one).
#pragma once

#include "atomic.hpp"

#include <cstdint>
#include <type_traits>
#include <utility>

namespace rdmaxx::detail {

/// A count of holders, 1 at construction (the creator). Count: an unsigned integer (one thread)
/// or detail::atomic of one (any thread: acquire-release, as a shared pointer's count).
template <class Count = std::uint32_t>
class ref_count {
  static constexpr bool atomic = !std::is_integral_v<Count>;

public:
  ref_count() noexcept = default;
  ref_count(const ref_count &) = delete;
  ref_count &operator=(const ref_count &) = delete;

  /// One more holder (relaxed: the new holder got the object from one that holds it).
  void add() noexcept {
    if constexpr (atomic) n_.fetch_add(1, detail::order::relaxed);
    else ++n_;
  }
  /// One holder fewer. Returns the holders left: 0 for the one that dropped the last, which
  /// finishes the object (the others must not touch it after this call).
  [[nodiscard]] std::uint32_t drop() noexcept {
    if constexpr (atomic) return std::uint32_t(n_.fetch_sub(1, detail::order::acq_rel) - 1);
    else return std::uint32_t(--n_);
  }
  /// The holders now (acquire; exact only while no other thread adds or drops).
  [[nodiscard]] std::uint32_t holders() const noexcept {
    if constexpr (atomic) return std::uint32_t(n_.load(detail::order::acquire));
    else return std::uint32_t(n_);
  }

private:
  Count n_{1};
};

/// The owning pointer of one reference to a T that has a `ref_count<> refs` member (one thread).
/// Dropping the last reference deletes the T, or calls T::finish(T *) where T declares one (a
/// state that must do something before it goes). Move-only, null after move; share() counts one
/// more holder and returns its pointer.
template <class T>
class counted_ptr {
public:
  constexpr counted_ptr() noexcept = default;
  /// Takes over the creator's reference of `p` (a new T, count 1), or null.
  explicit counted_ptr(T *p) noexcept : p_(p) {}
  counted_ptr(counted_ptr &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  counted_ptr &operator=(counted_ptr &&o) noexcept {
    counted_ptr tmp(std::move(o));
    std::swap(p_, tmp.p_);
    return *this;
  }
  counted_ptr(const counted_ptr &) = delete;
  counted_ptr &operator=(const counted_ptr &) = delete;
  ~counted_ptr() { reset(); }

  /// Another holder of the same object (null when this is null).
  [[nodiscard]] counted_ptr share() const noexcept {
    if (p_) p_->refs.add();
    return counted_ptr(p_);
  }
  /// Drop this reference now (the last one finishes the object); null afterwards.
  void reset() noexcept {
    if (T *p = std::exchange(p_, nullptr); p && p->refs.drop() == 0) {
      if constexpr (requires { T::finish(p); }) T::finish(p);
      else delete p;
    }
  }
  [[nodiscard]] T *get() const noexcept { return p_; }
  [[nodiscard]] T *operator->() const noexcept { return p_; }
  [[nodiscard]] T &operator*() const noexcept { return *p_; }
  [[nodiscard]] explicit operator bool() const noexcept { return p_ != nullptr; }

private:
  T *p_ = nullptr;
};

} // namespace rdmaxx::detail
