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
///     _REMOTE_INVALIDATE when peers may invalidate it, verbs.c:6822-6824); the provider rounds
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
/// to a batch is posted signaled and unconfirmed until its own completion is handed to
/// complete_key(); a batch that is dropped or whose submit() fails is undone with cancel_key().
/// A revoked rkey never answers again: each configure after the first rotates the mkey's 8-bit
/// tag (where the kernel allows it, MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG), and a key whose
/// tags are used up (all 256, or the only one without tag update) refuses to be configured
/// again (errc::key_retired). See key_state.
///
/// Across keys: mlx5dv_create_mkey always creates tag 0 (verbs.c:6832-6833), so a new mkey on an
/// index the firmware reused would answer to the rkey of the destroyed one. With tag update each
/// new key starts at a process-wide rotating variant (next_variant(), set on the mkey before its
/// first configure: qp.c:2870-2876 writes lkey & 0xff into the mkey context), and retires when
/// its tag comes back to that start (256 configures). Without tag update the only rkey of an
/// mkey is index << 8, so rdmaxx does not rely on the firmware's index allocation: it
/// quarantines indexes (seen_indexes): an index whose rkey was ever handed to the device in a
/// configure is remembered for the process's life (per device), a configure of an mkey on such
/// an index is refused (errc::key_retired), and IndirectKey::create asks for another mkey
/// (Capabilities::umr_revocation says which of the two applies).
///
/// Threads: a key_state (and the IndirectKey holding it) is used by one thread at a time; the
/// batch it posts through is that thread's (the provider holds the QP's send-queue lock from
/// ibv_wr_start to ibv_wr_complete). An outer key reads its nested keys' state (stale()), so keys
/// nested in one another belong to the same thread, or the caller serializes them. Only the
/// counters of the UMR QP's credit (sq_credit: head, tail, key_ops) and the process-wide variant
/// and quarantine are shared across threads (atomics and a spin lock).
///
/// Allocation: create_mkey() allocates inside the provider (mlx5dv_create_mkey); nothing else
/// here allocates (post_configure() builds its entry array on the stack).
#pragma once

#if RDMAXX_HAVE_MLX5

#include "../access.hpp"
#include "../detail/atomic.hpp"
#include "../detail/handle.hpp"
#include "../detail/sq_credit.hpp"
#include "../error.hpp"
#include "../layout.hpp"
#include "../queue_pair.hpp"
#include "umr_qp.hpp"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>

namespace rdmaxx::mlx5 {

/// The only rights an mlx5 indirect mkey is configured with. Remote atomic stays allowed: UCX
/// checks the HCA cap umr_modify_atomic_disabled before granting atomics through a UMR, but
/// rdma-core 44 puts the atomic bit into the mkey mask of every access-flags setter, atomic
/// asked or not (qp.c:2929-2933), so on such a device every configure would fail at completion:
/// refusing atomics alone would not help. IndirectKey::create reads the cap
/// (mlx5::query_umr_atomic, DEVX QUERY_HCA_CAP) and does not choose this backend there.
inline constexpr access_flags allowed_access =
    access::local_write | access::remote_read | access::remote_write | access::remote_atomic;

/// What bounds a layout on one QP and mkey.
struct umr_limits {
  std::uint32_t max_inline_data = 0; ///< the UMR QP's granted max_inline_data
  std::uint32_t mkey_max_entries = 0; ///< the mkey's max_entries as read back after creation
  /// The HCA's max_indirection (query_umr_caps): the most levels a key may have; 0: not
  /// reported, not enforced.
  std::uint32_t max_indirection = 0;
  /// The HCA reports repeated_block_disabled: no repeat layouts.
  bool repeat_disabled = false;
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
  const auto min3 = [](std::uint32_t a, std::uint32_t b, std::uint32_t c) {
    const std::uint32_t ab = a < b ? a : b;
    return ab < c ? ab : c;
  };
  l.max_entries = min3(fit, u.mkey_max_entries, cap);
  l.max_repeat_entries = min3(fit > 0 ? fit - 1 : 0, u.mkey_max_entries > 0 ? u.mkey_max_entries - 1 : 0, cap);
  l.max_segments = UINT32_MAX; // the device resolves the layout: nothing is flattened
  l.interleave_16bit = true;
  l.nested_hardware_only = true;
  l.allowed_access = allowed_access;
  if (u.max_indirection != 0) l.max_depth = u.max_indirection;
  l.repeat_layouts = !u.repeat_disabled;
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
/// verbs.c:6822-6824), without which a peer's send-with-invalidate naming the key fails;
/// `update_tag` adds MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG (accepted only where the kernel
/// reports MLX5_CTX_FLAGS_MKEY_UPDATE_TAG_SUPPORTED, verbs.c:6751-6762).
[[nodiscard]] inline mlx5dv_mkey_init_attr mkey_init_attr(ibv_pd *pd, std::uint16_t max_entries,
                                                          bool remote_invalidate = false,
                                                          bool update_tag = false) noexcept {
  mlx5dv_mkey_init_attr a{};
  a.pd = pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
                   (remote_invalidate ? unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE) : 0u) |
                   (update_tag ? unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG) : 0u);
  a.max_entries = max_entries;
  return a;
}

