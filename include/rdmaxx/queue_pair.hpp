/// \file
/// rdmaxx/queue_pair.hpp: reliable-connected QueuePair (ibv_create_qp_ex(3), ibv_modify_qp(3)),
/// its connection and post_recv. Its send batch is SendBatch (send_batch.hpp), its peer's address
/// an endpoint (endpoint.hpp); both come with this header.
///
/// Lifetime: borrows its ProtectionDomain and both CompletionQueues (destroy the QP first).
/// Type-2 memory windows bound through a QP count as its children: destroy or invalidate them
/// before the QP (rxe blocks for tens of seconds destroying a QP with a bound type-2 window: README),
/// and so does an mlx5 IndirectKey's unconfirmed configure or invalidate posted on it.
///
/// Allocation: QueuePair::create() allocates the node that counts the QP's children (new(nothrow))
/// besides what verbs allocates; the fast path (SendBatch, post_recv) and the connection calls do
/// not allocate.
#pragma once

#include "access.hpp"
#include "completion_queue.hpp"
#include "detail/flags.hpp"
#include "detail/handle.hpp"
#include "detail/sq_credit.hpp"
#include "error.hpp"
#include "protection_domain.hpp"
#include "endpoint.hpp"
#include "send_batch.hpp"
#include "work_request.hpp"

#if RDMAXX_HAVE_MLX5
#include <infiniband/mlx5dv.h>
#endif

#include <time.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace rdmaxx {

namespace detail {
// ibv_destroy_qp, then the QP's send-queue credit (rdmaxx's qp_context: only a counted QP has
// one, detail::sq_credit): QueuePair's deleter.
inline int destroy_qp(ibv_qp *q) noexcept {
  void *credit = q->qp_context;
  const int rc = ::ibv_destroy_qp(q);
  if (rc == 0) sq_credit::free(credit);
  return rc;
}
} // namespace detail

namespace detail {
struct qp_access; // after QueuePair
} // namespace detail

/// Send operations a QP is created with (IBV_QP_EX_WITH_*).
enum class send_op : std::uint64_t {
  rdma_write = IBV_QP_EX_WITH_RDMA_WRITE,
  rdma_write_imm = IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
  send = IBV_QP_EX_WITH_SEND,
  send_imm = IBV_QP_EX_WITH_SEND_WITH_IMM,
  rdma_read = IBV_QP_EX_WITH_RDMA_READ,
  atomic_cmp_swp = IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
  atomic_fetch_add = IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
  local_inv = IBV_QP_EX_WITH_LOCAL_INV,
  bind_mw = IBV_QP_EX_WITH_BIND_MW,
  send_inv = IBV_QP_EX_WITH_SEND_WITH_INV,
};
RDMAXX_FLAGS_OPERATORS(send_op)
/// A set of send operations; native() is the IBV_QP_EX_WITH_* mask.
using send_ops = flags<send_op>;

/// Every operation the rdmaxx features need (the default).
inline constexpr send_ops all_send_ops =
    send_op::rdma_write | send_op::rdma_write_imm | send_op::send | send_op::send_imm |
    send_op::rdma_read | send_op::atomic_cmp_swp | send_op::atomic_fetch_add |
    send_op::local_inv | send_op::bind_mw | send_op::send_inv;

/// Queue sizes of a QP (struct ibv_qp_cap).
struct qp_caps {
  /// Outstanding send work requests.
  std::uint32_t max_send_wr = 64;
  /// Outstanding receive work requests.
  std::uint32_t max_recv_wr = 64;
  /// Scatter/gather entries per send work request.
  std::uint32_t max_send_sge = 4;
  /// Scatter/gather entries per receive work request.
  std::uint32_t max_recv_sge = 4;
  /// Bytes one send can carry inline (IBV_SEND_INLINE).
  std::uint32_t max_inline_data = 64;
};

/// connect_options::gid_index value that selects the GID by type (the default).
inline constexpr int gid_auto = -1;

/// The local side's choices for a connection.
struct connect_options {
  /// Port number (1-based).
  std::uint8_t port = 1;
  /// Source GID index; gid_auto (the default): chosen by type (detail::select_gid_index: the
  /// RoCE v2 GID of the port's IPv4 address, then IPv6; InfiniBand: LID addressing).
  int gid_index = gid_auto;
  ibv_mtu mtu = IBV_MTU_1024;   ///< the smaller of this and the peer's mtu is used
  std::uint32_t psn = 0;        ///< our send PSN
  std::uint8_t timeout = 14;    ///< 4.096 us * 2^timeout
  /// Transport retries before an error completion (0..7).
  std::uint8_t retry_cnt = 7;
  /// Retries after receiver-not-ready (0..7; 7: without limit).
  std::uint8_t rnr_retry = 7;
  /// Receiver-not-ready delay code this side asks for (0..31).
  std::uint8_t min_rnr_timer = 12;
  /// Outstanding RDMA reads and atomics this QP initiates.
  std::uint8_t max_rd_atomic = 1;
  /// Outstanding RDMA reads and atomics this QP accepts as target.
  std::uint8_t max_dest_rd_atomic = 1;
  /// Remote operations this QP accepts as a target: access::remote_write, remote_read,
  /// remote_atomic (and local_write); to_init() refuses any other right.
  access_flags qp_access = access::local_write | access::remote_write | access::remote_read |
                           access::remote_atomic;
};

