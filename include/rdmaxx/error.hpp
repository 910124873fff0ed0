/// \file
/// rdmaxx/error.hpp: the error model of rdmaxx.
///
/// Every fallible call returns result<T> (result.hpp: a T or a std::error_code, [[nodiscard]]).
/// Codes come from five places:
///   - errno from a verb: generic_category, built by errno_code() / last_errno();
///   - what rdmaxx itself detects: rdmaxx::errc in rdmaxx::error_category();
///   - a failed work completion: ibv_wc_status in rdmaxx::wc_category();
///   - a failed QP state transition: qp_transition_category(), which names the transition and
///     the attribute together with the errno;
///   - a failed re-registration: rereg_category(), which says which MR is left valid.
/// All of them map to portable std::errc conditions, and every "this device does not support it"
/// answer compares equal to rdmaxx::condition::unsupported (see is_unsupported()).
///
/// Allocation: nothing here allocates, except the categories' message() (a std::string).
#pragma once

#include "detail/atomic.hpp"
#include "result.hpp"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace rdmaxx {

// Propagate a failure from a function that itself returns a result. Our own macros, because
// BOOST_OUTCOME_TRY changed meaning between Boost 1.74 and 1.76.
/// \cond
#define RDMAXX_CAT2_(a, b) a##b
#define RDMAXX_CAT_(a, b) RDMAXX_CAT2_(a, b)
/// \endcond
/// RDMAXX_TRYV(expr): return expr's error if it failed.
#define RDMAXX_TRYV(...)                                                                        \
  do {                                                                                         \
    auto &&rdmaxx_try_r_ = (__VA_ARGS__);                                                      \
    if (!rdmaxx_try_r_) [[unlikely]] return rdmaxx_try_r_.error();                             \
  } while (0)
/// RDMAXX_TRY(var, expr): return expr's error if it failed, else bind its value to `var`.
#define RDMAXX_TRY(var, ...)                                                                   \
  auto &&RDMAXX_CAT_(rdmaxx_try_, __LINE__) = (__VA_ARGS__);                                   \
  if (!RDMAXX_CAT_(rdmaxx_try_, __LINE__)) [[unlikely]]                                        \
    return RDMAXX_CAT_(rdmaxx_try_, __LINE__).error();                                         \
  [[maybe_unused]] auto &&var = std::move(RDMAXX_CAT_(rdmaxx_try_, __LINE__)).assume_value()

