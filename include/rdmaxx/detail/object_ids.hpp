/// \file
/// rdmaxx/detail/object_ids.hpp: the work request ids of the objects that post window and key
/// operations (MemoryWindow, and through it StrictGrant; IndirectKey, software and mlx5).
///
/// Every such object takes its own id when it is created, from one process-wide counter, so that
/// a completion carries the identity of the object that posted it: handed to another object, it
/// changes nothing there. The counter never goes back (2^48 ids: at a million objects a second,
/// nine years), so an id is never handed out twice, and a late completion of a
/// destroyed object meets no later object of the same id (pool_ids, whose 16-bit ids must be
/// reused, hands them out round-robin for the same reason).
#pragma once

#include "atomic.hpp"
#include "../error.hpp"
#include "../work_request.hpp"

#include <cstdint>
#include <system_error>

namespace rdmaxx {

/// The default wr_id of window and key operations: it stands for the posting object's own id
/// (MemoryWindow::wr_id(), IndirectKey::wr_id()), which the object writes into the work request.
/// Pass it, or leave the default, so that completions of two objects sharing a QP can never be
/// taken for one another; pass an id of your own only for your own bookkeeping (it must not carry
/// object_wr_tag, and no other work request of that QP may use it).
inline constexpr std::uint64_t own_wr_id = 0x5244584D57000000ull; // "RDXMW"

/// The top 16 bits of every object's own id ("RX"): keep them out of your own ids (GrantPool's
/// ids carry grant_pool_wr_tag, "RG").
inline constexpr std::uint64_t object_wr_tag = 0x5258ull << 48;

namespace detail {

inline constexpr std::uint64_t wr_tag_mask = 0xFFFFull << 48;

/// The process-wide counter of object ids.
class object_ids {
public:
  /// A new id, never handed out before in this process (object_wr_tag | n, n from 1).
  [[nodiscard]] static std::uint64_t acquire() noexcept {
    const std::uint64_t n = counter().fetch_add(1, detail::order::relaxed) + 1;
    return object_wr_tag | (n & ~wr_tag_mask);
  }

private:
  static detail::atomic<std::uint64_t> &counter() noexcept {
    static detail::atomic<std::uint64_t> c{0};
    return c;
  }
};

/// The id an object posts `w` with: own_wr_id becomes `own`. An id of another object (it carries
/// object_wr_tag and is not `own`) is refused with errc::foreign_wr_id: its completion would be
/// that object's. Any other id is the caller's choice and goes as given.
[[nodiscard]] inline std::error_code resolve_wr(wr &w, std::uint64_t own) noexcept {
  if (w.id == own_wr_id) {
    w.id = own;
    return {};
  }
  if ((w.id & wr_tag_mask) == object_wr_tag && w.id != own) return make_error_code(errc::foreign_wr_id);
  return {};
}

} // namespace detail
} // namespace rdmaxx
