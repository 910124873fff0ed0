// rdmaxx/memory_region.hpp: MemoryRegion (ibv_reg_mr(3), ibv_reg_mr_iova2, allocate-and-register).
//
// Lifetime: borrows its ProtectionDomain (destroy the MR first) and, for reg()/reg_iova(), the
// caller's memory, which must stay mapped until the MR is destroyed. allocate() owns its memory
// and unmaps it after deregistration.
#pragma once

#include "access.hpp"
#include "detail/handle.hpp"
#include "detail/pages.hpp"
#include "error.hpp"
#include "protection_domain.hpp"

#include <cstddef>
#include <cstdint>

namespace rdmaxx {

/// How the memory behind a MemoryRegion came to be.
enum class mr_kind : std::uint8_t {
  user,      ///< reg(): the caller's memory, IOVA = virtual address
  iova,      ///< reg_iova(): the caller's memory at a caller-chosen IOVA
  allocated, ///< allocate(): memory owned by the MemoryRegion
};

/// Whether a MemoryRegion can be used. Only a failed re-registration makes it unusable.
enum class mr_state : std::uint8_t { valid, unusable };

class MemoryRegion {
public:
  MemoryRegion() noexcept = default;
  MemoryRegion(MemoryRegion &&) noexcept = default;
  // Swap-based so that the old registration is destroyed in the right order (dereg, then unmap).
  MemoryRegion &operator=(MemoryRegion &&o) noexcept {
    MemoryRegion tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  void swap(MemoryRegion &o) noexcept {
    std::swap(pages_, o.pages_);
    h_.swap(o.h_);
    std::swap(iova_, o.iova_);
    std::swap(access_, o.access_);
    std::swap(kind_, o.kind_);
    std::swap(state_, o.state_);
  }

  /// ibv_reg_mr over [addr, addr+length) with IOVA = addr. The access rule (remote write/atomic
  /// need local write), a null address and a zero length are refused before verbs is called.
  /// Errors: errc::null_handle, errc::null_address, errc::zero_length, the check_access codes,
  /// errno of ibv_reg_mr (EINVAL, ENOMEM: memlock limit, EFAULT, EOPNOTSUPP for unsupported bits).
  [[nodiscard]] static result<MemoryRegion> reg(const ProtectionDomain &pd, void *addr,
                                                std::size_t length, access_flags acc) noexcept {
    return reg_impl(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), acc, mr_kind::user);
  }
  /// ibv_reg_mr_iova2: the region is addressed through `iova` (local SGEs and remote accesses both
  /// use IOVA addresses). The kernel requires iova and addr to share their offset within a page.
  /// Errors: as reg(), plus errc::iova_page_offset_mismatch.
  [[nodiscard]] static result<MemoryRegion> reg_iova(const ProtectionDomain &pd, void *addr,
                                                     std::size_t length, std::uint64_t iova,
                                                     access_flags acc) noexcept {
    if (auto ec = check_reg_args(addr, length, acc)) return ec;
    const auto page = std::uint64_t(::sysconf(_SC_PAGESIZE));
    if ((iova ^ reinterpret_cast<std::uintptr_t>(addr)) & (page - 1))
      return make_error_code(errc::iova_page_offset_mismatch);
    return reg_impl(pd, addr, length, iova, acc, mr_kind::iova);
  }
  /// Allocate page-aligned memory (2 MiB huge pages when `length` is a multiple of 2 MiB and huge
  /// pages are reserved, normal pages otherwise) and register it; the successor of the seed's
  /// IBV_ACCESS_ALLOCATE_MR. The memory is zeroed, owned, and unmapped after deregistration.
  /// Errors: as reg(), plus errno of mmap.
  [[nodiscard]] static result<MemoryRegion> allocate(const ProtectionDomain &pd, std::size_t length,
                                                     access_flags acc) noexcept {
    if (length == 0) return make_error_code(errc::zero_length);
    if (auto ec = check_access(acc)) return ec;
    if (!pd) return make_error_code(errc::null_handle);
    RDMAXX_TRY(pages, detail::owned_pages::map(length));
    void *p = pages.data();
    RDMAXX_TRY(mr, reg_impl(pd, p, length, reinterpret_cast<std::uintptr_t>(p), acc,
                                 mr_kind::allocated));
    mr.pages_ = std::move(pages);
    return std::move(mr);
  }

