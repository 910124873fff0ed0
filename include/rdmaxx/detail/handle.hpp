// rdmaxx/detail/handle.hpp: the one owning-handle template every rdmaxx handle is built on.
//
// Lifetime rule (the same for every handle): children BORROW their parents. A ProtectionDomain
// does not keep its Context alive, a MemoryRegion does not keep its ProtectionDomain alive, a
// QueuePair does not keep its PD or CQs alive. Destroy children before parents.
//
// A parent counts its live children in a small node allocated once when the parent is created
// (never touched on the fast path). If a parent is destroyed while children are alive, its destroy
// verb is NOT called then (verbs would refuse, or, for a device context, tear the children down
// under the application's feet): the destroy-failure hook is told, and the destruction is
// deferred: the parent's C object stays valid, so the children remain usable and destroyable, and
// the last child to go destroys the parent. Nothing is leaked, nothing is silent.
#pragma once

#include "../error.hpp"

#include <atomic>
#include <cstdint>
#include <new>
#include <utility>

namespace rdmaxx::detail {

/// A pointer that becomes null when moved from, so that handles can default their moves.
template <class T>
class moved_ptr {
public:
  constexpr moved_ptr() noexcept = default;
  constexpr explicit moved_ptr(T *p) noexcept : p_(p) {}
  constexpr moved_ptr(moved_ptr &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  constexpr moved_ptr &operator=(moved_ptr &&o) noexcept {
    p_ = std::exchange(o.p_, nullptr);
    return *this;
  }
  moved_ptr(const moved_ptr &) = delete;
  moved_ptr &operator=(const moved_ptr &) = delete;
  [[nodiscard]] constexpr T *get() const noexcept { return p_; }
  constexpr T *release() noexcept { return std::exchange(p_, nullptr); }
  constexpr void reset(T *p) noexcept { p_ = p; }

private:
  T *p_ = nullptr;
};

/// Live-children counter of a parent object, and what to do with the parent if it is destroyed
/// while children still use it (orphaned: destroyed by its last child).
struct parent_node {
  std::atomic<std::uint32_t> children{0};
  std::atomic<bool> orphaned{false};
  std::atomic<bool> claimed{false};   // whoever sets it first finishes the orphan
  void *native = nullptr;              // the orphaned C object
  int (*destroy)(void *) noexcept = nullptr;
  const char *object = nullptr;
  const char *verb = nullptr;
  parent_node *parent = nullptr;       // the orphan's own registration with its parent
};

void release_child(parent_node *p) noexcept;

/// Destroy an orphaned parent now that its last child is gone, then release its own parent.
[[gnu::cold]] inline void finish_orphan(parent_node *n) noexcept {
  if (const int rc = n->destroy(n->native))
    report_destroy_failure({n->object, n->verb, errno_code(rc), 0});
  parent_node *up = n->parent;
  delete n;
  if (up) release_child(up);
}

/// One child of `p` is gone.
inline void release_child(parent_node *p) noexcept {
  if (p->children.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
      p->orphaned.load(std::memory_order_acquire) &&
      !p->claimed.exchange(true, std::memory_order_acq_rel)) [[unlikely]]
    finish_orphan(p);
}

/// A child's registration with its parent; released (decremented) when the child is destroyed.
class child_link {
public:
  constexpr child_link() noexcept = default;
  explicit child_link(parent_node *p) noexcept : p_(p) {
    if (p) p->children.fetch_add(1, std::memory_order_relaxed);
  }
  child_link(child_link &&) noexcept = default;
  child_link &operator=(child_link &&o) noexcept {
    if (this != &o) {
      drop();
      p_ = std::move(o.p_);
    }
    return *this;
  }
  ~child_link() { drop(); }
  [[nodiscard]] parent_node *parent() const noexcept { return p_.get(); }
  void drop() noexcept {
    if (auto *p = p_.release()) release_child(p);
  }
  /// Keep the child registered (its C object could not be destroyed: the parent must stay).
  void keep() noexcept { p_.release(); }
  /// Hand the registration over (to an orphaned node that releases it later).
  [[nodiscard]] parent_node *transfer() noexcept { return p_.release(); }

private:
  moved_ptr<parent_node> p_;
};

/// One owned C object of type Traits::native, destroyed through Traits::destroy (a compile-time
/// deleter: no storage, inlined). Move-only, null after move. Parents also own the node that
/// counts their children; children hold a link to their parent's node.
///
/// Traits: using native = ...; static constexpr const char *object, *verb;
/// static int destroy(native *) noexcept (returns 0 or an errno value).
template <class Traits>
class handle {
public:
  using native = typename Traits::native;

