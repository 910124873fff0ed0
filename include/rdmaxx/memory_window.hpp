/// \file
/// rdmaxx/memory_window.hpp: MemoryWindow (ibv_alloc_mw(3), ibv_bind_mw(3), ibv_wr_bind_mw(3),
/// local and remote invalidation). StrictGrant, the grant the library chooses, is in
/// strict_grant.hpp; the window-bounds probe in probe.hpp.
///
/// A window grants a peer remote access to a range of a registered region and can be revoked
/// without touching the region. rdmaxx makes this safe on devices that get it wrong (rxe, measured
/// on Debian's 6.1 kernel; see README "rxe defects"):
///   - invalidating a type-2 window that is not bound panics rxe: the window tracks its state and
///     the library never posts an invalidate unless the window is bound;
///   - rxe checks neither window bounds nor PDs on type-2 binds: rdmaxx checks range, rights, MW_BIND
///     access and PDs before every bind; StrictGrant makes bounds hold where the device does not;
///   - destroying a QP with a bound type-2 window blocks for tens of seconds on rxe (README): such a window counts as a child of
///     its QP, so qp.destroy() answers errc::busy until the window is invalidated or deallocated;
///   - ibv_dereg_mr of an MR with bound windows: windows count as children of their MR, so
///     mr.destroy() answers errc::busy (rxe itself answers EINVAL);
///   - the provider does not update mw->rkey on type-2 binds: the library chooses each new key
///     (ibv_inc_rkey) and writes it back; a type-1 unbind with a NULL MR crashes the rxe provider:
///     the library unbinds with the bound MR, addr 0, length 0.
///
/// State is applied when an operation is posted (so that a descriptor can be sent right after the
/// bind, on the same QP). Up to max_pending operations stay "unconfirmed" until their completion
/// (or that of a later operation of the window) is handed to complete(): a failed one rolls state,
/// key and parent counts back to what they were before it. Unconfirmed operations keep the MR and
/// QP they used counted, so those cannot be destroyed under an operation still in flight.
/// An operation added to a SendBatch that is then dropped, or whose submit() fails, is rolled
/// back by the batch itself (SendBatch keeps an undo per window operation; cancel_pending() is
/// not needed for that).
///
/// Revoking for good: destroy() (synchronous: ibv_dealloc_mw unbinds and frees). Prefer it to
/// invalidate() when the peer keeps the old key: a peer's send-with-invalidate of a type-2 window
/// that is allocated but no longer bound panics rxe, and the owner cannot stop a peer from sending
/// one. invalidate() is for windows that are rebound right away. The library learns of a remote
/// invalidate only from the receive completion handed to complete(): a local invalidate posted
/// while a peer may be sending send-with-invalidate for the same key is a race no library can
/// close on rxe (both paths reach the same kernel bug); destroy() has no such race.
///
/// Not thread-safe: one thread at a time per window (like the QP it posts on).
///
/// A window with an operation in an open batch must stay alive, at its address, until that batch
/// is submitted or dropped (the batch's undo points to it).
///
/// Lifetime: a window borrows its ProtectionDomain; while bound it also counts as a child of its
/// MemoryRegion and (type 2) of the QueuePair it was bound through. Keys: only the low 8 bits of a
/// window's key change from bind to bind, so a key repeats after 256 binds of one window; to be
/// sure an old key never comes back, deallocate the window and allocate a new one.
///
/// Allocation: MemoryWindow allocates nothing but what verbs allocates (ibv_alloc_mw); bind,
/// unbind, invalidate and complete() are inline and allocation-free (the unconfirmed operations
/// live in the window). StrictGrant::create() registers a region (MemoryRegion::reg) and allocates
/// a window.
#pragma once

#include "access.hpp"
#include "completion_queue.hpp"
#include "detail/handle.hpp"
#include "detail/mw_log.hpp"
#include "detail/object_ids.hpp"
#include "device.hpp"
#include "error.hpp"
#include "maybe.hpp"
#include "memory_region.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#include "remote_descriptor.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>

