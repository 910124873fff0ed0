/// \file
/// rdmaxx/completion_queue.hpp: CompletionChannel (ibv_create_comp_channel(3)) and
/// CompletionQueue (ibv_create_cq(3), ibv_poll_cq(3), ibv_req_notify_cq(3)).
///
/// Lifetime: both borrow their Context; a CQ borrows its channel; QueuePairs borrow their CQs.
/// Destroy QPs, then CQs, then channels.
///
/// Allocation: the create() functions allocate the node that counts children (new(nothrow)) besides
/// what verbs allocates; poll() and wait() do not allocate.
#pragma once

#include "detail/clock.hpp"
#include "detail/handle.hpp"
#include "detail/span.hpp"
#include "device.hpp"
#include "error.hpp"

#include <poll.h>

#include <array>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace rdmaxx {

namespace detail {
// What a null CompletionQueue polls: the CQ failure a provider reports for a bad CQ (EINVAL).
inline int null_poll_cq(ibv_cq *, int, ibv_wc *) noexcept { return -EINVAL; }

// A CompletionQueue's poll entry: the provider's poll_cq (what ibv_poll_cq reads from
// cq->context->ops on every call), read once when the CompletionQueue gets its ibv_cq, so that
// poll() loads one pointer fewer; &null_poll_cq while the CompletionQueue is null (no test per
// poll). Moves with the CQ.
class poll_entry {
public:
  using fn = int (*)(ibv_cq *, int, ibv_wc *);
  constexpr poll_entry() noexcept = default;
  poll_entry(poll_entry &&o) noexcept : f_(std::exchange(o.f_, &null_poll_cq)) {}
  poll_entry &operator=(poll_entry &&o) noexcept {
    f_ = std::exchange(o.f_, &null_poll_cq);
    return *this;
  }
  void reset(ibv_cq *cq) noexcept { f_ = cq ? cq->context->ops.poll_cq : &null_poll_cq; }
  [[nodiscard]] fn get() const noexcept { return f_; }

private:
  fn f_ = &null_poll_cq;
};
} // namespace detail

/// A completion event channel: lets a CompletionQueue be waited on instead of busy-polled.
class CompletionChannel {
public:
  CompletionChannel() noexcept = default;

  /// ibv_create_comp_channel.
  /// \errors
  /// - errc::null_handle: `ctx` is null.
  /// - the errno of ibv_create_comp_channel (EMFILE, ENOMEM).
  /// \mallocs One node that counts the channel's CQs (new(nothrow)), besides what verbs
  /// allocates.
  [[nodiscard]] static result<CompletionChannel> create(const Context &ctx) noexcept {
    if (!ctx) return make_error_code(errc::null_handle);
    CompletionChannel c;
    if (auto ec = detail::create_with_node(c.h_, detail::handle_access::node(ctx), [&] {
          return ::ibv_create_comp_channel(ctx.native_handle());
        }))
      return ec;
    return c;
  }
  /// The ibv_comp_channel (owned), or nullptr.
  [[nodiscard]] ibv_comp_channel *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed or moved from).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The channel's file descriptor (for poll(2) or epoll), or -1 when null.
  [[nodiscard]] int fd() const noexcept { return h_ ? h_.get()->fd : -1; }

  /// Wait up to `timeout_ms` (0: do not wait) for one completion event (poll(2) on fd(), then
  /// ibv_get_cq_event(3)) and return the CQ it is for: one channel may serve several CQs
  /// (compare with CompletionQueue::native_handle()). The event must be acknowledged with that
  /// CQ's ack_events() (batching is allowed: ack n at once) before the CQ is destroyed:
  /// ibv_destroy_cq waits for every event to be acknowledged. The CQ is disarmed by the event:
  /// follow the drain rule of CompletionQueue::poll_and_arm().
  /// \errors
  /// - errc::null_handle: the channel is null.
  /// - errc::invalid_argument: negative timeout.
  /// - errc::timeout: no event within `timeout_ms`.
  /// - the errno of poll / ibv_get_cq_event.
  /// \mallocs None.
  [[nodiscard]] result<ibv_cq *> get_event(int timeout_ms) noexcept;
  /// Destroy now (ibv_destroy_comp_channel). A null channel succeeds (nothing to destroy).
  /// \errors
  /// - errc::busy: CQs use it.
  /// - the errno of ibv_destroy_comp_channel.
  /// \mallocs None.
  result<void> destroy() noexcept { return h_.destroy(); }