  constexpr handle() noexcept = default;
  constexpr handle(std::nullptr_t) noexcept {}
  handle(native *p, parent_node *parent, parent_node *own_node) noexcept
      : link_(parent), p_(p), node_(own_node) {}
  handle(handle &&) noexcept = default;
  handle &operator=(handle &&o) noexcept {
    handle tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~handle() { reset(); }

  [[nodiscard]] native *get() const noexcept { return p_.get(); }
  [[nodiscard]] explicit operator bool() const noexcept { return p_.get() != nullptr; }
  [[nodiscard]] parent_node *node() const noexcept { return node_.get(); }
  [[nodiscard]] parent_node *parent() const noexcept { return link_.parent(); }
  [[nodiscard]] std::uint32_t live_children() const noexcept {
    return node_.get() ? node_.get()->children.load(std::memory_order_acquire) : 0;
  }

  /// Re-parent (e.g. a MemoryRegion moved to another PD by rereg).
  void set_parent(parent_node *p) noexcept { link_ = child_link(p); }
  /// Replace the owned object without destroying the old one (the caller destroyed it).
  void replace(native *p) noexcept { p_.reset(p); }

  /// Destroy now and report the outcome (the destructor does the same and reports through the
  /// destroy-failure hook). On failure the handle keeps the object.
  result<void> destroy() noexcept {
    native *p = p_.get();
    if (!p) return success();
    if (const auto n = live_children(); n != 0) return make_error_code(errc::busy);
    if (const int rc = Traits::destroy(p); rc != 0) return errno_code(rc);
    p_.release();
    delete node_.release();
    link_.drop();
    return success();
  }

  void reset() noexcept {
    native *p = p_.release();
    if (!p) return;
    if (const auto n = live_children(); n != 0) {
      // Children still use it: defer the destruction to the last of them (see the rule above).
      report_destroy_failure({Traits::object, Traits::verb, make_error_code(errc::busy), n});
      parent_node *node = node_.release();
      node->native = p;
      node->destroy = &destroy_erased;
      node->object = Traits::object;
      node->verb = Traits::verb;
      node->parent = link_.transfer();
      node->orphaned.store(true, std::memory_order_release);
      // The last child may have gone in the meantime: then nobody else will finish it.
      if (node->children.load(std::memory_order_acquire) == 0 &&
          !node->claimed.exchange(true, std::memory_order_acq_rel))
        finish_orphan(node);
      return;
    }
    if (const int rc = Traits::destroy(p); rc != 0) {
      report_destroy_failure({Traits::object, Traits::verb, errno_code(rc), 0});
      link_.keep(); // the object is still alive in its parent
    } else {
      link_.drop();
    }
    delete node_.release();
  }

  void swap(handle &o) noexcept {
    std::swap(link_, o.link_);
    std::swap(p_, o.p_);
    std::swap(node_, o.node_);
  }

private:
  static int destroy_erased(void *p) noexcept { return Traits::destroy(static_cast<native *>(p)); }

  child_link link_;  // declared first: released after the object is destroyed
  moved_ptr<native> p_;
  moved_ptr<parent_node> node_;
};

/// Allocate a parent's children counter; nullptr when out of memory (creation then fails).
[[nodiscard]] inline parent_node *new_parent_node() noexcept { return new (std::nothrow) parent_node; }

} // namespace rdmaxx::detail
