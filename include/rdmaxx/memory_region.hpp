/// \file
/// rdmaxx/memory_region.hpp: MemoryRegion (ibv_reg_mr(3), ibv_reg_mr_iova2, allocate-and-register)
/// and its re-registration (ibv_rereg_mr(3), or a make-before-break replacement).
///
/// Lifetime: borrows its ProtectionDomain (destroy the MR first) and, for reg()/reg_iova(), the
/// caller's memory, which must stay mapped until the MR is destroyed. allocate() owns its memory
/// and unmaps it after deregistration.
///
/// Allocation: reg(), reg_iova() and allocate() allocate the node that counts the memory windows
/// bound to the MR (new(nothrow)) besides what verbs allocates; allocate() also maps its memory
/// (mmap). rereg() allocates nothing but what verbs allocates; the accessors, sge() and slice()
/// do not allocate.
#pragma once

#include "access.hpp"
#include "detail/handle.hpp"
#include "detail/pages.hpp"
#include "detail/rereg.hpp"
#include "error.hpp"
#include "maybe.hpp"
#include "protection_domain.hpp"

#include <cstddef>
#include <cstdint>

namespace rdmaxx {

namespace detail {
struct mr_access; // after MemoryRegion
}

/// How the memory behind a MemoryRegion came to be.
enum class mr_kind : std::uint8_t {
  user,      ///< reg(): the caller's memory, IOVA = virtual address
  iova,      ///< reg_iova(): the caller's memory at a caller-chosen IOVA
  allocated, ///< allocate(): memory owned by the MemoryRegion
};

/// Whether a MemoryRegion can be used. Only a failed re-registration makes it unusable.
/// valid: usable; unusable: only destruction is allowed (the destructor still deregisters).
enum class mr_state : std::uint8_t { valid, unusable };

/// How MemoryRegion::rereg may carry out a change.
enum class rereg_policy : std::uint8_t {
  native_with_fallback, ///< ibv_rereg_mr; where the device has none, a replacement (the default)
  native_only,          ///< ibv_rereg_mr only; errc::unsupported where the device has none
  replacement_only,     ///< always make-before-break: register anew, swap, deregister the old
};
/// How a successful rereg was carried out. native: ibv_rereg_mr(3) changed the registration in
/// place; replacement: a new registration was swapped in and the old one deregistered.
enum class rereg_path : std::uint8_t { native, replacement };

/// A range of process memory.
struct mr_range {
  /// First byte of the range.
  void *addr = nullptr;
  /// Bytes from addr.
  std::size_t length = 0;
};

/// What MemoryRegion::rereg should change; any combination. Fields left empty stay as they are.
/// Build with change_translation(), change_pd(), change_access(), combined with `|`.
struct rereg_changes {
  maybe<mr_range> translation;  ///< new memory (the IOVA becomes its address)
  const ProtectionDomain *pd = nullptr; ///< new protection domain
  maybe<access_flags> access;   ///< new access rights