/// What rdmaxx detects on its own, before or after calling verbs. One code per meaning; after
/// each, what the caller should do about it. Unless a function says otherwise, a call that
/// answers one of these changed nothing.
enum class errc : int {
  invalid_argument = 1,      ///< an argument is malformed (no more specific code fits): fix the call
  null_address,              ///< a null address where memory is required: pass real memory
  zero_length,               ///< an empty range where a non-empty one is required: pass a length
  remote_write_needs_local_write,   ///< IBV_ACCESS_REMOTE_WRITE without LOCAL_WRITE: add local_write
  remote_atomic_needs_local_write,  ///< IBV_ACCESS_REMOTE_ATOMIC without LOCAL_WRITE: add local_write
  unknown_access_flag,       ///< an access bit this library does not know: use access:: values only
  out_of_range,              ///< a range or index lies outside its object or a limit: shrink or move it
  wrong_state,               ///< the object's state does not allow the call (e.g. a QP before RTS,
                             ///< a submitted batch): reach the state first, or open a new batch
  null_handle,               ///< the handle is empty (moved from or never created): use a live one
  unusable,                  ///< a failed operation left the object unusable: destroy it
  busy,                      ///< the object still has children (windows, QPs, MRs...): destroy or
                             ///< invalidate them first; the object is unchanged
  unsupported,               ///< the device or build lacks the feature: take the portable path
  pd_mismatch,               ///< objects that must share a PD do not: create them on one PD
  no_device,                 ///< no RDMA device (of that name): check the name, load the driver
  timeout,                   ///< a bounded wait ran out: retry, or treat the peer as gone
  nothing_to_change,         ///< a modification that asks for no change: drop the call
  missing_access,            ///< a region lacks an access right the operation needs: register with it
  too_many_entries,          ///< more entries than the object or device allows: split the work
  verb_failed_without_errno, ///< a verb failed but left errno at 0 (a provider bug): report it
  malformed_input,           ///< bytes from a peer do not decode: drop them, distrust the peer
  wrong_version,             ///< bytes from a peer carry an unknown version: upgrade one side
  iova_page_offset_mismatch, ///< IOVA and address differ in their offset within a page: align them
  not_bound,                 ///< the window or key is not bound: nothing to invalidate; bind it first
  already_bound,             ///< the window or key is bound: invalidate it first
  wrong_type,                ///< not valid for this object's type (e.g. a type-1 window): use the
                             ///< call for its type
  provider_defect,           ///< the device's provider would get this request wrong (README lists
                             ///< them): use the documented alternative
  context_mismatch,          ///< objects that must belong to one device context do not: open them
                             ///< on one Context
  qp_mismatch,               ///< a batch, window or key belongs to another QueuePair than the one
                             ///< given: use the QP it was opened or bound on
  buffer_too_small,          ///< the caller's output buffer is too small: give it at least the
                             ///< size the function documents (e.g. encoded_size, max_send_sge)
  /// The QP was not created with the mlx5 UMR send operations (a configure through it would call
  /// a builder the provider never filled in): create it with mlx5::create_umr_qp (or
  /// create_indirect_key_qp).
  not_umr_qp,
  /// A valid request beyond what this device's provider can carry (e.g. an mlx5 list layout of
  /// 2 GiB or more in total on rdma-core before 61, an mlx5 layout entry over 2 GiB): split the
  /// request (several keys, shorter entries).
  provider_limit,
  /// A window already has MemoryWindow::max_pending operations posted and not yet confirmed
  /// (hand their completions to complete() before posting another), or a SendBatch already
  /// carries SendBatch::max_undo window and key operations (submit it and start another).
  too_many_pending,
  /// The request would allocate a type-2 window on a device where any peer could then crash the
  /// host's kernel (Capabilities::remote_inv_unbound_mw_panics; the exposure is device-wide, see
  /// type2_risk): use the grant mechanism the library chose (StrictGrant::create without a type,
  /// GrantPool, IndirectKey), or a type-1 window. Retrying does not help. Only a test of type-2
  /// behaviour passes type2_risk::accept_kernel_panic_by_any_peer.
  unsafe_grant,
  private_data_too_long,     ///< rdma_cm private data above the transport's limit (56 bytes on
                             ///< connect, 196 on accept, 148 on reject): send less, or send the
                             ///< rest over the connection once it is established
  bad_address,               ///< an IP address or port that does not parse (connection.hpp): pass
                             ///< A.B.C.D:PORT, [IPV6]:PORT or PORT
  /// Every slot of a GrantPool is leased or waits for its revocation to be confirmed: hand the
  /// pool its completions (GrantPool::complete), release leases, or create a larger pool.
  pool_exhausted,
  /// The buffer is still granted, or its revocation is not confirmed yet, so a peer may still
  /// reach it: revoke it and hand the pool the completion, or call GrantPool::revoke_all() once
  /// the connection's QP is down and drained.
  grant_outstanding,
  /// An operation of the object was posted and its completion has not been handed back yet, so
  /// whether the device did it is unknown (e.g. an mlx5 IndirectKey's configure or invalidate):
  /// hand the operation's completion to complete() first (after QueuePair::to_error(), its
  /// flushed completion rolls it back). Unlike errc::busy, no child object is involved.
  operation_unconfirmed,
  /// The key cannot be configured again without a peer's revoked key answering once more (an
  /// mlx5 mkey whose 8-bit tag cannot be rotated further, or at all on this device; or, without
  /// tag update, an mkey on an index whose rkey was handed out before, which rdmaxx
  /// quarantines): destroy it and create a new one.
  key_retired,
  /// The QP's send queue has no room for another work request (an mlx5 UMR QP counts them: its
  /// provider would write a full queue's work request into the last one posted): hand the QP's
  /// send completions to QueuePair::retire() (an IndirectKey's own go through complete()), then
  /// retry; after an error, reset the QP (QueuePair::reset_and_reconnect).
  send_queue_full,
  /// The QP keeps the provider's scatter-to-CQE, which would copy a small receive to a
  /// zero-based SGE's offset taken as an address: use a QP rdmaxx created on the device
  /// (QueuePair::scatter_to_cqe_disabled()).
  scatter_to_cqe,
  /// The GrantLease belongs to another GrantPool: hand it to the pool that leased it (each
  /// connection's pool serves only its own leases).
  pool_mismatch,
  /// Grant rights (a window bind, a grant, a grant list entry) must be one or more of
  /// access::remote_read, remote_write, remote_atomic (and zero_based for type-2 windows):
  /// local_write and mw_bind are rights of the region, not of the peer: drop them from the
  /// rights (and register the region with them).
  bad_grant_rights,
  /// CompletionQueue::wait_for() without a handler for other completions saw the completion of
  /// another work request first (it is handed back, not dropped): give it to whoever posted
  /// that work request, or pass wait_for() a handler for them.
  unexpected_completion,
  /// The work request id given to a window or key operation is another live object's own id
  /// (it carries object_wr_tag): its completion would change that object's state. Leave the
  /// default (own_wr_id: the object's own id) or pass an id without the library's tags.
  foreign_wr_id,
  /// A grant (ExactGrant, StrictGrant, GrantPool, IndirectKey) reaches this region's memory: a
  /// rereg that moves the memory or changes the PD, or MemoryRegion::destroy(), would leave the
  /// grant's key on the old memory (which the caller may then free). Destroy or revoke the grant
  /// first (MemoryRegion::live_grants() counts them); the region is unchanged.
  region_granted,
  /// An mlx5 IndirectKey was configured over another key that has since been invalidated or
  /// given a new tag (reconfigured): the device refuses every access through it, so it hands out
  /// no descriptor, SGE or nesting. Revoke the key (IndirectKey::revoke) and configure
  /// it again over the nested key as it is now.
  stale_key,
};