namespace rdmaxx {

namespace detail {
// ibv_dealloc_mw is static inline in verbs.h: a deleter's function needs external linkage.
inline int dealloc_mw(ibv_mw *mw) noexcept { return ::ibv_dealloc_mw(mw); }
} // namespace detail
namespace detail {
struct mw_access; // after MemoryWindow
}

/// Window type (enum ibv_mw_type). Type 2 is 2B on devices that report IBV_DEVICE_MEM_WINDOW_TYPE_2B.
/// type1: bound and unbound with ibv_bind_mw(3), the provider picks the key; type2: bound with a
/// work request (ibv_wr_bind_mw) through one QP, revoked by a local or remote invalidate.
enum class mw_type : std::uint8_t { type1 = IBV_MW_TYPE_1, type2 = IBV_MW_TYPE_2 };

/// What the library knows of a window, as of the operations posted so far.
enum class mw_state : std::uint8_t {
  unbound,     ///< never bound, or a type-1 window unbound
  bound,       ///< granted: the descriptor works
  invalidated, ///< type 2, invalidated locally or by the peer; can be bound again
};

/// The default wr_id of window and key operations (MemoryWindow, StrictGrant, IndirectKey;
/// posting and batch forms): own_wr_id, which each object replaces by its own id (wr_id()), unique
/// among the objects of the process. Two windows or keys sharing a QP and a CQ therefore never
/// take each other's completions, whatever completions the caller hands them.
inline constexpr std::uint64_t window_wr_id = own_wr_id;

/// A range of a MemoryRegion, as an offset from its start and a length.
struct window_range {
  /// Bytes from the start of the region.
  std::uint64_t offset = 0;
  /// Bytes in the range.
  std::uint64_t length = 0;
};

/// Rights a window can grant (access::zero_based makes the peer's addresses offsets; type 2 only).
inline constexpr access_flags window_rights =
    access::remote_read | access::remote_write | access::remote_atomic | access::zero_based;

/// The checks rdmaxx makes before posting any bind, because devices skip some of them (rxe checks
/// neither the window's bounds on access nor PDs on type-2 binds). Pure: no verbs are called.
/// \errors In this order:
/// - errc::pd_mismatch: window, region and QP do not share one PD.
/// - errc::unknown_access_flag: `rights` has a bit outside all_known_access.
/// - errc::bad_grant_rights: rights other than remote read/write/atomic and zero-based (e.g.
///   local_write or mw_bind, which belong to the region), or no remote right.
/// - errc::wrong_type: zero-based type-1 window.
/// - errc::zero_length: the range is empty.
/// - errc::out_of_range: the range is not inside the region.
/// - errc::missing_access: region without MW_BIND, or remote write/atomic rights over a region
///   without LOCAL_WRITE.
/// \mallocs None.
[[nodiscard]] inline std::error_code check_window_bind(mw_type type, const void *mw_pd,
                                                       const void *mr_pd, const void *qp_pd,
                                                       access_flags mr_access, std::uint64_t mr_length,
                                                       window_range r, access_flags rights) noexcept {
  if (mw_pd != mr_pd || mw_pd != qp_pd) return make_error_code(errc::pd_mismatch);
  if (!rights.subset_of(all_known_access)) return make_error_code(errc::unknown_access_flag);
  if (!rights.subset_of(window_rights) ||
      !rights.any(access::remote_read | access::remote_write | access::remote_atomic))
    return make_error_code(errc::bad_grant_rights);
  if (type == mw_type::type1 && rights.any(access::zero_based)) return make_error_code(errc::wrong_type);
  if (r.length == 0) return make_error_code(errc::zero_length);
  if (r.offset > mr_length || r.length > mr_length - r.offset) return make_error_code(errc::out_of_range);
  if (!mr_access.any(access::mw_bind)) return make_error_code(errc::missing_access);
  if (rights.any(access::remote_write | access::remote_atomic) && !mr_access.any(access::local_write))
    return make_error_code(errc::missing_access);
  return {};
}

/// The rkey a receive completion says the peer invalidated (send-with-invalidate), if any: one
/// flagged IBV_WC_WITH_INV. rxe does not set that flag: it copies the kernel's
/// IB_WC_WITH_INVALIDATE (1 << 2), which reads as IBV_WC_IP_CSUM_OK (measured: wc_flags 5 = GRH |
/// bit 2). With `device_omits_with_inv` (rxe's windows: MemoryWindow knows it from the vendor id)
/// a receive without immediate data whose invalidated_rkey equals `expected` counts too. Only
/// there: elsewhere (mlx5) a plain send's completion does not write that field, so it can still
/// hold the immediate data of an earlier completion in the same ibv_wc, which the peer chose.
[[nodiscard]] inline maybe<std::uint32_t> invalidated_rkey(const ibv_wc &wc, std::uint32_t expected,
                                                                   bool device_omits_with_inv = false) noexcept {
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) return {};
  if (wc.wc_flags & IBV_WC_WITH_INV) return wc.invalidated_rkey;
  if (device_omits_with_inv && !(wc.wc_flags & IBV_WC_WITH_IMM) && expected != 0 && wc.invalidated_rkey == expected)
    return wc.invalidated_rkey;
  return {};
}

namespace detail {
// Whether `ctx`'s device reports a peer's invalidation without IBV_WC_WITH_INV (rxe): one
// query (query_defect, so the fault-injection override applies), on the cold path of a type-2
// window's allocation. A failed query answers false: the flag is then required, and an unflagged
// invalidation is not taken for one (the window stays bound as far as it knows: revoked again,
// never reused early).
[[nodiscard]] inline bool device_omits_with_inv(ibv_context *ctx) noexcept {
  if (!ctx) return false;
  ibv_device_attr_ex ax{};
  tristate panics = tristate::unknown;
  return query_defect(ctx, ax, panics) == 0 && known_omits_with_inv(ax.orig_attr.vendor_id);
}
} // namespace detail