  /// Both sets of changes; where both name a field, the right-hand one wins.
  friend rereg_changes operator|(rereg_changes a, const rereg_changes &b) noexcept {
    if (b.translation) a.translation = b.translation;
    if (b.pd) a.pd = b.pd;
    if (b.access) a.access = b.access;
    return a;
  }
};
/// A change of translation: the region is to cover [addr, addr+length), with IOVA = addr
/// (IBV_REREG_MR_CHANGE_TRANSLATION).
/// \mallocs None.
[[nodiscard]] inline rereg_changes change_translation(void *addr, std::size_t length) noexcept {
  rereg_changes c;
  c.translation = mr_range{addr, length};
  return c;
}
/// A change of protection domain to `pd` (IBV_REREG_MR_CHANGE_PD); `pd` must outlive the rereg()
/// call.
/// \mallocs None.
[[nodiscard]] inline rereg_changes change_pd(const ProtectionDomain &pd) noexcept {
  rereg_changes c;
  c.pd = &pd;
  return c;
}
/// A change of access rights to `a` (IBV_REREG_MR_CHANGE_ACCESS).
/// \mallocs None.
[[nodiscard]] inline rereg_changes change_access(access_flags a) noexcept {
  rereg_changes c;
  c.access = a;
  return c;
}

/// What a successful rereg did. Keys may change on either path (always on replacement): re-read
/// lkey()/rkey() and hand peers the new rkey.
struct rereg_info {
  /// How the change was carried out.
  rereg_path path;
  /// True when lkey() or rkey() differ from before (always on the replacement path).
  bool keys_changed;
};

/// A registered memory region (ibv_reg_mr(3)): memory the device may access through lkey() and,
/// with remote rights, rkey(). Move-only, null after move; ibv_dereg_mr on destruction (withheld
/// and reported while memory windows are bound to it), then munmap of allocate()'s memory.
class MemoryRegion {
public:
  /// An empty (null) region.
  MemoryRegion() noexcept = default;
  /// Takes over `o`'s registration (and owned memory); `o` is left null.
  MemoryRegion(MemoryRegion &&) noexcept = default;
  /// ibv_dereg_mr (withheld while windows or keys use the region: then deferred to the last of
  /// them), then munmap of allocate()'s memory, after the deregistration even when deferred.
  ~MemoryRegion() {
    if (h_) h_.reset(pages_.hand_over());
  }
  /// Deregisters the region this one held (then unmaps its memory), takes over `o`'s.
  /// Swap-based so that the old registration is destroyed in the right order (dereg, then unmap).
  MemoryRegion &operator=(MemoryRegion &&o) noexcept {
    MemoryRegion tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  /// Exchange the registrations (with their owned memory, state and keys) of two regions.
  void swap(MemoryRegion &o) noexcept {
    std::swap(pages_, o.pages_);
    h_.swap(o.h_);
    std::swap(iova_, o.iova_);
    std::swap(access_, o.access_);
    std::swap(kind_, o.kind_);
    std::swap(state_, o.state_);
    std::swap(native_unsupported_, o.native_unsupported_);
  }

  /// ibv_reg_mr(3) over [addr, addr+length) with IOVA = addr. Malformed arguments are refused
  /// before verbs is called, the same way with or without a PD.
  /// \errors
  /// - errc::null_address: `addr` is null.
  /// - errc::zero_length: `length` is 0.
  /// - errc::out_of_range: [addr, addr+length) wraps the address space.
  /// - the check_access() codes: `acc` breaks the rule of ibv_reg_mr(3) or has an unknown bit.
  /// - errc::null_handle: `pd` is null.
  /// - ENOMEM: no memory for the node that counts the MR's windows.
  /// - errc::unsupported: access::on_demand on a device without ODP (which some kernels answer
  ///   with EINVAL).
  /// - the errno of ibv_reg_mr: EINVAL, ENOMEM (memlock limit), EFAULT, EOPNOTSUPP (unsupported
  ///   bits).
  /// \mallocs One node that counts the memory windows bound to the MR (new(nothrow)), besides
  /// what verbs allocates.
  [[nodiscard]] static result<MemoryRegion> reg(const ProtectionDomain &pd, void *addr,
                                                std::size_t length, access_flags acc) noexcept {
    return reg_impl(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), acc, mr_kind::user);
  }
  /// ibv_reg_mr_iova2: the region is addressed through `iova` (local SGEs and remote accesses both
  /// use IOVA addresses). The kernel requires iova and addr to share their offset within a page.
  /// \errors
  /// - those of reg().
  /// - errc::out_of_range: also when [iova, iova+length) wraps (rxe would register it).
  /// - errc::iova_page_offset_mismatch: `iova` and `addr` differ in their offset within a page.
  /// \mallocs As reg().
  [[nodiscard]] static result<MemoryRegion> reg_iova(const ProtectionDomain &pd, void *addr,
                                                     std::size_t length, std::uint64_t iova,
                                                     access_flags acc) noexcept {
    if (auto ec = check_reg_args(addr, length, acc)) return ec;
    if (length - 1 > UINT64_MAX - iova) return make_error_code(errc::out_of_range);
    const auto page = std::uint64_t(::sysconf(_SC_PAGESIZE));
    if ((iova ^ reinterpret_cast<std::uintptr_t>(addr)) & (page - 1))
      return make_error_code(errc::iova_page_offset_mismatch);
    return reg_impl(pd, addr, length, iova, acc, mr_kind::iova);
  }
  /// Allocate page-aligned memory (2 MiB huge pages when `length` is a multiple of 2 MiB and huge
  /// pages are reserved, normal pages otherwise) and register it (ibv_reg_mr(3)); the successor
  /// of MLNX_OFED's IBV_EXP_ACCESS_ALLOCATE_MR. The memory is zeroed, owned, and unmapped after
  /// deregistration.
  /// \errors
  /// - errc::zero_length: `length` is 0.
  /// - the check_access() codes.
  /// - errc::null_handle: `pd` is null.
  /// - the errno of mmap (ENOMEM, also for a length no mapping can have).
  /// - those of reg() for the registration.
  /// \mallocs The mapping of the memory (mmap of `length` rounded up to pages) and the node of
  /// reg(), besides what verbs allocates.
  [[nodiscard]] static result<MemoryRegion> allocate(const ProtectionDomain &pd, std::size_t length,
                                                     access_flags acc) noexcept {
    if (length == 0) return make_error_code(errc::zero_length);
    if (auto ec = check_access(acc)) return ec;
    if (!pd) return make_error_code(errc::null_handle);
    detail::owned_pages pages;
    if (auto ec = pages.map(length)) return ec;
    void *p = pages.data();
    RDMAXX_TRY(mr, reg_impl(pd, p, length, reinterpret_cast<std::uintptr_t>(p), acc,
                                 mr_kind::allocated));
    mr.pages_ = std::move(pages);
    return std::move(mr);
  }

