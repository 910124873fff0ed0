/// \file
/// rdmaxx/completion_dispatcher.hpp: CompletionDispatcher, the library's routing of its own
/// completions for blocking programs (the Asio CompletionRouter routes them for coroutines,
/// through the same table: detail/completion_targets.hpp).
///
/// A program attaches the windows, grants, keys and pools that post on QPs sending to one CQ, then
/// polls or waits through the dispatcher instead of the CQ: each completion of an attached object's
/// own work request goes to that object (a success confirms the operation, a failure rolls it
/// back), and the program gets only its own completions (receives always, also those that carried
/// a peer's invalidation, which the objects saw first). Nothing is dropped.
///
///     auto disp = RDMAXX_TRY(CompletionDispatcher::create(cq));
///     RDMAXX_TRYV(disp.attach(grant));                  // StrictGrant, MemoryWindow, IndirectKey, GrantPool
///     RDMAXX_TRY(d, grant.grant(qp, access::remote_write));
///     RDMAXX_TRYV(disp.settle(grant, 1000));            // confirmed, or its error and rolled back
///     ...
///     RDMAXX_TRYV(grant.revoke(qp));
///     RDMAXX_TRYV(disp.settle(grant, 1000));            // the old key is dead now
///
/// settle() returns once the object has no unconfirmed operation: success when each completed
/// successfully, else the first failed completion's code (wc_error), the object rolled back to
/// the state before that operation. The program's own completions polled meanwhile wait in the
/// dispatcher for its next poll() or wait() (or go to the handler given to settle()).
///
/// Lifetime: the dispatcher borrows its CompletionQueue (which must outlive it) and the attached
/// objects, which must stay at their addresses until detach() or the dispatcher's destruction
/// (detach before moving or destroying one; route(obj) does it when its Route ends). Not thread-safe: one thread, as the objects.
///
/// Allocation: create() allocates the target table and the stash of the program's completions
/// (new(nothrow)); nothing else allocates.
#pragma once

#include "completion_queue.hpp"
#include "detail/counted.hpp"
#include "detail/completion_targets.hpp"
#include "detail/owned_array.hpp"
#include "detail/span.hpp"
#include "error.hpp"
#include "grant_pool.hpp"
#include "indirect_key.hpp"
#include "memory_window.hpp"
#include "route.hpp"
#include "strict_grant.hpp"

#include <infiniband/verbs.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <utility>

namespace rdmaxx {

/// Sizes of a CompletionDispatcher.
struct dispatcher_options {
  /// Objects that can be attached at once.
  std::size_t max_targets = 64;
  /// The program's completions that settle() can keep for the next poll()/wait() (settle() with a
  /// handler keeps none).
  std::size_t stash = 64;
};

/// Routes a CQ's completions to the attached objects and the rest to the program (see the top of
/// this header). Move-only, null after move.
class CompletionDispatcher {
public:
  /// A null dispatcher.
  CompletionDispatcher() noexcept = default;
  /// Takes over `o`'s CQ, attached objects and kept completions; `o` is left null.
  CompletionDispatcher(CompletionDispatcher &&o) noexcept { *this = std::move(o); }
  /// As the move constructor (what this one held is let go: nothing is destroyed).
  CompletionDispatcher &operator=(CompletionDispatcher &&o) noexcept {
    if (this != &o) {
      cq_ = std::exchange(o.cq_, nullptr);
      targets_ = std::move(o.targets_);
      stash_ = std::move(o.stash_);
      cap_ = std::exchange(o.cap_, 0);
      head_ = std::exchange(o.head_, 0);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }

  /// A dispatcher of `cq` (borrowed).
  /// \errors
  /// - errc::null_handle: `cq` is null.
  /// - errc::zero_length: o.max_targets is 0.
  /// - ENOMEM: the table or the stash cannot be allocated.
  /// \mallocs The target table and the stash.
  [[nodiscard]] static result<CompletionDispatcher> create(CompletionQueue &cq, dispatcher_options o = {}) noexcept {
    if (!cq) return make_error_code(errc::null_handle);
    if (o.max_targets == 0) return make_error_code(errc::zero_length);
    CompletionDispatcher d;
    d.targets_ = detail::counted_ptr<table>(new (std::nothrow) table);
    if (!d.targets_ || !d.targets_->t.allocate(o.max_targets))
      return std::make_error_code(std::errc::not_enough_memory);
    if (o.stash) {
      d.stash_.reset(new (std::nothrow) ibv_wc[o.stash]());
      if (!d.stash_) return std::make_error_code(std::errc::not_enough_memory);
    }
    d.cap_ = o.stash;
    d.cq_ = &cq;
    return d;
  }

  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return cq_ != nullptr; }
  /// The CQ it polls.
  [[nodiscard]] CompletionQueue *queue() const noexcept { return cq_; }
  /// Objects attached.
  [[nodiscard]] std::size_t attached() const noexcept { return targets_ ? targets_->t.size() : 0; }
  /// The program's completions kept for its next poll() / wait().
  [[nodiscard]] std::size_t stashed() const noexcept { return n_; }

