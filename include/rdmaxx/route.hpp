/// \file
/// rdmaxx/route.hpp: Route, one object's completions routed by a CompletionDispatcher or an Asio
/// CompletionRouter for as long as the Route lives: the scoped form of attach() and detach().
///
/// Why: with attach()/detach() a function (or coroutine) that returns early through RDMAXX_TRY
/// leaves the dispatcher or router holding the address of an object it destroyed, and the next
/// completion routed there touches freed memory. A Route declared after the object is destroyed
/// before it, on every path.
#pragma once

#include <utility>

namespace rdmaxx {

namespace detail {
struct route_access;
}

/// Routing of one object's completions (CompletionDispatcher::route, asio CompletionRouter::route)
/// until this handle ends: destruction, reset() or move-assignment detach the object. It keeps
/// the dispatcher's or router's routing table alive (not its CQ), so it may outlive or follow a
/// moved dispatcher; once the router is closed, ending it does nothing more. Move-only, null
/// after move. One thread, as the dispatcher or router.
class Route {
public:
  /// A null route (routes nothing).
  Route() noexcept = default;
  /// Takes over `o`'s routing; `o` is left null.
  Route(Route &&o) noexcept
      : table_(std::exchange(o.table_, nullptr)), obj_(std::exchange(o.obj_, nullptr)),
        end_(std::exchange(o.end_, nullptr)) {}
  /// Ends this route (reset()), then takes over `o`'s.
  Route &operator=(Route &&o) noexcept {
    if (this != &o) {
      reset();
      table_ = std::exchange(o.table_, nullptr);
      obj_ = std::exchange(o.obj_, nullptr);
      end_ = std::exchange(o.end_, nullptr);
    }
    return *this;
  }
  Route(const Route &) = delete;
  Route &operator=(const Route &) = delete;
  /// reset().
  ~Route() { reset(); }

  /// True while it routes (until reset or moved from).
  [[nodiscard]] explicit operator bool() const noexcept { return end_ != nullptr; }
  /// Stop routing the object's completions now (detach): the object may then move or go.
  void reset() noexcept {
    if (auto end = std::exchange(end_, nullptr)) end(std::exchange(table_, nullptr), std::exchange(obj_, nullptr));
  }

private:
  friend struct detail::route_access;
  using end_fn = void (*)(void *table, const void *obj) noexcept;
  void *table_ = nullptr;    // the routing table, one reference of it held
  const void *obj_ = nullptr; // the object (or pool) routed
  end_fn end_ = nullptr;      // detaches `obj_` from `table_` and drops the reference
};

namespace detail {
// How a dispatcher or router makes a Route: `end(table, obj)` runs once, when it ends.
struct route_access {
  [[nodiscard]] static Route make(void *table, const void *obj, Route::end_fn end) noexcept {
    Route r;
    r.table_ = table;
    r.obj_ = obj;
    r.end_ = end;
    return r;
  }
};
} // namespace detail

} // namespace rdmaxx