  // ---- accessors: inline, no checks (an empty handle gives zeros) ----
  /// The ibv_mr (owned: do not deregister it), or nullptr.
  [[nodiscard]] ibv_mr *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed, moved from or deregistered); see state() and usable().
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The local key (for SGEs), or 0 when null.
  [[nodiscard]] std::uint32_t lkey() const noexcept { return h_ ? h_.get()->lkey : 0; }
  /// The remote key peers use, or 0 when null.
  /// 0 on rxe when the MR has no remote access.
  [[nodiscard]] std::uint32_t rkey() const noexcept { return h_ ? h_.get()->rkey : 0; }
  /// The process address of the first byte.
  [[nodiscard]] void *address() const noexcept { return h_ ? h_.get()->addr : nullptr; }
  /// address() as std::byte *.
  [[nodiscard]] std::byte *data() const noexcept { return static_cast<std::byte *>(address()); }
  /// The address the device uses for this region (SGEs and remote accesses).
  [[nodiscard]] std::uint64_t iova() const noexcept { return iova_; }
  /// Bytes registered, or 0 when null.
  [[nodiscard]] std::size_t length() const noexcept { return h_ ? h_.get()->length : 0; }
  /// The access rights registered (as updated by rereg()).
  [[nodiscard]] access_flags access() const noexcept { return access_; }
  /// The PD the region is registered on, or nullptr when null.
  [[nodiscard]] ibv_pd *pd() const noexcept { return h_ ? h_.get()->pd : nullptr; }
  /// How the memory came to be (a translation change by rereg() makes it mr_kind::user).
  [[nodiscard]] mr_kind kind() const noexcept { return kind_; }
  /// mr_state::unusable once a failed re-registration left the region unusable.
  [[nodiscard]] mr_state state() const noexcept { return state_; }
  /// True when allocate() got huge pages.
  [[nodiscard]] bool huge_pages() const noexcept { return pages_.huge(); }