/// The max_entries to create an mkey with for a key promised `n` layout entries: one more, as an
/// interleaved layout's repeat header takes a translation entry of the mkey (qp.c:2175), so
/// limits_for() then allows `n` repeat entries (capped at max_mkey_entries).
[[nodiscard]] constexpr std::uint32_t mkey_entries_for(std::uint32_t n) noexcept {
  return n < max_mkey_entries ? n + 1 : max_mkey_entries;
}

/// The signature of mlx5dv_create_mkey(3).
using create_mkey_verb = mlx5dv_mkey *(*)(mlx5dv_mkey_init_attr *);
/// The signature of mlx5dv_destroy_mkey(3).
using destroy_mkey_verb = int (*)(mlx5dv_mkey *);

/// The process-wide rotating variant: each new mkey with tag update starts at the next one
/// (start_at_variant), as the kernel's mlx5_ib and rdma-core's VFIO provider give each created
/// mkey a variant of its own, so that a key on an index the firmware reused does not begin with
/// the tags of the key destroyed there. (With tags of their own each key still retires after
/// 256 configures; two keys on one reused index can share a tag only when the earlier one used
/// more tags than the variants given out in between.)
inline detail::atomic<std::uint32_t> mkey_variant{0};
/// The next variant (relaxed: only its spread matters, not its order).
[[nodiscard]] inline std::uint8_t next_variant() noexcept {
  return std::uint8_t(mkey_variant.fetch_add(1, detail::order::relaxed));
}

/// The quarantine of mkey indexes without tag update: without MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG
/// an mkey's only rkey is index << 8 (verbs.c:6832-6833), so an index the firmware hands out
/// again after mlx5dv_destroy_mkey would give a new key the rkey a peer held for the destroyed
/// one. One table per device (2 MiB: a bit for each of the 2^24 indexes, made on first use):
/// an index is marked when a configure of an mkey there is handed to the device (mark), and
/// stays marked for the process's life; configure_key refuses an mkey on a marked index
/// (errc::key_retired) and IndirectKey::create asks for another mkey (create_fresh_mkey).
/// Thread-safe (atomic bits; the table of tables under a spin lock).
class seen_indexes {
public:
  /// mkey indexes (24 bits: lkey >> 8).
  static constexpr std::uint32_t index_count = 1u << 24;
  /// Devices with a table (more: of() answers nullptr and the key is refused).
  static constexpr std::size_t max_devices = 16;
  /// The table of device `dev` (ibv_device *, one index space per device), made on first use
  /// (new(nothrow)); nullptr when it cannot be made (no memory, or max_devices tables made).
  [[nodiscard]] static seen_indexes *of(const void *dev) noexcept;
  /// The rkey's index was handed to the device before.
  [[nodiscard]] bool seen(std::uint32_t key) const noexcept {
    const std::uint32_t i = key >> 8;
    return (bits_[i / 8].load(detail::order::acquire) >> (i % 8)) & 1u;
  }
  /// Mark the rkey's index (a configure of it goes to the device).
  void mark(std::uint32_t key) noexcept {
    const std::uint32_t i = key >> 8;
    bits_[i / 8].fetch_or(std::uint8_t(1u << (i % 8)), detail::order::acq_rel);
  }
  /// Unmark it: the configure that marked it never reached the device (cancel_key).
  void unmark(std::uint32_t key) noexcept {
    const std::uint32_t i = key >> 8;
    bits_[i / 8].fetch_and(std::uint8_t(~(1u << (i % 8))), detail::order::acq_rel);
  }
  /// Forget every index (contract tests only: their stand-in devices share addresses).
  void clear() noexcept {
    for (std::uint32_t i = 0; i < index_count / 8; ++i) bits_[i].store(0, detail::order::relaxed);
  }
  seen_indexes(const seen_indexes &) = delete;
  seen_indexes &operator=(const seen_indexes &) = delete;

private:
  seen_indexes() noexcept : bits_(new (std::nothrow) detail::atomic<std::uint8_t>[index_count / 8]()) {}
  ~seen_indexes() { delete[] bits_; }
  detail::atomic<std::uint8_t> *bits_;
};