namespace detail {
// The parts of a message, joined (empty parts add nothing). The categories build their messages
// here from `const char *`s: a string literal appended to a std::string directly instantiates
// libstdc++'s string_view-conversion checks once per literal length, in every TU.
[[nodiscard]] inline std::string join_text(const char *a, const char *b = "", const char *c = "",
                                           const char *d = "", const char *e = "", const char *f = "",
                                           const char *g = "") {
  const char *parts[] = {a, b, c, d, e, f, g};
  std::size_t n = 0;
  for (const char *x : parts) n += std::strlen(x);
  std::string m;
  m.reserve(n);
  for (const char *x : parts) m.append(x, std::strlen(x));
  return m;
}

// The text of an rdmaxx::errc ("unknown rdmaxx error" for other values).
[[nodiscard]] inline const char *errc_text(int c) noexcept;

class rdmaxx_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "rdmaxx"; }
  std::string message(int c) const override { return errc_text(c); }
  std::error_condition default_error_condition(int c) const noexcept override;
};
} // namespace detail

/// The category of rdmaxx::errc.
inline const std::error_category &error_category() noexcept {
  static const detail::rdmaxx_category_impl c;
  return c;
}
/// An rdmaxx::errc as a std::error_code; also makes `ec == rdmaxx::errc::busy` work.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// Whether calling again can succeed (the std::errc conditions above group codes by kind, not by
/// what the caller can do: pd_mismatch, qp_mismatch, null_handle and bad_address all compare
/// equal to std::errc::invalid_argument, busy and grant_outstanding to device_or_resource_busy).
enum class retry_hint : std::uint8_t {
  no,             ///< the same call fails the same way: fix the call or the objects it names
  after_progress, ///< once outstanding work moved on: hand completions to complete(), release a
                  ///< lease, destroy children, submit the batch, then call again
  yes,            ///< as is, perhaps after a pause: a transient condition (a timeout, EAGAIN)
};