  /// A local SGE for [offset, offset+length) of this region. Unchecked (fast path): use slice()
  /// for a checked one.
  [[nodiscard]] ibv_sge sge(std::size_t offset, std::uint32_t length) const noexcept {
    return {iova_ + offset, length, h_.get()->lkey};
  }
  /// A local SGE for the whole region. Unchecked (the region must be non-null; the length is
  /// truncated to 32 bits): use slice() for a checked one.
  [[nodiscard]] ibv_sge sge() const noexcept { return sge(0, std::uint32_t(length())); }
  /// A checked local SGE for [offset, offset+length) of this region.
  /// \errors
  /// - errc::null_handle, errc::unusable: see usable().
  /// - errc::zero_length: `length` is 0.
  /// - errc::out_of_range: the range does not lie within the region, or `length` does not fit
  ///   32 bits.
  /// \mallocs None.
  [[nodiscard]] result<ibv_sge> slice(std::size_t offset, std::size_t length) const noexcept {
    if (auto ec = usable()) return ec;
    if (length == 0) return make_error_code(errc::zero_length);
    if (offset > this->length() || length > this->length() - offset || length > UINT32_MAX)
      return make_error_code(errc::out_of_range);
    return sge(offset, std::uint32_t(length));
  }

  /// Deregister now (ibv_dereg_mr(3)), then unmap allocate()'s memory, and report the outcome; on
  /// failure the MR stays registered and in the handle. A null MR: success, nothing is called.
  /// The destructor does the same and reports a failure through the hook.
  /// \errors
  /// - errc::region_granted: a grant reaches the MR's memory (live_grants()) and no window is
  ///   bound to it; nothing is called.
  ///   (The destructor defers the deregistration, and an allocate()d region's unmapping, to the
  ///   last grant's destruction, and reports it through the destroy-failure hook.)
  /// - errc::busy: memory windows are bound to the MR; nothing is called (rxe would answer
  ///   EINVAL).
  /// - the errno of ibv_dereg_mr.
  /// \mallocs None.
  result<void> destroy() noexcept {
    if (bound_windows() == 0 && live_grants() != 0) return make_error_code(errc::region_granted);
    RDMAXX_TRYV(h_.destroy());
    pages_ = {};
    return success();
  }
  /// The former name of destroy().
  [[deprecated("use destroy()")]] result<void> dereg() noexcept { return destroy(); }

  /// Re-register: change the translation, the PD, the access rights, or any combination, keeping
  /// this handle (ibv_rereg_mr(3), or a make-before-break replacement; see rereg_policy). Keys
  /// may change on either path: re-read lkey()/rkey() (rereg_info::keys_changed says whether).
  /// \errors
  /// - Refused before verbs, the MR unchanged:
  ///   - errc::null_handle, errc::unusable: see usable().
  ///   - errc::null_address, errc::zero_length, errc::out_of_range: the new translation is null,
  ///     empty, or wraps the address space.
  ///   - errc::wrong_type: a translation change of an allocate()d MR (it owns its memory; allocate
  ///     a new MR instead).
  ///   - errc::null_handle: the new PD is null; errc::pd_mismatch: it is of another device.
  ///   - the check_access() codes: the new access rights.
  ///   - errc::nothing_to_change: no field given, or each equals the current value.
  ///   - errc::region_granted: a translation or PD change while a grant reaches the MR
  ///     (live_grants()): the grant's key would stay on the old memory. Also any change while an
  ///     IndirectKey names the MR (its key refers to this registration). An access change alone
  ///     is allowed under ExactGrant, StrictGrant and GrantPool: their regions are their own.
  ///   - errc::busy: memory windows are bound to the MR (checked before the grants).
  /// - Native path (ibv_rereg_mr): a rereg_category() code whose rereg_state_of() says what is
  ///   left:
  ///   - rereg_state::old_valid (-1, -2): nothing changed.
  ///   - rereg_state::new_valid (-3): the change is in place, fields refreshed.
  ///   - rereg_state::unusable (-4, -5): only destruction is allowed; the destructor still
  ///     deregisters.
  ///   - errc::unsupported: -4 with EOPNOTSUPP (no rereg in the provider) under
  ///     rereg_policy::native_only; nothing changed. native_with_fallback goes on with the
  ///     replacement instead (and skips the native attempt on later calls).
  /// - Replacement path (make-before-break), the old MR still registered and in the handle:
  ///   - rereg_error(old_valid, 0, errno): the new registration failed, or the old one could not
  ///     be deregistered (EBUSY).
  ///   - errc::unsupported: access::on_demand on a device without ODP.
  /// \mallocs None, besides what verbs allocates; the replacement costs exactly one ibv_reg_mr
  /// and one ibv_dereg_mr.
  result<rereg_info> rereg(const rereg_changes &c,
                           rereg_policy policy = rereg_policy::native_with_fallback) noexcept;