namespace detail {
// What a window is bound to; the links keep the MR and (type 2) QP counted while bound.
struct mw_binding {
  mw_state state = mw_state::unbound;
  std::uint32_t rkey = 0;
  std::uint32_t qp_num = 0; // type 2: the QP bound through
  ibv_mr *mr = nullptr;
  std::uint64_t addr = 0;   // device address of the first byte (mr iova + offset)
  std::uint64_t length = 0;
  access_flags rights;
  // Only in the log of unconfirmed operations: the MR and (type 2) QP of the binding before the
  // operation stay counted until it is confirmed. The current binding's are the window handle's
  // parent slots.
  child_link mr_link;
  child_link qp_link;
};
} // namespace detail

/// A memory window (ibv_alloc_mw(3)): grants a peer remote access to a range of a MemoryRegion and
/// is revoked without touching the region (see the top of this header for the rules rdmaxx adds).
/// Move-only, null after move; ibv_dealloc_mw on destruction. Not thread-safe.
class MemoryWindow {
public:
  /// Operations that may be posted and not yet confirmed through complete().
  static constexpr std::size_t max_pending = 4;

  /// An empty (null) window.
  MemoryWindow() noexcept = default;
  /// Takes over `o`'s window, binding and unconfirmed operations; `o` is left null.
  MemoryWindow(MemoryWindow &&o) noexcept { *this = std::move(o); }
  /// Deallocates the window this one held (then releases what it kept counted), takes over `o`'s.
  MemoryWindow &operator=(MemoryWindow &&o) noexcept;
  /// ibv_dealloc_mw (a failure goes to the destroy-failure hook), then releases the MR and QP the
  /// window kept counted.
  ~MemoryWindow() = default;

  /// ibv_alloc_mw of `type` on `pd`. A type-2 window on a device where a peer's
  /// send-with-invalidate of an unbound one panics the kernel (rxe) is refused unless `risk`
  /// accepts that every peer that reaches the device can then do so (see type2_risk).
  /// \errors
  /// - errc::null_handle: `pd` is null.
  /// - errc::unsafe_grant: type 2 on such a device, not accepted (one ibv_query_device_ex per
  ///   type-2 allocation tells; a failed query fails closed with its errno).
  /// - errc::unsupported: the device lacks the type (checked with ibv_query_device_ex only after
  ///   a failed allocation).
  /// - the errno of ibv_alloc_mw (ENOMEM, max_mw reached).
  /// \mallocs Only what ibv_alloc_mw allocates.
  [[nodiscard]] static result<MemoryWindow> alloc(const ProtectionDomain &pd, mw_type type,
                                                  type2_risk risk = type2_risk::refuse) noexcept;