namespace detail {
// The verbs attributes of every rdmaxx RC QP (QueuePair::create and mlx5::create_umr_qp).
[[nodiscard]] inline ibv_qp_init_attr_ex rc_qp_init_attr(ibv_pd *pd, ibv_cq *send_cq, ibv_cq *recv_cq,
                                                         const qp_caps &caps, send_ops ops) noexcept {
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_RC;
  a.send_cq = send_cq;
  a.recv_cq = recv_cq;
  a.cap = {caps.max_send_wr, caps.max_recv_wr, caps.max_send_sge, caps.max_recv_sge,
           caps.max_inline_data};
  a.pd = pd;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.send_ops_flags = ops.native();
  return a;
}

#if RDMAXX_HAVE_MLX5
// The mlx5dv attributes of every rdmaxx RC QP on mlx5 (mlx5dv_create_qp): scatter-to-CQE
// disabled. rdma-core 44 turns it on by default (verbs.c:2330-2331, use_scatter_to_cqe) and then
// copies a small receive or read response itself to the SGE's address taken as a pointer
// (cq.c:237-242, 778-783), which a zero-based SGE (an mlx5 IndirectKey's sges()) is not;
// DISABLE_SCATTER_TO_CQE clears the flag (verbs.c:2370-2379) on the same creation path as
// ibv_create_qp_ex (create_qp, verbs.c:3327-3338).
[[nodiscard]] inline mlx5dv_qp_init_attr rc_dv_attr() noexcept {
  mlx5dv_qp_init_attr dv{};
  dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
  dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
  return dv;
}
#endif

// A QueuePair's ibv_qp_ex and the posting pointer its batches start on, neither ever null:
// both &null_qp while the QueuePair is null (default-constructed, moved from, destroyed); the
// posting pointer is the QP only while rdmaxx has moved it to RTS or a later state (SQD, SQE,
// ERR: a post in ERR is flushed, which drain markers rely on), &unready_qp before (RESET, INIT,
// RTR). So neither start_send() nor submit() tests anything (send_batch.hpp, null_qp). Set from
// verbs' qp->state when the QP is adopted (reset()), then by rdmaxx's transitions (set_state()):
// a raw ibv_modify_qp on native_handle() is not seen.
class qpx_ptr {
public:
  constexpr qpx_ptr() noexcept = default;
  qpx_ptr(qpx_ptr &&o) noexcept
      : p_(std::exchange(o.p_, &null_qp)), post_(std::exchange(o.post_, &null_qp)) {}
  qpx_ptr &operator=(qpx_ptr &&o) noexcept {
    p_ = std::exchange(o.p_, &null_qp);
    post_ = std::exchange(o.post_, &null_qp);
    return *this;
  }
  /// The QP's ibv_qp_ex, or nullptr when null.
  [[nodiscard]] ibv_qp_ex *get() const noexcept { return p_ == &null_qp ? nullptr : p_; }
  /// The QP's ibv_qp_ex, or &null_qp when null.
  [[nodiscard]] ibv_qp_ex *owner() const noexcept { return p_; }
  /// What a batch starts on: the QP's ibv_qp_ex while it may post, else a stand-in.
  [[nodiscard]] ibv_qp_ex *post() const noexcept { return post_; }
  ibv_qp_ex *release() noexcept {
    ibv_qp_ex *p = get();
    p_ = post_ = &null_qp;
    return p;
  }
  void reset(ibv_qp_ex *p) noexcept {
    p_ = p ? p : &null_qp;
    post_ = &null_qp;
    if (p) set_state(p->qp_base.state);
  }
  /// After a successful transition to `s` (rdmaxx's ibv_modify_qp).
  void set_state(ibv_qp_state s) noexcept {
    if (p_ != &null_qp) post_ = s >= IBV_QPS_RTS ? p_ : &unready_qp;
  }

private:
  ibv_qp_ex *p_ = &null_qp;
  ibv_qp_ex *post_ = &null_qp;
};

// rxe reports vendor id 0xFFFFFF (RXE_VENDOR_ID in the kernel driver); asked once per QP creation.
[[nodiscard]] inline bool has_sge_list_defect(ibv_context *ctx) noexcept {
  ibv_device_attr a{};
  return ctx && ::ibv_query_device(ctx, &a) == 0 && a.vendor_id == 0xFFFFFF;
}
} // namespace detail