  /// Route the completions of `obj`'s own work requests to it, and offer it every receive (a
  /// peer's send-with-invalidate). `obj`: a MemoryWindow, StrictGrant, IndirectKey or GrantPool
  /// that posts on QPs whose send queue completes on this dispatcher's CQ. Attaching again
  /// changes nothing.
  /// \errors
  /// - errc::null_handle: the dispatcher or `obj` is null.
  /// - errc::too_many_entries: dispatcher_options::max_targets objects are attached.
  /// \mallocs None.
  template <detail::completion_target_type T>
  [[nodiscard]] result<void> attach(T &obj) noexcept {
    if (!cq_ || !obj) return make_error_code(errc::null_handle);
    if (auto ec = targets_->t.add(obj)) return ec;
    return success();
  }
  /// attach(obj) for as long as the returned Route lives: the Route detaches `obj` when it ends
  /// (declare it after `obj`: it then goes first, also on an early return). The form to use when
  /// the dispatcher outlives the objects (a long-lived dispatcher, objects per request).
  /// \errors As attach(obj).
  /// \mallocs None.
  template <detail::completion_target_type T>
  [[nodiscard]] result<Route> route(T &obj) noexcept {
    if (auto r = attach(obj); !r) return r.error();
    table *tb = targets_.get();
    tb->refs.add();
    return detail::route_access::make(tb, &obj, [](void *p, const void *o) noexcept {
      auto *t = static_cast<table *>(p);
      t->t.remove(o);
      if (t->refs.drop() == 0) delete t;
    });
  }
  /// Stop routing to `obj` (before it is moved or destroyed). Not attached: nothing changes.
  template <detail::completion_target_type T>
  void detach(const T &obj) noexcept {
    if (targets_) targets_->t.remove(&obj);
  }

  /// Poll the CQ once (ibv_poll_cq, up to out.size()) after handing out what settle() kept:
  /// each completion goes to the attached object it belongs to; the program's are written to
  /// `out`, in the order polled. Returns their number: 0 also when only objects' completions
  /// were polled (poll again: the CQ may hold more).
  /// \errors
  /// - errc::null_handle: the dispatcher is null.
  /// - errc::zero_length: `out` is empty.
  /// - those of CompletionQueue::poll.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> poll(std::span<ibv_wc> out) noexcept {
    if (!cq_) return make_error_code(errc::null_handle);
    if (out.empty()) return make_error_code(errc::zero_length);
    std::size_t k = unstash(out);
    if (k == out.size()) return k;
    RDMAXX_TRY(n, cq_->poll(detail::span_from(out, k)));
    return k + route_in_place(detail::span_of(out.data() + k, n));
  }

