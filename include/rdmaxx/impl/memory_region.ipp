/// \file
/// rdmaxx/impl/memory_region.ipp: the longer bodies of memory_region.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of memory_region.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

inline result<rereg_info> MemoryRegion::rereg(const rereg_changes &c,
                         rereg_policy policy) noexcept {
  if (auto ec = usable()) return ec;
  ibv_mr *mr = h_.get();
  int flags = 0;
  if (c.translation && (c.translation->addr != mr->addr || c.translation->length != mr->length ||
                        kind_ == mr_kind::iova)) {
    if (!c.translation->addr) return make_error_code(errc::null_address);
    if (c.translation->length == 0) return make_error_code(errc::zero_length);
    if (wraps(c.translation->addr, c.translation->length)) return make_error_code(errc::out_of_range);
    if (kind_ == mr_kind::allocated) return make_error_code(errc::wrong_type);
    flags |= IBV_REREG_MR_CHANGE_TRANSLATION;
  }
  if (c.pd && c.pd->native_handle() != mr->pd) {
    if (!*c.pd) return make_error_code(errc::null_handle);
    if (c.pd->context() != mr->context) return make_error_code(errc::pd_mismatch);
    flags |= IBV_REREG_MR_CHANGE_PD;
  }
  if (c.access && *c.access != access_) {
    if (auto ec = check_access(*c.access)) return ec;
    flags |= IBV_REREG_MR_CHANGE_ACCESS;
  }
  if (flags == 0) return make_error_code(errc::nothing_to_change);
  // Grants made from this MR reach its memory: moving it (or its PD) would leave their keys on
  // the old memory. An IndirectKey and a bound window refer to this registration itself.
  if (const std::uint32_t kids = h_.live_children(); kids != 0) {
    const std::uint32_t grants = live_grants();
    const bool moves = flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD);
    if (kids != grants) return make_error_code(errc::busy); // windows (or another child)
    if (moves || h_.live_children(child_kind::indirect_key) != 0) return make_error_code(errc::region_granted);
  }

  const mr_range to = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) ? *c.translation
                                                                : mr_range{mr->addr, mr->length};
  const ProtectionDomain *pd = (flags & IBV_REREG_MR_CHANGE_PD) ? c.pd : nullptr;
  const access_flags acc = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? *c.access : access_;

  if (policy != rereg_policy::replacement_only) {
    if (native_unsupported_) {
      if (policy == rereg_policy::native_only) return make_error_code(errc::unsupported);
    } else {
      const bool tr = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
      auto r = rereg_native_call(flags, pd, tr ? to.addr : nullptr, tr ? to.length : 0,
                                 (flags & IBV_REREG_MR_CHANGE_ACCESS) ? int(acc.native()) : 0);
      // Only "no rereg in this provider" falls through to the replacement.
      if (r || policy == rereg_policy::native_only || !native_unsupported_) return r;
    }
  }
  return rereg_replace(flags, pd, to, acc);
}

inline result<rereg_info> MemoryRegion::rereg_native_call(int flags, const ProtectionDomain *pd, void *addr,
                                     std::size_t length, int access) noexcept {
  ibv_mr *mr = h_.get();
  const std::uint32_t lkey = mr->lkey, rkey = mr->rkey;
  errno = 0;
  const int rc = detail::call_rereg_mr(mr, flags, pd ? pd->native_handle() : nullptr, addr,
                                       length, access);
  const int err = errno;
  const auto outcome = detail::classify_rereg(rc, err);
  if (rc != 0 && outcome.unsupported) {
    native_unsupported_ = true;
    return make_error_code(errc::unsupported);
  }
  if (rc == 0 || outcome.state == rereg_state::new_valid) {
    // ibv_rereg_mr updated addr, length, pd and the keys in the ibv_mr; refresh the rest.
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
      iova_ = reinterpret_cast<std::uintptr_t>(mr->addr);
      kind_ = mr_kind::user;
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) h_.set_parent(detail::handle_access::node(*pd));
    if (flags & IBV_REREG_MR_CHANGE_ACCESS) access_ = access_flags(unsigned(access));
  }
  if (rc == 0) return rereg_info{rereg_path::native, mr->lkey != lkey || mr->rkey != rkey};
  if (outcome.state == rereg_state::unusable) state_ = mr_state::unusable;
  return rereg_error(outcome.state, rc, err);
}

inline result<rereg_info> MemoryRegion::rereg_replace(int flags, const ProtectionDomain *pd, mr_range to,
                                 access_flags acc) noexcept {
  ibv_mr *old = h_.get();
  const std::uint64_t iova = (flags & IBV_REREG_MR_CHANGE_TRANSLATION)
                                 ? reinterpret_cast<std::uintptr_t>(to.addr)
                                 : iova_;
  ibv_mr *fresh = ::ibv_reg_mr_iova2(pd ? pd->native_handle() : old->pd, to.addr, to.length,
                                     iova, int(acc.native()));
  if (!fresh) {
    const int err = errno;
    if (odp_unsupported(old->context, acc)) return make_error_code(errc::unsupported);
    return rereg_error(rereg_state::old_valid, 0, err);
  }
  if (const int rc = ::ibv_dereg_mr(old)) {
    // The old MR is still in use (e.g. memory windows bound to it): keep it, drop the new one.
    ::ibv_dereg_mr(fresh);
    return rereg_error(rereg_state::old_valid, 0, rc == EINVAL ? EBUSY : rc);
  }
  h_.replace(fresh);
  if (pd) h_.set_parent(detail::handle_access::node(*pd));
  iova_ = iova;
  access_ = acc;
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) kind_ = mr_kind::user;
  return rereg_info{rereg_path::replacement, true};
}

} // namespace rdmaxx
