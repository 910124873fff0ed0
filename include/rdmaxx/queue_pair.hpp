/// \file
/// rdmaxx/queue_pair.hpp: reliable-connected QueuePair (ibv_create_qp_ex(3), ibv_modify_qp(3)),
/// its connection, and the send batch (ibv_wr_start(3) .. ibv_wr_complete) and post_recv.
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
#include "remote_descriptor.hpp" // descriptor_header (endpoint encoding)
#include "work_request.hpp"

#if RDMAXX_HAVE_MLX5
#include <infiniband/mlx5dv.h>
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace rdmaxx {

namespace mlx5 {
struct qp_factory; // mlx5/umr_qp.hpp: builds UMR QPs on QueuePair's construction path
} // namespace mlx5

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

/// What a peer needs to connect to a QP: exchange it out of band, as encode()'s bytes.
///
/// Encoding: kind 3 (descriptor_kind::endpoint) under the common 8-byte descriptor header of
/// remote_descriptor.hpp, then a 28-byte body (36 bytes in all), big-endian:
/// ```
///        8    4 qpn           1 .. 0xffffff
///       12    4 psn           0 .. 0xffffff
///       16   16 gid           the port's GID (RoCE: the address the peer sends to)
///       32    2 lid           InfiniBand LID (0 on RoCE)
///       34    1 mtu           ibv_mtu, 1 (256) .. 5 (4096)
///       35    1 reserved      0
/// ```
struct endpoint {
  /// Encoded bytes of an endpoint body.
  static constexpr std::size_t body_size = 28;
  /// Encoded bytes of a whole endpoint (header and body: 36).
  static constexpr std::size_t encoded_size = descriptor_header::size + body_size;

  /// QP number.
  std::uint32_t qpn = 0;
  /// Initial send PSN (24 bits): the receive PSN the peer expects.
  std::uint32_t psn = 0;
  /// GID of the port (required on RoCE).
  ibv_gid gid{};
  /// LID of the port (InfiniBand; 0 on RoCE).
  std::uint16_t lid = 0;
  /// Path MTU this side can use.
  ibv_mtu mtu = IBV_MTU_1024;

  /// The 36-byte encoding (layout above). Never fails.
  [[nodiscard]] std::array<std::byte, encoded_size> encode() const noexcept {
    std::array<std::byte, encoded_size> out{};
    detail::wire_writer w(out);
    descriptor_header{descriptor_version, std::uint8_t(descriptor_kind::endpoint), body_size}.write(w);
    w.u32(qpn);
    w.u32(psn);
    for (auto b : gid.raw) w.u8(b);
    w.u16(lid);
    w.u8(std::uint8_t(mtu));
    w.u8(0);
    return out;
  }
  /// Decode exactly one endpoint; `in` must be exactly encoded_size bytes.
  /// \errors
  /// - errc::malformed_input: truncated, wrong magic or body length, qpn 0 or above 24 bits, psn
  ///   above 24 bits, an mtu outside 256..4096, reserved byte set.
  /// - descriptor_trailing_error() (malformed_input in descriptor_category()): bytes after a
  ///   complete endpoint; the message points to descriptor_header::peek().
  /// - errc::wrong_version: another encoding version.
  /// - descriptor_kind_error() (wrong_type in descriptor_category()): a valid header of another
  ///   kind; the message names the kind expected and the kind found.
  /// \mallocs None.
  [[nodiscard]] static result<endpoint> decode(std::span<const std::byte> in) noexcept {
    RDMAXX_TRY(h, descriptor_header::peek(in));
    if (h.kind != std::uint8_t(descriptor_kind::endpoint))
      return descriptor_kind_error(std::uint8_t(descriptor_kind::endpoint), h.kind);
    if (h.body_length == body_size && in.size() > encoded_size)
      return descriptor_trailing_error(in.size() - encoded_size);
    if (h.body_length != body_size || in.size() != encoded_size)
      return make_error_code(errc::malformed_input);
    detail::wire_reader r(in.subspan(descriptor_header::size));
    endpoint e;
    e.qpn = r.u32();
    e.psn = r.u32();
    for (auto &b : e.gid.raw) b = r.u8();
    e.lid = r.u16();
    const std::uint8_t mtu = r.u8();
    const std::uint8_t reserved = r.u8();
    if (r.failed() || r.remaining() != 0 || reserved != 0) return make_error_code(errc::malformed_input);
    if (e.qpn == 0 || e.qpn > 0xffffff || e.psn > 0xffffff || mtu < IBV_MTU_256 || mtu > IBV_MTU_4096)
      return make_error_code(errc::malformed_input);
    e.mtu = ibv_mtu(mtu);
    return e;
  }
  /// Field-wise equality.
  friend bool operator==(const endpoint &a, const endpoint &b) noexcept {
    for (std::size_t i = 0; i < sizeof a.gid.raw; ++i)
      if (a.gid.raw[i] != b.gid.raw[i]) return false;
    return a.qpn == b.qpn && a.psn == b.psn && a.lid == b.lid && a.mtu == b.mtu;
  }
};

/// connect_options::gid_index value that selects the GID by type (the default).
inline constexpr int gid_auto = -1;

namespace detail {
[[nodiscard]] inline bool gid_is_v4_mapped(const ibv_gid &g) noexcept {
  for (int i = 0; i < 10; ++i)
    if (g.raw[i] != 0) return false;
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}
[[nodiscard]] inline bool gid_is_zero(const ibv_gid &g) noexcept {
  for (auto b : g.raw)
    if (b != 0) return false;
  return true;
}
/// The GID index connect_options::gid_index == gid_auto means on `port`: on RoCE, the RoCE v2
/// GID of an IPv4 address of the port's netdev (IPv4-mapped), else a RoCE v2 GID of a global
/// IPv6 address, else any RoCE v2 GID, else the first non-zero GID; on InfiniBand index 0
/// (addressing uses the LID). Found through ibv_query_gid_ex (rdma-core 44), entry by entry.
/// \errors
/// - the errno of ibv_query_port.
/// - errc::no_device: no usable GID on the port.
/// \mallocs None.
[[nodiscard]] inline result<int> select_gid_index(ibv_context *ctx, std::uint8_t port) noexcept {
  ibv_port_attr pa{};
  if (const int rc = ::ibv_query_port(ctx, port, &pa)) return errno_code(rc);
  if (pa.link_layer == IBV_LINK_LAYER_INFINIBAND) return 0;
  int v4 = -1, v6 = -1, v2 = -1, any = -1;
  for (int i = 0; i < pa.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    if (::ibv_query_gid_ex(ctx, port, std::uint32_t(i), &e, 0) != 0) continue;
    if (gid_is_zero(e.gid)) continue;
    if (any < 0) any = i;
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    if (v2 < 0) v2 = i;
    if (gid_is_v4_mapped(e.gid)) {
      if (v4 < 0) v4 = i;
    } else if (!(e.gid.raw[0] == 0xfe && (e.gid.raw[1] & 0xc0) == 0x80) && v6 < 0) {
      v6 = i; // not link-local
    }
  }
  const int pick = v4 >= 0 ? v4 : v6 >= 0 ? v6 : v2 >= 0 ? v2 : any;
  if (pick < 0) return make_error_code(errc::no_device);
  return pick;
}
} // namespace detail

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
// rxe fails a post before RTS (EINVAL) but keeps the work requests and runs them once the QP is
// connected, so rdmaxx never posts before RTS. qp->state is verbs' own record of the last
// ibv_modify_qp (raw calls on native_handle() included).
[[nodiscard]] inline bool before_rts(const ibv_qp &qp) noexcept { return qp.state < IBV_QPS_RTS; }

// What a batch of a null QueuePair (moved from, destroyed) posts to: a stand-in ibv_qp_ex whose
// ibv_wr_* entries do nothing and whose state is RESET, so that submit() aborts it with
// errc::wrong_state. It keeps the real batch free of a null test per operation (the compiler
// sees ibv_wr_start dereference the pointer). Per thread, because begin() writes wr_id/wr_flags.
[[gnu::cold, gnu::noinline, gnu::returns_nonnull]] inline ibv_qp_ex *closed_qp() noexcept {
  static thread_local ibv_qp_ex q = [] {
    ibv_qp_ex x{};
    x.qp_base.state = IBV_QPS_RESET;
    x.wr_atomic_cmp_swp = [](ibv_qp_ex *, std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t) {};
    x.wr_atomic_fetch_add = [](ibv_qp_ex *, std::uint32_t, std::uint64_t, std::uint64_t) {};
    x.wr_bind_mw = [](ibv_qp_ex *, ibv_mw *, std::uint32_t, const ibv_mw_bind_info *) {};
    x.wr_local_inv = [](ibv_qp_ex *, std::uint32_t) {};
    x.wr_rdma_read = [](ibv_qp_ex *, std::uint32_t, std::uint64_t) {};
    x.wr_rdma_write = [](ibv_qp_ex *, std::uint32_t, std::uint64_t) {};
    x.wr_rdma_write_imm = [](ibv_qp_ex *, std::uint32_t, std::uint64_t, __be32) {};
    x.wr_send = [](ibv_qp_ex *) {};
    x.wr_send_imm = [](ibv_qp_ex *, __be32) {};
    x.wr_send_inv = [](ibv_qp_ex *, std::uint32_t) {};
    x.wr_set_inline_data = [](ibv_qp_ex *, void *, std::size_t) {};
    x.wr_set_sge = [](ibv_qp_ex *, std::uint32_t, std::uint64_t, std::uint32_t) {};
    x.wr_set_sge_list = [](ibv_qp_ex *, std::size_t, const ibv_sge *) {};
    x.wr_start = [](ibv_qp_ex *) {};
    x.wr_complete = [](ibv_qp_ex *) { return EINVAL; };
    x.wr_abort = [](ibv_qp_ex *) {};
    return x;
  }();
  return &q;
}

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

// rxe reports vendor id 0xFFFFFF (RXE_VENDOR_ID in the kernel driver); asked once per QP creation.
[[nodiscard]] inline bool has_sge_list_defect(ibv_context *ctx) noexcept {
  ibv_device_attr a{};
  return ctx && ::ibv_query_device(ctx, &a) == 0 && a.vendor_id == 0xFFFFFF;
}
} // namespace detail