private:
  using traits = detail::deleter<ibv_comp_channel, ::ibv_destroy_comp_channel, "CompletionChannel",
                                 "ibv_destroy_comp_channel">;
  friend struct detail::handle_access; // children register with this object's node
  detail::handle<traits> h_;
};

/// A completion queue (ibv_create_cq(3)), optionally attached to a CompletionChannel.
/// Move-only, null after move; ibv_destroy_cq on destruction (withheld and reported while QPs use
/// it).
class CompletionQueue {
public:
  CompletionQueue() noexcept = default;

  /// ibv_create_cq with at least `cqe` entries, optionally attached to `channel` for wait().
  /// \errors
  /// - errc::null_handle: `ctx`, or the given `channel`, is null.
  /// - errc::zero_length: `cqe` is 0 or negative.
  /// - errc::context_mismatch: a channel of another device context.
  /// - the errno of ibv_create_cq (EINVAL: cqe above the device's max_cqe, ENOMEM).
  /// \mallocs One node that counts the CQ's QPs (new(nothrow)), besides what verbs allocates.
  [[nodiscard]] static result<CompletionQueue> create(const Context &ctx, int cqe,
                                                      const CompletionChannel *channel = nullptr) noexcept {
    if (!ctx || (channel && !*channel)) return make_error_code(errc::null_handle);
    if (cqe <= 0) return make_error_code(errc::zero_length);
    if (channel && channel->native_handle()->context != ctx.native_handle())
      return make_error_code(errc::context_mismatch);
    CompletionQueue q;
    if (auto ec = detail::create_with_node(q.h_, detail::handle_access::node(ctx), [&] {
          return ::ibv_create_cq(ctx.native_handle(), cqe, nullptr,
                                 channel ? channel->native_handle() : nullptr, 0);
        }))
      return ec;
    q.h_.set_parent<detail::parent_slot::second>(channel ? detail::handle_access::node(*channel) : nullptr);
    q.poll_.reset(q.h_.get());
    return q;
  }

  /// The ibv_cq (owned), or nullptr.
  [[nodiscard]] ibv_cq *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The number of entries the provider granted (at least what was asked); 0 when null.
  [[nodiscard]] int capacity() const noexcept { return h_ ? h_.get()->cqe : 0; }