/// A reliable-connected queue pair (ibv_create_qp_ex(3)) with the extended send API.
/// Move-only, null after move; ibv_destroy_qp on destruction (withheld and reported while bound
/// type-2 windows are alive).
class QueuePair {
public:
  QueuePair() noexcept = default;

  /// ibv_create_qp_ex: an RC QP on `pd` with the given CQs, queue sizes and send operations. On
  /// an mlx5 device (build with the mlx5 option) mlx5dv_create_qp instead, with scatter-to-CQE
  /// disabled (MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE, see scatter_to_cqe_disabled()).
  /// \errors
  /// - errc::null_handle: `pd` or a CQ is null.
  /// - errc::context_mismatch: CQs of another device context.
  /// - the errno of ibv_create_qp_ex / mlx5dv_create_qp (EINVAL: caps above the device limits,
  ///   EOPNOTSUPP: send ops the provider lacks, ENOMEM).
  /// \mallocs One node that counts the QP's children (new(nothrow)), besides what verbs
  /// allocates.
  [[nodiscard]] static result<QueuePair> create(const ProtectionDomain &pd,
                                                const CompletionQueue &send_cq,
                                                const CompletionQueue &recv_cq, qp_caps caps = {},
                                                send_ops ops = all_send_ops) noexcept;

  /// The ibv_qp (owned: do not destroy it), or nullptr. Move the QP between states through
  /// rdmaxx (to_init(), to_rts(), to_error(), ...; a Connection's rdma_cm transitions): SendBatch
  /// posts only while rdmaxx has moved it to RTS or later, and a raw ibv_modify_qp on this
  /// handle is not seen by posting (README, "The fast path as users build it").
  [[nodiscard]] ibv_qp *native_handle() const noexcept { return h_.get(); }
  /// The same QP as ibv_qp_ex (ibv_qp_to_qp_ex), for the ibv_wr_* API.
  [[nodiscard]] ibv_qp_ex *native_handle_ex() const noexcept { return qpx_.get(); }
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The QP number, or 0 when null.
  [[nodiscard]] std::uint32_t qp_num() const noexcept { return h_ ? h_.get()->qp_num : 0; }
  /// The PD the QP was created on, or nullptr when null.
  [[nodiscard]] ibv_pd *pd() const noexcept { return h_ ? h_.get()->pd : nullptr; }
  /// The capacities the provider actually granted (may exceed what was asked).
  [[nodiscard]] const qp_caps &caps() const noexcept { return caps_; }
  /// The mlx5dv send operations (MLX5DV_QP_EX_WITH_*) the QP was created with: 0 unless it was
  /// created by mlx5::create_umr_qp (mlx5/umr_qp.hpp); 0 when null.
  [[nodiscard]] std::uint64_t mlx5_send_ops() const noexcept { return h_ ? mlx5_send_ops_ : 0; }
  /// True when rdmaxx created the QP on mlx5 with scatter-to-CQE disabled (every QueuePair::create
  /// and mlx5::create_umr_qp there): zero-based SGEs (an mlx5 IndirectKey's sges()) may be posted
  /// on it. False elsewhere (no other provider scatters to the CQE) and when null.
  [[nodiscard]] bool scatter_to_cqe_disabled() const noexcept { return h_ && no_scatter_to_cqe_; }

  // ---- fast path (bodies in the class, as measured: README "Benchmarks") ----

  /// Open a send batch (ibv_wr_start). On a null QP (moved from, destroyed) the batch is not
  /// open: its operations are ignored and its submit() answers errc::null_handle.
  [[nodiscard]] SendBatch start_send() noexcept {
    return detail::batch_access::open(qpx_.post(), qpx_.owner(), sge_list_defect_);
  }

