/// \file
/// rdmaxx/impl/protection_domain.ipp: the bodies of ProtectionDomain that need Context complete.
/// Included by device.hpp after Context (and protection_domain.hpp) are declared; never alone.
#pragma once

#include "../device.hpp"
#include "../protection_domain.hpp"

namespace rdmaxx {

inline result<ProtectionDomain> ProtectionDomain::alloc(const Context &ctx) noexcept {
  if (!ctx) return make_error_code(errc::null_handle);
  ProtectionDomain r;
  if (auto ec = detail::create_with_node(r.h_, detail::handle_access::node(ctx), [&] {
        return ::ibv_alloc_pd(ctx.native_handle());
      }))
    return ec;
  return r;
}

} // namespace rdmaxx