  /// Wait up to `timeout_ms` for at least one completion of the program's (CompletionQueue::wait:
  /// a busy poll without a channel, the channel's event otherwise), routing the objects' own as
  /// they come. Returns their number (>= 1).
  /// \errors
  /// - errc::null_handle, errc::zero_length: as poll().
  /// - errc::timeout: none of the program's completions within `timeout_ms` (the objects' own
  ///   went to them meanwhile).
  /// - those of CompletionQueue::wait.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> wait(std::span<ibv_wc> out, int timeout_ms) noexcept {
    if (!cq_) return make_error_code(errc::null_handle);
    if (out.empty()) return make_error_code(errc::zero_length);
    if (std::size_t k = unstash(out)) return k;
    const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
    for (;;) {
      const std::int64_t left = deadline - detail::monotonic_ms();
      RDMAXX_TRY(n, cq_->wait(out, left > 0 ? int(left) : 0));
      if (std::size_t k = route_in_place(detail::span_of(out.data(), n))) return k;
      if (left <= 0) return make_error_code(errc::timeout);
    }
  }

  /// Wait until `obj` has no unconfirmed operation (MemoryWindow, StrictGrant, IndirectKey:
  /// pending(); a GrantLease: no revoke in flight, its pool attached), routing every completion
  /// polled meanwhile. The program's own go to `on_other` (a span of them, in the order polled;
  /// must not throw). An object with nothing unconfirmed: success at once, nothing polled.
  /// \errors
  /// - errc::null_handle: the dispatcher or `obj` is null.
  /// - errc::wrong_state: `obj` (a lease: its pool) is not attached: nothing could confirm it.
  /// - wc_error(wc) of the first of `obj`'s completions that failed (flushed included): that
  ///   operation and any later one of `obj` were rolled back (the object says its state).
  /// - errc::timeout: still unconfirmed after `timeout_ms` (a deadline of 0 or less polls once):
  ///   the operation may still execute; settle again, or move the QP to ERR
  ///   (QueuePair::to_error) and settle: the flushed completion rolls the operation back (an
  ///   mlx5 IndirectKey: the QP's to_reset() answers errc::busy until its completion was handed
  ///   over; a MemoryWindow may also be reset and cancel_pending()).
  /// - those of CompletionQueue::wait.
  /// \mallocs None.
  template <detail::settle_type T, class OnOther>
    requires std::invocable<OnOther &, std::span<ibv_wc>>
  [[nodiscard]] result<void> settle(T &obj, int timeout_ms, OnOther &&on_other) noexcept {
    return settle_impl(obj, timeout_ms, on_other, [] { return std::size_t(16); });
  }
  /// settle() keeping the program's completions for its next poll() / wait() (it polls no more
  /// than the stash has room for).
  /// \errors
  /// - those of settle(obj, timeout_ms, on_other).
  /// - errc::unexpected_completion: the stash is full of the program's completions and `obj` is
  ///   still unconfirmed (take them with poll() or wait(), then settle again); nothing was dropped.
  /// \mallocs None.
  template <detail::settle_type T>
  [[nodiscard]] result<void> settle(T &obj, int timeout_ms) noexcept {
    auto keep = [this](std::span<ibv_wc> s) noexcept {
      for (const ibv_wc &wc : s) stash_[(head_ + n_++) % cap_] = wc;
    };
    return settle_impl(obj, timeout_ms, keep, [this] { return cap_ - n_; });
  }

private:
  // settle(): `room()` bounds each poll (the program's completions must have somewhere to go).
  template <class T, class OnOther, class Room>
  [[nodiscard]] result<void> settle_impl(T &obj, int timeout_ms, OnOther &on_other, Room room) noexcept;
  // Route each of `wcs`; the program's are moved to its front. Returns their number.
  std::size_t route_in_place(std::span<ibv_wc> wcs) noexcept {
    std::size_t k = 0;
    for (ibv_wc &wc : wcs)
      if (!targets_->t.route(wc)) wcs[k++] = wc;
    return k;
  }
  std::size_t unstash(std::span<ibv_wc> out) noexcept {
    std::size_t k = 0;
    while (n_ && k < out.size()) {
      out[k++] = stash_[head_];
      head_ = (head_ + 1) % cap_;
      --n_;
    }
    return k;
  }

  CompletionQueue *cq_ = nullptr;
  // The table, counted: each Route holds it too, so that a route may end after the dispatcher
  // moved or went.
  struct table {
    detail::ref_count<> refs;
    detail::completion_targets t;
  };
  detail::counted_ptr<table> targets_;
  detail::owned_array<ibv_wc> stash_;
  std::size_t cap_ = 0, head_ = 0, n_ = 0; // the stash: a ring of cap_ entries, n_ from head_
};

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/completion_dispatcher.ipp"
