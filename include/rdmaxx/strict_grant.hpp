/// \file
/// rdmaxx/strict_grant.hpp: StrictGrant, the grant the library chooses for a device: one grant
/// slot (detail/grant_slot.hpp: an exact region, a window over it, key renewal) behind a handle.
#pragma once

#include "access.hpp"
#include "detail/grant_slot.hpp"
#include "device.hpp"
#include "error.hpp"
#include "memory_region.hpp"
#include "memory_window.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#include "remote_descriptor.hpp"

#include <cstdint>
#include <utility>

namespace rdmaxx {

/// A grant: a window over a region registered for exactly the granted bytes, so that the grant's
/// bounds hold even where the device checks only the bounds of the underlying MR (rxe, see
/// probe_window_bounds in probe.hpp), and, in the library's default (create() without a window
/// type), with a window type no peer can turn into a kernel panic:
///   - create(pd, mr, range, grant_options) uses the mechanism the library chooses for the device
///     (Capabilities::grant): on rxe, whose kernel panics when a peer's send-with-invalidate names
///     an unbound type-2 window (a peer that holds a type-2 key can do that by sending two in a
///     row), a type-1 window (grant_mechanism::type1_exact_region: cannot be remotely
///     invalidated; a peer's send-with-invalidate is refused with IBV_WC_REM_INV_REQ_ERR); on
///     mlx5 a type-2B window. grant_options::trusted_peers opts in to type 2 where the device is
///     not known to panic; on rxe only type2_risk::accept_kernel_panic_by_any_peer does (the
///     exposure is device-wide: any peer that reaches the device can guess a type-2 key);
///   - create(pd, mr, range, mw_type) is the explicit form: the caller chooses the type (type 2 on
///     rxe refused unless accepted, as above).
/// Isolation: a type-1 key works from every QP of the grant's PD while bound; a type-2 key only
/// from the QP it was bound through. For per-peer isolation under the type-1 default, give each
/// peer its own PD (its QPs on it) and create that peer's grants on it: the region may belong to
/// another PD of the same device (the exact region is registered on the grant's PD).
/// Any denied access (out of bounds, revoked key, wrong QP) moves the owner's QP to ERR as well
/// as the peer's: reconnect it (the grant stays valid).
/// Lifetime: the memory must outlive the grant. The grant counts as a child of the region it was
/// made from: while it lives, that region's destroy() and a rereg() of its translation or PD answer
/// errc::region_granted (the exact region, and so the key, would stay on the old memory).
/// Reuse: a StrictGrant kept per buffer slot (grant, revoke, grant again) never hands out a key it
/// handed out before: before the window's 8-bit key could repeat (grants_per_window() grants),
/// grant() replaces the window by a fresh one (detail::grant_slot, the mechanism GrantPool shares).
/// Cost: one ibv_reg_mr + ibv_dereg_mr per StrictGrant (create/destroy) plus a pinned-page
/// reference; a grant cycle on an existing StrictGrant (grant, revoke, grant again)
/// costs one window bind and one unbind (and an ibv_alloc_mw + ibv_dealloc_mw every
/// grants_per_window() grants): reuse one StrictGrant per buffer slot.
class StrictGrant {
public:
  /// An empty grant (no region, no window).
  StrictGrant() noexcept = default;

  /// The library's grant (the default): register [r.offset, r.offset + r.length) of `mr` again,
  /// alone, on `pd` (ibv_reg_mr with MW_BIND and the region's LOCAL_WRITE; `pd` may be another PD
  /// of the same device, e.g. one per peer), and allocate a window of the type the grant
  /// mechanism of the device calls for (detail::grant_for: one ibv_query_device_ex; see
  /// grant_mechanism).
  /// \errors
  /// - errc::null_handle: `pd` or `mr` is null.
  /// - errc::unusable: `mr` is unusable.
  /// - errc::zero_length: `r` is empty.
  /// - errc::out_of_range: `r` is not inside `mr`.
  /// - errc::context_mismatch: `pd` of another device, or o.caps of another device.
  /// - errc::unsupported: no memory windows here.
  /// - errc::unsafe_grant: only type-2 windows on a device where a peer could panic the kernel
  ///   with them (see type2_risk; grant_options::type2 accepts the risk).
  /// - the errno of ibv_query_device_ex (not called when o.caps is given) and ibv_reg_mr.
  /// - those of MemoryWindow::alloc.
  /// \mallocs The exact region (MemoryRegion::reg: its node, besides what verbs allocates) and
  /// what ibv_alloc_mw allocates.
  [[nodiscard]] static result<StrictGrant> create(const ProtectionDomain &pd, const MemoryRegion &mr,
                                                  window_range r, grant_options o = {}) noexcept {
    if (auto ec = check_source(pd, mr)) return ec;
    RDMAXX_TRY(g, detail::grant_for(pd.context(), o));
    if (g.mechanism == grant_mechanism::none)
      return make_error_code(g.unsafe ? errc::unsafe_grant : errc::unsupported);
    // grant_for chose type 2 only where it is safe or accepted in `o`.
    return make(pd, mr, r,
                g.mechanism == grant_mechanism::type1_exact_region ? mw_type::type1 : mw_type::type2,
                type2_risk::accept_kernel_panic_by_any_peer);
  }

