/// \file
/// rdmaxx/cm_options.hpp: what the three rdma_cm classes share: conn_options (how a Connection is
/// made, by connect or by accept), retry_options (how a connect retries) and conn_state. Part of
/// the rdma_cm support (connection.hpp; needs librdmacm). Apart so that connect_request.hpp, which
/// accepts with conn_options, needs no part of connection.hpp (no include cycle).
///
/// Allocation: nothing here allocates.
#pragma once

#include "access.hpp"
#include "cm_error.hpp"
#include "completion_queue.hpp"
#include "detail/clock.hpp"
#include "error.hpp"
#include "event_channel.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"

#include <time.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaxx {

/// What a connection is made of and how it behaves (connect and accept).
struct conn_options {
  /// The PD the QP is created on; nullptr: the Connection opens a Context on the resolved
  /// device and allocates its own PD. A PD of another device: errc::context_mismatch.
  const ProtectionDomain *pd = nullptr;
  /// CQs of the QP (required with `pd`: errc::null_handle without them); nullptr: the Connection
  /// creates one CQ of cq_entries entries for both.
  const CompletionQueue *send_cq = nullptr;
  /// The receive CQ of the QP (as send_cq).
  const CompletionQueue *recv_cq = nullptr;
  /// Entries of the CQ the Connection creates.
  int cq_entries = 128;
  /// Attach the created CQ to a CompletionChannel of its own (for CompletionQueue::wait and
  /// epoll: Connection::completion_channel()).
  bool cq_channel = false;
  /// Queue sizes and send operations of the QP (QueuePair::create).
  qp_caps caps{};
  /// Send operations of the QP (QueuePair::create).
  send_ops ops = all_send_ops;
  /// Remote operations the QP accepts (as connect_options::qp_access: local write, remote
  /// write/read/atomic; any other bit: errc::unknown_access_flag).
  access_flags qp_access = access::local_write | access::remote_write | access::remote_read |
                           access::remote_atomic;
  /// Outstanding RDMA reads/atomics this side accepts (responder_resources) and initiates
  /// (initiator_depth); clipped to the device's limits by rdma_cm.
  std::uint8_t responder_resources = 1;
  /// Outstanding RDMA reads/atomics this side initiates (see responder_resources).
  std::uint8_t initiator_depth = 1;
  /// RNR retries the peer should make (7: without limit).
  std::uint8_t rnr_retry_count = 7;
  /// Bound of each step (address, route, connect, accept), in milliseconds.
  int timeout_ms = 5000;
  /// Private data sent with rdma_connect (at most 56 bytes) or rdma_accept (at most 196).
  std::span<const std::byte> private_data{};
  /// When not null, receives the private data of a REJECTED event (connect).
  cm_private_data *reject_data = nullptr;
  /// The rdma_cm event channel to share (EventChannel::create(); it must outlive the connection:
  /// destroying it first is refused with errc::busy); nullptr: the connection creates a channel
  /// of its own (one fd). A null EventChannel: errc::null_handle.
  EventChannel *channel = nullptr;
  /// What EventChannel::dispatch() hands out for this connection (with `channel`), e.g. its
  /// index in the caller's table.
  std::uint64_t cookie = 0;
};

/// How Connection::connect(to, o, retry) (and asio::connect(to, o, retry)) retries while the
/// passive side is not up yet: a new attempt follows a failed one only when retry_hint_of() says
/// retry_hint::yes for its error (cm_category(): nobody listens on the port yet, reject reason 8;
/// the peer unreachable, its address or route not resolved in time, a step past its bound); any
/// other error returns at once.
struct retry_options {
  /// Time for all attempts, in milliseconds from the call. No attempt starts after it, and each
  /// attempt's steps are bounded by conn_options::timeout_ms or the time left when it starts,
  /// whichever is less (so the call returns within about three times that time left past it).
  /// 0: one attempt, exactly connect(to, o).
  int total_ms = 0;
  /// The pause after the first failed attempt, in milliseconds; doubled after each further one
  /// up to max_backoff_ms, and never past the deadline. At least 1.
  int backoff_ms = 50;
  /// The longest pause between two attempts, in milliseconds (at least backoff_ms).
  int max_backoff_ms = 1000;
  /// When not null, receives the number of attempts made (also when the call fails).
  int *attempts = nullptr;
};