  /// Work requests the send queue takes now, on a QP whose send queue rdmaxx counts (an mlx5 UMR
  /// QP, mlx5::create_umr_qp: rdma-core 44's builders would write a full queue's work request
  /// into the last one posted, see detail/sq_credit.hpp); UINT32_MAX on any other QP (not
  /// counted: the fast path pays nothing) and when null. Hand the send completions back
  /// (retire()) for the room to come back.
  [[nodiscard]] std::uint32_t send_queue_room() const noexcept {
    const detail::sq_credit *c = detail::sq_credit::of(h_.get());
    if (!c) return UINT32_MAX;
    const std::uint32_t used = c->used();
    return used < c->max_post ? c->max_post - used : 0;
  }
  /// Hand a send completion of this QP back to its counted send queue: a successful one retires
  /// its work request (the earliest outstanding one with its wr_id) and every earlier one (RC
  /// completes in order); error completions and other QPs' are ignored (after an error,
  /// to_reset() gives every credit back). An IndirectKey's complete() retires its own operation.
  /// The operation of an mlx5 IndirectKey destroyed while it was unconfirmed is settled here
  /// once retired (its own completion, or any later one), and its deferred destruction runs
  /// (mlx5dv_destroy_mkey). Returns true when room came back; false on a QP that is not
  /// counted. Inline, allocation-free (a deferred destruction frees what the key held).
  bool retire(const ibv_wc &wc) noexcept {
    detail::sq_credit *c = detail::sq_credit::of(h_.get());
    return c && wc.qp_num == h_.get()->qp_num && c->retire(wc);
  }

  /// ibv_post_recv of one receive with the caller's SGEs.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - the errno of ibv_post_recv (ENOMEM: receive queue full, EINVAL: too many SGEs or bad
  ///   state).
  /// \mallocs None.
  result<void> post_recv(std::uint64_t wr_id, std::span<const ibv_sge> sges) noexcept {
    return post_recv(wr_id, sges.data(), sges.size());
  }
  /// ibv_post_recv of one receive with a single SGE.
  /// \errors
  /// - those of post_recv() with SGEs.
  /// \mallocs None.
  result<void> post_recv(std::uint64_t wr_id, const ibv_sge &sge) noexcept { return post_recv(wr_id, &sge, 1); }

  // ---- connection ----

  /// Our side of the connection, to send to the peer (encode() it): ibv_query_port and the GID
  /// of o.gid_index (gid_auto: chosen by type, see detail::select_gid_index; ibv_query_gid_ex).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::no_device: gid_auto found no usable GID.
  /// - the errno of the queries.
  /// \mallocs None.
  [[nodiscard]] result<endpoint> local_endpoint(const connect_options &o = {}) const noexcept;

  /// ibv_modify_qp RESET->INIT.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::unknown_access_flag: a bit in o.qp_access other than local write and remote
  ///   write/read/atomic (rxe would store it).
  /// - qp_transition codes naming the attribute blamed.
  /// \mallocs None.
  result<void> to_init(const connect_options &o = {}) noexcept;
  /// ibv_modify_qp INIT->RTR towards `remote`, from the GID o.gid_index names (gid_auto: by
  /// type). On an InfiniBand port with a peer LID the path uses the LID (no GRH).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::no_device: gid_auto found no usable GID.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_rtr(const endpoint &remote, const connect_options &o = {}) noexcept;
  /// ibv_modify_qp RTR->RTS.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_rts(const connect_options &o = {}) noexcept;
  /// RESET->INIT->RTR->RTS towards `remote`; remembered for reconnect().
  /// \errors
  /// - those of to_init(), to_rtr() and to_rts().
  /// \mallocs None.
  result<void> connect(const endpoint &remote, const connect_options &o = {}) noexcept;
  /// Move to RESET (from any state, typically ERR after a failed work request: outstanding work
  /// is flushed, poll it away) and connect again to the remembered peer. The peer must be reset
  /// and reconnected too if it went to ERR. A QP found back in ERR after the reset (rxe on Linux
  /// 6.12 finishes a failed request after the reset: docs/kernels.md) is reset again, up to three
  /// times in all, 1 and 2 ms apart.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::wrong_state: never connected.
  /// - errc::busy: as to_reset() (nothing was changed).
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> reset_and_reconnect() noexcept;
  /// ibv_modify_qp to RESET (a state change, like to_init(): the QP is not destroyed). A counted
  /// send queue (send_queue_room()) gets all its room back, as the provider's does.
  ///
  /// A UMR QP (mlx5::create_umr_qp) with an unconfirmed mlx5 IndirectKey configure or invalidate
  /// posted on it is not reset: RESET drops the QP's unpolled completions (mlx5_cq_clean,
  /// verbs.c:3019-3026 of rdma-core v44.0) and the operation's own completion is the only thing
  /// that says whether the device ran it (a configure may have made the mkey live). rdmaxx
  /// answers errc::busy rather than guess: hand the operation's completion to the key first. In
  /// ERR every outstanding work request completes (flushed: not run), so after an error
  /// completion, or to give up on an operation (to_error()), poll the CQ and hand the
  /// completions to the keys (IndirectKey::complete, CompletionDispatcher): the flushed one
  /// rolls the operation back, and the reset then goes through. The operation of a key
  /// destroyed meanwhile does not hold the reset: the reset settles it (the key's deferred
  /// destruction runs, see IndirectKey).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::busy: an mlx5 key operation posted on this UMR QP is unconfirmed (nothing changed).
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_reset() noexcept;
  /// ibv_modify_qp to ERR (flushes outstanding work).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_error() noexcept;
  /// The state as the device reports it (ibv_query_qp).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - the errno of ibv_query_qp.
  /// \mallocs None.
  [[nodiscard]] result<ibv_qp_state> state() const noexcept;
  /// The peer given to the last successful connect().
  [[nodiscard]] const endpoint &remote() const noexcept { return remote_; }