namespace detail {
// A category of another rdmaxx header whose codes retry_hint_of() answers (cm_error.hpp's
// cm_category(): a reject because nobody listens yet is worth retrying, a reject by the peer
// application is not). It registers itself when it is constructed (its singleton's first use,
// before any of its codes exists), so that this header needs none of theirs and no RTTI.
class retry_hinted_category : public std::error_category {
public:
  // The retry_hint of this category's code `value`.
  [[nodiscard]] virtual retry_hint retry_hint_of_value(int value) const noexcept = 0;
};
inline constexpr std::size_t retry_hinted_slots = 4;
[[nodiscard]] inline detail::atomic<const retry_hinted_category *> *retry_hinted() noexcept {
  static detail::atomic<const retry_hinted_category *> s[retry_hinted_slots]{};
  return s;
}
inline void register_retry_hinted(const retry_hinted_category &c) noexcept {
  detail::atomic<const retry_hinted_category *> *s = retry_hinted();
  for (std::size_t i = 0; i < retry_hinted_slots; ++i) {
    const retry_hinted_category *none = nullptr;
    if (s[i].compare_exchange_strong(none, &c, detail::order::acq_rel) || none == &c) return;
  }
}
} // namespace detail

/// The retry_hint of an rdmaxx code or an errno (std::generic_category / system_category), and
/// of an rdma_cm code (cm_category(), cm_error.hpp: yes for a reject because nobody listens on the
/// port yet, an unreachable peer, an address or route resolution that timed out or found no host,
/// a step past its deadline; the errno rule below for a failed librdmacm call; no otherwise, e.g.
/// a reject by the peer application); no for other categories.
[[nodiscard]] inline retry_hint retry_hint_of(const std::error_code &ec) noexcept {
  if (ec.category() == error_category()) {
    switch (static_cast<errc>(ec.value())) {
    case errc::timeout: return retry_hint::yes;
    case errc::busy:
    case errc::too_many_pending:
    case errc::pool_exhausted:
    case errc::grant_outstanding:
    case errc::region_granted:
    case errc::operation_unconfirmed:
    case errc::unexpected_completion:
    case errc::send_queue_full:
    case errc::already_bound:
    case errc::wrong_state: return retry_hint::after_progress;
    default: return retry_hint::no;
    }
  }
  if (ec.category() == std::generic_category() || ec.category() == std::system_category()) {
    switch (ec.value()) {
    case EAGAIN:
    case EINTR:
    case ETIMEDOUT:
    case ENOMEM:
    case ENOBUFS: return retry_hint::yes;
    case EBUSY:
    case EINPROGRESS: return retry_hint::after_progress;
    default: return retry_hint::no;
    }
  }
  const detail::atomic<const detail::retry_hinted_category *> *h = detail::retry_hinted();
  for (std::size_t i = 0; i < detail::retry_hinted_slots; ++i) {
    const detail::retry_hinted_category *c = h[i].load(detail::order::acquire);
    if (!c) break;
    if (&ec.category() == c) return c->retry_hint_of_value(ec.value());
  }
  return retry_hint::no;
}

// ---------------------------------------------------------------------------------------------
// errno from verbs

/// An errno value (as returned by a verb, or read from errno) as a std::error_code.
/// errno 0 after a reported failure becomes errc::verb_failed_without_errno.
[[nodiscard]] inline std::error_code errno_code(int e) noexcept {
  if (e < 0) e = -e; // some verbs return -errno
  if (e == 0) return make_error_code(errc::verb_failed_without_errno);
  return {e, std::generic_category()};
}
/// The current errno as a std::error_code (call right after the failing verb).
[[nodiscard]] inline std::error_code last_errno() noexcept { return errno_code(errno); }

// ---------------------------------------------------------------------------------------------
// work completions

namespace detail {
class wc_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "ibv_wc_status"; }
  std::string message(int c) const override {
    return ibv_wc_status_str(static_cast<ibv_wc_status>(c));
  }
  std::error_condition default_error_condition(int c) const noexcept override;
};
} // namespace detail

/// The category of work-completion status codes (message from ibv_wc_status_str).
inline const std::error_category &wc_category() noexcept {
  static const detail::wc_category_impl c;
  return c;
}
/// A completion status as an error_code; IBV_WC_SUCCESS gives the empty (success) code.
[[nodiscard]] inline std::error_code wc_error(ibv_wc_status s) noexcept {
  if (s == IBV_WC_SUCCESS) return {};
  return {static_cast<int>(s), wc_category()};
}
/// The status of a polled work completion as an error_code (empty on success).
[[nodiscard]] inline std::error_code wc_error(const ibv_wc &wc) noexcept { return wc_error(wc.status); }

// ---------------------------------------------------------------------------------------------
// asynchronous events

