/// \file
/// rdmaxx/detail/grant_slot.hpp: one grant slot, the mechanism StrictGrant (one slot) and GrantPool
/// (an array of slots) share: a region of exactly the granted bytes, a window over all of it, and
/// the count of keys the window has taken, so that the window is renewed before its 8-bit key
/// could repeat and no revoked key ever answers again, however often the slot is reused.
#pragma once

#include "../access.hpp"
#include "../error.hpp"
#include "../memory_region.hpp"
#include "../memory_window.hpp"
#include "../protection_domain.hpp"
#include "../queue_pair.hpp"
#include "../remote_descriptor.hpp"

#include <cstddef>
#include <cstdint>

namespace rdmaxx::detail {

struct grant_slot {
  /// What a GrantPool does with the slot (StrictGrant leaves it free).
  enum class use : std::uint8_t { free, leased, dropped, retired };

  /// Keys one window takes before it is replaced: only the low 8 bits of a window's key change
  /// from bind to bind, so after 256 changes an old key would come back and a very late access
  /// could reach a later grant's bytes. Each grant takes one key (and a type-1 unbind another).
  static constexpr std::uint32_t max_key_changes = 255;

  MemoryRegion region; // declared first: destroyed after the window
  MemoryWindow window;
  std::byte *data = nullptr;
  std::uint32_t key_changes = 0; // since the window was allocated (binds, type-1 unbinds)
  use in_use = use::free;

  /// The exact region (ibv_reg_mr of [data, data + length) on `pd`, with `region_access`) and a
  /// window of `type` on it (ibv_alloc_mw). The caller checked that type 2 may be allocated.
  [[nodiscard]] static result<grant_slot> make(const ProtectionDomain &pd, std::byte *data,
                                               std::size_t length, access_flags region_access,
                                               mw_type type) noexcept {
    if (!pd) return make_error_code(errc::null_handle);
    return make_on(handle_access::node(pd), pd.native_handle(), data, length, region_access, type);
  }
  /// As make(), on a PD known by its C object and children counter (a GrantPool with lazy slots
  /// makes each at its first lease, holding no ProtectionDomain). Nothing is left allocated on
  /// failure.
  /// \errors the errno of ibv_reg_mr / ibv_alloc_mw.
  [[nodiscard]] static result<grant_slot> make_on(parent_node *pd_node, ibv_pd *pd, std::byte *data,
                                                  std::size_t length, access_flags region_access,
                                                  mw_type type) noexcept {
    if (auto ec = mr_access::check_reg_args(data, length, region_access)) return ec; // as reg()
    grant_slot s;
    RDMAXX_TRY(region, mr_access::reg_on(pd_node, pd, data, length, reinterpret_cast<std::uintptr_t>(data),
                                         region_access, mr_kind::user));
    RDMAXX_TRY(window, mw_access::alloc_on(pd_node, pd, type));
    s.region = std::move(region);
    s.window = std::move(window);
    s.data = data;
    return s;
  }
  /// The slot has its exact region and window (a lazy GrantPool slot before its first lease has
  /// only its bytes).
  [[nodiscard]] bool made() const noexcept { return bool(region); }

  // ---- IndirectKey's software backend: one slot per flattened segment ----

