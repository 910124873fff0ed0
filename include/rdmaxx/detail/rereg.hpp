/// \file
/// rdmaxx/detail/rereg.hpp: the ibv_rereg_mr(3) return-code table, and the fault-injection seam
/// for the codes a test device cannot produce.
///
/// Allocation: none.
#pragma once

#include "atomic.hpp"
#include "../error.hpp"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>

namespace rdmaxx {

/// FAULT INJECTION, for tests only. rxe answers every ibv_rereg_mr with -4/EOPNOTSUPP (or -1 for
/// bad input), so the other rows of the return-code table (-2, -3, -4 with another errno, -5)
/// cannot be produced on it. A test may install a function that is called INSTEAD of
/// ibv_rereg_mr and returns the code (setting errno) it wants to check. nullptr restores the real
/// verb. Never install one in production code.
namespace fault_injection {
/// The signature of ibv_rereg_mr(3).
using rereg_mr_fn = int (*)(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, std::size_t length,
                            int access);
/// The installed substitute (nullptr: the real verb). Install through set_rereg_mr().
inline detail::atomic<rereg_mr_fn> &rereg_mr_override() noexcept {
  static detail::atomic<rereg_mr_fn> fn{nullptr};
  return fn;
}
/// Install (or with nullptr remove) the substitute for ibv_rereg_mr. Returns the previous one.
inline rereg_mr_fn set_rereg_mr(rereg_mr_fn fn) noexcept { return rereg_mr_override().exchange(fn); }
} // namespace fault_injection

namespace detail {

/// ibv_rereg_mr, or the fault-injection substitute when a test installed one.
inline int call_rereg_mr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, std::size_t length,
                         int access) noexcept {
  if (auto fn = fault_injection::rereg_mr_override().load(detail::order::acquire)) [[unlikely]]
    return fn(mr, flags, pd, addr, length, access);
  return ::ibv_rereg_mr(mr, flags, pd, addr, length, access);
}

/// What one ibv_rereg_mr return value means for the MR (ibv_rereg_mr(3)).
struct native_rereg_outcome {
  rereg_state state;      ///< only meaningful when rc != 0
  bool unsupported;       ///< -4 with EOPNOTSUPP (or relative): a provider without rereg, MR unchanged
};
[[nodiscard]] constexpr native_rereg_outcome classify_rereg(int rc, int err) noexcept {
  switch (rc) {
  case 0: return {rereg_state::new_valid, false};
  case IBV_REREG_MR_ERR_INPUT:        // bad input, nothing done
  case IBV_REREG_MR_ERR_DONT_FORK_NEW: // dontfork of the new range failed, nothing done
    return {rereg_state::old_valid, false};
  case IBV_REREG_MR_ERR_DO_FORK_OLD:  // the new registration is in place; fork of old range failed
    return {rereg_state::new_valid, false};
  case IBV_REREG_MR_ERR_CMD:
    // rdma-core's providers without rereg answer -4/EOPNOTSUPP before touching anything; the
    // other "not there" errnos (is_unsupported_errno) are refusals of the same kind.
    if (is_unsupported_errno(err)) return {rereg_state::old_valid, true};
    return {rereg_state::unusable, false};
  case IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW:
  default: // an undocumented code: assume the worst, as ibv_rereg_mr(3)'s "undefined state"
    return {rereg_state::unusable, false};
  }
}

} // namespace detail
} // namespace rdmaxx