  /// Destroy now (ibv_destroy_qp). On failure the QP stays valid.
  /// \errors
  /// - errc::busy: type-2 windows bound through this QP are alive, or an mlx5 IndirectKey's
  ///   configure or invalidate posted on it is unconfirmed.
  /// - the errno of ibv_destroy_qp.
  /// \mallocs None.
  result<void> destroy() noexcept;
  /// Type-2 windows bound through this QP and not yet invalidated or deallocated, and unconfirmed
  /// mlx5 key operations posted on it.
  [[nodiscard]] std::uint32_t live_children() const noexcept { return h_.live_children(); }

private:
  // Both post_recv forms, by pointer and count: constructing a std::span of a new element type
  // costs every TU that includes this header (libstdc++'s contiguous_iterator check).
  // fast path
  result<void> post_recv(std::uint64_t wr_id, const ibv_sge *sges, std::size_t n) noexcept {
    if (!h_) [[unlikely]] return make_error_code(errc::null_handle);
    ibv_recv_wr w{};
    w.wr_id = wr_id;
    w.sg_list = const_cast<ibv_sge *>(sges);
    w.num_sge = int(n);
    ibv_recv_wr *bad = nullptr;
    if (const int rc = ::ibv_post_recv(h_.get(), &w, &bad)) [[unlikely]] return errno_code(rc);
    return success();
  }

  // The one construction path of every QueuePair: checks, the child node, the CQ links, the
  // granted caps. `create(ctx, attr)` is the creation verb (ibv_create_qp_ex, or
  // mlx5dv_create_qp for mlx5::create_umr_qp); `mlx5_ops` records the mlx5dv send operations it
  // was given.
  template <class Create>
  [[nodiscard]] static result<QueuePair> create_with(const ProtectionDomain &pd,
                                                     const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq, qp_caps caps,
                                                     send_ops ops, std::uint64_t mlx5_ops,
                                                     Create &&create) noexcept;

#if RDMAXX_HAVE_MLX5
  // QueuePair::create on mlx5: `verb` is mlx5dv_create_qp (contract tests hand a stand-in).
  template <class Verb>
  [[nodiscard]] static result<QueuePair> create_mlx5(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq, qp_caps caps, send_ops ops,
                                                     Verb verb) noexcept;
#endif

  // Parents: the PD, the send CQ, the receive CQ.
  using traits = detail::deleter<ibv_qp, detail::destroy_qp, "QueuePair", "ibv_destroy_qp", 3>;

  [[nodiscard]] result<int> gid_index_for(const connect_options &o) const noexcept;

  [[nodiscard]] ibv_qp_state current_state() const noexcept;

  result<void> modify(ibv_qp_attr &a, int mask, ibv_qp_state from, const connect_options &o) noexcept;

  // After each successful transition rdmaxx makes: what its batches may post (detail::qpx_ptr)
  // and, on a QP whose send queue is counted, the credit routed again: rdma-core >= 40 rewrites
  // wr_complete at every state change (detail/sq_credit.hpp). Nothing else for other QPs.
  void transitioned(ibv_qp_state s) noexcept {
    qpx_.set_state(s);
    if (detail::sq_credit::of(h_.get())) [[unlikely]] detail::sq_credit::reroute(qpx_.get());
  }

  // Which attribute of a refused transition is out of the device's limits. Cold: only on failure.
  [[gnu::cold]] int diagnose(const ibv_qp_attr &a, int mask, const connect_options &o) const noexcept;

  friend struct detail::handle_access; // children register with this object's node
  friend struct detail::qp_access;     // special QPs built on this construction path (mlx5)
  friend struct detail::test_access;
  detail::handle<traits> h_; // parents: PD, send CQ, receive CQ
  detail::qpx_ptr qpx_;
  qp_caps caps_{};
  endpoint remote_{};
  connect_options opts_{};
  std::uint64_t mlx5_send_ops_ = 0; // MLX5DV_QP_EX_WITH_*: set only by mlx5::create_umr_qp
  bool connected_once_ = false;
  bool sge_list_defect_ = false; // rxe: see SendBatch
  bool no_scatter_to_cqe_ = false; // mlx5: created with MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
  // The transitions' verb: ibv_modify_qp (contract tests hand a stand-in that behaves as the
  // provider, detail::test_access).
  int (*modify_)(ibv_qp *, ibv_qp_attr *, int) = &::ibv_modify_qp;
};

