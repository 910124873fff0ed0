/// \file
/// rdmaxx/mlx5/umr_qp.hpp: the RC QueuePair that can configure mlx5 indirect keys (hardware UMR).
///
/// mlx5dv_qp_ex_from_ibv_qp_ex(3) is a plain container_of: the mkey builders
/// (wr_mkey_configure, wr_set_mkey_access_flags, wr_set_mkey_layout_*) are filled in only for
/// QPs created by mlx5dv_create_qp(3) with mlx5 send operations (rdma-core v44.0,
/// providers/mlx5/qp.c:3552-3609, mlx5_qp_fill_wr_pfns; the builders at 3595-3609), and the
/// inline wrappers of mlx5dv.h call them unchecked: on any other QP a configure calls a NULL
/// function pointer. A QueuePair made here records the mlx5dv send operations it was created
/// with (QueuePair::mlx5_send_ops()); IndirectKey::configure refuses any other QP with
/// errc::not_umr_qp.
///
/// The QP is built on QueuePair's one construction path (same checks, same lifetime: a child of
/// its PD and of both CQs, destroy it first), only the creation verb differs.
///
/// Modelled on pyverbs' tests/test_mlx5_mkey.py (v44.0, Mlx5MkeyResources), which passes on
/// hardware: MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS | _SEND_OPS_FLAGS, create flag
/// MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE, and max_inline_data 512. Not identical: pyverbs asks
/// for IBV_QP_EX_WITH_SEND only (test_mlx5_mkey.py:36), rdmaxx for `ops` plus local invalidate,
/// and the provider's per-WQE overhead depends on the send operations (sq_overhead,
/// verbs.c:1532, used by mlx5_calc_send_wqe, verbs.c:1583), so the WQE may be larger and the
/// granted max_send_wr / max_inline_data differ: caps() holds the grant. Scatter-to-CQE is on by
/// default (verbs.c:2330-2331, use_scatter_to_cqe()); for a small receive the provider then
/// copies the data itself to the receive SGE's address taken as a pointer (cq.c:237-242 ->
/// qp.c:74-101, copy_to_scat), but an SGE of an indirect key is zero-based ({offset, length,
/// mkey}), so it would write to virtual address `offset`. mlx5dv_create_mkey(3): indirect mkeys
/// cannot be used with scatter-to-CQE. Every QP rdmaxx creates on mlx5 disables it (a QP made
/// here, and QueuePair::create there: QueuePair::scatter_to_cqe_disabled()); post receives that
/// land in an indirect key only on such a QP.
///
/// Compiled and contract-tested against rdma-core 44, NOT run on hardware.
#pragma once

#if RDMAXX_HAVE_MLX5

#include "../completion_queue.hpp"
#include "../error.hpp"
#include "../protection_domain.hpp"
#include "../queue_pair.hpp"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cstdint>

