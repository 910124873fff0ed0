/// \file
/// rdmaxx/mlx5/indirect_key_mlx5.hpp: the mlx5dv backend of IndirectKey (hardware UMR).
///
/// Compiled only when rdmaxx is built with the mlx5 option (RDMAXX_HAVE_MLX5 == 1). Compiled and
/// contract-tested, NOT run on hardware: no mlx5 device was available. The functions here take
/// the C structs they post through (ibv_qp_ex, mlx5dv_qp_ex, mlx5dv_mkey), so the contract tests
/// hand them structs whose function pointers record every call and assert exactly what the
/// library gives mlx5dv.
///
/// What mlx5dv requires, and what is checked before anything is posted:
///   - an indirect mkey from mlx5dv_create_mkey (MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT); the
///     provider rounds max_entries up (to a multiple of 4): read it back;
///   - the layout is posted inline (IBV_SEND_INLINE is mandatory), so a list layout holds at most
///     (max_inline_data + 4) / 16 entries and an interleaved one one fewer; never more than the
///     mkey's max_entries (interleaved: one entry is the strided header);
///   - interleaved bytes_count and bytes_count + bytes_skip go into 16-bit fields: both < 2^16;
///   - access flags: local write and remote read / write / atomic only;
///   - the QP comes from mlx5dv_create_qp with MLX5DV_QP_EX_WITH_MKEY_CONFIGURE (and MR_LIST,
///     MR_INTERLEAVED) plus IBV_QP_EX_WITH_LOCAL_INV; builder errors surface from ibv_wr_complete;
///   - invalidation is a local invalidate of the mkey (ibv_wr_local_inv).
///
/// Allocation: create_mkey() allocates inside the provider (mlx5dv_create_mkey); nothing else
/// here allocates (post_configure() builds its entry array on the stack).
#pragma once

#if RDMAXX_HAVE_MLX5

#include "../access.hpp"
#include "../error.hpp"
#include "../layout.hpp"
#include "../queue_pair.hpp"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>

namespace rdmaxx::mlx5 {

/// The only rights an mlx5 indirect mkey is configured with.
inline constexpr access_flags allowed_access =
    access::local_write | access::remote_read | access::remote_write | access::remote_atomic;

/// What bounds a layout on one QP and mkey.
struct umr_limits {
  std::uint32_t max_inline_data = 0; ///< the UMR QP's granted max_inline_data
  std::uint32_t mkey_max_entries = 0; ///< the mkey's max_entries as read back after creation
};

/// List entries that fit inline: (max_inline_data + 4) / 16.
[[nodiscard]] constexpr std::uint32_t inline_list_capacity(std::uint32_t max_inline_data) noexcept {
  return (max_inline_data + 4) / 16;
}

/// The layout limits of this backend for `u`.
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

/// The attributes given to mlx5dv_create_mkey for an indirect mkey of `max_entries` entries.
[[nodiscard]] inline mlx5dv_mkey_init_attr mkey_init_attr(ibv_pd *pd, std::uint16_t max_entries) noexcept {
  mlx5dv_mkey_init_attr a{};
  a.pd = pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
  a.max_entries = max_entries;
  return a;
}

/// mlx5dv_create_mkey (indirect). On success `max_entries` holds what the provider granted (it
/// rounds up). Errors: errc::null_handle, errc::out_of_range (max_entries 0 or above 65535),
/// errno of mlx5dv_create_mkey (EOPNOTSUPP: no DEVX context, ENOMEM, EINVAL).
[[nodiscard]] inline result<mlx5dv_mkey *> create_mkey(ibv_pd *pd, std::uint32_t &max_entries) noexcept {
  if (!pd) return make_error_code(errc::null_handle);
  if (max_entries == 0 || max_entries > 0xffff) return make_error_code(errc::out_of_range);
  mlx5dv_mkey_init_attr a = mkey_init_attr(pd, std::uint16_t(max_entries));
  mlx5dv_mkey *k = ::mlx5dv_create_mkey(&a);
  if (!k) return last_errno();
  max_entries = a.max_entries;
  return k;
}

/// mlx5dv send operations a UMR QP is created with.
inline constexpr std::uint64_t umr_send_ops =
    MLX5DV_QP_EX_WITH_MR_LIST | MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MKEY_CONFIGURE;

/// Fill the attributes of mlx5dv_create_qp for a UMR-capable RC QP: the verbs send ops `ops`
/// (local invalidate always added), `caps` (max_inline_data sizes the inline layouts).
inline void umr_qp_attrs(ibv_pd *pd, ibv_cq *send_cq, ibv_cq *recv_cq, const qp_caps &caps,
                         send_ops ops, ibv_qp_init_attr_ex &a, mlx5dv_qp_init_attr &dv) noexcept {
  a = {};
  a.qp_type = IBV_QPT_RC;
  a.send_cq = send_cq;
  a.recv_cq = recv_cq;
  a.cap = {caps.max_send_wr, caps.max_recv_wr, caps.max_send_sge, caps.max_recv_sge,
           caps.max_inline_data};
  a.pd = pd;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.send_ops_flags = (ops | send_op::local_inv).native();
  dv = {};
  dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
  dv.send_ops_flags = umr_send_ops;
}

/// Post one mkey-configure work request: mlx5dv_wr_mkey_configure (2 setters),
/// mlx5dv_wr_set_mkey_access_flags(acc), then mlx5dv_wr_set_mkey_layout_list (list layouts, as
/// ibv_sge {iova + offset, length, lkey}) or mlx5dv_wr_set_mkey_layout_interleaved (repeat
/// layouts). wr_flags get IBV_SEND_INLINE. `pd` (may be null) is the mkey's PD.
/// Errors (nothing posted): the layout_category() codes of layout::validate with limits_for(u).
/// Builder errors of the provider surface from ibv_wr_complete.
[[nodiscard]] inline result<void> post_configure(ibv_qp_ex *qpx, mlx5dv_qp_ex *mqp,
                                                 mlx5dv_mkey *mkey, ibv_pd *pd, wr w,
                                                 const layout &l, access_flags acc,
                                                 const umr_limits &u) noexcept {
  if (!qpx || !mqp || !mkey) return make_error_code(errc::null_handle);
  if (auto ec = l.validate(limits_for(u), acc, pd)) return ec;
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

/// Post a local invalidate of the mkey (ibv_wr_local_inv with its lkey). Errors: null_handle.
[[nodiscard]] inline result<void> post_invalidate(ibv_qp_ex *qpx, mlx5dv_mkey *mkey, wr w) noexcept {
  if (!qpx || !mkey) return make_error_code(errc::null_handle);
  qpx->wr_id = w.id;
  qpx->wr_flags = w.flags.native();
  ::ibv_wr_local_inv(qpx, mkey->lkey);
  return success();
}

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