  /// ibv_poll_cq into `out`: the number of completions written (0 when none). Fast path: inline,
  /// no allocation, no check of the handle: it calls the provider's poll_cq entry, read once
  /// when the CQ was created (what ibv_poll_cq reads from the context on every call); a null CQ
  /// (moved from, destroyed) has a stand-in entry that answers EINVAL. Each completion carries
  /// its own status: turn it into an error_code with wc_error().
  /// \errors
  /// - errno: the provider reports a CQ failure (e.g. an overrun on some providers);
  ///   std::errc::invalid_argument on a null CQ.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> poll(std::span<ibv_wc> out) noexcept {
    const int n = poll_.get()(h_.get(), int(out.size()), out.data());
    if (n < 0) [[unlikely]] return failed(n);
    return std::size_t(n);
  }

  /// ibv_req_notify_cq: arm the CQ so that the next completion (with `solicited_only`, the next
  /// completion of a work request with send_flag::solicited, or any error completion) raises one
  /// event on its channel. One arm gives at most one event. An event that wait() saw on the
  /// channel and left there is taken first (ibv_get_cq_event + ibv_ack_cq_events): mlx4 and
  /// mlx5 count their arm sequence in ibv_get_cq_event. If another reader took that event
  /// (CompletionChannel::get_event(), an asio router) the read finds none: on a non-blocking
  /// fd (a router makes it so) arm() goes on; on a blocking one the read would wait for the
  /// next event, so take one CQ's events either through wait() or through get_event().
  /// \errors
  /// - errc::null_handle: the CQ is null.
  /// - errc::wrong_state: the CQ has no channel.
  /// - the errno of ibv_get_cq_event or ibv_req_notify_cq.
  /// \mallocs None.
  result<void> arm(bool solicited_only = false) noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (!h_.get()->channel) return make_error_code(errc::wrong_state);
    if (event_pending_) {
      event_pending_ = false;
      ibv_cq *ev_cq = nullptr;
      void *ev_ctx = nullptr;
      if (::ibv_get_cq_event(h_.get()->channel, &ev_cq, &ev_ctx) == 0) ::ibv_ack_cq_events(ev_cq, 1);
      else if (errno != EAGAIN && errno != EWOULDBLOCK) return last_errno();
      // EAGAIN: a non-blocking channel (a router's) whose event another reader took already.
    }
    if (const int rc = ::ibv_req_notify_cq(h_.get(), solicited_only ? 1 : 0)) return errno_code(rc);
    return success();
  }

  /// The drain-after-event rule in one call: poll into `out`; if the CQ is then empty (fewer
  /// than out.size() written), arm it (as arm()) and poll once more, because a completion that
  /// arrived between the empty poll and the arm raises no event. Returns the number written.
  /// While it returns out.size() the CQ may hold more: call it again. When it returns less, the
  /// CQ is empty and armed: it is safe to wait for the next event. Skipping this (waiting with
  /// completions left in the CQ, or arming without the second poll) loses notifications: the
  /// next event may never come.
  /// \errors
  /// - errc::null_handle: the CQ is null.
  /// - errc::zero_length: `out` is empty.
  /// - errc::wrong_state: the CQ has no channel.
  /// - the errno of ibv_poll_cq / ibv_get_cq_event (an event wait() left, see arm()) /
  ///   ibv_req_notify_cq.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> poll_and_arm(std::span<ibv_wc> out, bool solicited_only = false) noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (out.empty()) return make_error_code(errc::zero_length);
    RDMAXX_TRY(n, poll(out));
    if (n == out.size()) return n;
    RDMAXX_TRYV(arm(solicited_only));
    RDMAXX_TRY(m, poll(detail::span_from(out, n)));
    return n + m;
  }

  /// ibv_ack_cq_events: acknowledge `n` events CompletionChannel::get_event() returned for this
  /// CQ (acknowledging in batches saves a mutex per event; every event must be acknowledged
  /// before the CQ is destroyed).
  /// \errors
  /// - errc::null_handle: the CQ is null.
  /// \mallocs None.
  result<void> ack_events(unsigned n) noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (n) ::ibv_ack_cq_events(h_.get(), n);
    return success();
  }

  /// Wait up to `timeout_ms` milliseconds for completions and poll them into `out`. Returns the
  /// number written (>= 1).
  /// - With a channel: poll; if empty, arm (ibv_req_notify_cq), poll again to close the race,
  ///   then wait on the channel fd (poll(2)) and poll. The event is left on the channel and
  ///   taken (ibv_get_cq_event + ibv_ack_cq_events) by the next arm of this CQ (arm(), the next
  ///   wait() or poll_and_arm()): its read is then not between the completion and what the
  ///   caller does with it. Take the channel's events with CompletionChannel::get_event() or with
  ///   wait(), not both.
  ///   Do not use it on a channel shared by several CQs: it may take another CQ's event (it
  ///   acknowledges it, so nothing hangs, but that CQ's owner never sees the event). Use
  ///   CompletionChannel::get_event() there.
  /// - Without a channel: a bounded busy poll (ibv_poll_cq in a loop, the clock read every 64
  ///   empty polls). Cost: one CPU core at 100% until a completion arrives or the time is up;
  ///   latency is the best there is (no interrupt, no system call). Use a channel for long waits.
  /// A timeout of 0 or less polls once (twice with a channel) and does not wait.
  /// \errors
  /// - errc::null_handle: the CQ is null.
  /// - errc::zero_length: `out` is empty (no completion could be returned).
  /// - errc::timeout: no completion within `timeout_ms`.
  /// - the errno of the verbs.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> wait(std::span<ibv_wc> out, int timeout_ms) noexcept;

  /// Wait up to `timeout_ms` for the completion of the one work request `wr_id` (posted
  /// signaled: an unsignaled one never completes on its own) and return it. Completions of other
  /// work requests polled meanwhile are never dropped: they are handed to `on_other` (called with
  /// a span of them, in the order polled, possibly several times; also those polled in the same
  /// batch after the one waited for), e.g. a GrantPool's complete() and the caller's own
  /// bookkeeping. `on_other` must not throw. Waits as wait() does (a busy poll without a channel;
  /// with a channel the same arm-and-poll sequence); it polls up to 16 completions at a time.
  /// \errors
  /// - errc::null_handle: the CQ is null.
  /// - errc::timeout: `wr_id` did not complete within `timeout_ms` (what completed meanwhile went
  ///   to `on_other`).
  /// - wc_error(wc) (wc_category(), e.g. IBV_WC_REM_ACCESS_ERR): the work request completed with
  ///   a failed status (the QP is then in ERR: later completions are flushed).
  /// - the errno of the verbs.
  /// \mallocs None.
  template <class OnOther>
    requires std::invocable<OnOther &, std::span<ibv_wc>>
  [[nodiscard]] result<ibv_wc> wait_for(std::uint64_t wr_id, int timeout_ms, OnOther &&on_other) noexcept;
  /// wait_for() where no other completion is expected: one that arrives anyway ends the wait
  /// with errc::unexpected_completion and is written to `*other` (when not null), so that it is
  /// never lost silently.
  /// \errors
  /// - errc::unexpected_completion: another work request's completion came first (in `*other`;
  ///   hand it to whoever posted it, then wait again).
  /// - those of wait_for(wr_id, timeout_ms, on_other).
  /// \mallocs None.
  [[nodiscard]] result<ibv_wc> wait_for(std::uint64_t wr_id, int timeout_ms, ibv_wc *other = nullptr) noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    ibv_wc wc{};
    RDMAXX_TRY(n, wait(detail::span_of(&wc, 1), timeout_ms)); // one at a time: nothing polled is held back
    (void)n;
    if (wc.wr_id != wr_id) {
      if (other) *other = wc;
      return make_error_code(errc::unexpected_completion);
    }
    if (auto ec = wc_error(wc)) return ec;
    return wc;
  }

  /// Destroy now (ibv_destroy_cq).
  /// \errors
  /// - errc::busy: QPs use it.
  /// - the errno of ibv_destroy_cq.
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(h_.destroy());
    poll_.reset(nullptr);
    event_pending_ = false; // an event never read needs no acknowledgement
    return success();
  }

private:
  // A failed poll's result, built in place from the errno as std::errc (the code and category
  // errno_code() gives for it): nothing out of line takes the caller's result (clang would keep
  // it in memory on the success path too), and nothing of it has side effects, so that a
  // compiler may fold a caller's test of the result into its test of the count (g++ does in
  // small TUs; README, "The fast path as users build it").
  [[gnu::always_inline, gnu::flatten]] static result<std::size_t> failed(int n) noexcept {
    return static_cast<std::errc>(-n);
  }
  // Parents: the Context, the completion channel.
  using traits = detail::deleter<ibv_cq, ::ibv_destroy_cq, "CompletionQueue", "ibv_destroy_cq", 2>;
  friend struct detail::handle_access; // children register with this object's node
  friend struct detail::test_access;
  detail::handle<traits> h_; // parents: Context, completion channel
  detail::poll_entry poll_;  // h_'s provider poll_cq, or the null stand-in
  bool event_pending_ = false; // wait() saw the channel readable: arm() takes that event first
};

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/completion_queue.ipp"