namespace detail {
// Values are event type + 1: IBV_EVENT_CQ_ERR is 0, and a zero error_code means success.
class async_event_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "ibv_event_type"; }
  std::string message(int c) const override {
    return ibv_event_type_str(static_cast<ibv_event_type>(c - 1));
  }
  std::error_condition default_error_condition(int c) const noexcept override {
    switch (static_cast<ibv_event_type>(c - 1)) {
    case IBV_EVENT_CQ_ERR: return std::errc::no_buffer_space; // overrun: completions were lost
    case IBV_EVENT_QP_ACCESS_ERR: return std::errc::permission_denied;
    case IBV_EVENT_PORT_ERR: return std::errc::network_down;
    default: return std::errc::io_error;
    }
  }
};
} // namespace detail

/// The category of asynchronous error events (message from ibv_event_type_str).
inline const std::error_category &async_event_category() noexcept {
  static const detail::async_event_category_impl c;
  return c;
}
/// An asynchronous event (Context::wait_async_event) as an error_code: the empty (success) code
/// for informational events (port active, communication established, last WQE reached, SQ
/// drained, LID/P_Key/GID change, SRQ limit, client reregister), else the event type in
/// async_event_category() (value: type + 1, see async_event_type()). IBV_EVENT_CQ_ERR, a completion-queue overrun on rxe, compares equal
/// to std::errc::no_buffer_space; its event.element.cq names the CQ that lost completions.
[[nodiscard]] inline std::error_code async_error(const ibv_async_event &ev) noexcept {
  switch (ev.event_type) {
  case IBV_EVENT_CQ_ERR:
  case IBV_EVENT_QP_FATAL:
  case IBV_EVENT_QP_REQ_ERR:
  case IBV_EVENT_QP_ACCESS_ERR:
  case IBV_EVENT_PATH_MIG_ERR:
  case IBV_EVENT_DEVICE_FATAL:
  case IBV_EVENT_PORT_ERR:
  case IBV_EVENT_SRQ_ERR:
  case IBV_EVENT_WQ_FATAL: return {static_cast<int>(ev.event_type) + 1, async_event_category()};
  default: return {};
  }
}
/// The event type an async_error() code was made from (-1 for codes of other categories).
[[nodiscard]] inline int async_event_type(const std::error_code &ec) noexcept {
  return ec.category() == async_event_category() ? ec.value() - 1 : -1;
}

// ---------------------------------------------------------------------------------------------
// conditions

/// Error conditions that group codes from several categories.
enum class condition : int {
  unsupported = 1, ///< the device, provider or build does not support the operation
};

namespace detail {
// The one set of errnos that mean "this device or kernel does not have it": used by
// is_unsupported() and by the classification of a failed ibv_rereg_mr (a -4 with one of these
// left the MR unchanged), so that both always agree.
[[nodiscard]] constexpr bool is_unsupported_errno(int e) noexcept {
  // EOPNOTSUPP (== ENOTSUP on Linux) is what providers answer; ENOSYS and EPROTONOSUPPORT
  // come from missing kernel or provider entry points; EAFNOSUPPORT from missing transports.
  return e == EOPNOTSUPP || e == ENOTSUP || e == ENOSYS || e == EPROTONOSUPPORT || e == EAFNOSUPPORT;
}
class condition_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "rdmaxx.condition"; }
  std::string message(int c) const override {
    return c == static_cast<int>(condition::unsupported) ? "not supported by this device"
                                                         : "unknown condition";
  }
  // Declared inline here so that no vtable becomes a key-function vtable emitted in every TU.
  inline bool equivalent(const std::error_code &ec, int cond) const noexcept override;
};
} // namespace detail

/// The category of rdmaxx::condition.
inline const std::error_category &condition_category() noexcept {
  static const detail::condition_category_impl c;
  return c;
}
/// Makes `ec == rdmaxx::condition::unsupported` work.
inline std::error_condition make_error_condition(condition c) noexcept {
  return {static_cast<int>(c), condition_category()};
}

} // namespace rdmaxx

/// \cond
template <> struct std::is_error_code_enum<rdmaxx::errc> : std::true_type {};
template <> struct std::is_error_condition_enum<rdmaxx::condition> : std::true_type {};
/// \endcond