inline seen_indexes *seen_indexes::of(const void *dev) noexcept {
  static detail::atomic<bool> lock;
  static struct {
    const void *dev;
    seen_indexes *t;
  } tables[max_devices] = {};
  while (lock.exchange(true, detail::order::acquire)) {
  }
  seen_indexes *found = nullptr;
  for (auto &e : tables) {
    if (e.t && e.dev == dev) {
      found = e.t;
      break;
    }
    if (!e.t) {
      auto *t = new (std::nothrow) seen_indexes;
      if (t && !t->bits_) {
        delete t;
        t = nullptr;
      }
      if (t) e = {dev, t};
      found = t;
      break;
    }
  }
  lock.store(false, detail::order::release);
  return found;
}


/// What create_mkey made.
struct created_mkey {
  mlx5dv_mkey *mkey = nullptr;   ///< the mkey (owned by the caller: mlx5dv_destroy_mkey)
  std::uint32_t max_entries = 0; ///< as granted (rounded up to a multiple of 4, verbs.c:6802, 6831)
  /// Created with MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG: each configure may carry a new 8-bit
  /// tag (qp.c:2870-2876 writes lkey & 0xff into the mkey context).
  bool update_tag = false;
  /// Without update_tag (create_fresh_mkey): the quarantine of the device, which the mkey's
  /// index is not in.
  seen_indexes *seen = nullptr;
};

/// mlx5dv_create_mkey (indirect; remote invalidation enabled when `remote_invalidate`), first
/// with MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG and, when that is refused with EOPNOTSUPP (no
/// tag update in this kernel, verbs.c:6751-6762), again without it.
/// \errors
/// - errc::null_handle: `pd` is null.
/// - errc::out_of_range: `max_entries` 0 or above max_mkey_entries.
/// - the errno of mlx5dv_create_mkey (EOPNOTSUPP: no DEVX context, ENOMEM, EINVAL).
/// \mallocs What mlx5dv_create_mkey allocates inside the provider.
[[nodiscard]] inline result<created_mkey> create_mkey(ibv_pd *pd, std::uint32_t max_entries,
                                                      bool remote_invalidate = false,
                                                      create_mkey_verb verb = &::mlx5dv_create_mkey) noexcept {
  if (!pd) return make_error_code(errc::null_handle);
  if (max_entries == 0 || max_entries > max_mkey_entries) return make_error_code(errc::out_of_range);
  mlx5dv_mkey_init_attr a = mkey_init_attr(pd, std::uint16_t(max_entries), remote_invalidate, true);
  bool tag = true;
  mlx5dv_mkey *k = verb(&a);
  if (!k && errno == EOPNOTSUPP) {
    a = mkey_init_attr(pd, std::uint16_t(max_entries), remote_invalidate, false);
    tag = false;
    k = verb(&a);
  }
  if (!k) return last_errno();
  return created_mkey{k, a.max_entries, tag};
}

/// mkeys create_fresh_mkey holds aside at most while it looks for an index not quarantined.
inline constexpr int max_index_tries = 8;