namespace detail {
/// What the creators of special QPs built on QueuePair (mlx5::create_umr_qp, mlx5/umr_qp.hpp)
/// reach of it, instead of being its friends: its one construction path and the mlx5 flag.
struct qp_access {
  /// QueuePair's construction path (checks, children node, CQ links, granted caps) through the
  /// creation verb `create(ctx, attr)`; `mlx5_ops`: the mlx5dv send operations it was given.
  template <class Create>
  [[nodiscard]] static result<QueuePair> create_with(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq, qp_caps caps, send_ops ops,
                                                     std::uint64_t mlx5_ops, Create &&create) noexcept {
    return QueuePair::create_with(pd, send_cq, recv_cq, caps, ops, mlx5_ops, std::forward<Create>(create));
  }
  /// Records that the QP was created with MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE.
  static void set_no_scatter_to_cqe(QueuePair &q) noexcept { q.no_scatter_to_cqe_ = true; }
  /// Records a transition to `s` made outside QueuePair (Connection's rdma_cm INIT/RTR/RTS):
  /// what its batches may post (detail::qpx_ptr), and a counted send queue routed again.
  static void note_state(QueuePair &q, ibv_qp_state s) noexcept { q.transitioned(s); }
};
} // namespace detail

// ---- QueuePair: the longer bodies ----

inline result<QueuePair> QueuePair::create(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                           const CompletionQueue &recv_cq, qp_caps caps, send_ops ops) noexcept {
#if RDMAXX_HAVE_MLX5
  if (pd && ::mlx5dv_is_supported(pd.context()->device))
    return create_mlx5(pd, send_cq, recv_cq, caps, ops, &::mlx5dv_create_qp);
#endif
  return create_with(pd, send_cq, recv_cq, caps, ops, 0,
                     [](ibv_context *c, ibv_qp_init_attr_ex &a) noexcept {
                       return ::ibv_create_qp_ex(c, &a);
                     });
}

inline result<endpoint> QueuePair::local_endpoint(const connect_options &o) const noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  ibv_context *ctx = h_.get()->context;
  ibv_port_attr pa{};
  if (const int rc = ::ibv_query_port(ctx, o.port, &pa)) return errno_code(rc);
  endpoint e;
  RDMAXX_TRY(gid_index, gid_index_for(o));
  if (::ibv_query_gid(ctx, o.port, gid_index, &e.gid)) return last_errno();
  e.qpn = qp_num();
  e.psn = o.psn & 0xffffff;
  e.lid = pa.lid;
  e.mtu = o.mtu < pa.active_mtu ? o.mtu : pa.active_mtu;
  return e;
}

inline result<void> QueuePair::to_init(const connect_options &o) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (!o.qp_access.subset_of(access::local_write | access::remote_write | access::remote_read |
                             access::remote_atomic))
    return make_error_code(errc::unknown_access_flag);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = o.port;
  a.qp_access_flags = o.qp_access.native();
  return modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                IBV_QPS_RESET, o);
}

inline result<void> QueuePair::to_rtr(const endpoint &remote, const connect_options &o) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  RDMAXX_TRY(gid_index, gid_index_for(o));
  ibv_port_attr pa{};
  const bool ib = ::ibv_query_port(h_.get()->context, o.port, &pa) == 0 &&
                  pa.link_layer == IBV_LINK_LAYER_INFINIBAND && remote.lid != 0;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = o.mtu < remote.mtu ? o.mtu : remote.mtu;
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = o.max_dest_rd_atomic;
  a.min_rnr_timer = o.min_rnr_timer;
  a.ah_attr.port_num = o.port;
  a.ah_attr.dlid = remote.lid;
  a.ah_attr.is_global = ib ? 0 : 1;
  a.ah_attr.grh.dgid = remote.gid;
  a.ah_attr.grh.sgid_index = std::uint8_t(gid_index);
  a.ah_attr.grh.hop_limit = 64;
  return modify(a,
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                IBV_QPS_INIT, o);
}

inline result<void> QueuePair::to_rts(const connect_options &o) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = o.timeout;
  a.retry_cnt = o.retry_cnt;
  a.rnr_retry = o.rnr_retry;
  a.sq_psn = o.psn & 0xffffff;
  a.max_rd_atomic = o.max_rd_atomic;
  return modify(a,
                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                IBV_QPS_RTR, o);
}