  // ---- accessors (inline, unchecked) ----
  /// The ibv_mw (owned: do not deallocate it), or nullptr.
  [[nodiscard]] ibv_mw *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed, moved from or deallocated).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The type given to alloc().
  [[nodiscard]] mw_type type() const noexcept { return type_; }
  /// What the library knows of the window, as of the operations posted so far (see complete()).
  [[nodiscard]] mw_state state() const noexcept { return cur_.state; }
  /// The current key (the one a bound window's peers use).
  [[nodiscard]] std::uint32_t rkey() const noexcept { return cur_.rkey; }
  /// Posted operations whose completion was not handed to complete() yet.
  [[nodiscard]] std::size_t pending() const noexcept { return log_.size(); }
  /// The window's own work request id (detail::object_ids: never handed to another object of
  /// this process): what its operations carry when given own_wr_id (the default), and so what
  /// their completions carry. 0 when null.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return id_; }
  /// The grant as the peer must use it (meaningful while bound).
  [[nodiscard]] remote_descriptor descriptor() const noexcept {
    const bool zb = cur_.rights.any(access::zero_based);
    return {zb ? 0 : cur_.addr, cur_.length, cur_.rkey,
            cur_.rights & (access::remote_read | access::remote_write | access::remote_atomic), zb};
  }

  // ---- bind ----

  /// Add a bind to an open batch of `qp` (ibv_wr_bind_mw; either type). The library chooses the
  /// new key (ibv_inc_rkey of the current one) and writes it into the ibv_mw, which the provider
  /// does not. Checks first (see check_window_bind), and refuses to rebind a bound type-2 window.
  /// Returns the descriptor for the peer; it is valid once the bind executes, so send it on the
  /// same QP or after the bind's completion. If the batch is then dropped or its submit() fails,
  /// the batch rolls the window back (key, state, counted MR and QP): keep the window alive and
  /// in place until then. Inline.
  /// \errors
  /// - errc::null_handle: a null window, QP or MR.
  /// - errc::foreign_wr_id: `w.id` is another window's or key's own id (after the checks below).
  /// - errc::qp_mismatch: a batch of another QP.
  /// - errc::unusable: the MR is unusable.
  /// - the check_window_bind codes.
  /// - errc::already_bound: a bound type-2 window.
  /// - errc::wrong_state: unconfirmed operations on another QP, or the batch is not open.
  /// - errc::too_many_pending: max_pending unconfirmed operations, or the batch already carries
  ///   SendBatch::max_undo window and key operations.
  /// \mallocs None.
  [[nodiscard]] result<remote_descriptor> bind(SendBatch &batch, QueuePair &qp, const MemoryRegion &mr,
                                               window_range r, access_flags rights, wr w = {window_wr_id}) noexcept;

  /// Bind and post now: type 1 through ibv_bind_mw (the provider picks the key), type 2 through
  /// a batch of its own. The work request is signaled unless `w.flags` says otherwise: hand its
  /// completion to complete().
  /// \errors
  /// - those of the batch form.
  /// - errc::wrong_state: also when the QP has not reached RTS.
  /// - the errno of ibv_bind_mw / ibv_wr_complete (nothing is posted and the window is
  ///   unchanged).
  /// \mallocs None.
  [[nodiscard]] result<remote_descriptor> bind(QueuePair &qp, const MemoryRegion &mr, window_range r,
                                               access_flags rights,
                                               wr w = {window_wr_id, send_flag::signaled}) noexcept;

  // ---- revoke ----

  /// Type 1: unbind now (ibv_bind_mw with the bound MR, addr 0, length 0; never a NULL MR, which
  /// crashes the rxe provider). The old key stops working once it executes.
  /// \errors
  /// - errc::null_handle: a null window or QP.
  /// - errc::foreign_wr_id: `w.id` is another window's or key's own id.
  /// - errc::wrong_type: type 2 (use invalidate or dealloc).
  /// - errc::not_bound: the window is not bound.
  /// - errc::wrong_state: see bind; or the QP has not reached RTS.
  /// - errc::too_many_pending: see bind.
  /// - the errno of ibv_bind_mw.
  /// \mallocs None.
  result<void> unbind(QueuePair &qp, wr w = {window_wr_id, send_flag::signaled}) noexcept;
  /// Type 1: add an unbind to an open batch of `qp` (ibv_wr_bind_mw, bound MR, length 0). A
  /// dropped batch or a failed submit() rolls it back (as for bind).
  /// \errors
  /// - those of unbind(QueuePair&).
  /// - errc::qp_mismatch: a batch of another QP.
  /// - errc::wrong_state: also when the batch is not open.
  /// - errc::too_many_pending: also when the batch carries SendBatch::max_undo window and key
  ///   operations.
  /// \mallocs None.
  result<void> unbind(SendBatch &batch, QueuePair &qp, wr w = {window_wr_id}) noexcept;

  /// Type 2: add a local invalidate of the current key to an open batch (ibv_wr_local_inv) of the
  /// QP the window was bound through. Posted only when the window is bound: invalidating an
  /// unbound type-2 window panics rxe. A bind and its invalidate can share one batch and one
  /// completion (signal only the invalidate). A dropped batch or a failed submit() rolls it back
  /// (as for bind).
  /// \errors
  /// - errc::null_handle: a null window or QP.
  /// - errc::foreign_wr_id: `w.id` is another window's or key's own id.
  /// - errc::wrong_type: type 1.
  /// - errc::not_bound: never bound, already invalidated locally or by the peer.
  /// - errc::qp_mismatch: another QP than the one bound through, or a batch of another QP.
  /// - errc::wrong_state: the batch is not open.
  /// - errc::too_many_pending: see bind.
  /// \mallocs None.
  result<void> invalidate(SendBatch &batch, QueuePair &qp, wr w = {window_wr_id}) noexcept;
  /// Type 2: local invalidate posted now in a batch of its own (signaled unless `w` says
  /// otherwise).
  /// \errors
  /// - those of the batch form above.
  /// - the errno of ibv_wr_complete (the window is unchanged).
  /// \mallocs None.
  result<void> invalidate(QueuePair &qp, wr w = {window_wr_id, send_flag::signaled}) noexcept;

  /// ibv_dealloc_mw now: unbinds (if bound) and frees the window, synchronously; the old key is
  /// dead when this returns. The way to revoke for good.
  /// \errors
  /// - the errno of ibv_dealloc_mw (the window then stays allocated and unchanged).
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(h_.destroy());
    forget();
    return success();
  }
  /// The former name of destroy().
  [[deprecated("use destroy()")]] result<void> dealloc() noexcept { return destroy(); }

  // ---- completions ----

  /// Hand a completion to the window. Returns true when it concerned this window:
  ///  - a completion (success or error) of an operation the window posted, matched by wr_id and
  ///    QP: a success confirms it and every earlier one; a failure (flushed included) rolls the
  ///    window back to the state before that operation (key, bound range, counted MR and QP);
  ///  - a successful receive that invalidated the window's key (the peer's send-with-invalidate,
  ///    on rxe detected without IBV_WC_WITH_INV, see invalidated_rkey()): the window becomes
  ///    invalidated, so that no local invalidate is ever posted after it.
  /// Operations are matched by wr_id and QP (a failed completion carries no reliable opcode): by
  /// default each carries the window's own id (wr_id()), so a completion of another window, key
  /// or work request changes nothing here, whoever hands it over. An id the caller chose must
  /// not be used by any other work request on that QP. Inline, allocation-free.
  bool complete(const ibv_wc &wc) noexcept;

  /// Undo every unconfirmed operation (restore the state before the oldest one), whatever batch
  /// posted it. Not needed after a dropped batch or a failed submit(): the batch rolls back the
  /// operations it carried itself (and only those). For a caller that knows none of the
  /// unconfirmed operations will execute (e.g. its QP was reset before they ran).
  void cancel_pending() noexcept {
    if (log_.cancel(cur_, h_)) restore_key();
  }