/// create_mkey, and when the mkey has no tag update and lands on an index quarantined for device
/// `dev` (seen_indexes::of(dev), made then: its rkey was handed out before), again, holding the refused mkeys so that the
/// firmware cannot hand the same index back, up to max_index_tries; the refused ones are then
/// destroyed through `destroy` (never configured, nothing reaches them).
/// \errors Those of create_mkey, and:
/// - errc::key_retired: every mkey tried lay on a quarantined index.
/// - ENOMEM: no tag update, and no quarantine table could be made for `dev` (refused rather
///   than relying on the firmware's index allocation).
/// \mallocs As create_mkey, for each mkey tried.
[[nodiscard]] inline result<created_mkey> create_fresh_mkey(ibv_pd *pd, std::uint32_t max_entries,
                                                            bool remote_invalidate, create_mkey_verb verb,
                                                            destroy_mkey_verb destroy,
                                                            const void *dev) noexcept {
  mlx5dv_mkey *held[max_index_tries] = {};
  int nheld = 0;
  result<created_mkey> r = make_error_code(errc::key_retired);
  for (;;) {
    auto k = create_mkey(pd, max_entries, remote_invalidate, verb);
    if (!k || k.value().update_tag) {
      r = std::move(k);
      break;
    }
    seen_indexes *const seen = seen_indexes::of(dev);
    if (!seen) {
      (void)destroy(k.value().mkey);
      r = std::make_error_code(std::errc::not_enough_memory);
      break;
    }
    if (!seen->seen(k.value().mkey->lkey)) {
      k.value().seen = seen;
      r = std::move(k);
      break;
    }
    if (nheld == max_index_tries) {
      (void)destroy(k.value().mkey);
      break; // errc::key_retired
    }
    held[nheld++] = k.value().mkey;
  }
  while (nheld > 0) (void)destroy(held[--nheld]);
  return r;
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
/// - errc::send_queue_full: the QP's counted send queue (detail::sq_credit) is full.
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
  // The mlx5dv builders are not routed through the credit: admit the WR here.
  if (detail::sq_credit *c = detail::sq_credit::of(qpx); c && !c->admit(qpx))
    return make_error_code(errc::send_queue_full);
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

/// Post a local invalidate of the mkey (ibv_wr_local_inv with its lkey), fenced: IBV_SEND_FENCE
/// whatever w.flags says. The provider turns it into MLX5_WQE_CTRL_FENCE on the WQE
/// (_common_wqe_init_op, qp.c:1272-1274; the local invalidate is built there through
/// _build_umr_wqe, qp.c:1622-1627 and 1595), so the device starts the invalidate only after every
/// earlier work request of the QP completed: an RDMA read posted before it, whose response lands
/// through the key, lands before the key dies instead of failing halfway.
/// \errors
/// - errc::null_handle: `qpx` or `mkey` is null.
/// \mallocs None.
[[nodiscard]] inline result<void> post_invalidate(ibv_qp_ex *qpx, mlx5dv_mkey *mkey, wr w) noexcept {
  if (!qpx || !mkey) return make_error_code(errc::null_handle);
  qpx->wr_id = w.id;
  qpx->wr_flags = (w.flags | send_flag::fence).native();
  ::ibv_wr_local_inv(qpx, mkey->lkey);
  return success();
}

// ---------------------------------------------------------------------------------------------
// key state: what the device did

/// Where an mlx5 key stands. configuring / invalidating: the operation was added to a batch and
/// is not confirmed yet (it may still fail at ibv_wr_complete, be aborted, or complete in
/// error).
enum class key_phase : std::uint8_t { idle, configuring, configured, invalidating };

/// The state of an mlx5 indirect key. One unconfirmed operation at a time. Move-only (it holds
/// the links to the layout's sources). One thread at a time (see the top of this header).
struct key_state {
  /// The indirect mkey (create_mkey), or nullptr.
  ::mlx5dv_mkey *mkey = nullptr;
  /// Where the key stands.
  key_phase phase = key_phase::idle;
  std::uint64_t wr_id = 0;  ///< of the unconfirmed operation
  std::uint32_t qp_num = 0; ///< the QP it was posted on
  /// The mkey's 8-bit tag can be changed (created with MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG).
  bool update_tag = false;
  /// A peer's send-with-invalidate named the key while its local invalidate was unconfirmed.
  bool remotely_invalidated = false;
  /// The mkey was created with MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE: only then can a
  /// peer's send-with-invalidate name it (without, the device refuses it, so a receive
  /// completion naming its rkey is some other key's).
  bool remote_invalidate = false;
  /// The QP the last configure was posted on: a peer's send-with-invalidate is matched on it
  /// (complete_key), or on a QP the caller names (complete_key_on).
  std::uint32_t conf_qp_num = 0;
  /// Without tag update: the quarantine of the mkey's device (seen_indexes; set by
  /// IndirectKey::create). A configure of an mkey on a quarantined index is refused.
  seen_indexes *seen = nullptr;
  /// The unconfirmed configure marked the index in `seen` (cancel_key unmarks it).
  bool marked = false;
  /// A hardware key nested in the configured layout, and the lkey it had then: once it is
  /// invalidated or re-tagged the layout points at a key the device refuses (stale()).
  struct nested_key {
    const key_state *key = nullptr; ///< the nested key's state (alive: the layout's link holds it)
    std::uint32_t lkey = 0;         ///< its lkey when this key was configured over it
  };
  nested_key nested[layout::capacity]; ///< the configured layout's nested hardware keys
  std::uint8_t nnested = 0;           ///< (how many)
  /// The tag of the first configure: with tag update the process-wide variant given at creation
  /// (start_at_variant), else lkey & 0xff at creation (0 on rdma-core 44, verbs.c:6832). The key
  /// retires when its tag would come back to it.
  std::uint8_t first_tag = 0;
  std::uint32_t generations = 0;  ///< configures handed to the device, each with its own tag
  std::uint32_t prev_lkey = 0;    ///< the mkey's keys before the unconfirmed configure
  std::uint32_t prev_rkey = 0;    ///< (the rkey of the same)
  /// While a layout is posted or configured: one link per entry to its source's child counter
  /// (a MemoryRegion, or a nested IndirectKey), so neither can be destroyed under the layout.
  detail::child_link links[layout::capacity];
  /// The counted send queue of the QP the unconfirmed operation was posted on (or nullptr), its
  /// position there and that queue's epoch: its own completion gives the room back.
  detail::sq_credit *credit = nullptr;
  std::uint32_t sq_pos = 0;   ///< (its position in that queue)
  std::uint32_t sq_epoch = 0; ///< (that queue's resets when it was posted)
  /// While an operation is unconfirmed: a link to that QP's child counter, so the QP (and its
  /// credit) outlives it.
  detail::child_link qp_link;
  /// The key's handle went away while its operation was unconfirmed on a counted send queue
  /// (orphan_key): the operation as that queue adopted it (sq_credit::adopt).
  detail::sq_credit::orphan orphan;
  /// (orphan_key) keeps the key's own node counted, so its destruction is deferred until the
  /// queue settles the operation (settle_orphan).
  detail::child_link self_hold;
  /// (settle_orphan) the queue showed the orphaned operation ended: the mkey may be destroyed.
  bool qp_settled = false;
  /// The key may grant access (configured, or either operation not yet confirmed).
  [[nodiscard]] bool live() const noexcept { return phase != key_phase::idle; }
  /// An operation is posted and not yet confirmed.
  [[nodiscard]] bool pending() const noexcept {
    return phase == key_phase::configuring || phase == key_phase::invalidating;
  }
  /// Configures this mkey can carry, each with a tag no earlier one had: 256 with tag update,
  /// else 1 (a second configure would make every revoked rkey of the key answer again).
  [[nodiscard]] std::uint32_t max_generations() const noexcept { return update_tag ? 256 : 1; }
};

/// Start tracking `mkey` (from create_mkey) in `k`; `remote_invalidate`: created with
/// MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE. The first configure keeps the mkey's tag
/// (IndirectKey::create then moves it to a variant of its own: start_at_variant).
inline void init_key(key_state &k, ::mlx5dv_mkey *mkey, bool update_tag, bool remote_invalidate = false) noexcept {
  k.mkey = mkey;
  k.update_tag = update_tag;
  k.remote_invalidate = remote_invalidate;
  k.first_tag = mkey ? std::uint8_t(mkey->lkey & 0xff) : 0;
  k.generations = 0;
  k.phase = key_phase::idle;
}

/// The tag of generation `g` (the first configure keeps the tag the mkey was created with).
[[nodiscard]] constexpr std::uint8_t tag_of(std::uint8_t first, std::uint32_t g) noexcept {
  return std::uint8_t((first + g) & 0xff);
}
/// Give the mkey tag `t`: the provider writes lkey & 0xff into the mkey context of the next
/// configure (qp.c:2870-2876) and the rkey is the lkey (verbs.c:6832-6833), so both change.
inline void set_tag(::mlx5dv_mkey *m, std::uint8_t t) noexcept {
  m->lkey = (m->lkey & ~0xffu) | t;
  m->rkey = (m->rkey & ~0xffu) | t;
}

/// A new key with tag update starts at variant `v` (next_variant()): the mkey gets tag `v` now,
/// before its first configure, which writes it into the mkey context (qp.c:2870-2876), and the
/// key retires when its tag would come back to `v`. Nothing without tag update (a tag other
/// than 0 would make the provider fail the configure, qp.c:2870-2874).
inline void start_at_variant(key_state &k, std::uint8_t v) noexcept {
  if (!k.mkey || !k.update_tag || k.generations != 0) return;
  k.first_tag = v;
  set_tag(k.mkey, v);
}

/// The configured layout points at a hardware key that is no longer as it was when `k` was
/// configured over it: invalidated (or its invalidate posted), re-tagged, or itself stale. The
/// device refuses every access through such a key (its translation reaches an mkey that no
/// longer answers to the lkey it holds), so `k` must not be handed out until reconfigured.
[[nodiscard]] inline bool stale(const key_state &k) noexcept {
  for (std::uint8_t i = 0; i < k.nnested; ++i) {
    const key_state *n = k.nested[i].key;
    if (!n->mkey || n->phase != key_phase::configured || n->mkey->lkey != k.nested[i].lkey || stale(*n))
      return true;
  }
  return false;
}

/// Converts a QP's ibv_qp_ex to its mlx5dv_qp_ex (mlx5dv_qp_ex_from_ibv_qp_ex in real use).
using to_dv_qp = mlx5dv_qp_ex *(*)(ibv_qp_ex *) noexcept;
/// mlx5dv_qp_ex_from_ibv_qp_ex.
[[nodiscard]] inline mlx5dv_qp_ex *dv_qp_of(ibv_qp_ex *q) noexcept {
  return ::mlx5dv_qp_ex_from_ibv_qp_ex(q);
}

/// While an operation of `k` is unconfirmed: the counted send queue it was posted on, its
/// position there, and a link to the QP (see key_state::credit); the queue counts it among its
/// unconfirmed key operations (sq_credit::key_ops: the QP's to_reset() answers errc::busy).
inline void hold_credit(key_state &k, detail::sq_credit *c, std::uint32_t pos) noexcept {
  if (c) c->key_ops.fetch_add(1, detail::order::acq_rel); // QueuePair::to_reset() refuses
  k.credit = c;
  k.sq_pos = pos;
  k.sq_epoch = c ? c->epoch.load(detail::order::relaxed) : 0;
  k.qp_link = detail::child_link(c ? c->qp_node : nullptr);
}
/// The unconfirmed operation is settled: a successful completion (`done`) retires it and every
/// earlier WR of its QP's counted send queue (RC completes in order); then the QP is let go.
inline void release_credit(key_state &k, bool done) noexcept {
  if (done && k.credit) k.credit->retire_through(k.sq_pos, k.sq_epoch);
  if (k.credit) k.credit->key_ops.fetch_sub(1, detail::order::acq_rel);
  k.credit = nullptr;
  k.qp_link.drop();
}

/// Add a configure of `k` to the open batch `qpx` of a QP created with mlx5dv send operations
/// `qp_mlx5_ops` (QueuePair::mlx5_send_ops()). Posted signaled whatever `w.flags` says: only
/// its own completion (this QP, w.id, opcode MLX5DV_WC_UMR) confirms it. Each configure after
/// the first gives the mkey a new tag (set_tag), so the rkeys of earlier generations stay dead.
/// The key then links to each entry's source (layout entries' region_ref::node). On success the
/// key is configuring.
/// \errors Nothing is then added, the state unchanged:
/// - errc::null_handle: the key's mkey or `qpx` is null.
/// - errc::operation_unconfirmed: an operation is unconfirmed (hand its completion to
///   complete_key, or cancel_key).
/// - errc::already_bound: configured.
/// - errc::not_umr_qp: the QP lacks the UMR builders (checked before the mlx5dv_qp_ex is even
///   computed).
/// - errc::key_retired: every tag of the mkey has been used (max_generations()), or, without
///   tag update, the mkey lies on a quarantined index (seen_indexes: its rkey was handed out
///   before).
/// - errc::send_queue_full: the QP's counted send queue has no room (detail::sq_credit): hand
///   its send completions back first.
/// - the codes of post_configure.
/// \mallocs None.
[[nodiscard]] inline result<void> configure_key(key_state &k, std::uint64_t qp_mlx5_ops, ibv_qp_ex *qpx,
                                                ibv_pd *pd, wr w, const layout &l, access_flags acc,
                                                const umr_limits &u, to_dv_qp to_dv = dv_qp_of) noexcept {
  if (!k.mkey || !qpx) return make_error_code(errc::null_handle);
  if (k.pending()) return make_error_code(errc::operation_unconfirmed);
  if (k.phase == key_phase::configured) return make_error_code(errc::already_bound);
  if (!has_umr_ops(qp_mlx5_ops)) return make_error_code(errc::not_umr_qp);
  if (k.generations >= k.max_generations()) return make_error_code(errc::key_retired);
  const bool quarantined = !k.update_tag && k.seen;
  if (quarantined && k.seen->seen(k.mkey->lkey)) return make_error_code(errc::key_retired);
  detail::sq_credit *const credit = detail::sq_credit::of(qpx);
  if (credit && credit->full()) return make_error_code(errc::send_queue_full);
  const std::uint32_t pos = credit ? credit->next_position() : 0;
  const std::uint32_t old_lkey = k.mkey->lkey, old_rkey = k.mkey->rkey;
  if (k.generations > 0) set_tag(k.mkey, tag_of(k.first_tag, k.generations));
  w.flags |= send_flags(send_flag::signaled);
  if (auto r = post_configure(qpx, to_dv(qpx), k.mkey, pd, w, l, acc, u); !r) {
    k.mkey->lkey = old_lkey;
    k.mkey->rkey = old_rkey;
    return r.error();
  }
  k.prev_lkey = old_lkey;
  k.prev_rkey = old_rkey;
  k.nnested = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    k.links[i] = detail::child_link(l[i].source.node, child_kind::indirect_key);
    if (l[i].source.hw_key)
      k.nested[k.nnested++] = {static_cast<const key_state *>(l[i].source.hw_key), l[i].source.lkey};
  }
  if (quarantined) k.seen->mark(k.mkey->lkey); // before the device sees it: never handed out again
  k.marked = quarantined;
  ++k.generations;
  k.phase = key_phase::configuring;
  k.wr_id = w.id;
  k.qp_num = qpx->qp_base.qp_num;
  k.conf_qp_num = k.qp_num;
  k.remotely_invalidated = false;
  hold_credit(k, credit, pos);
  return success();
}

