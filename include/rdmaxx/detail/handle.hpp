/// \file
/// rdmaxx/detail/handle.hpp: the one owning-handle template every rdmaxx handle is built on.
///
/// Lifetime rule (the same for every handle): children BORROW their parents. A ProtectionDomain
/// does not keep its Context alive, a MemoryRegion does not keep its ProtectionDomain alive, a
/// QueuePair does not keep its PD or CQs alive. Destroy children before parents.
///
/// A parent's node holds ONE count: the owning handle's reference plus one per live child. Whoever
/// takes it to zero finishes the object, and nobody touches the node after its own decrement (so
/// a parent and its last child destroyed on two threads neither leak nor race). Beside it, a
/// counter per kind of child (child_kind), for the report only: a child adds to its kind's
/// counter before it counts and takes from it before its decrement of the one count, so the
/// report can say "3 MemoryRegion, 7 MemoryWindow" (one more relaxed atomic per child created
/// and destroyed; nothing is allocated). If a parent is
/// destroyed while children are alive, its destroy verb is NOT called then (verbs would refuse,
/// or, for a device context, tear the children down under the application's feet): the
/// destroy-failure hook is told, and the destruction is deferred: the handle writes into the node
/// everything the destruction needs (the C object, its verb, its own parents' registrations and
/// what must be freed after it, e.g. an allocated region's pages) and drops its reference; the
/// C object stays valid, so the children remain usable and destroyable, and the last child to go
/// destroys the parent. Nothing is leaked, nothing is silent.
#pragma once

#include "atomic.hpp"
#include "counted.hpp"
#include "../error.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace rdmaxx::detail {

// Declared, never defined by the library: a contract test defines it to build handles over
// stand-in C objects (no device) whose calls it records; the handle classes it needs befriend it.
struct test_access;

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