inline result<void> QueuePair::connect(const endpoint &remote, const connect_options &o) noexcept {
  RDMAXX_TRYV(to_init(o));
  RDMAXX_TRYV(to_rtr(remote, o));
  RDMAXX_TRYV(to_rts(o));
  remote_ = remote;
  opts_ = o;
  connected_once_ = true;
  return success();
}

inline result<void> QueuePair::reset_and_reconnect() noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (!connected_once_) return make_error_code(errc::wrong_state);
  // rxe on Linux 6.12 finishes a failed request on a workqueue, which can run after the reset and
  // move the QP back to ERR: RESET->INIT then fails with EINVAL (docs/kernels.md; 2 of 300
  // reconnects right after a remote error, never on 6.1). Found back in ERR: reset again, at
  // most three times in all, a millisecond or two apart (that work is then done).
  for (int attempt = 1;; ++attempt) {
    RDMAXX_TRYV(to_reset());
    auto r = connect(remote_, opts_);
    if (r || attempt == 3 || current_state() != IBV_QPS_ERR) return r;
    const timespec pause{0, attempt * 1'000'000L};
    ::nanosleep(&pause, nullptr);
  }
}

inline result<void> QueuePair::to_reset() noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (const auto *c = detail::sq_credit::of(h_.get()); c && c->key_ops.load(detail::order::acquire) != 0)
    return make_error_code(errc::busy); // RESET would drop their completions (mlx5_cq_clean)
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  if (const int rc = modify_(h_.get(), &a, IBV_QP_STATE))
    return qp_transition_error(current_state(), IBV_QPS_RESET, 0, rc);
  if (auto *c = detail::sq_credit::of(h_.get())) c->reset(); // so does the provider's queue
  transitioned(IBV_QPS_RESET);
  return success();
}

inline result<void> QueuePair::to_error() noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (const int rc = modify_(h_.get(), &a, IBV_QP_STATE))
    return qp_transition_error(current_state(), IBV_QPS_ERR, 0, rc);
  transitioned(IBV_QPS_ERR);
  return success();
}

inline result<ibv_qp_state> QueuePair::state() const noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (const int rc = ::ibv_query_qp(h_.get(), &a, IBV_QP_STATE, &ia)) return errno_code(rc);
  return a.qp_state;
}

inline result<void> QueuePair::destroy() noexcept {
  RDMAXX_TRYV(h_.destroy());
  qpx_.release();
  return success();
}

template <class Create>
inline result<QueuePair> QueuePair::create_with(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                const CompletionQueue &recv_cq, qp_caps caps, send_ops ops,
                                                std::uint64_t mlx5_ops, Create &&create) noexcept {
  if (!pd || !send_cq || !recv_cq) return make_error_code(errc::null_handle);
  if (send_cq.native_handle()->context != pd.context() ||
      recv_cq.native_handle()->context != pd.context())
    return make_error_code(errc::context_mismatch);
  ibv_qp_init_attr_ex a = detail::rc_qp_init_attr(pd.native_handle(), send_cq.native_handle(),
                                                  recv_cq.native_handle(), caps, ops);
  detail::handle<traits> h;
  if (auto ec = detail::create_with_node(h, detail::handle_access::node(pd), [&] {
        return create(pd.context(), a);
      }))
    return ec;
  ibv_qp *qp = h.get();
  QueuePair r;
  r.h_ = std::move(h);
  r.h_.set_parent<detail::parent_slot::second>(detail::handle_access::node(send_cq));
  r.h_.set_parent<detail::parent_slot::third>(detail::handle_access::node(recv_cq));
  r.qpx_.reset(::ibv_qp_to_qp_ex(qp));
  r.caps_ = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
             a.cap.max_inline_data};
  r.mlx5_send_ops_ = mlx5_ops;
  r.sge_list_defect_ = detail::has_sge_list_defect(pd.context());
  return r;
}

#if RDMAXX_HAVE_MLX5
template <class Verb>
inline result<QueuePair> QueuePair::create_mlx5(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                const CompletionQueue &recv_cq, qp_caps caps, send_ops ops,
                                                Verb verb) noexcept {
  mlx5dv_qp_init_attr dv = detail::rc_dv_attr();
  auto r = create_with(pd, send_cq, recv_cq, caps, ops, 0,
                       [&dv, verb](ibv_context *c, ibv_qp_init_attr_ex &a) noexcept { return verb(c, &a, &dv); });
  if (r) r.value().no_scatter_to_cqe_ = true;
  return r;
}
#endif

inline result<int> QueuePair::gid_index_for(const connect_options &o) const noexcept {
  if (o.gid_index != gid_auto) return o.gid_index;
  return detail::select_gid_index(h_.get()->context, o.port);
}