  /// ibv_rereg_mr exactly as given (flags, pd, addr, length, access), with no argument checks,
  /// and the return-code table applied to this MR. For tests that need the verb's own answers to
  /// bad input; use rereg().
  /// \errors
  /// - errc::null_handle, errc::unusable: see usable().
  /// - those of rereg()'s native path; errc::unsupported for -4/EOPNOTSUPP.
  /// \mallocs None, besides what verbs allocates.
  result<rereg_info> rereg_native_unchecked(int flags, const ProtectionDomain *pd, void *addr,
                                            std::size_t length, int access) noexcept {
    if (auto ec = usable()) return ec;
    return rereg_native_call(flags, pd, addr, length, access);
  }

  /// Memory windows bound (or with a bind in flight) to this MR (memory_window.hpp).
  [[nodiscard]] std::uint32_t bound_windows() const noexcept {
    return h_.live_children(child_kind::memory_window);
  }
  /// Live grants that reach this MR's memory: ExactGrants and StrictGrants made from it, GrantPools
  /// over it, IndirectKeys whose layout names it. While any lives, rereg() of the translation or
  /// PD and destroy() answer errc::region_granted: the memory must outlive its grants.
  [[nodiscard]] std::uint32_t live_grants() const noexcept {
    return h_.live_children(child_kind::exact_grant) + h_.live_children(child_kind::strict_grant) +
           h_.live_children(child_kind::grant_pool) + h_.live_children(child_kind::indirect_key);
  }

  /// Whether the MR can be used: an empty error_code when it can.
  /// \errors
  /// - errc::null_handle: the MR is null (default-constructed, moved from or deregistered).
  /// - errc::unusable: a failed re-registration left it unusable; only destruction is allowed.
  /// \mallocs None.
  [[nodiscard]] std::error_code usable() const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (state_ == mr_state::unusable) return make_error_code(errc::unusable);
    return {};
  }

