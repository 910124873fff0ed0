/// \file
/// rdmaxx/mlx5/indirect_key_mlx5.hpp: the mlx5dv backend of IndirectKey (hardware UMR).
///
/// Compiled only when rdmaxx is built with the mlx5 option (RDMAXX_HAVE_MLX5 == 1). Compiled and
/// contract-tested against rdma-core 44 (providers/mlx5 of tag v44.0), NOT run on hardware: no
/// mlx5 device was available. The functions here take the C structs they post through
/// (ibv_qp_ex, mlx5dv_qp_ex, mlx5dv_mkey), so the contract tests hand them structs whose
/// function pointers record every call and assert exactly what the library gives mlx5dv.
///
/// What mlx5dv requires, and what is checked before anything is posted (v44.0 source lines):
///   - an indirect mkey from mlx5dv_create_mkey (MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, plus
///     _REMOTE_INVALIDATE when peers may invalidate it, verbs.c:6820-6822); the provider rounds
///     max_entries up to a multiple of 4 into a 16-bit field (verbs.c:6802, mlx5.h:896), so
///     65533..65535 would wrap to 0: at most max_mkey_entries (65532); read the value back;
///   - the layout is posted inline (IBV_SEND_INLINE is mandatory, qp.c:2837-2840), so a list
///     holds at most (max_inline_data + 4) / 16 entries and an interleaved one one fewer, and
///     never more than the mkey's entries (qp.c:2999-3011);
///   - list entries: at most 2 GiB each (a KLM's reach: "KLM support only 2GB", qp.c:624-626);
///     rdma-core before 61 sums list lengths into an int (umr_sg_list_create, qp.c:2102 and
///     2115, fixed by e23cb0a72 in v61.0), so a list of 2 GiB or more in total gets a wrong
///     length: refused (errc::provider_limit) unless RDMAXX_MLX5_LIST_TOTAL_FIXED is 1;
///   - interleaved bytes_count and bytes_count + bytes_skip go into 16-bit fields (qp.c:2163-2164);
///   - access flags: local write and remote read / write / atomic only (qp.c:2944-2951);
///   - the QP comes from mlx5::create_umr_qp (mlx5/umr_qp.hpp): any other QP lacks the builders
///     (errc::not_umr_qp); builder errors surface only from ibv_wr_complete;
///   - invalidation is a local invalidate of the mkey (ibv_wr_local_inv).
///
/// Key state follows what the device did, not what was queued: a configure or invalidate added
/// to a batch is unconfirmed until its completion (or a later successful completion of the same
/// send queue) is handed to complete_key(); a batch that is dropped or whose submit() fails is
/// undone with cancel_key(). See key_state.
///
/// Allocation: create_mkey() allocates inside the provider (mlx5dv_create_mkey); nothing else
/// here allocates (post_configure() builds its entry array on the stack).
#pragma once

#if RDMAXX_HAVE_MLX5

#include "../access.hpp"
#include "../error.hpp"
#include "../layout.hpp"
#include "../queue_pair.hpp"
#include "umr_qp.hpp"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>