inline ibv_qp_state QueuePair::current_state() const noexcept {
  auto s = state();
  return s ? s.value() : IBV_QPS_UNKNOWN;
}

inline result<void> QueuePair::modify(ibv_qp_attr &a, int mask, ibv_qp_state from,
                                      const connect_options &o) noexcept {
  if (const int rc = modify_(h_.get(), &a, mask)) [[unlikely]]
    return qp_transition_error(from, a.qp_state, diagnose(a, mask, o), rc);
  transitioned(a.qp_state);
  return success();
}

inline int QueuePair::diagnose(const ibv_qp_attr &a, int mask, const connect_options &o) const noexcept {
  ibv_context *ctx = h_.get()->context;
  ibv_device_attr da{};
  ibv_port_attr pa{};
  const bool have_dev = ::ibv_query_device(ctx, &da) == 0;
  const bool have_port = ::ibv_query_port(ctx, o.port, &pa) == 0;
  auto bit = [](int flag) { return __builtin_ctz(unsigned(flag)); };
  if (!have_port || (have_dev && (o.port == 0 || o.port > da.phys_port_cnt)))
    return mask & IBV_QP_PORT ? bit(IBV_QP_PORT) : bit(IBV_QP_AV);
  if (mask & IBV_QP_STATE) {
    const ibv_qp_state cur = current_state();
    const ibv_qp_state expect =
        a.qp_state == IBV_QPS_INIT ? IBV_QPS_RESET
        : a.qp_state == IBV_QPS_RTR ? IBV_QPS_INIT
        : a.qp_state == IBV_QPS_RTS ? IBV_QPS_RTR : cur;
    if (cur != expect && !(a.qp_state == IBV_QPS_INIT && cur == IBV_QPS_INIT)) return bit(IBV_QP_STATE);
  }
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (a.qp_access_flags & ~unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
    return bit(IBV_QP_ACCESS_FLAGS);
  if ((mask & IBV_QP_PKEY_INDEX) && have_port && a.pkey_index >= pa.pkey_tbl_len)
    return bit(IBV_QP_PKEY_INDEX);
  if (mask & IBV_QP_AV) {
    if (have_port && a.ah_attr.is_global && int(a.ah_attr.grh.sgid_index) >= pa.gid_tbl_len)
      return bit(IBV_QP_AV);
    ibv_gid g{};
    if (a.ah_attr.is_global &&
        ::ibv_query_gid(ctx, o.port, a.ah_attr.grh.sgid_index, &g) == 0) {
      bool zero = true;
      for (auto b : g.raw) zero = zero && b == 0;
      if (zero) return bit(IBV_QP_AV);
    }
  }
  if ((mask & IBV_QP_PATH_MTU) && have_port &&
      (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096 || a.path_mtu > pa.max_mtu))
    return bit(IBV_QP_PATH_MTU);
  if ((mask & IBV_QP_DEST_QPN) && (a.dest_qp_num == 0 || a.dest_qp_num > 0xffffff))
    return bit(IBV_QP_DEST_QPN);
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && have_dev && a.max_dest_rd_atomic > da.max_qp_rd_atom)
    return bit(IBV_QP_MAX_DEST_RD_ATOMIC);
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && have_dev && a.max_rd_atomic > da.max_qp_init_rd_atom)
    return bit(IBV_QP_MAX_QP_RD_ATOMIC);
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return bit(IBV_QP_MIN_RNR_TIMER);
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return bit(IBV_QP_TIMEOUT);
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return bit(IBV_QP_RETRY_CNT);
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return bit(IBV_QP_RNR_RETRY);
  return -1;
}

namespace detail {
// For calls that add to a caller's batch: it must be open (errc::wrong_state: submitted, moved
// from) and belong to `qp` (errc::qp_mismatch).
[[nodiscard]] inline std::error_code check_batch_of(const SendBatch &b, const QueuePair &qp) noexcept {
  if (!b.native_handle()) return make_error_code(errc::wrong_state);
  if (b.native_handle() != qp.native_handle_ex()) return make_error_code(errc::qp_mismatch);
  return {};
}
} // namespace detail

/// Connect two QPs of one device to each other (loopback), both with options `o` (each uses its
/// own local endpoint).
/// \errors
/// - those of local_endpoint() and connect().
/// \mallocs None.
inline result<void> connect_loopback(QueuePair &a, QueuePair &b, const connect_options &o = {}) noexcept {
  RDMAXX_TRY(ea, a.local_endpoint(o));
  RDMAXX_TRY(eb, b.local_endpoint(o));
  RDMAXX_TRYV(a.connect(eb, o));
  return b.connect(ea, o);
}

} // namespace rdmaxx