/// Add a local invalidate of `k` to the open batch `qpx`, signaled and fenced whatever `w.flags`
/// says (post_invalidate: earlier reads of the QP land first; only its own completion, opcode
/// IBV_WC_LOCAL_INV, confirms it). On success the key is invalidating
/// (it still counts as live until confirmed).
/// \errors Nothing is then added:
/// - errc::null_handle: the key's mkey or `qpx` is null.
/// - errc::operation_unconfirmed: an operation is unconfirmed.
/// - errc::not_bound: not configured.
/// - errc::send_queue_full: the QP's counted send queue has no room.
/// \mallocs None.
[[nodiscard]] inline result<void> invalidate_key(key_state &k, ibv_qp_ex *qpx, wr w) noexcept {
  if (!k.mkey || !qpx) return make_error_code(errc::null_handle);
  if (k.pending()) return make_error_code(errc::operation_unconfirmed);
  if (k.phase != key_phase::configured) return make_error_code(errc::not_bound);
  detail::sq_credit *const credit = detail::sq_credit::of(qpx);
  if (credit && credit->full()) return make_error_code(errc::send_queue_full);
  const std::uint32_t pos = credit ? credit->next_position() : 0;
  w.flags |= send_flags(send_flag::signaled);
  RDMAXX_TRYV(post_invalidate(qpx, k.mkey, w)); // ibv_wr_local_inv: admitted by the credit
  k.phase = key_phase::invalidating;
  k.wr_id = w.id;
  k.qp_num = qpx->qp_base.qp_num;
  hold_credit(k, credit, pos);
  return success();
}