namespace detail {
// What the batch-form operations of a MemoryWindow or IndirectKey applied at post time, to take
// back when nothing of the batch is posted (dropped, or submit() failed). Fixed capacity, no
// allocation; entries stay uninitialised until added, so a batch without such operations pays
// nothing for the list (inlined, its count is a known 0).
class undo_list {
public:
  static constexpr std::size_t capacity = 8;
  using undo_fn = void (*)(void *object, std::uint64_t tag) noexcept;

  undo_list() noexcept = default;
  // The moved-from batch no longer aborts, so it must not undo either.
  undo_list(undo_list &&o) noexcept : n_(std::exchange(o.n_, 0)) {
    for (std::size_t i = 0; i < n_; ++i) e_[i] = o.e_[i];
  }
  undo_list &operator=(undo_list &&) = delete;

  [[nodiscard]] bool full() const noexcept { return n_ == capacity; }
  // Precondition: !full() (callers check before adding their work request).
  void add(undo_fn f, void *object, std::uint64_t tag) noexcept { e_[n_++] = {f, object, tag}; }
  void clear() noexcept { n_ = 0; }
  // Always inlined: called out of line (gcc does that on cold paths) it would take the batch's
  // address, and the batch would live in memory on the hot path too.
  [[gnu::always_inline]] void run() noexcept {
    if (n_ != 0) [[unlikely]] {
      const entries copy = e_; // see run_all
      run_all(copy, n_);
      n_ = 0;
    }
  }

private:
  struct entry {
    undo_fn f;
    void *object;
    std::uint64_t tag;
  };
  struct entries {
    entry e[capacity];
    entry &operator[](std::size_t i) noexcept { return e[i]; }
    const entry &operator[](std::size_t i) const noexcept { return e[i]; }
  };
  // Newest first: a later operation of one object is undone before an earlier one. It reads a
  // copy: a pointer into the list itself, passed to a call, would keep the whole batch in memory
  // (clang's SROA gives up on an object whose address escapes, even on a cold path).
  [[gnu::cold, gnu::noinline]] static void run_all(const entries &e, std::size_t n) noexcept {
    while (n != 0) {
      --n;
      e[n].f(e[n].object, e[n].tag);
    }
  }
  std::size_t n_ = 0;
  entries e_;
};
} // namespace detail