namespace detail {
// Sleep `ms` milliseconds (a retry's pause; EINTR resumes the rest).
inline void sleep_ms(int ms) noexcept {
  timespec t{ms / 1000, long(ms % 1000) * 1000000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

// The schedule of a retrying connect (the blocking and the co_await form): its deadline, the
// bound of each attempt's steps, the pauses.
class retry_schedule {
public:
  explicit retry_schedule(const retry_options &r) noexcept
      : r_(r), deadline_(monotonic_ms() + r.total_ms), pause_(r.backoff_ms) {}
  // The options are usable: errc::invalid_argument otherwise.
  [[nodiscard]] static std::error_code check(const retry_options &r) noexcept {
    if (r.total_ms < 0 || r.backoff_ms < 1 || r.max_backoff_ms < r.backoff_ms)
      return make_error_code(errc::invalid_argument);
    return {};
  }
  // The next attempt begins (counted in retry_options::attempts): the step bound it gets.
  [[nodiscard]] int begin_attempt(int timeout_ms) noexcept {
    ++n_;
    if (r_.attempts) *r_.attempts = n_;
    clipped_ = false;
    if (r_.total_ms == 0) return timeout_ms;
    const std::int64_t left = deadline_ - monotonic_ms();
    clipped_ = left < timeout_ms;
    return left < 1 ? 1 : left < timeout_ms ? int(left) : timeout_ms;
  }
  // After a failed attempt: the error the call returns if it gives up now. A timeout of an
  // attempt whose bound was the time left (below the caller's timeout) says only that the
  // deadline came first: the answer of the attempt before it (e.g. REJECTED, reason 8) stands.
  [[nodiscard]] std::error_code failed(const std::error_code &ec) noexcept {
    if (!(clipped_ && is_cm_timeout(ec) && answer_)) answer_ = ec;
    return answer_;
  }
  // After a failed attempt: the pause before the next one, in milliseconds, or -1 when the
  // error is not worth retrying (retry_hint_of) or the deadline has passed.
  [[nodiscard]] int pause_after(const std::error_code &ec) noexcept {
    if (retry_hint_of(ec) != retry_hint::yes) return -1;
    const std::int64_t left = deadline_ - monotonic_ms();
    if (left <= 0) return -1;
    const int p = left < pause_ ? int(left) : pause_;
    pause_ = pause_ > r_.max_backoff_ms / 2 ? r_.max_backoff_ms : pause_ * 2;
    return p;
  }
  // True once the deadline has passed (after a pause: no attempt starts then).
  [[nodiscard]] bool expired() const noexcept { return monotonic_ms() >= deadline_; }

private:
  const retry_options &r_;
  std::int64_t deadline_;
  int pause_;
  int n_ = 0;
  bool clipped_ = false;   // the current attempt's bound is the time left
  std::error_code answer_; // what failed() reports
};
} // namespace detail

/// State of a Connection.
enum class conn_state : std::uint8_t {
  resolving_addr,  ///< rdma_resolve_addr posted
  resolving_route, ///< rdma_resolve_route posted
  resolved,        ///< active side (Connection::resolve): route resolved, QP in INIT on pd(),
                   ///< rdma_connect not called yet (connect_with())
  connecting,      ///< rdma_connect posted, waiting for the response
  prepared,        ///< accepting side: QP in RTS, rdma_accept not called yet (accept())
  accepting,       ///< rdma_accept posted, waiting for ESTABLISHED
  established,     ///< connected: the QP is in RTS
  disconnected,    ///< DISCONNECTED seen or disconnect() called: the QP is in ERR
  failed,          ///< a step failed (advance() returned the reason)
};

} // namespace rdmaxx
