/// \file
/// rdmaxx/protection_domain.hpp: ProtectionDomain (ibv_alloc_pd(3)).
///
/// Lifetime: borrows its Context. MemoryRegions, MemoryWindows and QueuePairs borrow the PD and
/// must be destroyed before it; destroying it earlier is reported (detail/handle.hpp), not leaked
/// silently.
///
/// Context is only declared here: a program that calls alloc() has a Context, and so has included
/// device.hpp, which defines alloc() (impl/protection_domain.ipp).
///
/// Allocation: alloc() allocates the node that counts the PD's children (new(nothrow)) besides
/// what ibv_alloc_pd allocates; nothing else allocates.
#pragma once

#include "detail/handle.hpp"
#include "error.hpp"

#include <infiniband/verbs.h>

#include <cstdint>

namespace rdmaxx {

// Only alloc() needs the Context complete: its body is in impl/protection_domain.ipp, which
// device.hpp includes at its end. So a header that needs the PD but not the device (a
// memory region's) does not pay for the whole of Context in every translation unit.
class Context;

/// A protection domain (ibv_alloc_pd(3)): the parent of memory regions, memory windows and
/// queue pairs. Move-only, null after move; ibv_dealloc_pd on destruction (withheld and reported
/// while children are alive).
class ProtectionDomain {
public:
  ProtectionDomain() noexcept = default;

  /// ibv_alloc_pd(3): a protection domain of `ctx`.
  /// \errors
  /// - errc::null_handle: `ctx` is null (default-constructed, moved from or closed).
  /// - ENOMEM: no memory for the node that counts the PD's children.
  /// - the errno of ibv_alloc_pd (ENOMEM).
  /// \mallocs One node that counts the PD's children (new(nothrow)), besides what ibv_alloc_pd
  /// allocates.
  [[nodiscard]] static result<ProtectionDomain> alloc(const Context &ctx) noexcept;

  /// The ibv_pd (owned: do not deallocate it), or nullptr.
  [[nodiscard]] ibv_pd *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The device context of the PD, or nullptr when null.
  [[nodiscard]] ibv_context *context() const noexcept { return h_ ? h_.get()->context : nullptr; }
  /// Objects (MRs, MWs, QPs) that still use this PD.
  [[nodiscard]] std::uint32_t live_children() const noexcept { return h_.live_children(); }
  /// ibv_dealloc_pd(3) now. On failure the PD stays valid. A null PD: success, nothing is called.
  /// \errors
  /// - errc::busy: children (MRs, MWs, QPs) are alive; nothing is called.
  /// - the errno of ibv_dealloc_pd.
  /// \mallocs None.
  result<void> destroy() noexcept { return h_.destroy(); }
  /// The former name of destroy().
  [[deprecated("use destroy()")]] result<void> dealloc() noexcept { return destroy(); }

private:
  using traits = detail::deleter<ibv_pd, ::ibv_dealloc_pd, "ProtectionDomain", "ibv_dealloc_pd">;
  friend struct detail::handle_access; // children register with this object's node
  friend struct detail::test_access;
  detail::handle<traits> h_;
};

} // namespace rdmaxx