/// The layout no longer reaches its sources: release the links.
inline void drop_links(key_state &k) noexcept {
  for (auto &l : k.links) l.drop();
  k.nnested = 0;
}
/// The key is revoked (its invalidate confirmed, or a peer invalidated it).
inline void revoked(key_state &k) noexcept {
  k.phase = key_phase::idle;
  k.remotely_invalidated = false;
  drop_links(k);
}

/// The unconfirmed operation reached the device and failed: a configure leaves the key idle (its
/// tag stays used), an invalidate leaves it configured unless a peer invalidated it meanwhile.
inline void undo_key(key_state &k) noexcept {
  if (k.phase == key_phase::configuring) revoked(k);
  else if (k.phase == key_phase::invalidating && k.remotely_invalidated) revoked(k);
  else if (k.phase == key_phase::invalidating) k.phase = key_phase::configured;
}
/// The unconfirmed operation took effect.
inline void confirm_key(key_state &k) noexcept {
  if (k.phase == key_phase::configuring) k.phase = key_phase::configured;
  else if (k.phase == key_phase::invalidating) revoked(k);
}

/// Hand a completion to the key. Returns true when the key's state changed; any other
/// completion is ignored. Inline, allocation-free.
///   - The unconfirmed operation's own completion (same QP, same wr_id; when successful, also
///     its opcode: MLX5DV_WC_UMR == IBV_WC_DRIVER1 for a configure, IBV_WC_LOCAL_INV for an
///     invalidate, as qp.c:1256-1261 records them and cq.c:193-196 reports them) confirms it;
///     in error (ibv_poll_cq(3): then only wr_id, status and qp_num are valid) it undoes it.
///     Nothing else confirms: an earlier work request's completion says nothing about this one.
///   - A receive completion with IBV_WC_WITH_INV naming the key's current rkey (a peer's
///     send-with-invalidate, cq.c:313-316) revokes a configured key created with remote
///     invalidation, when it arrived on the QP `inv_qp_num` (complete_key: the QP the key was
///     configured through; complete_key_on: a QP of the key's PD the caller names). The same
///     rkey value on another QP (another device's, whose keys are numbered apart) or for a key
///     a peer cannot invalidate is some other key's: ignored. While a local invalidate is
///     unconfirmed, its completion then revokes the key whatever its status.
inline bool complete_key_on(key_state &k, const ibv_wc &wc, std::uint32_t inv_qp_num) noexcept {
  if (wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_INV) && k.mkey &&
      wc.invalidated_rkey == k.mkey->rkey) {
    if (!k.remote_invalidate || wc.qp_num != inv_qp_num) return false;
    if (k.phase == key_phase::configured) {
      revoked(k);
      return true;
    }
    if (k.phase == key_phase::invalidating && !k.remotely_invalidated) {
      k.remotely_invalidated = true;
      return true;
    }
    return false;
  }
  if (!k.pending() || wc.qp_num != k.qp_num || wc.wr_id != k.wr_id) return false;
  if (wc.status == IBV_WC_SUCCESS) {
    const unsigned own = k.phase == key_phase::configuring ? unsigned(MLX5DV_WC_UMR) : unsigned(IBV_WC_LOCAL_INV);
    if (unsigned(wc.opcode) != own) return false; // another work request with the same wr_id
    confirm_key(k);
    release_credit(k, true);
    return true;
  }
  undo_key(k);
  release_credit(k, false); // an error completion retires nothing (QueuePair::retire)
  return true;
}
/// complete_key_on(k, wc, the QP the key was configured through).
inline bool complete_key(key_state &k, const ibv_wc &wc) noexcept { return complete_key_on(k, wc, k.conf_qp_num); }