/// An open send batch (ibv_wr_start). Add operations, then submit() (ibv_wr_complete). A batch
/// dropped without submit() is aborted (ibv_wr_abort): nothing of it is posted. Every member is
/// inline, noexcept and allocation-free. The batch-form operations of MemoryWindow (bind,
/// unbind, invalidate) and IndirectKey (configure, mlx5 invalidate) apply their state at post
/// time and register an undo with the batch: a dropped batch, or a failed submit(), rolls them
/// back itself (at most max_undo of them per batch; keep those windows and keys alive, at their
/// address, until the batch is submitted or dropped). A batch that is not open (submitted, moved from, or
/// started on a null QueuePair) ignores further operations and its submit() answers
/// errc::wrong_state (errc::null_handle for a batch of a null QueuePair: moved from, e.g. a
/// moved-from Connection's qp()), as it does on a QP that has not reached RTS (rxe would
/// otherwise keep the refused work requests and run them once the QP is connected).
///
/// One open batch per QP at a time: a second ibv_wr_start on the same QP spins forever in the
/// provider (rxe; its send-queue lock). The posting forms MemoryWindow::bind(qp, ...) (type 2)
/// and MemoryWindow::invalidate(qp) open a batch of their own: do not call them while a batch of
/// yours is open on that QP.
///
/// The fast path does not depend on the inliner's choices (issue 24): submit(), the destructor
/// and the rollback's test are always inlined, and what only failures run (abort, rollback, the
/// error code) is out of line and cold and never gets a pointer to the batch or to submit()'s
/// result, so that the compiler keeps both in registers. A batch of plain work requests then adds
/// to the ibv_wr_* calls only the null-QP and before-RTS tests (README, "Benchmarks").
///
/// Known rxe defect (rdma-core 44 provider, measured): ibv_wr_set_sge_list sends num_sge x the
/// FIRST SGE's length and still completes successfully. On a QP of an rxe device the
/// std::span<const ibv_sge> overloads therefore never hand it SGEs of unequal lengths: a gather
/// write or scatter read is posted as one work request per SGE at consecutive remote addresses
/// (only the last carries the signaled/solicited flags and is the one completion; the first
/// keeps a fence), and a send or send-with-invalidate, which cannot be split, fails the batch
/// with errc::provider_defect (nothing of it is posted). Test `[ikey][rxe-defect]` tracks the
/// provider; `[core]` checks the workaround.
class [[nodiscard]] SendBatch {
public:
  /// Moves the open batch; the moved-from batch no longer aborts.
  SendBatch(SendBatch &&) noexcept = default;
  SendBatch &operator=(SendBatch &&) = delete;
  /// Aborts an open batch (ibv_wr_abort) and rolls back the window and key operations it carried.
  [[gnu::always_inline]] ~SendBatch() {
    if (ibv_qp_ex *q = qp_.release()) [[unlikely]] abort_open(q);
    undo_.run(); // after the abort, as in submit(): rollbacks run with no batch open
  }