namespace rdmaxx::mlx5 {

/// The only rights an mlx5 indirect mkey is configured with. Remote atomic stays allowed: UCX
/// checks the HCA cap umr_modify_atomic_disabled before granting atomics through a UMR, but
/// rdma-core 44 puts the atomic bit into the mkey mask of every access-flags setter, atomic
/// asked or not (qp.c:2929-2933), so on such a device every configure would fail at completion
/// (not checked on hardware; the key state then rolls back, see key_state): refusing atomics
/// alone would not help, and the cap is readable only through a DEVX command.
inline constexpr access_flags allowed_access =
    access::local_write | access::remote_read | access::remote_write | access::remote_atomic;

/// What bounds a layout on one QP and mkey.
struct umr_limits {
  std::uint32_t max_inline_data = 0; ///< the UMR QP's granted max_inline_data
  std::uint32_t mkey_max_entries = 0; ///< the mkey's max_entries as read back after creation
};

/// List entries that fit inline: (max_inline_data + sizeof(mlx5_wqe_inl_data_seg)) /
/// sizeof(mlx5_wqe_data_seg) = (max_inline_data + 4) / 16 (qp.c:3004-3006).
[[nodiscard]] constexpr std::uint32_t inline_list_capacity(std::uint32_t max_inline_data) noexcept {
  return (max_inline_data + 4) / 16;
}

/// The layout limits of this backend for `u`. Interleaved: one entry fewer than fit inline
/// (qp.c:3000-3002) and one fewer than the mkey's entries: the repeat block header takes a
/// translation entry of its own (xlat_size = (num_interleaved + 1) * 16, qp.c:2175), which the
/// provider's own check (against num_desc, qp.c:3003) does not count.
[[nodiscard]] constexpr layout_limits limits_for(const umr_limits &u) noexcept {
  const std::uint32_t fit = inline_list_capacity(u.max_inline_data);
  const std::uint32_t cap = std::uint32_t(layout::capacity);
  layout_limits l;
  l.max_entries = std::min({fit, u.mkey_max_entries, cap});
  l.max_repeat_entries = std::min({fit > 0 ? fit - 1 : 0, u.mkey_max_entries > 0 ? u.mkey_max_entries - 1 : 0, cap});
  l.max_segments = UINT32_MAX; // the device resolves the layout: nothing is flattened
  l.interleave_16bit = true;
  l.nested_hardware_only = true;
  l.allowed_access = allowed_access;
  return l;
}

/// The largest max_entries an indirect mkey can be created with: the provider stores
/// align(max_entries, 4) in a uint16_t (verbs.c:6802), so 65533..65535 would become 0.
inline constexpr std::uint32_t max_mkey_entries = 65532;

/// The longest list entry (one KLM): 2 GiB (qp.c:624-626 "KLM support only 2GB"; UCX splits
/// KLM entries at 0x80000000 too).
inline constexpr std::uint64_t max_list_entry_length = std::uint64_t(1) << 31;

#ifndef RDMAXX_MLX5_LIST_TOTAL_FIXED
/// Define as 1 when the mlx5 provider used at run time is rdma-core 61 or newer (commit
/// e23cb0a72: umr_sg_list_create sums lengths into a uint64_t). rdmaxx cannot see the provider
/// loaded at run time, so the rdma-core 44 rule is the default.
#define RDMAXX_MLX5_LIST_TOTAL_FIXED 0
#endif
/// The longest list layout in total: rdma-core before 61 sums the entry lengths into an int
/// (qp.c:2102, 2115) and stores it sign-extended as the mkey length (qp.c:2122, 3036).
inline constexpr std::uint64_t max_list_total =
    RDMAXX_MLX5_LIST_TOTAL_FIXED ? UINT64_MAX : (std::uint64_t(1) << 31) - 1;

/// The provider limits that layout::validate does not know.
/// \errors layout_category() codes naming the entry:
/// - errc::provider_limit: a list entry over max_list_entry_length, or the entry at which a
///   list's running total passes max_list_total.
/// \mallocs None.
[[nodiscard]] inline std::error_code check_provider_limits(const layout &l) noexcept {
  if (l.type() != layout::kind::list) return {};
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    const std::uint64_t len = l[i].length;
    if (len > max_list_entry_length) return layout_error(errc::provider_limit, i);
    total += len; // at most 32 entries of at most 2^31 each: cannot overflow
    if (total > max_list_total) return layout_error(errc::provider_limit, i);
  }
  return {};
}

/// The attributes given to mlx5dv_create_mkey for an indirect mkey of `max_entries` entries;
/// `remote_invalidate` adds MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE (en_rinval,
/// verbs.c:6820-6822), without which a peer's send-with-invalidate naming the key fails.
[[nodiscard]] inline mlx5dv_mkey_init_attr mkey_init_attr(ibv_pd *pd, std::uint16_t max_entries,
                                                          bool remote_invalidate = false) noexcept {
  mlx5dv_mkey_init_attr a{};
  a.pd = pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
                   (remote_invalidate ? unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE) : 0u);
  a.max_entries = max_entries;
  return a;
}

/// mlx5dv_create_mkey (indirect; remote invalidation enabled when `remote_invalidate`). On
/// success `max_entries` holds what the provider granted (it rounds up).
/// \errors
/// - errc::null_handle: `pd` is null.
/// - errc::out_of_range: `max_entries` 0 or above max_mkey_entries.
/// - the errno of mlx5dv_create_mkey (EOPNOTSUPP: no DEVX context, ENOMEM, EINVAL).
/// \mallocs What mlx5dv_create_mkey allocates inside the provider.
[[nodiscard]] inline result<mlx5dv_mkey *> create_mkey(ibv_pd *pd, std::uint32_t &max_entries,
                                                       bool remote_invalidate = false) noexcept {
  if (!pd) return make_error_code(errc::null_handle);
  if (max_entries == 0 || max_entries > max_mkey_entries) return make_error_code(errc::out_of_range);
  mlx5dv_mkey_init_attr a = mkey_init_attr(pd, std::uint16_t(max_entries), remote_invalidate);
  mlx5dv_mkey *k = ::mlx5dv_create_mkey(&a);
  if (!k) return last_errno();
  max_entries = a.max_entries;
  return k;
}