  /// The explicit form: as above with a window of `type` chosen by the caller, and the same PD
  /// rule (`pd` any PD of `mr`'s device: the exact region is registered on it). A type-2 window on
  /// a device with Capabilities::remote_inv_unbound_mw_panics (rxe) is refused unless `risk`
  /// accepts the device-wide exposure (see type2_risk).
  /// \errors
  /// - errc::null_handle: `pd` or `mr` is null.
  /// - errc::unsafe_grant: type 2 there, not accepted.
  /// - errc::unusable: `mr` is unusable.
  /// - errc::context_mismatch: `pd` of another device.
  /// - errc::zero_length: `r` is empty.
  /// - errc::out_of_range: `r` is not inside `mr`.
  /// - the errno of ibv_reg_mr.
  /// - those of MemoryWindow::alloc.
  /// \mallocs As the default form.
  [[nodiscard]] static result<StrictGrant> create(const ProtectionDomain &pd, const MemoryRegion &mr,
                                                  window_range r, mw_type type,
                                                  type2_risk risk = type2_risk::refuse) noexcept {
    if (auto ec = check_source(pd, mr)) return ec;
    return make(pd, mr, r, type, risk);
  }

  /// Grant: bind the window over the whole exact region (see MemoryWindow::bind). Before the window's
  /// key could repeat, the window is first replaced by a fresh one (ibv_alloc_mw, then
  /// ibv_dealloc_mw of the old one), so no key handed out before ever answers again.
  /// \errors
  /// - errc::grant_outstanding: the window's keys are used up and the previous grant is still
  ///   bound or unconfirmed (revoke it and hand its completion to window().complete()).
  /// - the errno of ibv_alloc_mw / ibv_dealloc_mw when the window is replaced (nothing posted).
  /// - those of MemoryWindow::bind (the posting form).
  /// \mallocs None (what ibv_alloc_mw allocates when the window is replaced).
  [[nodiscard]] result<remote_descriptor> grant(QueuePair &qp, access_flags rights,
                                                wr w = {window_wr_id, send_flag::signaled}) noexcept {
    if (auto ec = renew_if_used_up()) return ec;
    return slot_.bind(qp, rights, w);
  }
  /// Add a bind of the window over the whole exact region to an open batch of `qp` (see the batch
  /// form of MemoryWindow::bind), replacing the window first as above. Inline.
  /// \errors
  /// - as the posting form, with those of the batch form of MemoryWindow::bind.
  /// \mallocs None (what ibv_alloc_mw allocates when the window is replaced).
  [[nodiscard]] result<remote_descriptor> grant(SendBatch &batch, QueuePair &qp, access_flags rights,
                                                wr w = {window_wr_id}) noexcept {
    if (auto ec = renew_if_used_up()) return ec;
    return slot_.bind(batch, qp, rights, w);
  }
  /// Revoke: end the current grant and keep the slot for the next one: type 1, MemoryWindow::unbind
  /// (ibv_bind_mw, length 0); type 2, MemoryWindow::invalidate (a local invalidate). The old key
  /// is dead once the operation executes (its completion, handed to window().complete()).
  /// \errors
  /// - those of MemoryWindow::unbind / invalidate.
  /// \mallocs None.
  result<void> revoke(QueuePair &qp, wr w = {window_wr_id, send_flag::signaled}) noexcept {
    return slot_.unbind(qp, w);
  }
  /// As above, added to an open batch of `qp`.
  /// \errors
  /// - those of the batch forms of MemoryWindow::unbind / invalidate.
  /// \mallocs None.
  result<void> revoke(SendBatch &batch, QueuePair &qp, wr w = {window_wr_id}) noexcept {
    return slot_.unbind(batch, qp, w);
  }