  /// Window and key operations (those that register an undo) one batch can carry.
  static constexpr std::size_t max_undo = detail::undo_list::capacity;

  // Each operation: start the WR with its op verb (which takes id and flags), then its data.
  /// RDMA write of one local SGE to `r` (ibv_wr_rdma_write).
  SendBatch &write(wr w, remote_addr r, const ibv_sge &s) noexcept {
    if (begin(w)) { ::ibv_wr_rdma_write(q(), r.rkey, r.addr); set(s); }
    return *this;
  }
  /// RDMA write gathering several local SGEs (ibv_wr_rdma_write, ibv_wr_set_sge_list).
  SendBatch &write(wr w, remote_addr r, std::span<const ibv_sge> s) noexcept {
    if (split_needed(s)) [[unlikely]] return split(w, r, s, false);
    if (begin(w)) { ::ibv_wr_rdma_write(q(), r.rkey, r.addr); set(s); }
    return *this;
  }
  /// IBV_SEND_INLINE write: the bytes are copied at post time, no lkey needed.
  SendBatch &write_inline(wr w, remote_addr r, std::span<const std::byte> data) noexcept {
    w.flags |= send_flag::inline_data;
    if (begin(w)) { ::ibv_wr_rdma_write(q(), r.rkey, r.addr); set_inline(data); }
    return *this;
  }
  /// RDMA write with immediate (ibv_wr_rdma_write_imm); imm_be in network byte order.
  SendBatch &write_imm(wr w, remote_addr r, std::uint32_t imm_be, const ibv_sge &s) noexcept {
    if (begin(w)) { ::ibv_wr_rdma_write_imm(q(), r.rkey, r.addr, imm_be); set(s); }
    return *this;
  }
  /// RDMA read from `r` into one local SGE (ibv_wr_rdma_read).
  SendBatch &read(wr w, remote_addr r, const ibv_sge &s) noexcept {
    if (begin(w)) { ::ibv_wr_rdma_read(q(), r.rkey, r.addr); set(s); }
    return *this;
  }
  /// RDMA read scattering into several local SGEs (ibv_wr_rdma_read, ibv_wr_set_sge_list).
  SendBatch &read(wr w, remote_addr r, std::span<const ibv_sge> s) noexcept {
    if (split_needed(s)) [[unlikely]] return split(w, r, s, true);
    if (begin(w)) { ::ibv_wr_rdma_read(q(), r.rkey, r.addr); set(s); }
    return *this;
  }
  /// Send of one SGE (ibv_wr_send); consumes a receive the peer posted.
  SendBatch &send(wr w, const ibv_sge &s) noexcept {
    if (begin(w)) { ::ibv_wr_send(q()); set(s); }
    return *this;
  }
  /// Send gathering several SGEs (ibv_wr_send, ibv_wr_set_sge_list).
  SendBatch &send(wr w, std::span<const ibv_sge> s) noexcept {
    if (split_needed(s)) [[unlikely]] return fail(errc::provider_defect);
    if (begin(w)) { ::ibv_wr_send(q()); set(s); }
    return *this;
  }
  /// Send that copies `data` at post time (IBV_SEND_INLINE; no lkey needed).
  SendBatch &send_inline(wr w, std::span<const std::byte> data) noexcept {
    w.flags |= send_flag::inline_data;
    if (begin(w)) { ::ibv_wr_send(q()); set_inline(data); }
    return *this;
  }
  /// imm_be is in network byte order, as the verbs API wants it.
  SendBatch &send_imm(wr w, std::uint32_t imm_be, const ibv_sge &s) noexcept {
    if (begin(w)) { ::ibv_wr_send_imm(q(), imm_be); set(s); }
    return *this;
  }
  /// Send that invalidates the peer's rkey `invalidate_rkey` (a type-2 window or an indirect key).
  SendBatch &send_inv(wr w, std::uint32_t invalidate_rkey, std::span<const ibv_sge> s) noexcept {
    if (split_needed(s)) [[unlikely]] return fail(errc::provider_defect);
    if (begin(w)) { ::ibv_wr_send_inv(q(), invalidate_rkey); set(s); }
    return *this;
  }
  /// Invalidate a local key (ibv_wr_local_inv): a type-2 window or an indirect key.
  SendBatch &local_inv(wr w, std::uint32_t key) noexcept {
    if (begin(w)) { ::ibv_wr_local_inv(q(), key); }
    return *this;
  }
  /// Atomic compare-and-swap of the 8 bytes at `r` (ibv_wr_atomic_cmp_swp); the old value
  /// is written to result8.
  SendBatch &atomic_cmp_swp(wr w, remote_addr r, std::uint64_t compare, std::uint64_t swap,
                            const ibv_sge &result8) noexcept {
    if (begin(w)) { ::ibv_wr_atomic_cmp_swp(q(), r.rkey, r.addr, compare, swap); set(result8); }
    return *this;
  }
  /// Atomic fetch-and-add on the 8 bytes at `r` (ibv_wr_atomic_fetch_add); the old value
  /// is written to result8.
  SendBatch &atomic_fetch_add(wr w, remote_addr r, std::uint64_t add, const ibv_sge &result8) noexcept {
    if (begin(w)) { ::ibv_wr_atomic_fetch_add(q(), r.rkey, r.addr, add); set(result8); }
    return *this;
  }
  /// Raw type-2 window bind (ibv_wr_bind_mw). MemoryWindow::bind() is the checked way.
  SendBatch &bind_mw(wr w, ibv_mw *mw, std::uint32_t rkey, const ibv_mw_bind_info &info) noexcept {
    if (begin(w)) { ::ibv_wr_bind_mw(q(), mw, rkey, &info); }
    return *this;
  }