/// The key's handle goes away (destructor, move assignment) while its operation is posted and
/// unconfirmed on a counted send queue (`k.credit`; `own`: the key's own node): its destruction
/// is deferred until that queue shows the operation ended. `self_hold` counts on `own`, so the
/// handle defers the destruction to the node as it does for children (and reports it); the
/// queue adopts the operation (sq_credit::adopt) and settles it (settle_orphan: the hold
/// dropped, the deferred destruction runs: mlx5dv_destroy_mkey, then the layout's links and the
/// PD) once a completion handed back retired it (the operation's own handed to
/// QueuePair::retire, or any later one), or the QP is reset or destroyed. The QP is let go at
/// once: the operation no longer holds its reset or its destruction (either ends it). Nothing
/// when the queue is not counted (then the destroy trait keeps the mkey: abandon_key).
inline void orphan_key(key_state &k, detail::parent_node *own) noexcept;
/// What the queue calls once the adopted operation ended.
inline void settle_orphan(detail::sq_credit::orphan *o) noexcept {
  auto *k = static_cast<key_state *>(o->owner);
  k->qp_settled = true;
  k->self_hold.drop(); // may run the deferred destruction, which frees *k
}
inline void orphan_key(key_state &k, detail::parent_node *own) noexcept {
  detail::sq_credit *const c = k.credit;
  if (!c || !own || !k.pending()) return;
  k.self_hold = detail::child_link(own, child_kind::queue_pair);
  k.orphan.pos = k.sq_pos;
  k.orphan.epoch = k.sq_epoch;
  k.orphan.settle = &settle_orphan;
  k.orphan.owner = &k;
  k.credit = nullptr;
  c->key_ops.fetch_sub(1, detail::order::acq_rel); // the QP's reset no longer waits for it
  detail::child_link qp = std::move(k.qp_link);
  c->adopt(&k.orphan); // may settle at once (already retired): the handle still holds the node
  qp.drop();           // last: the QP (and `c`) may go now; its destruction settles what is left
}

/// The key goes away (its handle destroyed) while its operation is posted and unconfirmed on a
/// QP whose send queue is not counted, so nothing can tell when it ends: the mkey is not
/// destroyed (the device may still write it) and keeps its state and its links to the layout's
/// sources; only the QP is let go.
inline void abandon_key(key_state &k) noexcept { release_credit(k, false); }

/// The batch holding the unconfirmed operation was dropped, or its submit() failed: nothing of
/// it was posted, undo it (a configure gives its tag back: the device never saw it).
inline void cancel_key(key_state &k) noexcept {
  release_credit(k, false);
  if (k.phase == key_phase::configuring) {
    if (k.marked && k.seen) k.seen->unmark(k.mkey->lkey); // never handed to the device
    k.marked = false;
    --k.generations;
    k.mkey->lkey = k.prev_lkey;
    k.mkey->rkey = k.prev_rkey;
    revoked(k);
    return;
  }
  if (k.phase == key_phase::invalidating) k.phase = k.remotely_invalidated ? key_phase::idle : key_phase::configured;
  if (k.phase == key_phase::idle) revoked(k);
}

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