  /// The exact region of an indirect key's segment: [bytes, bytes + length) at device address
  /// `iova` (ibv_reg_mr_iova2, so the descriptor keeps the layout's addresses), on the PD known by
  /// its node (the key holds no ProtectionDomain). Replaces the slot's region.
  /// \errors the errno of ibv_reg_mr_iova2.
  [[nodiscard]] result<void> reg_exact(parent_node *pd_node, ibv_pd *pd, std::byte *bytes,
                                       std::size_t length, std::uint64_t iova,
                                       access_flags acc) noexcept {
    RDMAXX_TRY(r, mr_access::reg_on(pd_node, pd, bytes, length, iova, acc, mr_kind::iova));
    region = std::move(r);
    data = bytes;
    return success();
  }
  /// The region still holds exactly these bytes at this address with these rights (an indirect
  /// key reuses it for an unchanged segment instead of registering the bytes again).
  [[nodiscard]] bool holds(const std::byte *bytes, std::size_t length, std::uint64_t iova,
                           access_flags acc) const noexcept {
    return region && data == bytes && region.length() == length && region.iova() == iova &&
           region.access() == acc;
  }
  /// A fresh window of `type` for the slot (the previous one, if any, deallocated first by the
  /// caller).
  /// \errors those of ibv_alloc_mw.
  [[nodiscard]] result<void> alloc_window(parent_node *pd_node, ibv_pd *pd, mw_type type) noexcept {
    RDMAXX_TRY(w, mw_access::alloc_on(pd_node, pd, type));
    window = std::move(w);
    key_changes = 0;
    return success();
  }
  /// Check a bind of the window over a segment, as MemoryWindow::bind checks: over the slot's
  /// exact region when it has one, else over the segment's own region `mr` (type 2; `mr_access`
  /// as the layout's validation checked it).
  [[nodiscard]] std::error_code check_segment(const QueuePair &qp, const ibv_mr *mr,
                                              access_flags mr_access, std::uint32_t length,
                                              access_flags rights) const noexcept {
    if (region)
      return mw_access::check_segment(window, qp, region.native_handle(), region.access(), length, rights);
    return mw_access::check_segment(window, qp, mr, mr_access, length, rights);
  }
  /// Add the checked bind to `batch` (then `addr` is the exact region's iova, which is the
  /// segment's address). No undo entry in the batch: the key has one for all its segments.
  void bind_segment(SendBatch &batch, QueuePair &qp, ibv_mr *mr, parent_node *mr_node,
                    std::uint64_t addr, std::uint32_t length, access_flags rights, wr w) noexcept {
    if (region) {
      mr = region.native_handle();
      mr_node = handle_access::node(region);
    }
    mw_access::bind_segment(window, batch, qp, mr, mr_node, addr, length, rights, w);
    ++key_changes;
  }

  /// Grants left before the window must be renewed.
  [[nodiscard]] static constexpr std::uint32_t grants_per_window(mw_type t) noexcept {
    return t == mw_type::type2 ? max_key_changes : max_key_changes / 2;
  }
  /// The next grant (and its type-1 unbind) could take a key the window already handed out.
  [[nodiscard]] bool keys_used_up() const noexcept { return key_changes + 2 > max_key_changes; }

  /// Replace the window by a fresh one (a new key index) of the same type on the same PD. The new
  /// one is allocated while the old one still holds its index, so the device cannot hand that
  /// index (and so an old key) back. Only for a window with nothing bound or unconfirmed. On
  /// failure the slot keeps its window.
  /// \errors the errno of ibv_alloc_mw / ibv_dealloc_mw.
  [[gnu::cold]] result<void> renew() noexcept {
    ibv_mw *old = window.native_handle();
    RDMAXX_TRY(fresh, mw_access::alloc_on(mw_access::pd_node(window), old->pd, window.type()));
    RDMAXX_TRYV(window.destroy()); // `fresh` is deallocated on this path
    window = std::move(fresh);
    key_changes = 0;
    return success();
  }

  /// Bind the window over the whole exact region, in an open batch of `qp`.
  [[nodiscard]] result<remote_descriptor> bind(SendBatch &batch, QueuePair &qp, access_flags rights,
                                               wr w) noexcept {
    RDMAXX_TRY(d, window.bind(batch, qp, region, {0, region.length()}, rights, w));
    ++key_changes;
    return d;
  }
  /// As above, posted now.
  [[nodiscard]] result<remote_descriptor> bind(QueuePair &qp, access_flags rights, wr w) noexcept {
    RDMAXX_TRY(d, window.bind(qp, region, {0, region.length()}, rights, w));
    ++key_changes;
    return d;
  }
  /// End the grant: type 1 an unbind (which takes a key too), type 2 a local invalidate.
  result<void> unbind(SendBatch &batch, QueuePair &qp, wr w) noexcept {
    if (window.type() == mw_type::type2) return window.invalidate(batch, qp, w);
    RDMAXX_TRYV(window.unbind(batch, qp, w));
    ++key_changes;
    return success();
  }
  /// As above, posted now.
  result<void> unbind(QueuePair &qp, wr w) noexcept {
    if (window.type() == mw_type::type2) return window.invalidate(qp, w);
    RDMAXX_TRYV(window.unbind(qp, w));
    ++key_changes;
    return success();
  }
};

} // namespace rdmaxx::detail