private:
  // Parents: the PD, the MR bound to, type 2: the QP bound through.
  using traits = detail::deleter<ibv_mw, detail::dealloc_mw, "MemoryWindow", "ibv_dealloc_mw", 3>;

  [[gnu::cold]] static std::error_code alloc_failure(ibv_context *ctx, mw_type type) noexcept;

  [[nodiscard]] std::error_code check_pending(const QueuePair &qp) const noexcept;

  [[nodiscard]] std::error_code check_bind(const QueuePair &qp, const MemoryRegion &mr, window_range r,
                                           access_flags rights) const noexcept;
  // ibv_bind_mw before RTS would stay queued and run later, as a batch would (detail::before_rts).
  [[nodiscard]] static std::error_code check_can_post(const QueuePair &qp) noexcept {
    if (detail::before_rts(*qp.native_handle())) return make_error_code(errc::wrong_state);
    return {};
  }
  [[nodiscard]] std::error_code check_unbind(const QueuePair &qp) const noexcept;
  [[nodiscard]] std::error_code check_invalidate(const QueuePair &qp) const noexcept;

  // check_batch_of, and room for the undo push() registers.
  [[nodiscard]] static std::error_code check_batch(const SendBatch &batch, const QueuePair &qp) noexcept {
    if (auto ec = detail::check_batch_of(batch, qp)) return ec;
    if (detail::batch_access::undo(batch).full()) return make_error_code(errc::too_many_pending);
    return {};
  }
  // Record an operation added to `batch`: the current binding (with its counted MR/QP) moves into
  // the log, and the batch gets an undo for it in case nothing of it is posted.
  void push(const wr &w, const QueuePair &qp, SendBatch &batch, ibv_wc_opcode op = IBV_WC_BIND_MW) noexcept {
    detail::batch_access::undo(batch).add(&undo_op, this, push(w, qp, op));
  }
  // The batch's undo: roll back the operation named `seq` and any later one (all in that batch:
  // one open batch per QP, and a window's unconfirmed operations share one QP). Gone already
  // (confirmed, or the window deallocated or moved from): nothing to do.
  static void undo_op(void *window, std::uint64_t seq) noexcept {
    auto *self = static_cast<MemoryWindow *>(window);
    if (self->log_.undo(std::uint32_t(seq), self->cur_, self->h_)) self->restore_key();
  }
  // Record a posted operation: the current binding (with its counted MR/QP) moves into the log.
  std::uint32_t push(const wr &w, const QueuePair &qp, ibv_wc_opcode op = IBV_WC_BIND_MW) noexcept {
    return log_.push(w.id, qp.qp_num(), op, cur_, h_, w.flags.has(send_flag::signaled));
  }
  void set_bound(const QueuePair &qp, const MemoryRegion &mr, window_range r, access_flags rights,
                 std::uint32_t key) noexcept {
    set_bound(qp, mr.native_handle(), detail::handle_access::node(mr), mr.iova() + r.offset, r.length,
              rights, key);
  }
  void set_bound(const QueuePair &qp, ibv_mr *mr, detail::parent_node *mr_node, std::uint64_t addr,
                 std::uint64_t length, access_flags rights, std::uint32_t key) noexcept;
  void set_unbound(mw_state s, std::uint32_t key) noexcept;
  // After a rollback: the kernel still holds the restored binding's key.
  void restore_key() noexcept {
    if (h_) h_.get()->rkey = cur_.rkey;
  }
  void forget() noexcept {
    log_.clear();
    cur_ = detail::mw_binding{};
    unlink();
  }
  // The current binding no longer uses its MR and QP.
  void unlink() noexcept {
    h_.set_parent<detail::parent_slot::second>(nullptr);
    h_.set_parent<detail::parent_slot::third>(nullptr);
  }

  // An IndirectKey segment's bind: check_segment() as bind() checks a bind over all
  // [addr, addr + length) of `mr` (`mr_access`: what it was registered with, or what the
  // layout's validation checked), then bind_segment() adds it to `batch` and records it in the
  // window's log, but without an undo entry in the batch: the key binds one window per segment
  // under one undo entry of its own and deallocates the windows when it runs.
  [[nodiscard]] std::error_code check_segment(const QueuePair &qp, const ibv_mr *mr,
                                              access_flags mr_access, std::uint32_t length,
                                              access_flags rights) const noexcept;
  void bind_segment(SendBatch &batch, QueuePair &qp, ibv_mr *mr, detail::parent_node *mr_node,
                    std::uint64_t addr, std::uint32_t length, access_flags rights, wr w) noexcept;

  // ibv_alloc_mw on a PD known by its C object and children counter (GrantPool replaces the
  // windows it deallocated without holding the ProtectionDomain).
  [[nodiscard]] static result<MemoryWindow> alloc_on(detail::parent_node *pd_node, ibv_pd *pd,
                                                     mw_type type) noexcept;

  friend struct detail::mw_access; // for the types built on windows (grant slots, GrantPool)
  // Declaration order: h_ last, so the window is deallocated before the MR/QP counts drop.
  detail::mw_binding cur_;
  detail::mw_log<detail::mw_binding, max_pending> log_; // the unconfirmed operations
  mw_type type_ = mw_type::type1;
  bool omits_with_inv_ = false; // type 2 on rxe: see invalidated_rkey()
  std::uint64_t id_ = 0;        // own work request id (wr_id())
  detail::handle<traits> h_;
};

