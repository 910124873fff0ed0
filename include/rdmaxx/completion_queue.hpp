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
#include "device.hpp"
#include "error.hpp"

#include <poll.h>

#include <cstddef>
#include <span>

namespace rdmaxx {

/// A completion event channel: lets a CompletionQueue be waited on instead of busy-polled.
class CompletionChannel {
public:
  CompletionChannel() noexcept = default;

  /// ibv_create_comp_channel. Errors: errc::null_handle, errno (EMFILE, ENOMEM).
  [[nodiscard]] static result<CompletionChannel> create(const Context &ctx) noexcept {
    if (!ctx) return make_error_code(errc::null_handle);
    RDMAXX_TRY(h, detail::create_with_node<traits>(detail::handle_access::node(ctx), [&] {
      return ::ibv_create_comp_channel(ctx.native_handle());
    }));
    CompletionChannel c;
    c.h_ = std::move(h);
    return c;
  }
  /// The ibv_comp_channel (owned), or nullptr.
  [[nodiscard]] ibv_comp_channel *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed or moved from).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The channel's file descriptor (for poll(2) or epoll), or -1 when null.
  [[nodiscard]] int fd() const noexcept { return h_ ? h_.get()->fd : -1; }
  /// Destroy now (ibv_destroy_comp_channel). Errors: errc::busy while CQs use it, errno of
  /// ibv_destroy_comp_channel. A null channel succeeds (nothing to destroy).
  result<void> destroy() noexcept { return h_.destroy(); }

private:
  struct traits {
    using native = ibv_comp_channel;
    static constexpr const char *object = "CompletionChannel";
    static constexpr const char *verb = "ibv_destroy_comp_channel";
    static int destroy(native *c) noexcept { return ::ibv_destroy_comp_channel(c); }
  };
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
  /// Errors: errc::null_handle, errc::zero_length (cqe 0 or negative), errc::context_mismatch
  /// (a channel of another device context), errno of ibv_create_cq (EINVAL: cqe above the
  /// device's max_cqe, ENOMEM).
  [[nodiscard]] static result<CompletionQueue> create(const Context &ctx, int cqe,
                                                      const CompletionChannel *channel = nullptr) noexcept {
    if (!ctx || (channel && !*channel)) return make_error_code(errc::null_handle);
    if (cqe <= 0) return make_error_code(errc::zero_length);
    if (channel && channel->native_handle()->context != ctx.native_handle())
      return make_error_code(errc::context_mismatch);
    RDMAXX_TRY(h, detail::create_with_node<traits>(detail::handle_access::node(ctx), [&] {
      return ::ibv_create_cq(ctx.native_handle(), cqe, nullptr,
                             channel ? channel->native_handle() : nullptr, 0);
    }));
    CompletionQueue q;
    q.h_ = std::move(h);
    q.h_.set_parent<detail::parent_slot::second>(channel ? detail::handle_access::node(*channel) : nullptr);
    return q;
  }

  /// The ibv_cq (owned), or nullptr.
  [[nodiscard]] ibv_cq *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The number of entries the provider granted (at least what was asked); 0 when null.
  [[nodiscard]] int capacity() const noexcept { return h_ ? h_.get()->cqe : 0; }

  /// ibv_poll_cq into `out`: the number of completions written (0 when none). Fast path: inline,
  /// no allocation, no check of the handle (like unique_ptr's operator*: polling a null CQ is a
  /// precondition violation, not an error; a check would cost every poll). Each completion carries its own status: turn it
  /// into an error_code with wc_error(). Errors: errno when the provider reports a CQ failure
  /// (e.g. an overrun on some providers).
  [[nodiscard]] result<std::size_t> poll(std::span<ibv_wc> out) noexcept {
    const int n = ::ibv_poll_cq(h_.get(), int(out.size()), out.data());
    if (n < 0) [[unlikely]] return errno_code(n);
    return std::size_t(n);
  }

  /// Wait up to `timeout_ms` milliseconds for completions and poll them into `out` (needs a
  /// channel): poll; if empty, arm (ibv_req_notify_cq), poll again to close the race, then wait
  /// on the channel fd (poll(2)), ibv_get_cq_event + ibv_ack_cq_events, and poll. Returns the
  /// number written (>= 1). Errors: errc::null_handle, errc::zero_length (`out` is empty: no
  /// completion could be returned), errc::wrong_state (no channel), errc::timeout, errno of the
  /// verbs.
  [[nodiscard]] result<std::size_t> wait(std::span<ibv_wc> out, int timeout_ms) noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (out.empty()) return make_error_code(errc::zero_length);
    ibv_comp_channel *ch = h_.get()->channel;
    if (!ch) return make_error_code(errc::wrong_state);
    const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
    for (;;) {
      RDMAXX_TRY(n, poll(out));
      if (n) return n;
      if (const int rc = ::ibv_req_notify_cq(h_.get(), 0)) return errno_code(rc);
      RDMAXX_TRY(m, poll(out));
      if (m) return m;
      const std::int64_t left = deadline - detail::monotonic_ms();
      if (left <= 0) return make_error_code(errc::timeout);
      pollfd p{ch->fd, POLLIN, 0};
      const int pr = ::poll(&p, 1, int(left));
      if (pr < 0 && errno != EINTR) return last_errno();
      if (pr <= 0) continue; // timeout or EINTR: the loop re-checks the deadline
      ibv_cq *ev_cq = nullptr;
      void *ev_ctx = nullptr;
      if (::ibv_get_cq_event(ch, &ev_cq, &ev_ctx)) return last_errno();
      ::ibv_ack_cq_events(ev_cq, 1);
    }
  }

  /// Destroy now (ibv_destroy_cq). Errors: errc::busy while QPs use it, errno of ibv_destroy_cq.
  result<void> destroy() noexcept {
    return h_.destroy();
  }

private:
  struct traits {
    using native = ibv_cq;
    static constexpr const char *object = "CompletionQueue";
    static constexpr const char *verb = "ibv_destroy_cq";
    static constexpr std::size_t parents = 2; // Context, completion channel
    static int destroy(native *c) noexcept { return ::ibv_destroy_cq(c); }
  };
  friend struct detail::handle_access; // children register with this object's node
  detail::handle<traits> h_; // parents: Context, completion channel
};

} // namespace rdmaxx