/// Post one mkey-configure work request: mlx5dv_wr_mkey_configure (2 setters),
/// mlx5dv_wr_set_mkey_access_flags(acc), then mlx5dv_wr_set_mkey_layout_list (list layouts, as
/// ibv_sge {iova + offset, length, lkey}) or mlx5dv_wr_set_mkey_layout_interleaved (repeat
/// layouts). wr_flags get IBV_SEND_INLINE. `pd` (may be null) is the mkey's PD. `mqp` must be
/// the mlx5dv_qp_ex of a QP from create_umr_qp (configure_key() checks that first).
/// Builder errors of the provider surface from ibv_wr_complete.
/// \errors Nothing is then posted:
/// - errc::null_handle: `qpx`, `mqp` or `mkey` is null.
/// - the layout_category() codes of layout::validate with limits_for(u) and of
///   check_provider_limits.
/// \mallocs None (the entry array is on the stack).
[[nodiscard]] inline result<void> post_configure(ibv_qp_ex *qpx, mlx5dv_qp_ex *mqp,
                                                 mlx5dv_mkey *mkey, ibv_pd *pd, wr w,
                                                 const layout &l, access_flags acc,
                                                 const umr_limits &u) noexcept {
  if (!qpx || !mqp || !mkey) return make_error_code(errc::null_handle);
  if (auto ec = l.validate(limits_for(u), acc, pd)) return ec;
  if (auto ec = check_provider_limits(l)) return ec;
  qpx->wr_id = w.id;
  qpx->wr_flags = (w.flags | send_flag::inline_data).native();
  mlx5dv_mkey_conf_attr attr{};
  ::mlx5dv_wr_mkey_configure(mqp, mkey, 2, &attr);
  ::mlx5dv_wr_set_mkey_access_flags(mqp, acc.native());
  if (l.type() == layout::kind::list) {
    ibv_sge sg[layout::capacity];
    for (std::size_t i = 0; i < l.size(); ++i) {
      const auto &e = l[i];
      sg[i] = {e.source.iova + e.offset, std::uint32_t(e.length), e.source.lkey};
    }
    ::mlx5dv_wr_set_mkey_layout_list(mqp, std::uint16_t(l.size()), sg);
  } else {
    mlx5dv_mr_interleaved il[layout::capacity];
    for (std::size_t i = 0; i < l.size(); ++i) {
      const auto &e = l[i];
      il[i] = {e.source.iova + e.offset, std::uint32_t(e.length), e.skip, e.source.lkey};
    }
    ::mlx5dv_wr_set_mkey_layout_interleaved(mqp, l.repeat_count(), std::uint16_t(l.size()), il);
  }
  return success();
}

/// Post a local invalidate of the mkey (ibv_wr_local_inv with its lkey).
/// \errors
/// - errc::null_handle: `qpx` or `mkey` is null.
/// \mallocs None.
[[nodiscard]] inline result<void> post_invalidate(ibv_qp_ex *qpx, mlx5dv_mkey *mkey, wr w) noexcept {
  if (!qpx || !mkey) return make_error_code(errc::null_handle);
  qpx->wr_id = w.id;
  qpx->wr_flags = w.flags.native();
  ::ibv_wr_local_inv(qpx, mkey->lkey);
  return success();
}

// ---------------------------------------------------------------------------------------------
// key state: what the device did

/// Where an mlx5 key stands. configuring / invalidating: the operation was added to a batch and
/// is not confirmed yet (it may still fail at ibv_wr_complete, be aborted, or complete in
/// error).
enum class key_phase : std::uint8_t { idle, configuring, configured, invalidating };

/// The state of an mlx5 indirect key. One unconfirmed operation at a time.
struct key_state {
  /// The indirect mkey (create_mkey), or nullptr.
  ::mlx5dv_mkey *mkey = nullptr;
  /// Where the key stands.
  key_phase phase = key_phase::idle;
  std::uint64_t wr_id = 0;  ///< of the unconfirmed operation
  std::uint32_t qp_num = 0; ///< the QP it was posted on
  /// The key may grant access (configured, or either operation not yet confirmed).
  [[nodiscard]] bool live() const noexcept { return phase != key_phase::idle; }
  /// An operation is posted and not yet confirmed.
  [[nodiscard]] bool pending() const noexcept {
    return phase == key_phase::configuring || phase == key_phase::invalidating;
  }
};