  /// ibv_wr_complete: post everything added. Nothing of a failed batch is posted, and the window
  /// and key operations it carried are rolled back before it returns.
  /// \errors
  /// - errc::null_handle: the batch was started on a null QueuePair (moved from, destroyed).
  /// - errc::wrong_state: the batch is not open (already submitted, or moved from); or the QP
  ///   has not reached RTS (the batch is aborted).
  /// - errc::provider_defect: an operation this device's provider would have got wrong (the
  ///   batch was aborted).
  /// - errc::send_queue_full: a counted send queue (an mlx5 UMR QP, see
  ///   QueuePair::send_queue_room()) had no room for one of the work requests: nothing of the
  ///   batch reached the provider's builders from that one on, and it was aborted.
  /// - the errno of ibv_wr_complete (ENOMEM: send queue full, EINVAL: a malformed work
  ///   request).
  /// \mallocs None.
  [[gnu::always_inline]] result<void> submit() noexcept {
    ibv_qp_ex *qp = qp_.release();
    if (!qp || detail::before_rts(qp->qp_base)) [[unlikely]] {
      const std::error_code e = refused(qp, fault_); // aborts an open batch first
      undo_.run();
      return failure(e);
    }
    if (const int rc = ::ibv_wr_complete(qp)) [[unlikely]] {
      undo_.run();
      return failure(complete_failed(qp, rc));
    }
    undo_.clear(); // posted: the operations stand
    return success();
  }
  /// The QP's ibv_qp_ex while the batch is open; nullptr after submit() or a move.
  [[nodiscard]] ibv_qp_ex *native_handle() const noexcept { return qp_.get(); }

private:
  friend class QueuePair;
  friend class MemoryWindow; // undo_
  friend class IndirectKey;  // undo_
  SendBatch(ibv_qp_ex *q, bool sge_list_defect) noexcept : qp_(q), sge_list_defect_(sge_list_defect) {
    // Never null: a null QueuePair hands over detail::closed_qp(). Said to the compiler too, so
    // that begin() of an inlined batch tests nothing until submit() (clang does not infer it
    // from the dereference in ibv_wr_start).
    if (!q) __builtin_unreachable();
    ::ibv_wr_start(q);
  }
  ibv_qp_ex *q() const noexcept { return qp_.get(); }
  // False when the batch is not open (submitted or moved from): the operation is then ignored
  // and submit() answers errc::wrong_state. After ibv_wr_start dereferenced the QP the compiler
  // knows it is not null, so an inlined batch pays nothing for the test.
  [[nodiscard]] bool begin(wr w) noexcept {
    ibv_qp_ex *qp = q();
    if (!qp) [[unlikely]] return false;
    qp->wr_id = w.id;
    qp->wr_flags = w.flags.native();
    return true;
  }
  void set(const ibv_sge &s) noexcept { ::ibv_wr_set_sge(q(), s.lkey, s.addr, s.length); }
  void set(std::span<const ibv_sge> s) noexcept { ::ibv_wr_set_sge_list(q(), s.size(), s.data()); }
  // The rxe defect (see the class comment) bites only SGE lists of unequal lengths.
  [[nodiscard]] bool split_needed(std::span<const ibv_sge> s) const noexcept {
    if (!sge_list_defect_) return false;
    for (const ibv_sge &e : s)
      if (e.length != s.front().length) [[unlikely]] return true;
    return false;
  }
  SendBatch &split(wr w, remote_addr r, std::span<const ibv_sge> s, bool read) noexcept {
    if (ibv_qp_ex *qp = q()) split_wrs(qp, w, r, s, read);
    return *this;
  }
  // One RDMA write/read per SGE at consecutive remote addresses: the same bytes land, and only
  // the last WR signals (the caller still sees one completion with its wr_id). Static, as are
  // the other cold parts: a pointer to the batch would keep an inlined batch out of registers.
  [[gnu::cold, gnu::noinline]] static void split_wrs(ibv_qp_ex *qp, wr w, remote_addr r,
                                                     std::span<const ibv_sge> s, bool read) noexcept {
    const send_flags last_only = send_flag::signaled | send_flag::solicited;
    std::uint64_t at = r.addr;
    for (std::size_t i = 0; i < s.size(); ++i) {
      wr part = w;
      if (i + 1 < s.size()) part.flags &= ~last_only;
      if (i > 0) part.flags &= ~send_flags(send_flag::fence);
      qp->wr_id = part.id;
      qp->wr_flags = part.flags.native();
      if (read)
        ::ibv_wr_rdma_read(qp, r.rkey, at);
      else
        ::ibv_wr_rdma_write(qp, r.rkey, at);
      ::ibv_wr_set_sge(qp, s[i].lkey, s[i].addr, s[i].length);
      at += s[i].length;
    }
  }
  // Abort the batch (nothing of it is posted); submit() then answers `e`.
  SendBatch &fail(errc e) noexcept {
    if (ibv_qp_ex *qp = qp_.release()) abort_open(qp);
    fault_ = e;
    return *this;
  }
  [[gnu::cold, gnu::noinline]] static void abort_open(ibv_qp_ex *qp) noexcept { ::ibv_wr_abort(qp); }
  // submit() of a batch that is not open (null `qp`: answers its fault, else wrong_state), of a
  // null QueuePair (the stand-in: null_handle) or whose QP has not reached RTS (aborted;
  // wrong_state).
  [[gnu::cold, gnu::noinline]] static std::error_code refused(ibv_qp_ex *qp, errc fault) noexcept {
    if (!qp) return make_error_code(fault != errc{} ? fault : errc::wrong_state);
    ::ibv_wr_abort(qp);
    return make_error_code(qp == detail::closed_qp() ? errc::null_handle : errc::wrong_state);
  }
  // A counted send queue's refusal (detail::sq_credit) has its own code.
  [[gnu::cold, gnu::noinline]] static std::error_code complete_failed(const ibv_qp_ex *qp, int rc) noexcept {
    if (rc == detail::sq_credit::refused_rc && detail::sq_credit::of(qp)) return make_error_code(errc::send_queue_full);
    return errno_code(rc);
  }
  // The failed result, built in place: a constructor left out of line would be handed the
  // caller's result, which the compiler then keeps in memory on the hot path too (clang).
  [[gnu::always_inline, gnu::flatten]] static result<void> failure(std::error_code e) noexcept {
    return e;
  }
  void set_inline(std::span<const std::byte> d) noexcept {
    ::ibv_wr_set_inline_data(q(), const_cast<std::byte *>(d.data()), d.size());
  }
  detail::moved_ptr<ibv_qp_ex> qp_;
  bool sge_list_defect_ = false;
  errc fault_{};
  detail::undo_list undo_;
};

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
                                                send_ops ops = all_send_ops) noexcept {
#if RDMAXX_HAVE_MLX5
    if (pd && ::mlx5dv_is_supported(pd.context()->device))
      return create_mlx5(pd, send_cq, recv_cq, caps, ops, &::mlx5dv_create_qp);
#endif
    return create_with(pd, send_cq, recv_cq, caps, ops, 0,
                       [](ibv_context *c, ibv_qp_init_attr_ex &a) noexcept {
                         return ::ibv_create_qp_ex(c, &a);
                       });
  }

  /// The ibv_qp (owned: do not destroy it), or nullptr.
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

  // ---- fast path ----

  /// Open a send batch (ibv_wr_start). On a null QP (moved from, destroyed) the batch is not
  /// open: its operations are ignored and its submit() answers errc::null_handle.
  [[nodiscard]] SendBatch start_send() noexcept {
    ibv_qp_ex *q = qpx_.get();
    if (!q) [[unlikely]] q = detail::closed_qp();
    return SendBatch(q, sge_list_defect_);
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
  /// Returns true when room came back; false on a QP that is not counted. Inline,
  /// allocation-free.
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
    if (!h_) [[unlikely]] return make_error_code(errc::null_handle);
    ibv_recv_wr w{};
    w.wr_id = wr_id;
    w.sg_list = const_cast<ibv_sge *>(sges.data());
    w.num_sge = int(sges.size());
    ibv_recv_wr *bad = nullptr;
    if (const int rc = ::ibv_post_recv(h_.get(), &w, &bad)) [[unlikely]] return errno_code(rc);
    return success();
  }
  /// ibv_post_recv of one receive with a single SGE.
  /// \errors
  /// - those of post_recv() with SGEs.
  /// \mallocs None.
  result<void> post_recv(std::uint64_t wr_id, const ibv_sge &sge) noexcept {
    return post_recv(wr_id, std::span<const ibv_sge>(&sge, 1));
  }

  // ---- connection ----

  /// Our side of the connection, to send to the peer (encode() it): ibv_query_port and the GID
  /// of o.gid_index (gid_auto: chosen by type, see detail::select_gid_index; ibv_query_gid_ex).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::no_device: gid_auto found no usable GID.
  /// - the errno of the queries.
  /// \mallocs None.
  [[nodiscard]] result<endpoint> local_endpoint(const connect_options &o = {}) const noexcept {
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

  /// ibv_modify_qp RESET->INIT.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::unknown_access_flag: a bit in o.qp_access other than local write and remote
  ///   write/read/atomic (rxe would store it).
  /// - qp_transition codes naming the attribute blamed.
  /// \mallocs None.
  result<void> to_init(const connect_options &o = {}) noexcept {
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
  /// ibv_modify_qp INIT->RTR towards `remote`, from the GID o.gid_index names (gid_auto: by
  /// type). On an InfiniBand port with a peer LID the path uses the LID (no GRH).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::no_device: gid_auto found no usable GID.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_rtr(const endpoint &remote, const connect_options &o = {}) noexcept {
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
  /// ibv_modify_qp RTR->RTS.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_rts(const connect_options &o = {}) noexcept {
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
  /// RESET->INIT->RTR->RTS towards `remote`; remembered for reconnect().
  /// \errors
  /// - those of to_init(), to_rtr() and to_rts().
  /// \mallocs None.
  result<void> connect(const endpoint &remote, const connect_options &o = {}) noexcept {
    RDMAXX_TRYV(to_init(o));
    RDMAXX_TRYV(to_rtr(remote, o));
    RDMAXX_TRYV(to_rts(o));
    remote_ = remote;
    opts_ = o;
    connected_once_ = true;
    return success();
  }
  /// Move to RESET (from any state, typically ERR after a failed work request: outstanding work
  /// is flushed, poll it away) and connect again to the remembered peer. The peer must be reset
  /// and reconnected too if it went to ERR.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - errc::wrong_state: never connected.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> reset_and_reconnect() noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (!connected_once_) return make_error_code(errc::wrong_state);
    RDMAXX_TRYV(to_reset());
    return connect(remote_, opts_);
  }
  /// ibv_modify_qp to RESET (a state change, like to_init(): the QP is not destroyed). A counted
  /// send queue (send_queue_room()) gets all its room back, as the provider's does.
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_reset() noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    if (const int rc = ::ibv_modify_qp(h_.get(), &a, IBV_QP_STATE))
      return qp_transition_error(current_state(), IBV_QPS_RESET, 0, rc);
    if (auto *c = detail::sq_credit::of(h_.get())) c->reset(); // so does the provider's queue
    return success();
  }
  /// ibv_modify_qp to ERR (flushes outstanding work).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - qp_transition codes.
  /// \mallocs None.
  result<void> to_error() noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (const int rc = ::ibv_modify_qp(h_.get(), &a, IBV_QP_STATE))
      return qp_transition_error(current_state(), IBV_QPS_ERR, 0, rc);
    return success();
  }
  /// The state as the device reports it (ibv_query_qp).
  /// \errors
  /// - errc::null_handle: the QP is null.
  /// - the errno of ibv_query_qp.
  /// \mallocs None.
  [[nodiscard]] result<ibv_qp_state> state() const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (const int rc = ::ibv_query_qp(h_.get(), &a, IBV_QP_STATE, &ia)) return errno_code(rc);
    return a.qp_state;
  }
  /// The peer given to the last successful connect().
  [[nodiscard]] const endpoint &remote() const noexcept { return remote_; }

  /// Destroy now (ibv_destroy_qp). On failure the QP stays valid.
  /// \errors
  /// - errc::busy: type-2 windows bound through this QP are alive, or an mlx5 IndirectKey's
  ///   configure or invalidate posted on it is unconfirmed.
  /// - the errno of ibv_destroy_qp.
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(h_.destroy());
    qpx_.release();
    return success();
  }
  /// Type-2 windows bound through this QP and not yet invalidated or deallocated, and unconfirmed
  /// mlx5 key operations posted on it.
  [[nodiscard]] std::uint32_t live_children() const noexcept { return h_.live_children(); }

