/// \file
/// rdmaxx/access.hpp: memory access rights (enum ibv_access_flags) as a typed bitmask.
///
/// Allocation: none.
#pragma once

#include "detail/flags.hpp"
#include "error.hpp"

#include <infiniband/verbs.h>

namespace rdmaxx {

/// One access right; the values are the IBV_ACCESS_* constants.
enum class access : unsigned {
  local_write = IBV_ACCESS_LOCAL_WRITE,
  remote_write = IBV_ACCESS_REMOTE_WRITE,
  remote_read = IBV_ACCESS_REMOTE_READ,
  remote_atomic = IBV_ACCESS_REMOTE_ATOMIC,
  mw_bind = IBV_ACCESS_MW_BIND,
  zero_based = IBV_ACCESS_ZERO_BASED,
  on_demand = IBV_ACCESS_ON_DEMAND,
  hugetlb = IBV_ACCESS_HUGETLB,
  relaxed_ordering = IBV_ACCESS_RELAXED_ORDERING,
};
RDMAXX_FLAGS_OPERATORS(access)
/// A set of access rights; native() is the IBV_ACCESS_* mask.
using access_flags = flags<access>;

/// Every access right this library knows; check_access() refuses any other bit.
inline constexpr access_flags all_known_access =
    access::local_write | access::remote_write | access::remote_read | access::remote_atomic |
    access::mw_bind | access::zero_based | access::on_demand | access::hugetlb |
    access::relaxed_ordering;

/// The rule of ibv_reg_mr(3): remote write and remote atomic require local write; unknown bits
/// are refused. Checked by every call that registers or re-registers, before verbs is called.
/// Returns an empty error_code when `a` is a valid combination.
/// \errors
/// - errc::unknown_access_flag: a bit outside all_known_access.
/// - errc::remote_write_needs_local_write: access::remote_write without access::local_write.
/// - errc::remote_atomic_needs_local_write: access::remote_atomic without access::local_write.
/// \mallocs None.
[[nodiscard]] inline std::error_code check_access(access_flags a) noexcept {
  if (!a.subset_of(all_known_access)) return make_error_code(errc::unknown_access_flag);
  if (a.any(access::remote_write) && !a.any(access::local_write))
    return make_error_code(errc::remote_write_needs_local_write);
  if (a.any(access::remote_atomic) && !a.any(access::local_write))
    return make_error_code(errc::remote_atomic_needs_local_write);
  return {};
}

} // namespace rdmaxx