// ---- MemoryWindow: the longer bodies ----

inline MemoryWindow &MemoryWindow::operator=(MemoryWindow &&o) noexcept {
  if (this != &o) {
    h_.reset();
    forget();
    cur_ = std::move(o.cur_);
    log_ = std::move(o.log_);
    type_ = o.type_;
    omits_with_inv_ = o.omits_with_inv_;
    id_ = std::exchange(o.id_, 0);
    h_ = std::move(o.h_);
    o.forget();
  }
  return *this;
}

inline result<MemoryWindow> MemoryWindow::alloc(const ProtectionDomain &pd, mw_type type,
                                                type2_risk risk) noexcept {
  if (!pd) return make_error_code(errc::null_handle);
  if (type == mw_type::type2)
    if (auto ec = detail::check_type2(pd.context(), risk)) return ec;
  return alloc_on(detail::handle_access::node(pd), pd.native_handle(), type);
}

inline result<remote_descriptor> MemoryWindow::bind(SendBatch &batch, QueuePair &qp, const MemoryRegion &mr,
                                                    window_range r, access_flags rights, wr w) noexcept {
  if (auto ec = check_bind(qp, mr, r, rights)) return ec;
  if (auto ec = detail::resolve_wr(w, id_)) return ec;
  if (auto ec = check_batch(batch, qp)) return ec;
  const std::uint32_t key = ::ibv_inc_rkey(cur_.rkey);
  const ibv_mw_bind_info info{mr.native_handle(), mr.iova() + r.offset, r.length,
                              static_cast<unsigned>(rights.native())};
  batch.bind_mw(w, h_.get(), key, info);
  push(w, qp, batch);
  h_.get()->rkey = key; // what the kernel will hold once the bind executes
  set_bound(qp, mr, r, rights, key);
  return descriptor();
}

inline result<remote_descriptor> MemoryWindow::bind(QueuePair &qp, const MemoryRegion &mr, window_range r,
                                                    access_flags rights, wr w) noexcept {
  if (type_ == mw_type::type2) {
    if (!qp) return make_error_code(errc::null_handle);
    auto batch = qp.start_send();
    RDMAXX_TRY(d, bind(batch, qp, mr, r, rights, w));
    RDMAXX_TRYV(batch.submit()); // a failed submit rolled the bind back
    return d;
  }
  if (auto ec = check_bind(qp, mr, r, rights)) return ec;
  if (auto ec = check_can_post(qp)) return ec;
  if (auto ec = detail::resolve_wr(w, id_)) return ec;
  ibv_mw_bind b{};
  b.wr_id = w.id;
  b.send_flags = w.flags.native();
  b.bind_info = {mr.native_handle(), mr.iova() + r.offset, r.length,
                 static_cast<unsigned>(rights.native())};
  if (const int rc = ::ibv_bind_mw(qp.native_handle(), h_.get(), &b)) return errno_code(rc);
  push(w, qp);
  set_bound(qp, mr, r, rights, h_.get()->rkey); // the provider advanced mw->rkey
  return descriptor();
}