private:
  using traits = detail::deleter<ibv_mr, ::ibv_dereg_mr, "MemoryRegion", "ibv_dereg_mr">;

  // ibv_rereg_mr with exactly these arguments, then the return-code table applied to this MR.
  result<rereg_info> rereg_native_call(int flags, const ProtectionDomain *pd, void *addr,
                                       std::size_t length, int access) noexcept;

  // Make-before-break: the new registration exists before the old one goes, and any failure
  // leaves the old one registered and in the handle.
  result<rereg_info> rereg_replace(int flags, const ProtectionDomain *pd, mr_range to,
                                   access_flags acc) noexcept;

  // True when the last byte of [addr, addr+length) lies beyond the address space (length > 0).
  [[nodiscard]] static bool wraps(const void *addr, std::size_t length) noexcept {
    return length - 1 > UINTPTR_MAX - reinterpret_cast<std::uintptr_t>(addr);
  }

  [[nodiscard]] static std::error_code check_reg_args(const void *addr, std::size_t length,
                                                      access_flags acc) noexcept {
    if (!addr) return make_error_code(errc::null_address);
    if (length == 0) return make_error_code(errc::zero_length);
    if (wraps(addr, length)) return make_error_code(errc::out_of_range);
    return check_access(acc);
  }

  // After a failed registration: was it access::on_demand on a device without ODP? Kernels before
  // 6.3 answer that with EINVAL, not EOPNOTSUPP. Cold: only on failure.
  [[gnu::cold]] static bool odp_unsupported(ibv_context *ctx, access_flags acc) noexcept {
    if (!acc.any(access::on_demand)) return false;
    ibv_device_attr_ex ax{};
    return ::ibv_query_device_ex(ctx, nullptr, &ax) == 0 &&
           !(ax.odp_caps.general_caps & IBV_ODP_SUPPORT);
  }

  [[nodiscard]] static result<MemoryRegion> reg_impl(const ProtectionDomain &pd, void *addr,
                                                     std::size_t length, std::uint64_t iova,
                                                     access_flags acc, mr_kind kind) noexcept {
    // Arguments first, so that every malformed call is refused the same way with or without a PD.
    if (auto ec = check_reg_args(addr, length, acc)) return ec;
    if (!pd) return make_error_code(errc::null_handle);
    return reg_on(detail::handle_access::node(pd), pd.native_handle(), addr, length, iova, acc, kind);
  }
  // ibv_reg_mr_iova2 on a PD known by its C object and children counter, arguments checked
  // (an IndirectKey registers its exact regions without holding the ProtectionDomain).
  [[nodiscard]] static result<MemoryRegion> reg_on(detail::parent_node *pd_node, ibv_pd *pd, void *addr,
                                                   std::size_t length, std::uint64_t iova,
                                                   access_flags acc, mr_kind kind) noexcept {
    // The node counts memory windows bound to this MR (destroy() refuses with errc::busy meanwhile).
    MemoryRegion r;
    if (auto ec = detail::create_with_node(r.h_, pd_node, [&] {
          return ::ibv_reg_mr_iova2(pd, addr, length, iova, int(acc.native()));
        })) {
      if (odp_unsupported(pd->context, acc)) return make_error_code(errc::unsupported);
      return ec;
    }
    r.iova_ = iova;
    r.access_ = acc;
    r.kind_ = kind;
    return r;
  }


  // Declaration order matters: pages_ is destroyed after h_ (dereg before munmap).
  detail::owned_pages pages_;
  friend struct detail::handle_access; // children register with this object's node
  friend struct detail::mr_access;     // reg_on, for the types built on regions
  detail::handle<traits> h_;
  std::uint64_t iova_ = 0;
  access_flags access_;
  mr_kind kind_ = mr_kind::user;
  mr_state state_ = mr_state::valid;
  bool native_unsupported_ = false; // learned from -4/EOPNOTSUPP: skip the native attempt
};

namespace detail {
/// What the types built on MemoryRegion reach of it, instead of being its friends: registration on
/// a PD known only by its C object and children counter (detail::grant_slot, for an IndirectKey
/// segment's exact region: the key holds no ProtectionDomain).
struct mr_access {
  /// ibv_reg_mr_iova2 of [addr, addr + length) at `iova` on `pd`, a child of `pd_node`.
  [[nodiscard]] static result<MemoryRegion> reg_on(parent_node *pd_node, ibv_pd *pd, void *addr,
                                                   std::size_t length, std::uint64_t iova, access_flags acc,
                                                   mr_kind kind) noexcept {
    return MemoryRegion::reg_on(pd_node, pd, addr, length, iova, acc, kind);
  }
  /// The argument checks of MemoryRegion::reg (null address, zero length, a wrapping range, the
  /// access rules), for a caller that registers through reg_on.
  [[nodiscard]] static std::error_code check_reg_args(const void *addr, std::size_t length,
                                                      access_flags acc) noexcept {
    return MemoryRegion::check_reg_args(addr, length, acc);
  }
};
} // namespace detail

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/memory_region.ipp"