/// Converts a QP's ibv_qp_ex to its mlx5dv_qp_ex (mlx5dv_qp_ex_from_ibv_qp_ex in real use).
using to_dv_qp = mlx5dv_qp_ex *(*)(ibv_qp_ex *) noexcept;
/// mlx5dv_qp_ex_from_ibv_qp_ex.
[[nodiscard]] inline mlx5dv_qp_ex *dv_qp_of(ibv_qp_ex *q) noexcept {
  return ::mlx5dv_qp_ex_from_ibv_qp_ex(q);
}

/// Add a configure of `k` to the open batch `qpx` of a QP created with mlx5dv send operations
/// `qp_mlx5_ops` (QueuePair::mlx5_send_ops()). On success the key is configuring.
/// \errors Nothing is then added, the state unchanged:
/// - errc::null_handle: the key's mkey or `qpx` is null.
/// - errc::already_bound: configured.
/// - errc::busy: an operation is unconfirmed (hand its completion to complete_key, or
///   cancel_key).
/// - errc::not_umr_qp: the QP lacks the UMR builders (checked before the mlx5dv_qp_ex is even
///   computed).
/// - the codes of post_configure.
/// \mallocs None.
[[nodiscard]] inline result<void> configure_key(key_state &k, std::uint64_t qp_mlx5_ops, ibv_qp_ex *qpx,
                                                ibv_pd *pd, wr w, const layout &l, access_flags acc,
                                                const umr_limits &u, to_dv_qp to_dv = dv_qp_of) noexcept {
  if (!k.mkey || !qpx) return make_error_code(errc::null_handle);
  if (k.pending()) return make_error_code(errc::busy);
  if (k.phase == key_phase::configured) return make_error_code(errc::already_bound);
  if (!has_umr_ops(qp_mlx5_ops)) return make_error_code(errc::not_umr_qp);
  RDMAXX_TRYV(post_configure(qpx, to_dv(qpx), k.mkey, pd, w, l, acc, u));
  k.phase = key_phase::configuring;
  k.wr_id = w.id;
  k.qp_num = qpx->qp_base.qp_num;
  return success();
}

/// Add a local invalidate of `k` to the open batch `qpx`. On success the key is invalidating
/// (it still counts as live until confirmed).
/// \errors Nothing is then added:
/// - errc::null_handle: the key's mkey or `qpx` is null.
/// - errc::not_bound: not configured.
/// - errc::busy: an operation is unconfirmed.
/// \mallocs None.
[[nodiscard]] inline result<void> invalidate_key(key_state &k, ibv_qp_ex *qpx, wr w) noexcept {
  if (!k.mkey || !qpx) return make_error_code(errc::null_handle);
  if (k.pending()) return make_error_code(errc::busy);
  if (k.phase != key_phase::configured) return make_error_code(errc::not_bound);
  RDMAXX_TRYV(post_invalidate(qpx, k.mkey, w));
  k.phase = key_phase::invalidating;
  k.wr_id = w.id;
  k.qp_num = qpx->qp_base.qp_num;
  return success();
}

/// The unconfirmed operation did not take effect: back to the state before it.
inline void undo_key(key_state &k) noexcept {
  if (k.phase == key_phase::configuring) k.phase = key_phase::idle;
  else if (k.phase == key_phase::invalidating) k.phase = key_phase::configured;
}
/// The unconfirmed operation took effect.
inline void confirm_key(key_state &k) noexcept {
  if (k.phase == key_phase::configuring) k.phase = key_phase::configured;
  else if (k.phase == key_phase::invalidating) k.phase = key_phase::idle;
}

/// Hand a completion to the key. A completion of the unconfirmed operation (same QP, same
/// wr_id) confirms it when successful and undoes it otherwise; a successful send-queue
/// completion of another work request of that QP confirms it too (a send queue completes in
/// order). Returns true when the state changed; any other completion is ignored. Inline,
/// allocation-free.
inline bool complete_key(key_state &k, const ibv_wc &wc) noexcept {
  if (!k.pending() || wc.qp_num != k.qp_num) return false;
  if (wc.status == IBV_WC_SUCCESS) {
    // a receive says nothing about the send queue. Not `opcode & IBV_WC_RECV` alone: a UMR
    // completes as MLX5DV_WC_UMR == IBV_WC_DRIVER1 (mlx5dv.h:437, qp.c:1263), which has that bit.
    if ((wc.opcode & IBV_WC_RECV) && wc.opcode < IBV_WC_DRIVER1) return false;
    confirm_key(k);
    return true;
  }
  if (wc.wr_id != k.wr_id) return false;
  undo_key(k);
  return true;
}

/// The batch holding the unconfirmed operation was dropped, or its submit() failed: nothing of
/// it was posted, undo it.
inline void cancel_key(key_state &k) noexcept { undo_key(k); }

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