namespace rdmaxx {

/// True for every "not supported by this device/provider/build" answer, whichever category
/// carries it: EOPNOTSUPP and relatives from verbs, rdmaxx::errc::unsupported, and the same
/// errno inside a qp_transition or rereg code. Equivalent to ec == condition::unsupported.
[[nodiscard]] inline bool is_unsupported(const std::error_code &ec) noexcept {
  return ec == condition::unsupported;
}

// ---------------------------------------------------------------------------------------------
// QP transitions: the code packs the target state, the attribute blamed and the errno, so a
// failed connect says "INIT->RTR: IBV_QP_PATH_MTU: Invalid argument" and still compares equal to
// std::errc::invalid_argument.

namespace detail {
[[nodiscard]] inline const char *qp_state_name(int s) noexcept {
  switch (s) {
  case IBV_QPS_RESET: return "RESET";
  case IBV_QPS_INIT: return "INIT";
  case IBV_QPS_RTR: return "RTR";
  case IBV_QPS_RTS: return "RTS";
  case IBV_QPS_SQD: return "SQD";
  case IBV_QPS_SQE: return "SQE";
  case IBV_QPS_ERR: return "ERR";
  default: return "?";
  }
}
[[nodiscard]] inline const char *qp_attr_name(int bit) noexcept {
  switch (bit) {
  case -1: return "attribute not identified";
  case 0: return "IBV_QP_STATE";
  case 1: return "IBV_QP_CUR_STATE";
  case 2: return "IBV_QP_EN_SQD_ASYNC_NOTIFY";
  case 3: return "IBV_QP_ACCESS_FLAGS";
  case 4: return "IBV_QP_PKEY_INDEX";
  case 5: return "IBV_QP_PORT";
  case 6: return "IBV_QP_QKEY";
  case 7: return "IBV_QP_AV";
  case 8: return "IBV_QP_PATH_MTU";
  case 9: return "IBV_QP_TIMEOUT";
  case 10: return "IBV_QP_RETRY_CNT";
  case 11: return "IBV_QP_RNR_RETRY";
  case 12: return "IBV_QP_RQ_PSN";
  case 13: return "IBV_QP_MAX_QP_RD_ATOMIC";
  case 14: return "IBV_QP_ALT_PATH";
  case 15: return "IBV_QP_MIN_RNR_TIMER";
  case 16: return "IBV_QP_SQ_PSN";
  case 17: return "IBV_QP_MAX_DEST_RD_ATOMIC";
  case 18: return "IBV_QP_PATH_MIG_STATE";
  case 19: return "IBV_QP_CAP";
  case 20: return "IBV_QP_DEST_QPN";
  default: return "IBV_QP_?";
  }
}
// value layout: bits 0..15 errno, 16..23 attribute bit + 1 (0 = not identified), 24..27 from,
// 28..30 to.
// Categories whose value packs the errno of a verb in bits 0..15 and detail above it: each code
// compares equal to that errno's std::errc.
class packed_errno_category : public std::error_category {
public:
  std::error_condition default_error_condition(int v) const noexcept override {
    return {v & 0xffff, std::generic_category()};
  }
};
// An errno as packed (positive, never 0: a failure without errno is EIO).
[[nodiscard]] constexpr int packed_errno(int err) noexcept {
  if (err < 0) err = -err;
  return (err == 0 ? EIO : err) & 0xffff;
}

class qp_transition_category_impl final : public packed_errno_category {
public:
  const char *name() const noexcept override { return "rdmaxx.qp_transition"; }
  std::string message(int v) const override {
    const std::string why = std::generic_category().message(v & 0xffff);
    return join_text(qp_state_name((v >> 24) & 0xf), "->", qp_state_name((v >> 28) & 0x7), " failed: ",
                     qp_attr_name(((v >> 16) & 0xff) - 1), ": ", why.c_str());
  }
};
} // namespace detail

/// The category of failed QP state transitions (see qp_transition_error()).
inline const std::error_category &qp_transition_category() noexcept {
  static const detail::qp_transition_category_impl c;
  return c;
}
/// A failed ibv_modify_qp from state `from` to `to`; attr_bit is the index of the IBV_QP_* mask
/// bit blamed (log2 of the flag), or -1 when no single attribute could be identified.
[[nodiscard]] inline std::error_code qp_transition_error(ibv_qp_state from, ibv_qp_state to,
                                                         int attr_bit, int err) noexcept {
  const int v = detail::packed_errno(err) | (((attr_bit + 1) & 0xff) << 16) | ((int(from) & 0xf) << 24) |
                ((int(to) & 0x7) << 28);
  return {v, qp_transition_category()};
}
/// The attribute bit blamed in a qp_transition code (-1 when none or another category).
[[nodiscard]] inline int qp_transition_attribute(const std::error_code &ec) noexcept {
  if (ec.category() != qp_transition_category()) return -1;
  return ((ec.value() >> 16) & 0xff) - 1;
}

// ---------------------------------------------------------------------------------------------
// Re-registration: which memory region a failed rereg left behind (ibv_rereg_mr(3)).

/// What a failed re-registration left in the MemoryRegion handle.
enum class rereg_state : int {
  old_valid = 1,   ///< nothing changed: the MR is still the old, valid registration
  new_valid = 2,   ///< the new registration is in place and valid (-3: fork of old range failed)
  unusable = 3,    ///< the MR can only be deregistered (-4, -5)
};

namespace detail {
// value layout: bits 0..15 errno, 16..19 rereg_state, 20..23 -(ibv_rereg_mr return) (0 = none)
class rereg_category_impl final : public packed_errno_category {
public:
  const char *name() const noexcept override { return "rdmaxx.rereg"; }
  std::string message(int v) const override;
};
} // namespace detail

/// The category of failed re-registrations (see rereg_error() and rereg_state_of()).
inline const std::error_category &rereg_category() noexcept {
  static const detail::rereg_category_impl c;
  return c;
}
/// A failed re-registration: the state left behind, the ibv_rereg_mr return code (0 when the
/// failure came from the replacement path) and the errno.
[[nodiscard]] inline std::error_code rereg_error(rereg_state s, int verb_rc, int err) noexcept {
  const int v = detail::packed_errno(err) | ((int(s) & 0xf) << 16) | (((-verb_rc) & 0xf) << 20);
  return {v, rereg_category()};
}
/// The state a failed rereg left, or old_valid for any code that is not a rereg code (every
/// other rdmaxx failure changes nothing).
[[nodiscard]] inline rereg_state rereg_state_of(const std::error_code &ec) noexcept {
  if (ec.category() != rereg_category()) return rereg_state::old_valid;
  return static_cast<rereg_state>((ec.value() >> 16) & 0xf);
}

inline bool detail::condition_category_impl::equivalent(const std::error_code &ec,
                                                        int cond) const noexcept {
  if (cond != static_cast<int>(condition::unsupported)) return false;
  if (ec.category() == rdmaxx::error_category())
    return ec.value() == static_cast<int>(errc::unsupported) ||
           ec.value() == static_cast<int>(errc::provider_defect);
  if (ec.category() == std::generic_category() || ec.category() == std::system_category())
    return is_unsupported_errno(ec.value());
  if (ec.category() == qp_transition_category() || ec.category() == rereg_category())
    return is_unsupported_errno(ec.value() & 0xffff);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Destruction failures: destructors cannot return errors, so they report them here.

/// The kinds of objects that count as children of a parent (destroy_failure::children): a
/// handle's kind follows from its class, a GrantPool counts on its PD, an IndirectKey on its
/// regions. Values index destroy_failure::children; other is anything else.
enum class child_kind : std::uint8_t {
  context,            ///< Context
  protection_domain,  ///< ProtectionDomain
  completion_channel, ///< CompletionChannel
  completion_queue,   ///< CompletionQueue
  queue_pair,         ///< QueuePair
  memory_region,      ///< MemoryRegion
  memory_window,      ///< MemoryWindow
  indirect_key,       ///< IndirectKey
  grant_pool,         ///< GrantPool (its windows are reallocated on the PD; its buffers' region)
  exact_grant,        ///< ExactGrant (of the region it was made from)
  strict_grant,       ///< StrictGrant (of the region it was made from)
  other,              ///< none of the above
};
/// Number of child_kind values.
inline constexpr std::size_t child_kind_count = 12;
/// The class name of a child_kind ("MemoryRegion", ...; "other object" for child_kind::other).
[[nodiscard]] constexpr const char *child_kind_name(child_kind k) noexcept {
  constexpr const char *names[child_kind_count] = {
      "Context",    "ProtectionDomain", "CompletionChannel", "CompletionQueue", "QueuePair",
      "MemoryRegion", "MemoryWindow",   "IndirectKey",       "GrantPool",       "ExactGrant",
      "StrictGrant",  "other object"};
  return std::size_t(k) < child_kind_count ? names[std::size_t(k)] : names[child_kind_count - 1];
}

/// What a destructor could not do.
struct destroy_failure {
  const char *object;        ///< "ProtectionDomain", "MemoryRegion", ...
  const char *verb;          ///< the verb that failed or was withheld, e.g. "ibv_dealloc_pd"
  std::error_code error;     ///< errno of the verb, or errc::busy when children are alive
  unsigned live_children;    ///< children still alive (destruction deferred to the last of them)
  /// The live children by kind (index: child_kind), read just before the parent let go (with
  /// children destroyed on other threads meanwhile they may add up to more than live_children).
  std::uint32_t children[child_kind_count];
};

/// The one-line text of `f` (what the default handler prints, without the newline) into `out`
/// (`size` bytes), truncated to fit and NUL-terminated: e.g. "rdmaxx: ProtectionDomain destroyed
/// while 10 child object(s) still use it (3 MemoryRegion, 7 MemoryWindow); ibv_dealloc_pd is
/// deferred until the last of them is destroyed. ...". Returns the characters written (without
/// the NUL).
/// \mallocs None for children still alive; for a failed verb its error's message() (a string).
inline std::size_t describe(const destroy_failure &f, char *out, std::size_t size) noexcept {
  if (size == 0) return 0;
  std::size_t n = 0;
  const auto put = [&](const char *t) {
    while (*t && n + 1 < size) out[n++] = *t++;
    out[n] = '\0';
  };
  const auto put_u = [&](unsigned v) {
    char d[12];
    int i = 0;
    do d[i++] = char('0' + v % 10); while ((v /= 10) != 0);
    char r[12];
    for (int j = 0; j < i; ++j) r[j] = d[i - 1 - j];
    r[i] = '\0';
    put(r);
  };
  out[0] = '\0';
  put("rdmaxx: ");
  if (f.live_children == 0) {
    put(f.verb);
    put(" failed while destroying a ");
    put(f.object);
    put(": ");
    put(f.error.message().c_str());
    return n;
  }
  put(f.object);
  put(" destroyed while ");
  put_u(f.live_children);
  put(" child object(s) still use it (");
  bool first = true;
  for (std::size_t k = 0; k < child_kind_count; ++k) {
    if (f.children[k] == 0) continue;
    if (!first) put(", ");
    put_u(f.children[k]);
    put(" ");
    put(child_kind_name(child_kind(k)));
    first = false;
  }
  if (first) put("kinds not recorded");
  put("); ");
  put(f.verb);
  put(" is deferred until the last of them is destroyed. Destroy children before their parent.");
  return n;
}

/// Called by destructors that could not destroy their object (see set_destroy_failure_handler()).
using destroy_failure_handler = void (*)(const destroy_failure &) noexcept;

namespace detail {
inline void default_destroy_failure_handler(const destroy_failure &f) noexcept {
  char line[512];
  describe(f, line, sizeof line);
  std::fprintf(stderr, "%s\n", line);
}
inline detail::atomic<destroy_failure_handler> &destroy_failure_hook() noexcept {
  static detail::atomic<destroy_failure_handler> h{&default_destroy_failure_handler};
  return h;
}
[[gnu::cold]] inline void report_destroy_failure(const destroy_failure &f) noexcept {
  destroy_failure_hook().load(detail::order::acquire)(f);
}
} // namespace detail

/// Install the handler that destructors call when a destroy verb fails or is withheld because
/// children are alive. Returns the previous handler. The default prints one line to stderr.
inline destroy_failure_handler set_destroy_failure_handler(destroy_failure_handler h) noexcept {
  if (h == nullptr) h = &detail::default_destroy_failure_handler;
  return detail::destroy_failure_hook().exchange(h, detail::order::acq_rel);
}

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/error.ipp"
