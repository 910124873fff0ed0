/// \file
/// rdmaxx/impl/exact_grant.ipp: the longer bodies of exact_grant.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of exact_grant.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<ExactGrant> ExactGrant::create(const ProtectionDomain &pd, const MemoryRegion &mr,
                                               window_range r, access_flags rights) noexcept {
  constexpr access_flags remote = access::remote_read | access::remote_write | access::remote_atomic;
  if (!pd) return make_error_code(errc::null_handle);
  if (auto ec = mr.usable()) return ec;
  if (mr.native_handle()->context != pd.context()) return make_error_code(errc::context_mismatch);
  if (r.length == 0) return make_error_code(errc::zero_length);
  if (r.offset > mr.length() || r.length > mr.length() - r.offset)
    return make_error_code(errc::out_of_range);
  if (rights.empty() || (rights & remote) != rights) return make_error_code(errc::bad_grant_rights);
  const bool writes = rights.any(access::remote_write | access::remote_atomic);
  if (writes && !mr.access().any(access::local_write)) return make_error_code(errc::missing_access);
  ExactGrant g;
  RDMAXX_TRY(region, MemoryRegion::reg(pd, mr.data() + r.offset, std::size_t(r.length),
                                       rights | (writes ? access::local_write : access_flags{})));
  g.source_ = detail::child_link(detail::handle_access::node(mr), child_kind::exact_grant);
  g.region_ = std::move(region);
  g.rights_ = rights;
  return g;
}

} // namespace rdmaxx