private:
  // The one construction path of every QueuePair: checks, the child node, the CQ links, the
  // granted caps. `create(ctx, attr)` is the creation verb (ibv_create_qp_ex, or
  // mlx5dv_create_qp for mlx5::create_umr_qp); `mlx5_ops` records the mlx5dv send operations it
  // was given.
  template <class Create>
  [[nodiscard]] static result<QueuePair> create_with(const ProtectionDomain &pd,
                                                     const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq, qp_caps caps,
                                                     send_ops ops, std::uint64_t mlx5_ops,
                                                     Create &&create) noexcept {
    if (!pd || !send_cq || !recv_cq) return make_error_code(errc::null_handle);
    if (send_cq.native_handle()->context != pd.context() ||
        recv_cq.native_handle()->context != pd.context())
      return make_error_code(errc::context_mismatch);
    ibv_qp_init_attr_ex a = detail::rc_qp_init_attr(pd.native_handle(), send_cq.native_handle(),
                                                    recv_cq.native_handle(), caps, ops);
    RDMAXX_TRY(h, detail::create_with_node<traits>(detail::handle_access::node(pd), [&] {
      return create(pd.context(), a);
    }));
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
  // QueuePair::create on mlx5: `verb` is mlx5dv_create_qp (contract tests hand a stand-in).
  template <class Verb>
  [[nodiscard]] static result<QueuePair> create_mlx5(const ProtectionDomain &pd, const CompletionQueue &send_cq,
                                                     const CompletionQueue &recv_cq, qp_caps caps, send_ops ops,
                                                     Verb verb) noexcept {
    mlx5dv_qp_init_attr dv = detail::rc_dv_attr();
    auto r = create_with(pd, send_cq, recv_cq, caps, ops, 0,
                         [&dv, verb](ibv_context *c, ibv_qp_init_attr_ex &a) noexcept { return verb(c, &a, &dv); });
    if (r) r.value().no_scatter_to_cqe_ = true;
    return r;
  }
#endif

  struct traits {
    using native = ibv_qp;
    static constexpr const char *object = "QueuePair";
    static constexpr const char *verb = "ibv_destroy_qp";
    static constexpr std::size_t parents = 3; // PD, send CQ, receive CQ
    static int destroy(native *q) noexcept {
      void *credit = q->qp_context; // rdmaxx's: only a counted QP has one (detail::sq_credit)
      const int rc = ::ibv_destroy_qp(q);
      if (rc == 0) detail::sq_credit::free(credit);
      return rc;
    }
  };

  [[nodiscard]] result<int> gid_index_for(const connect_options &o) const noexcept {
    if (o.gid_index != gid_auto) return o.gid_index;
    return detail::select_gid_index(h_.get()->context, o.port);
  }

  [[nodiscard]] ibv_qp_state current_state() const noexcept {
    auto s = state();
    return s ? s.value() : IBV_QPS_UNKNOWN;
  }

  result<void> modify(ibv_qp_attr &a, int mask, ibv_qp_state from, const connect_options &o) noexcept {
    if (const int rc = ::ibv_modify_qp(h_.get(), &a, mask)) [[unlikely]]
      return qp_transition_error(from, a.qp_state, diagnose(a, mask, o), rc);
    return success();
  }

  // Which attribute of a refused transition is out of the device's limits. Cold: only on failure.
  [[gnu::cold]] int diagnose(const ibv_qp_attr &a, int mask, const connect_options &o) const noexcept {
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

  friend class IndirectKey;
  friend struct detail::handle_access; // children register with this object's node
  friend struct mlx5::qp_factory;
  friend struct detail::test_access;
  detail::handle<traits> h_; // parents: PD, send CQ, receive CQ
  detail::moved_ptr<ibv_qp_ex> qpx_;
  qp_caps caps_{};
  endpoint remote_{};
  connect_options opts_{};
  std::uint64_t mlx5_send_ops_ = 0; // MLX5DV_QP_EX_WITH_*: set only by mlx5::create_umr_qp
  bool connected_once_ = false;
  bool sge_list_defect_ = false; // rxe: see SendBatch
  bool no_scatter_to_cqe_ = false; // mlx5: created with MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
};

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