/// A name known at compile time (a deleter's object and verb): a string literal as a template
/// argument.
template <std::size_t N>
struct name_literal {
  char text[N];
  consteval name_literal(const char (&s)[N]) noexcept {
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

/// How a C destroy function reports failure: verbs' ibv_* return 0 or an errno value; some return
/// nothing (ibv_free_device_list, rdma_destroy_event_channel); librdmacm's return -1 with errno
/// set.
enum class destroy_returns : std::uint8_t { errno_value, nothing, minus_one_errno };

/// A handle's Traits in one line: the C type, its destroy function, the class and verb names the
/// destroy-failure report gives, the parents it holds (1 to max_parents) and how the function
/// reports failure. E.g. `using traits = detail::deleter<ibv_pd, ::ibv_dealloc_pd,
/// "ProtectionDomain", "ibv_dealloc_pd">;`. The function is a compile-time argument: no storage,
/// inlined (a verb that verbs.h defines static inline needs a wrapper with external linkage, or
/// every header using it would be a different type in each translation unit).
template <class Native, auto Destroy, name_literal Object, name_literal Verb, std::size_t Parents = 1,
          destroy_returns Returns = destroy_returns::errno_value>
struct deleter {
  using native = Native;
  static constexpr const char *object = Object.text;
  static constexpr const char *verb = Verb.text;
  static constexpr std::size_t parents = Parents;
  static int destroy(native *p) noexcept {
    if constexpr (Returns == destroy_returns::nothing) {
      Destroy(p);
      return 0;
    } else if constexpr (Returns == destroy_returns::minus_one_errno) {
      return Destroy(p) ? (errno ? errno : EIO) : 0;
    } else {
      return Destroy(p);
    }
  }
};

/// The most parents one handle has (a QueuePair: its PD and its two CQs; a MemoryWindow: its PD,
/// the MR it is bound to and, type 2, the QP it was bound through).
inline constexpr std::size_t max_parents = 3;

/// What a deferred destruction frees after the C object is gone (an allocate()d region's pages:
/// they must stay mapped while windows and keys on the region are live).
struct after_destroy {
  void (*fn)(void *, std::size_t) noexcept = nullptr;
  void *p = nullptr;
  std::size_t n = 0;
  void run() const noexcept {
    if (fn) fn(p, n);
  }
};

/// The count of a parent object (its owning handle + its live children) and, once the handle has
/// let go while children remain (deferred destruction), what the last of them must do. An orphan
/// carries every parent it had, so each of them stays counted until the orphan is destroyed.
struct parent_node {
  ref_count<detail::atomic<std::uint32_t>> refs; // the owning handle's + one per live child
  // Live children by kind (index: child_kind): what the report names, and what a region's rereg
  // tells grants from windows by (MemoryRegion::rereg).
  detail::atomic<std::uint32_t> kinds[child_kind_count] = {};
  child_kind kind = child_kind::other; // the orphan's own kind in its parents' counters
  // Written by the owning handle before it drops its reference; read by whoever drops the last.
  void *native = nullptr;              // the C object; null: released, only the node is freed
  int (*destroy)(void *) noexcept = nullptr;
  const char *object = nullptr;
  const char *verb = nullptr;
  parent_node *parents[max_parents] = {}; // the orphan's own registrations with its parents
  after_destroy after;
  /// Live children, while the owning handle holds its reference.
  [[nodiscard]] std::uint32_t live_children() const noexcept {
    return refs.holders() - 1;
  }
};

void release_child(parent_node *p, child_kind k = child_kind::other) noexcept;
void release_ref(parent_node *p) noexcept;

/// The last reference to `n` is gone: destroy the orphaned C object (if the handle did not
/// release it), free what it carried, free the node, then release its own parents. If the verb
/// fails the object is still alive in its parents: they stay counted (and so are reported, not
/// destroyed under it, when they go), and what it carried (its memory) is kept.
[[gnu::cold]] inline void finish_orphan(parent_node *n) noexcept {
  const int rc = n->native ? n->destroy(n->native) : 0;
  parent_node *up[max_parents];
  for (std::size_t i = 0; i < max_parents; ++i) up[i] = n->parents[i];
  const after_destroy after = n->after;
  const child_kind kind = n->kind;
  if (rc != 0) report_destroy_failure({n->object, n->verb, errno_code(rc), 0, {}});
  delete n;
  if (rc != 0) return;
  after.run();
  for (parent_node *p : up)
    if (p) release_child(p, kind);
}

/// Drop one reference (the owning handle's): whoever drops the last finishes.
inline void release_ref(parent_node *p) noexcept {
  if (p->refs.drop() == 0) [[unlikely]]
    finish_orphan(p);
}
/// A child of kind `k` gone: its kind's counter first (the node is alive until release_ref).
inline void release_child(parent_node *p, child_kind k) noexcept {
  p->kinds[std::size_t(k)].fetch_sub(1, detail::order::relaxed);
  release_ref(p);
}

/// A child's registration with one parent; released (decremented) when dropped. Handles keep
/// their links in their `handle` (below); the only other holder is a memory window's log of
/// unconfirmed operations, which keeps the binding before each operation counted.
class child_link {
public:
  constexpr child_link() noexcept = default;
  /// Register a child of kind `k` with `p` (null: none).
  explicit child_link(parent_node *p, child_kind k = child_kind::other) noexcept : p_(p), kind_(k) {
    if (p) {
      p->kinds[std::size_t(k)].fetch_add(1, detail::order::relaxed);
      p->refs.add();
    }
  }
  child_link(child_link &&) noexcept = default;
  child_link &operator=(child_link &&o) noexcept {
    if (this != &o) {
      drop();
      p_ = std::move(o.p_);
      kind_ = o.kind_;
    }
    return *this;
  }
  ~child_link() { drop(); }
  [[nodiscard]] parent_node *parent() const noexcept { return p_.get(); }
  [[nodiscard]] explicit operator bool() const noexcept { return p_.get() != nullptr; }
  void drop() noexcept {
    if (auto *p = p_.release()) release_child(p, kind_);
  }
  /// Keep the child registered (its C object could not be destroyed: the parent must stay).
  void keep() noexcept { p_.release(); }
  /// Hand the registration over (to an orphaned node that releases it later, as its kind).
  [[nodiscard]] parent_node *transfer() noexcept { return p_.release(); }
  /// The kind this link counts as.
  [[nodiscard]] child_kind kind() const noexcept { return kind_; }

private:
  moved_ptr<parent_node> p_;
  child_kind kind_ = child_kind::other;
};

/// The child_kind of a handle's Traits: Traits::kind if given, else the kind named
/// Traits::object ("MemoryRegion": memory_region), else other.
template <class Traits>
[[nodiscard]] consteval child_kind kind_of() noexcept {
  if constexpr (requires { Traits::kind; }) {
    return Traits::kind;
  } else {
    for (std::size_t k = 0; k + 1 < child_kind_count; ++k) {
      const char *a = Traits::object, *b = child_kind_name(child_kind(k));
      while (*a && *a == *b) ++a, ++b;
      if (*a == *b) return child_kind(k);
    }
    return child_kind::other;
  }
}

/// Which parents a handle has, by slot. Slot 0 is the creating parent (Context, PD); the others
/// are the further objects the C object uses while it lives.
// handle<T>::reset() for every handle type: one function, not one instantiation per type (the
// destruction path is not the fast path; the indirect call to `destroy` costs nothing next to the
// verb). Destroys the object at `p` (through `destroy`), or, while children still use `node`,
// hands that to whoever drops the node's last reference.
inline void reset_erased(void *p, parent_node *node, child_link *links, std::size_t parents,
                         int (*destroy)(void *) noexcept, const char *object, const char *verb,
                         child_kind kind, after_destroy after, bool report_deferral) noexcept {
  if (node && node->refs.holders() != 1) {
    // Children still use it: hand the destruction to whoever drops the last reference (it may
    // be this thread, if the last child went in the meantime). The node is not touched after
    // this thread's decrement.
    node->native = p;
    node->destroy = destroy;
    node->object = object;
    node->verb = verb;
    node->after = after;
    node->kind = kind;
    for (std::size_t i = 0; i < parents; ++i) node->parents[i] = links[i].transfer();
    // The kinds are read while this handle's reference keeps the node alive.
    destroy_failure f{object, verb, make_error_code(errc::busy), 0, {}};
    for (std::size_t k = 0; k < child_kind_count; ++k)
      f.children[k] = node->kinds[k].load(detail::order::relaxed);
    const std::uint32_t left = node->refs.drop();
    if (left == 0) {
      finish_orphan(node);
    } else {
      f.live_children = left;
      if (report_deferral) report_destroy_failure(f);
    }
    return;
  }
  delete node;
  if (const int rc = destroy(p); rc != 0) {
    report_destroy_failure({object, verb, errno_code(rc), 0, {}});
    for (std::size_t i = 0; i < parents; ++i) links[i].keep(); // still alive in its parents
  } else {
    for (std::size_t i = 0; i < parents; ++i) links[i].drop();
    after.run();
  }
}

enum class parent_slot : std::size_t { primary = 0, second = 1, third = 2 };

/// One owned C object of type Traits::native, destroyed through Traits::destroy (a compile-time
/// deleter: no storage, inlined). Move-only, null after move. Parents also own the node that
/// counts their children; children hold one link per parent (up to Traits::parents, default 1),
/// all of them kept while the C object exists: released after a successful destroy, kept when
/// the verb fails, carried into the node when the destruction is deferred.
///
/// Traits: using native = ...; static constexpr const char *object, *verb;
/// static int destroy(native *) noexcept (returns 0 or an errno value);
/// optional static constexpr std::size_t parents (1 to max_parents);
/// optional static constexpr bool report_deferral (default true; see reset()).
template <class Traits>
class handle {
  static constexpr std::size_t parents_of() noexcept {
    if constexpr (requires { Traits::parents; }) return Traits::parents;
    else return 1;
  }
  static constexpr bool reports_deferral_of() noexcept {
    if constexpr (requires { Traits::report_deferral; }) return Traits::report_deferral;
    else return true;
  }

public:
  using native = typename Traits::native;
  static constexpr std::size_t parents = parents_of();
  /// What this handle counts as in its parents' per-kind counters.
  static constexpr child_kind kind = kind_of<Traits>();
  /// Whether a deferred destruction is reported (destroy-failure hook): Traits::report_deferral
  /// if given, else true. False for a parent whose children outlive it by design (a Listener's
  /// own channel and the requests taken from it): then the destructor and the move assignment
  /// defer quietly too.
  static constexpr bool reports_deferral = reports_deferral_of();
  static_assert(parents >= 1 && parents <= max_parents);

  constexpr handle() noexcept = default;
  constexpr handle(std::nullptr_t) noexcept {}
  /// Owns `p`, a child of `parent` (slot 0; may be null), counting its own children in `own_node`
  /// (null for objects that cannot have children).
  handle(native *p, parent_node *parent, parent_node *own_node) noexcept : p_(p), node_(own_node) {
    links_[0] = child_link(parent, kind);
  }
  handle(handle &&) noexcept = default;
  handle &operator=(handle &&o) noexcept {
    if (this != &o) {
      reset(); // as the destructor: deferred while children use it
      for (std::size_t i = 0; i < parents; ++i) links_[i] = std::move(o.links_[i]);
      p_ = std::move(o.p_);
      node_ = std::move(o.node_);
    }
    return *this;
  }
  ~handle() { reset(); }

  [[nodiscard]] native *get() const noexcept { return p_.get(); }
  [[nodiscard]] explicit operator bool() const noexcept { return p_.get() != nullptr; }
  [[nodiscard]] parent_node *node() const noexcept { return node_.get(); }
  template <parent_slot S = parent_slot::primary>
  [[nodiscard]] parent_node *parent() const noexcept {
    return links_[index<S>()].parent();
  }
  [[nodiscard]] std::uint32_t live_children() const noexcept {
    return node_.get() ? node_.get()->live_children() : 0;
  }
  /// Live children of kind `k` (relaxed: exact on the thread that creates and destroys them).
  [[nodiscard]] std::uint32_t live_children(child_kind k) const noexcept {
    return node_.get() ? node_.get()->kinds[std::size_t(k)].load(detail::order::relaxed) : 0;
  }

  /// Register with parent `p` in slot S (null: no parent there), releasing the one it replaces
  /// (e.g. a MemoryRegion moved to another PD by rereg).
  template <parent_slot S = parent_slot::primary>
  void set_parent(parent_node *p) noexcept {
    links_[index<S>()] = child_link(p, kind);
  }
  /// Move a registration in or out of slot S without counting anew (a window's binding moving to
  /// and from its log of unconfirmed operations).
  template <parent_slot S>
  void set_link(child_link &&l) noexcept {
    links_[index<S>()] = std::move(l);
  }
  template <parent_slot S>
  [[nodiscard]] child_link take_link() noexcept {
    return std::move(links_[index<S>()]);
  }
  /// Replace the owned object without destroying the old one (the caller destroyed it).
  void replace(native *p) noexcept { p_.reset(p); }
  /// Give the object up without destroying it (the caller owns it now): its parents' counts are
  /// released. If children still use it, the node stays until the last of them goes (it then
  /// frees only the node: the object is the caller's).
  [[nodiscard]] native *release() noexcept {
    native *p = p_.release();
    if (parent_node *node = node_.release()) {
      node->native = nullptr;
      release_ref(node);
    }
    drop_links();
    return p;
  }

  /// Destroy now and report the outcome (the destructor does the same and reports through the
  /// destroy-failure hook). On failure the handle keeps the object and its parents.
  result<void> destroy() noexcept {
    native *p = p_.get();
    if (!p) return success();
    if (live_children() != 0) return make_error_code(errc::busy);
    if (const int rc = Traits::destroy(p); rc != 0) return errno_code(rc);
    p_.release();
    delete node_.release();
    drop_links();
    return success();
  }

  /// Destroy (or, while children live, defer the destruction to the last of them); `after` runs
  /// once the object is destroyed (not if its verb fails: the object, and so its memory, stays).
  /// A deferral is reported (destroy-failure hook) unless `report_deferral` is false (by
  /// default: reports_deferral, from the Traits).
  void reset(after_destroy after = {}, bool report_deferral = reports_deferral) noexcept {
    if (native *p = p_.release())
      reset_erased(p, node_.release(), links_, parents, &destroy_erased, Traits::object, Traits::verb, kind,
                   after, report_deferral);
  }

  void swap(handle &o) noexcept {
    for (std::size_t i = 0; i < parents; ++i) std::swap(links_[i], o.links_[i]);
    std::swap(p_, o.p_);
    std::swap(node_, o.node_);
  }

private:
  static int destroy_erased(void *p) noexcept { return Traits::destroy(static_cast<native *>(p)); }
  template <parent_slot S>
  static constexpr std::size_t index() noexcept {
    static_assert(static_cast<std::size_t>(S) < parents, "this handle has no parent in that slot");
    return static_cast<std::size_t>(S);
  }
  void drop_links() noexcept {
    for (auto &l : links_) l.drop();
  }

  child_link links_[parents]; // declared first: released after the object is destroyed
  moved_ptr<native> p_;
  moved_ptr<parent_node> node_;
};

/// The one way a child reaches the node of a parent handle of another class, to register with it:
/// each parent class befriends this struct (and no child class), so adding a kind of child edits
/// no parent.
struct handle_access {
  template <class T>
  [[nodiscard]] static parent_node *node(const T &parent) noexcept {
    return parent.h_.node();
  }
};

/// Allocate a parent's children counter; nullptr when out of memory (creation then fails).
[[nodiscard]] inline parent_node *new_parent_node() noexcept { return new (std::nothrow) parent_node; }

/// How every object that can have children is created: allocate its children counter, call
/// `create` (the verb: returns the C object, or nullptr with errno set) and own the object in
/// `out` as a child of `parent`. On failure nothing stays allocated, `out` is unchanged and the
/// verb's errno is returned (ENOMEM when the counter itself cannot be allocated; the verb is then
/// not called). An error code, not a result<handle<Traits>>: each result<T> a header instantiates
/// costs every translation unit that includes it (bench/compile).
template <class Traits, class Create>
[[nodiscard]] std::error_code create_with_node(handle<Traits> &out, parent_node *parent,
                                               Create &&create) noexcept {
  parent_node *node = new_parent_node();
  if (!node) return std::make_error_code(std::errc::not_enough_memory);
  typename Traits::native *p = create();
  if (!p) {
    const std::error_code ec = last_errno();
    delete node;
    return ec;
  }
  out = handle<Traits>(p, parent, node);
  return {};
}

} // namespace rdmaxx::detail
