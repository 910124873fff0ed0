/// \file
/// rdmaxx/detail/completion_targets.hpp: the one table that hands completions to the library's
/// objects that post work requests (MemoryWindow, StrictGrant, IndirectKey, GrantPool), shared by
/// CompletionDispatcher (blocking programs) and the Asio CompletionRouter (coroutines).
///
/// Routing rule: a send-side completion goes to the first object that claims it (its own work
/// request, recognised by wr_id and QP: each object posts with an id of its own, see
/// detail/object_ids.hpp), and is the caller's when none does. A successful receive is offered to
/// every object (a peer's send-with-invalidate revokes a type-2 grant) and is always the caller's
/// too: the caller posted the receive. Not thread-safe: one thread at a time, as the objects.
#pragma once

#include "../error.hpp"
#include "owned_array.hpp"
#include "span.hpp"

#include <infiniband/verbs.h>

#include <concepts>
#include <cstddef>
#include <new>
#include <span>
#include <system_error>
#include <type_traits>

namespace rdmaxx::detail {

struct pool_access; // grant_pool.hpp: a pool's and a lease's state, by address

/// A successful receive (its opcode is reliable only on success).
[[nodiscard]] constexpr bool is_receive(const ibv_wc &wc) noexcept {
  return wc.status == IBV_WC_SUCCESS && (wc.opcode & IBV_WC_RECV) != 0;
}

// `pool_access` named through T, so that it is looked up where the table is used (grant_pool.hpp
// is not included here: the table costs its includers nothing of the objects it routes to).
template <class T>
using pool_access_of = std::conditional_t<sizeof(T) != 0, pool_access, void>;

/// How the table reaches each kind of object, from what the object offers:
///  - take(obj, wc): hand `wc` over; true when it was the completion of the object's own work
///    request. A GrantPool (owns() and complete(span)) also takes the receive of a peer's
///    invalidation, as do windows and keys through their complete(wc); a receive is never the
///    object's own;
///  - unconfirmed(obj): an operation of the object is posted and its completion not handed
///    over yet (pending(); a GrantLease: its revoke in flight);
///  - key(obj): what names the object in the table (its address; a pool's state, which its
///    leases name too).
template <class T>
struct target_ops {
  static bool take(T &o, ibv_wc &wc) noexcept {
    if constexpr (requires { o.owns(wc); }) {
      const bool own = o.owns(wc);
      (void)o.complete(span_of(&wc, 1));
      return own;
    } else {
      return o.complete(wc) && !is_receive(wc);
    }
  }
  static bool unconfirmed(const T &o) noexcept {
    if constexpr (requires { o.state() == decltype(o.state())::revoking; }) // a lease
      return o.state() == decltype(o.state())::revoking;
    else
      return o.pending() != 0;
  }
  static const void *key(const T &o) noexcept {
    if constexpr (requires { o.owns(std::declval<const ibv_wc &>()); } ||
                  requires { o.state() == decltype(o.state())::revoking; })
      return pool_access_of<T>::state(o);
    else
      return &o;
  }
};

/// The objects a type can name in the table.
/// The objects a type can name in the table: a MemoryWindow, StrictGrant or IndirectKey
/// (complete(wc), pending()), or a GrantPool (owns(wc), complete(span)).
template <class T>
concept completion_target_type =
    requires(T &t, ibv_wc &wc) {
      { t.complete(wc) } -> std::convertible_to<bool>;
      t.pending();
    } || requires(T &t, ibv_wc &wc) {
      { t.owns(wc) } -> std::same_as<bool>;
      t.complete(std::span<ibv_wc>(&wc, 1));
    };
/// What settle() can wait for: a window, grant or key, or a GrantLease (its pool attached).
template <class T>
concept settle_type = requires(const T &t) {
  t.pending();
} || requires(const T &t) { t.state() == decltype(t.state())::revoking; };

/// One object of the table, type-erased.
struct completion_target {
  void *obj = nullptr;
  const void *key = nullptr; // target_ops<T>::key(obj)
  bool (*take)(void *, ibv_wc &) noexcept = nullptr;

  template <completion_target_type T>
  [[nodiscard]] static completion_target of(T &o) noexcept {
    return {&o, target_ops<T>::key(o),
            [](void *p, ibv_wc &wc) noexcept { return target_ops<T>::take(*static_cast<T *>(p), wc); }};
  }
};

/// A fixed-capacity table of targets (allocated once, new(nothrow)).
class completion_targets {
public:
  /// Room for `capacity` objects; false when out of memory.
  [[nodiscard]] bool allocate(std::size_t capacity) noexcept {
    t_.reset(new (std::nothrow) completion_target[capacity ? capacity : 1]());
    cap_ = t_ ? capacity : 0;
    n_ = 0;
    return bool(t_);
  }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }

  /// Add `o` (again: nothing changes).
  /// \errors errc::too_many_entries: capacity() objects are in the table.
  template <completion_target_type T>
  [[nodiscard]] std::error_code add(T &o) noexcept {
    if (contains(target_ops<T>::key(o))) return {};
    if (n_ == cap_) return make_error_code(errc::too_many_entries);
    t_[n_++] = completion_target::of(o);
    return {};
  }
  /// Remove the object at `o` (absent: nothing changes).
  void remove(const void *o) noexcept {
    for (std::size_t i = 0; i < n_; ++i)
      if (t_[i].obj == o) {
        t_[i] = t_[--n_];
        t_[n_] = {};
        return;
      }
  }
  /// Whether an object of key `key` (target_ops<T>::key) is in the table.
  [[nodiscard]] bool contains(const void *key) const noexcept {
    for (std::size_t i = 0; i < n_; ++i)
      if (t_[i].key == key) return true;
    return false;
  }

  /// Hand `wc` to the objects (the routing rule above). Returns the key of the object that
  /// claimed it, or nullptr when it is the caller's.
  const void *route(ibv_wc &wc) noexcept {
    if (is_receive(wc)) {
      for (std::size_t i = 0; i < n_; ++i) (void)t_[i].take(t_[i].obj, wc);
      return nullptr;
    }
    for (std::size_t i = 0; i < n_; ++i)
      if (t_[i].take(t_[i].obj, wc)) return t_[i].key;
    return nullptr;
  }

private:
  owned_array<completion_target> t_;
  std::size_t cap_ = 0, n_ = 0;
};

} // namespace rdmaxx::detail