  /// 0.1's name of grant(qp, ...) (the window verb it posts). Deprecated: one name per meaning
  /// in every grant form: grant() hands a key out, revoke() ends that grant, destroy() is the
  /// checked destruction (0.1's revoke()).
  [[deprecated("StrictGrant::bind is now grant()")]] [[nodiscard]] result<remote_descriptor>
  bind(QueuePair &qp, access_flags rights, wr w = {window_wr_id, send_flag::signaled}) noexcept {
    return grant(qp, rights, w);
  }
  /// 0.1's name of grant(batch, qp, ...). Deprecated (see above).
  [[deprecated("StrictGrant::bind is now grant()")]] [[nodiscard]] result<remote_descriptor>
  bind(SendBatch &batch, QueuePair &qp, access_flags rights, wr w = {window_wr_id}) noexcept {
    return grant(batch, qp, rights, w);
  }
  /// 0.1's name of revoke(qp, ...). Deprecated (see above).
  [[deprecated("StrictGrant::unbind is now revoke(qp)")]] result<void>
  unbind(QueuePair &qp, wr w = {window_wr_id, send_flag::signaled}) noexcept {
    return revoke(qp, w);
  }
  /// 0.1's name of revoke(batch, qp, ...). Deprecated (see above).
  [[deprecated("StrictGrant::unbind is now revoke(batch, qp)")]] result<void>
  unbind(SendBatch &batch, QueuePair &qp, wr w = {window_wr_id}) noexcept {
    return revoke(batch, qp, w);
  }
  /// Grants one window makes before grant() replaces it (127 type 1, whose unbind takes a key
  /// too; 255 type 2).
  [[nodiscard]] std::uint32_t grants_per_window() const noexcept {
    return detail::grant_slot::grants_per_window(slot_.window.type());
  }
  /// Hand a completion to the grant's window (MemoryWindow::complete): true when it concerned
  /// this grant (its own grant or revoke, matched by wr_id and QP; a failure rolls it back; a
  /// peer's invalidation of its key). Inline, allocation-free.
  bool complete(const ibv_wc &wc) noexcept { return slot_.window.complete(wc); }
  /// Grant and revoke operations posted and not yet confirmed through complete().
  [[nodiscard]] std::size_t pending() const noexcept { return slot_.window.pending(); }
  /// The window (for state(), descriptor(), rkey(), and type-2 invalidate()).
  [[nodiscard]] MemoryWindow &window() noexcept { return slot_.window; }
  /// The window, read-only (state(), rkey(), descriptor()).
  [[nodiscard]] const MemoryWindow &window() const noexcept { return slot_.window; }
  /// The region registered for exactly the granted bytes.
  [[nodiscard]] const MemoryRegion &region() const noexcept { return slot_.region; }
  /// The grant mechanism in use (type1_exact_region or type2_window; none when empty).
  [[nodiscard]] grant_mechanism mechanism() const noexcept {
    if (!slot_.window) return grant_mechanism::none;
    return slot_.window.type() == mw_type::type1 ? grant_mechanism::type1_exact_region
                                            : grant_mechanism::type2_window;
  }
  /// True while the grant holds a window (false when empty, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(slot_.window); }

  /// Destroy now (the checked destruction; the destructor does the same and reports a failure
  /// through the destroy-failure hook): deallocate the window (ibv_dealloc_mw: the key is dead
  /// when it returns, whatever the window's recorded state), then deregister the exact region
  /// (ibv_dereg_mr). 0.1 called this revoke().
  /// \errors
  /// - those of MemoryWindow::dealloc and MemoryRegion::dereg (the grant then keeps what was not
  ///   destroyed).
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(slot_.window.destroy());
    RDMAXX_TRYV(slot_.region.destroy());
    source_.drop();
    return success();
  }

private:
  // Both create() forms' PD rule: the exact region is registered on `pd`, any PD of `mr`'s device.
  [[nodiscard]] static std::error_code check_source(const ProtectionDomain &pd, const MemoryRegion &mr) noexcept {
    if (!pd) return make_error_code(errc::null_handle);
    if (auto ec = mr.usable()) return ec;
    if (mr.native_handle()->context != pd.context()) return make_error_code(errc::context_mismatch);
    return {};
  }
  [[nodiscard]] static result<StrictGrant> make(const ProtectionDomain &pd, const MemoryRegion &mr,
                                                window_range r, mw_type type,
                                                type2_risk risk) noexcept {
    if (r.length == 0) return make_error_code(errc::zero_length);
    if (r.offset > mr.length() || r.length > mr.length() - r.offset)
      return make_error_code(errc::out_of_range);
    if (type == mw_type::type2)
      if (auto ec = detail::check_type2(pd.context(), risk)) return ec;
    RDMAXX_TRY(slot, detail::grant_slot::make(pd, mr.data() + r.offset, std::size_t(r.length),
                                              (mr.access() & access::local_write) | access::mw_bind,
                                              type));
    StrictGrant g;
    g.source_ = detail::child_link(detail::handle_access::node(mr), child_kind::strict_grant);
    g.slot_ = std::move(slot);
    return g;
  }

  [[nodiscard]] std::error_code renew_if_used_up() noexcept {
    if (!slot_.window || !slot_.keys_used_up()) [[likely]]
      return {};
    if (slot_.window.state() == mw_state::bound || slot_.window.pending() != 0)
      return make_error_code(errc::grant_outstanding);
    if (auto r = slot_.renew(); !r) return r.error();
    return {};
  }

  // Counts the grant as a child of the region it was made from (kind strict_grant): that region
  // cannot move its memory or be deregistered while the grant lives. Declared first: released
  // after the slot's window and exact region are destroyed.
  detail::child_link source_;
  detail::grant_slot slot_;
};

} // namespace rdmaxx