  // ---- accessors: inline, no checks (an empty handle gives zeros) ----
  [[nodiscard]] ibv_mr *native_handle() const noexcept { return h_.get(); }
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  [[nodiscard]] std::uint32_t lkey() const noexcept { return h_ ? h_.get()->lkey : 0; }
  /// 0 on rxe when the MR has no remote access.
  [[nodiscard]] std::uint32_t rkey() const noexcept { return h_ ? h_.get()->rkey : 0; }
  /// The process address of the first byte.
  [[nodiscard]] void *address() const noexcept { return h_ ? h_.get()->addr : nullptr; }
  [[nodiscard]] std::byte *data() const noexcept { return static_cast<std::byte *>(address()); }
  /// The address the device uses for this region (SGEs and remote accesses).
  [[nodiscard]] std::uint64_t iova() const noexcept { return iova_; }
  [[nodiscard]] std::size_t length() const noexcept { return h_ ? h_.get()->length : 0; }
  [[nodiscard]] access_flags access() const noexcept { return access_; }
  [[nodiscard]] ibv_pd *pd() const noexcept { return h_ ? h_.get()->pd : nullptr; }
  [[nodiscard]] mr_kind kind() const noexcept { return kind_; }
  [[nodiscard]] mr_state state() const noexcept { return state_; }
  /// True when allocate() got huge pages.
  [[nodiscard]] bool huge_pages() const noexcept { return pages_.huge(); }

  /// A local SGE for [offset, offset+length) of this region. Unchecked (fast path): use slice()
  /// for a checked one.
  [[nodiscard]] ibv_sge sge(std::size_t offset, std::uint32_t length) const noexcept {
    return {iova_ + offset, length, h_.get()->lkey};
  }
  [[nodiscard]] ibv_sge sge() const noexcept { return sge(0, std::uint32_t(length())); }
  /// A checked local SGE. Errors: errc::null_handle, errc::unusable, errc::zero_length,
  /// errc::out_of_range.
  [[nodiscard]] result<ibv_sge> slice(std::size_t offset, std::size_t length) const noexcept {
    if (auto ec = usable()) return ec;
    if (length == 0) return make_error_code(errc::zero_length);
    if (offset > this->length() || length > this->length() - offset || length > UINT32_MAX)
      return make_error_code(errc::out_of_range);
    return sge(offset, std::uint32_t(length));
  }

  /// Deregister now (ibv_dereg_mr) and report the outcome; on failure the MR stays registered and
  /// in the handle. Errors: errno of ibv_dereg_mr (EINVAL on rxe, EBUSY elsewhere, while memory
  /// windows are bound to it). The destructor does the same and reports through the hook.
  result<void> dereg() noexcept {
    RDMAXX_TRYV(h_.destroy());
    pages_ = {};
    return success();
  }

  /// Empty error when the MR can be used; errc::null_handle or errc::unusable otherwise.
  [[nodiscard]] std::error_code usable() const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (state_ == mr_state::unusable) return make_error_code(errc::unusable);
    return {};
  }

private:
  struct traits {
    using native = ibv_mr;
    static constexpr const char *object = "MemoryRegion";
    static constexpr const char *verb = "ibv_dereg_mr";
    static int destroy(native *m) noexcept { return ::ibv_dereg_mr(m); }
  };

  [[nodiscard]] static std::error_code check_reg_args(const void *addr, std::size_t length,
                                                      access_flags acc) noexcept {
    if (!addr) return make_error_code(errc::null_address);
    if (length == 0) return make_error_code(errc::zero_length);
    return check_access(acc);
  }

  [[nodiscard]] static result<MemoryRegion> reg_impl(const ProtectionDomain &pd, void *addr,
                                                     std::size_t length, std::uint64_t iova,
                                                     access_flags acc, mr_kind kind) noexcept {
    // Arguments first, so that every malformed call is refused the same way with or without a PD.
    if (auto ec = check_reg_args(addr, length, acc)) return ec;
    if (!pd) return make_error_code(errc::null_handle);
    ibv_mr *mr = ::ibv_reg_mr_iova2(pd.native_handle(), addr, length, iova, int(acc.native()));
    if (!mr) return last_errno();
    MemoryRegion r;
    r.h_ = detail::handle<traits>(mr, pd.node(), nullptr);
    r.iova_ = iova;
    r.access_ = acc;
    r.kind_ = kind;
    return r;
  }

  friend class MemoryWindow;
  friend class IndirectKey;
  friend struct detail_rereg_access;

  // Declaration order matters: pages_ is destroyed after h_ (dereg before munmap).
  detail::owned_pages pages_;
  detail::handle<traits> h_;
  std::uint64_t iova_ = 0;
  access_flags access_;
  mr_kind kind_ = mr_kind::user;
  mr_state state_ = mr_state::valid;
};

} // namespace rdmaxx