inline result<void> MemoryWindow::unbind(QueuePair &qp, wr w) noexcept {
  if (auto ec = check_unbind(qp)) return ec;
  if (auto ec = check_can_post(qp)) return ec;
  if (auto ec = detail::resolve_wr(w, id_)) return ec;
  ibv_mw_bind b{};
  b.wr_id = w.id;
  b.send_flags = w.flags.native();
  b.bind_info = {cur_.mr, 0, 0, 0};
  if (const int rc = ::ibv_bind_mw(qp.native_handle(), h_.get(), &b)) return errno_code(rc);
  push(w, qp);
  set_unbound(mw_state::unbound, h_.get()->rkey);
  return success();
}

inline result<void> MemoryWindow::unbind(SendBatch &batch, QueuePair &qp, wr w) noexcept {
  if (auto ec = check_unbind(qp)) return ec;
  if (auto ec = check_batch(batch, qp)) return ec;
  if (auto ec = detail::resolve_wr(w, id_)) return ec;
  const std::uint32_t key = ::ibv_inc_rkey(cur_.rkey);
  const ibv_mw_bind_info info{cur_.mr, 0, 0, 0};
  batch.bind_mw(w, h_.get(), key, info);
  push(w, qp, batch);
  h_.get()->rkey = key;
  set_unbound(mw_state::unbound, key);
  return success();
}

inline result<void> MemoryWindow::invalidate(SendBatch &batch, QueuePair &qp, wr w) noexcept {
  if (auto ec = check_invalidate(qp)) return ec;
  if (auto ec = check_batch(batch, qp)) return ec;
  if (auto ec = detail::resolve_wr(w, id_)) return ec;
  const std::uint32_t key = cur_.rkey;
  batch.local_inv(w, key);
  push(w, qp, batch, IBV_WC_LOCAL_INV);
  set_unbound(mw_state::invalidated, key); // the key stays; the next bind advances it
  return success();
}

inline result<void> MemoryWindow::invalidate(QueuePair &qp, wr w) noexcept {
  if (auto ec = check_invalidate(qp)) return ec;
  auto batch = qp.start_send();
  RDMAXX_TRYV(invalidate(batch, qp, w));
  return batch.submit(); // a failed submit rolled the invalidate back
}

inline bool MemoryWindow::complete(const ibv_wc &wc) noexcept {
  const bool peer_invalidated = type_ == mw_type::type2 && cur_.state == mw_state::bound &&
                                invalidated_rkey(wc, cur_.rkey, omits_with_inv_) == cur_.rkey;
  switch (log_.complete(wc, peer_invalidated, cur_, h_)) {
  case detail::mw_outcome::ignored: return false;
  case detail::mw_outcome::confirmed: return true;
  case detail::mw_outcome::rolled_back: restore_key(); return true;
  case detail::mw_outcome::invalidated: set_unbound(mw_state::invalidated, cur_.rkey); return true;
  }
  return false;
}