namespace rdmaxx::mlx5 {

/// mlx5dv send operations a UMR QP is created with.
inline constexpr std::uint64_t umr_send_ops =
    MLX5DV_QP_EX_WITH_MR_LIST | MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MKEY_CONFIGURE;

/// True when a QP created with mlx5dv send operations `ops` has the mkey-configure builders
/// IndirectKey::configure uses (qp.c:3595-3609 fills them for any non-zero set on an RC QP;
/// rdmaxx asks for MKEY_CONFIGURE explicitly).
[[nodiscard]] constexpr bool has_umr_ops(std::uint64_t ops) noexcept {
  return (ops & MLX5DV_QP_EX_WITH_MKEY_CONFIGURE) != 0;
}

/// The mlx5dv attributes of mlx5dv_create_qp for a UMR QP: the UMR send operations and
/// scatter-to-CQE disabled (see the top of this header).
[[nodiscard]] inline mlx5dv_qp_init_attr umr_dv_attr() noexcept {
  mlx5dv_qp_init_attr dv{};
  dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS | MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
  dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
  dv.send_ops_flags = umr_send_ops;
  return dv;
}

/// The verbs send operations of a UMR QP: `ops` plus local invalidate (IndirectKey::revoke).
[[nodiscard]] constexpr send_ops umr_verbs_ops(send_ops ops) noexcept { return ops | send_op::local_inv; }

/// Default queue sizes of a UMR QP: max_inline_data 512 (32 inline list entries, as pyverbs).
inline constexpr qp_caps umr_default_caps = {.max_inline_data = 512};

/// The signature of mlx5dv_create_qp(3).
using create_qp_verb = ibv_qp *(*)(ibv_context *, ibv_qp_init_attr_ex *, mlx5dv_qp_init_attr *);

/// Builds UMR QPs through QueuePair's construction path (detail::qp_access).
struct qp_factory {
  /// See create_umr_qp().
  [[nodiscard]] static result<QueuePair> create(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                const CompletionQueue &recv_cq, qp_caps caps,
                                                send_ops ops) noexcept {
    if (!pd || !send_cq || !recv_cq) return make_error_code(errc::null_handle);
    if (!::mlx5dv_is_supported(pd.context()->device)) return make_error_code(errc::unsupported);
    return create_with(pd, send_cq, recv_cq, caps, ops, &::mlx5dv_create_qp);
  }
  /// create() past its device check, through `verb` (mlx5dv_create_qp; contract tests hand one
  /// that records what it is given and writes back caps as the provider does). The QueuePair
  /// records the caps `verb` left in the attributes: what the provider granted.
  [[nodiscard]] static result<QueuePair> create_with(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq, qp_caps caps,
                                                     send_ops ops, create_qp_verb verb) noexcept {
    mlx5dv_qp_init_attr dv = umr_dv_attr();
    auto r = detail::qp_access::create_with(pd, send_cq, recv_cq, caps, umr_verbs_ops(ops), dv.send_ops_flags,
                                            [&dv, verb](ibv_context *c, ibv_qp_init_attr_ex &a) noexcept {
                                              return verb(c, &a, &dv);
                                            });
    if (!r) return r;
    detail::qp_access::set_no_scatter_to_cqe(r.value()); // umr_dv_attr() disables it
    // A full queue must never reach rdma-core 44's builders (detail/sq_credit.hpp): count it.
    if (ibv_qp_ex *qx = r.value().native_handle_ex();
        qx && !detail::sq_credit::install(qx, r.value().caps().max_send_wr, detail::handle_access::node(r.value())))
      return std::make_error_code(std::errc::not_enough_memory); // the QP is destroyed
    return r;
  }
};

/// An RC QueuePair that can configure mlx5 indirect keys: mlx5dv_create_qp(3) with the UMR send
/// operations (MLX5DV_QP_EX_WITH_MR_LIST, _MR_INTERLEAVED, _MKEY_CONFIGURE), `ops` plus
/// IBV_QP_EX_WITH_LOCAL_INV, and MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE. caps.max_inline_data
/// sizes the inline layouts: QueuePair::caps() holds what the provider granted
/// (verbs.c:1667-1669 writes it back), and IndirectKey::limits() derives the entry limits from
/// it. Its send queue is counted (detail/sq_credit.hpp): a work request that would find it full
/// is refused before the provider's builder runs (rdma-core 44's would write it into the last
/// one posted), SendBatch::submit() answering errc::send_queue_full for the whole batch and
/// IndirectKey's configure and invalidate refusing at once. rdma-core 40 and later rewrite the
/// QP's wr_complete at every state change: the credit is routed again after each transition
/// QueuePair makes (and checked at each ibv_wr_start), so move the QP through QueuePair; hand the QP's send completions to QueuePair::retire() (a
/// key's own to IndirectKey::complete()) to give the room back, and post on it only with
/// ibv_wr_* (SendBatch), never ibv_post_send. Lifetime: as any QueuePair (a child of `pd`,
/// `send_cq` and `recv_cq`); an unconfirmed key operation posted on it counts as its child.
/// \errors
/// - errc::null_handle: `pd` or a CQ is null.
/// - errc::unsupported: not an mlx5 device.
/// - errc::context_mismatch: CQs of another device context.
/// - the errno of mlx5dv_create_qp (EOPNOTSUPP: send operations the device lacks, EINVAL: caps
///   above the device's limits, ENOMEM).
/// - ENOMEM: the send-queue credit could not be allocated.
/// \mallocs As QueuePair::create(): one node that counts the QP's children (new(nothrow)),
/// besides what the provider allocates; and the send-queue credit (new(nothrow): 8 bytes per
/// granted send work request, plus its header).
[[nodiscard]] inline result<QueuePair> create_umr_qp(const ProtectionDomain &pd,
                                                     const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq,
                                                     qp_caps caps = umr_default_caps,
                                                     send_ops ops = all_send_ops) noexcept {
  return qp_factory::create(pd, send_cq, recv_cq, caps, ops);
}

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
