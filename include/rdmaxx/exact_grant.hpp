/// \file
/// rdmaxx/exact_grant.hpp: ExactGrant, the cheapest safe one-shot grant: the bytes are registered
/// again, alone, with the remote rights, and the peer uses that region's own rkey. No window.
///
/// When to use which grant: a fresh range each time (one-shot) -> ExactGrant: one ibv_reg_mr and
/// one ibv_dereg_mr, the least a safe grant can cost where the device does not bound windows (the
/// exact bytes must be registered anyway; a window on top only adds cost). The same buffer slot
/// granted again and again -> StrictGrant kept per slot, or a GrantPool (a window bind and unbind
/// per grant, no registration).
///
/// Lifetime: the memory must outlive the grant. The grant counts as a child of the region it was
/// made from: while it lives, that region's destroy() and a rereg() of its translation or PD answer
/// errc::region_granted (the grant's key would stay on the old memory).
///
/// The promise, as for every grant: the key reaches exactly the granted bytes (the region's own
/// bounds, which every device enforces); it works once create() returns (ibv_reg_mr is
/// synchronous: there is no completion to wait for), and never after destroy() returns
/// (ibv_dereg_mr is synchronous). The key is the region's own, so ending the grant ends the
/// object: ExactGrant has no revoke() that keeps it (its former revoke() was this destroy()).
/// A peer's send-with-invalidate naming the key is refused on rxe (user MRs cannot be remotely
/// invalidated; tested) and costs the connection, not the kernel.
#pragma once

#include "access.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "memory_region.hpp"
#include "memory_window.hpp"
#include "protection_domain.hpp"
#include "remote_descriptor.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>

namespace rdmaxx {

/// A one-shot grant: a region of exactly the granted bytes registered with the granted remote
/// rights (see the top of this header). Move-only, null after move; ibv_dereg_mr on destruction.
class ExactGrant {
public:
  /// An empty grant.
  ExactGrant() noexcept = default;

  /// Register [r.offset, r.offset + r.length) of `mr` again, alone, on `pd` (which may be another
  /// PD of the same device, e.g. the peer's), with `rights` (ibv_reg_mr; remote write and atomic
  /// rights also register LOCAL_WRITE, which verbs requires). The key is live when this returns.
  /// \errors
  /// - errc::null_handle: `pd` or `mr` is null.
  /// - errc::unusable: `mr` is unusable.
  /// - errc::context_mismatch: `pd` of another device.
  /// - errc::zero_length: `r` is empty.
  /// - errc::out_of_range: `r` is not inside `mr`.
  /// - errc::bad_grant_rights: `rights` has no remote right, or bits other than remote_read,
  ///   remote_write and remote_atomic (e.g. local_write: the region's, not the peer's).
  /// - errc::missing_access: remote write or atomic rights on a region without local_write (the
  ///   caller's memory is not writable through it).
  /// - the errno of ibv_reg_mr.
  /// \mallocs What MemoryRegion::reg allocates (its node, besides what verbs allocates).
  [[nodiscard]] static result<ExactGrant> create(const ProtectionDomain &pd, const MemoryRegion &mr,
                                                 window_range r, access_flags rights) noexcept;

  /// The grant as the peer must use it: the region's address, length and rkey, and the rights.
  [[nodiscard]] remote_descriptor descriptor() const noexcept {
    if (!region_) return {};
    return {region_.iova(), region_.length(), region_.rkey(), rights_, false};
  }
  /// The region registered for exactly the granted bytes.
  [[nodiscard]] const MemoryRegion &region() const noexcept { return region_; }
  /// True while the grant holds its region (false when empty, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(region_); }

  /// End the grant and the object now: ibv_dereg_mr(3); the key is dead when this returns and
  /// the grant is empty. An empty grant: success, nothing is called.
  /// \errors
  /// - errc::busy: windows are bound to the region (only if the caller bound some).
  /// - the errno of ibv_dereg_mr (the grant then stays live and unchanged).
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(region_.destroy());
    source_.drop();
    return success();
  }
  /// The former name of destroy() (it never kept the object, as a revoke does).
  [[deprecated("use destroy()")]] result<void> revoke() noexcept { return destroy(); }

private:
  // Counts the grant as a child of the region it was made from (kind exact_grant): that region
  // cannot move its memory or be deregistered while the grant lives. Declared first: released
  // after the grant's own region is deregistered.
  detail::child_link source_;
  MemoryRegion region_;
  access_flags rights_;
};

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/exact_grant.ipp"