inline std::error_code MemoryWindow::alloc_failure(ibv_context *ctx, mw_type type) noexcept {
  const std::error_code ec = last_errno();
  ibv_device_attr_ex ax{};
  if (::ibv_query_device_ex(ctx, nullptr, &ax) == 0) {
    const auto f = ax.orig_attr.device_cap_flags;
    const bool has = type == mw_type::type1 ? (f & IBV_DEVICE_MEM_WINDOW) != 0
                                            : (f & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
    if (!has || ax.orig_attr.max_mw == 0) return make_error_code(errc::unsupported);
  }
  if (is_unsupported(ec)) return make_error_code(errc::unsupported);
  return ec;
}

inline std::error_code MemoryWindow::check_pending(const QueuePair &qp) const noexcept {
  if (log_.full()) return make_error_code(errc::too_many_pending);
  // Operations of one window in flight on two QPs could execute out of order.
  if (!log_.empty() && log_[0].qp_num != qp.qp_num()) return make_error_code(errc::wrong_state);
  return {};
}

inline std::error_code MemoryWindow::check_bind(const QueuePair &qp, const MemoryRegion &mr, window_range r,
                                                access_flags rights) const noexcept {
  if (!h_ || !qp || !mr) return make_error_code(errc::null_handle);
  if (auto ec = mr.usable()) return ec;
  if (auto ec = check_window_bind(type_, h_.get()->pd, mr.pd(), qp.pd(), mr.access(), mr.length(),
                                  r, rights))
    return ec;
  if (type_ == mw_type::type2 && cur_.state == mw_state::bound)
    return make_error_code(errc::already_bound);
  return check_pending(qp);
}

inline std::error_code MemoryWindow::check_unbind(const QueuePair &qp) const noexcept {
  if (!h_ || !qp) return make_error_code(errc::null_handle);
  if (type_ != mw_type::type1) return make_error_code(errc::wrong_type);
  if (cur_.state != mw_state::bound) return make_error_code(errc::not_bound);
  return check_pending(qp);
}

inline std::error_code MemoryWindow::check_invalidate(const QueuePair &qp) const noexcept {
  if (!h_ || !qp) return make_error_code(errc::null_handle);
  if (type_ != mw_type::type2) return make_error_code(errc::wrong_type);
  if (cur_.state != mw_state::bound) return make_error_code(errc::not_bound);
  if (qp.qp_num() != cur_.qp_num) return make_error_code(errc::qp_mismatch);
  return check_pending(qp);
}

inline void MemoryWindow::set_bound(const QueuePair &qp, ibv_mr *mr, detail::parent_node *mr_node,
                                    std::uint64_t addr, std::uint64_t length, access_flags rights,
                                    std::uint32_t key) noexcept {
  cur_.state = mw_state::bound;
  cur_.rkey = key;
  cur_.mr = mr;
  cur_.addr = addr;
  cur_.length = length;
  cur_.rights = rights;
  h_.set_parent<detail::parent_slot::second>(mr_node);
  if (type_ == mw_type::type2) {
    cur_.qp_num = qp.qp_num();
    h_.set_parent<detail::parent_slot::third>(detail::handle_access::node(qp));
  }
}

inline void MemoryWindow::set_unbound(mw_state s, std::uint32_t key) noexcept {
  cur_ = detail::mw_binding{};
  unlink();
  cur_.state = s;
  cur_.rkey = key;
}

inline std::error_code MemoryWindow::check_segment(const QueuePair &qp, const ibv_mr *mr,
                                                   access_flags mr_access, std::uint32_t length,
                                                   access_flags rights) const noexcept {
  if (!h_ || !qp || !mr) return make_error_code(errc::null_handle);
  if (auto ec = check_window_bind(type_, h_.get()->pd, mr->pd, qp.pd(), mr_access, length,
                                  {0, length}, rights))
    return ec;
  if (type_ == mw_type::type2 && cur_.state == mw_state::bound)
    return make_error_code(errc::already_bound);
  return check_pending(qp);
}

inline void MemoryWindow::bind_segment(SendBatch &batch, QueuePair &qp, ibv_mr *mr,
                                       detail::parent_node *mr_node, std::uint64_t addr, std::uint32_t length,
                                       access_flags rights, wr w) noexcept {
  const std::uint32_t key = ::ibv_inc_rkey(cur_.rkey);
  const ibv_mw_bind_info info{mr, addr, length, static_cast<unsigned>(rights.native())};
  batch.bind_mw(w, h_.get(), key, info);
  push(w, qp);
  h_.get()->rkey = key;
  set_bound(qp, mr, mr_node, addr, length, rights, key);
}

inline result<MemoryWindow> MemoryWindow::alloc_on(detail::parent_node *pd_node, ibv_pd *pd,
                                                   mw_type type) noexcept {
  ibv_mw *mw = ::ibv_alloc_mw(pd, ibv_mw_type(type));
  if (!mw) return alloc_failure(pd->context, type);
  MemoryWindow w;
  w.h_ = detail::handle<traits>(mw, pd_node, nullptr);
  w.type_ = type;
  w.omits_with_inv_ = type == mw_type::type2 && detail::device_omits_with_inv(pd->context);
  w.cur_.rkey = mw->rkey;
  w.id_ = detail::object_ids::acquire();
  return w;
}

namespace detail {
/// What the types built on MemoryWindow (detail::grant_slot, GrantPool) reach of it, instead of
/// being its friends: allocation on a PD known by its C object and children counter, the PD's
/// counter, and the segment bind of a software IndirectKey (see MemoryWindow's private
/// check_segment and bind_segment).
struct mw_access {
  /// ibv_alloc_mw of `type` on `pd`, a child of `pd_node`; the caller checked that type 2 may be
  /// allocated.
  [[nodiscard]] static result<MemoryWindow> alloc_on(parent_node *pd_node, ibv_pd *pd, mw_type type) noexcept {
    return MemoryWindow::alloc_on(pd_node, pd, type);
  }
  /// The children counter of the window's PD (nullptr when null).
  [[nodiscard]] static parent_node *pd_node(const MemoryWindow &w) noexcept { return w.h_.parent(); }
  /// A bind over all [addr, addr + length) of `mr`, checked as MemoryWindow::bind checks.
  [[nodiscard]] static std::error_code check_segment(const MemoryWindow &w, const QueuePair &qp, const ibv_mr *mr,
                                                     access_flags mr_access, std::uint32_t length,
                                                     access_flags rights) noexcept {
    return w.check_segment(qp, mr, mr_access, length, rights);
  }
  /// Adds the checked segment bind to `batch` and logs it, without an undo entry in the batch.
  static void bind_segment(MemoryWindow &w, SendBatch &batch, QueuePair &qp, ibv_mr *mr, parent_node *mr_node,
                           std::uint64_t addr, std::uint32_t length, access_flags rights, wr wr_) noexcept {
    w.bind_segment(batch, qp, mr, mr_node, addr, length, rights, wr_);
  }
};
} // namespace detail

} // namespace rdmaxx
