/// \file
/// rdmaxx/detail/sq_credit.hpp: a QP's send-queue credit, counted by rdmaxx (issue 21, point 2).
///
/// On a full send queue rdma-core 44's mlx5 builders write through a stale pointer into the last
/// work request already posted: _common_wqe_init_op (providers/mlx5/qp.c:1236-1251, v44.0) only
/// sets ENOMEM when mlx5_wq_overflow (qp.c:186-199) says the queue is full and returns without a
/// new mqp->cur_ctrl, and every builder goes on writing through it (the mkey configure,
/// qp.c:2849-2857, the local invalidate and bind, qp.c:1595-1597, an RDMA write's address
/// segment, qp.c:1472-1485). The queue is full when head - tail + nreq >= max_post: head counts
/// the WRs rung, tail moves when the provider polls a completion (cq.c:807, 918: to the WR after
/// the completed one), max_post is the granted max_send_wr (verbs.c:1689, 2623).
///
/// The credit counts the same from what rdmaxx sees: WRs posted (head) and WRs retired by the
/// completions the caller hands back (tail). A completion handed back has been polled, so the
/// provider's tail is at least rdmaxx's: whenever the credit admits a WR, the provider has room
/// and never reaches the stale-pointer path. It is installed on a QP's ibv_qp_ex (install()):
/// each op entry (wr_rdma_write, wr_local_inv, ...) is replaced by one that admits the WR first
/// (refused: the provider's builder is not called, nor any setter after it, and wr_complete
/// aborts the batch and answers ENOSPC, which SendBatch::submit() reports as
/// errc::send_queue_full), so SendBatch and raw ibv_wr_* calls on native_handle_ex() are counted
/// alike. Not counted: ibv_post_send and mlx5dv_wr_* builders called by the caller (rdmaxx's
/// own mkey configure admits itself).
///
/// The provider rewrites one of those entries by itself: since rdma-core v40 (commit 988f90bc1,
/// "Enforce IB spec QP state behaviour on post_send()/recv()") every state change of an mlx5 QP
/// sets ibqp->wr_complete (set_qp_operational_state, verbs.c:2250-2268 of v44.0, called by
/// mlx5_modify_qp at 3063-3064 and at creation at 2652): the error variant at RESET
/// (mlx5_send_wr_complete_error, qp.c:1189-1198, which rolls the batch back and answers EINVAL),
/// mlx5_send_wr_complete at RTS (qp.c:3536-3550). A credit installed after creation would be
/// bypassed from the first RTS on: head would never advance and a refused batch would be rung
/// without its refused work requests. So the credit routes itself again (reroute()) after each
/// transition rdmaxx makes (QueuePair's to_init/to_rtr/to_rts/connect, to_reset, to_error,
/// reset_and_reconnect, and those a Connection makes), and its wr_start checks wr_complete once
/// more under the provider's lock (a transition rdmaxx did not make: a raw ibv_modify_qp,
/// mlx5dv_devx_qp_modify). Only QPs with a credit pay for either; SendBatch is unchanged.
///
/// Credits come back only through completions handed back: a successful send completion of the
/// QP (QueuePair::retire, or IndirectKey::complete for its own operation) retires its WR and
/// every earlier one (RC completes the send queue in order, and the provider's tail does the
/// same, cq.c:807). A completion is matched to its WR by wr_id, the earliest outstanding WR with
/// that id: when ids repeat, fewer WRs are retired than the device did, never more. Error
/// completions retire nothing (their opcode is undefined, so a receive's cannot be told from a
/// send's); after an error the QP goes through RESET (QueuePair::to_reset, reset_and_reconnect),
/// which gives every credit back, as the provider resets its indices (verbs.c:3017-3031).
///
/// The credit lives in the QP's qp_context (rdmaxx owns that field of the QPs it creates) and is
/// freed after ibv_destroy_qp. Threads: the posting side runs under the provider's send-queue
/// lock (from wr_start to wr_complete); retiring may run on another thread (head and tail are
/// atomic); to_reset must not run while another thread posts or retires.
#pragma once

#include "atomic.hpp"
#include "handle.hpp"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <new>

namespace rdmaxx::detail {

struct sq_credit {
  /// What wr_complete answers for a batch the credit refused.
  static constexpr int refused_rc = ENOSPC;

  std::uint32_t max_post = 0;         // the granted max_send_wr
  detail::atomic<std::uint32_t> head{0}; // WRs posted since creation or the last reset
  detail::atomic<std::uint32_t> tail{0}; // WRs retired by completions handed back
  detail::atomic<std::uint32_t> epoch{0}; // resets so far (a position is valid within its epoch)
  // WRs admitted into the open batch: written under the provider's lock, read by used() on any
  // thread (relaxed: a batch still open elsewhere is seen approximately).
  detail::atomic<std::uint32_t> nreq{0};
  // Unconfirmed mlx5 key operations posted on the QP (IndirectKey's configure and invalidate,
  // mlx5/indirect_key_mlx5.hpp hold_credit / release_credit): QueuePair::to_reset() refuses
  // while any is (RESET would drop its completion, mlx5_cq_clean).
  detail::atomic<std::uint32_t> key_ops{0};
  bool refused = false;               // the open batch met a full queue
  /// A posted operation whose owner went away unconfirmed (an mlx5 IndirectKey destroyed while
  /// its configure or invalidate was posted): adopt()ed by the credit, which calls settle(o)
  /// once, on whichever thread finds that the operation ended: a completion handed back retired
  /// it (retire_through past `pos` of `epoch`), or the QP was reset (reset()) or destroyed
  /// (free()). settle may free `o` (and its owner).
  struct orphan {
    orphan *next = nullptr;    ///< the next adopted one (the credit's list)
    std::uint32_t pos = 0;     ///< the operation's position in the queue
    std::uint32_t epoch = 0;   ///< the queue's resets when it was posted
    void (*settle)(orphan *) noexcept = nullptr; ///< called once, when it ended
    void *owner = nullptr;     ///< for settle
  };
  detail::atomic<orphan *> orphans{nullptr}; // adopted, not settled yet (a stack)
  std::uint64_t *ids = nullptr;       // wr_id by position % max_post
  parent_node *qp_node = nullptr;     // the QP's child counter (a pending key operation holds it)
  ibv_qp_ex saved{};                  // the provider's entries (function pointers only)

  ~sq_credit() { delete[] ids; }

  /// Outstanding WRs (posted and not retired) plus those of the open batch.
  [[nodiscard]] std::uint32_t used() const noexcept {
    return head.load(detail::order::relaxed) - tail.load(detail::order::acquire) +
           nreq.load(detail::order::relaxed);
  }
  /// No further WR can be admitted into the open batch.
  [[nodiscard]] bool full() const noexcept { return refused || used() >= max_post; }
  /// The position the next admitted WR takes.
  [[nodiscard]] std::uint32_t next_position() const noexcept {
    return head.load(detail::order::relaxed) + nreq.load(detail::order::relaxed);
  }
  /// Admit one WR (its wr_id is q->wr_id) into the open batch, or refuse the batch.
  [[nodiscard]] bool admit(const ibv_qp_ex *q) noexcept {
    if (full()) {
      refused = true;
      return false;
    }
    const std::uint32_t n = nreq.load(detail::order::relaxed);
    ids[(head.load(detail::order::relaxed) + n) % max_post] = q->wr_id;
    nreq.store(n + 1, detail::order::relaxed);
    return true;
  }
  /// Retire every WR up to and including `pos` (of epoch `ep`).
  void retire_through(std::uint32_t pos, std::uint32_t ep) noexcept {
    if (ep != epoch.load(detail::order::relaxed)) return;
    const std::uint32_t h = head.load(detail::order::acquire);
    std::uint32_t t = tail.load(detail::order::relaxed);
    // only forward, and never past what was posted
    while (pos - t < h - t && !tail.compare_exchange_weak(t, pos + 1, detail::order::release,
                                                          detail::order::relaxed)) {
    }
    if (orphans.load(detail::order::acquire)) [[unlikely]] settle_orphans(false);
  }
  /// Take `o` (its settle, pos and epoch set): settled once its operation ended (see orphan);
  /// at once if it already has.
  void adopt(orphan *o) noexcept {
    orphan *top = orphans.load(detail::order::relaxed);
    do o->next = top;
    while (!orphans.compare_exchange_weak(top, o, detail::order::acq_rel, detail::order::relaxed));
    settle_orphans(false);
  }
  /// Settle the adopted operations that ended (`all`: every one: the QP was reset or destroyed).
  /// An operation that ends while another thread holds the list is settled at the next call.
  void settle_orphans(bool all) noexcept {
    orphan *o = orphans.exchange(nullptr, detail::order::acq_rel);
    const std::uint32_t ep = epoch.load(detail::order::relaxed);
    const std::uint32_t t = tail.load(detail::order::acquire);
    const std::uint32_t h = head.load(detail::order::acquire);
    while (o) {
      orphan *const next = o->next;
      // ended: the queue was reset since, or its position is no longer outstanding ([t, h))
      if (all || o->epoch != ep || o->pos - t >= h - t) {
        o->settle(o); // may free o
      } else {
        orphan *top = orphans.load(detail::order::relaxed);
        do o->next = top;
        while (!orphans.compare_exchange_weak(top, o, detail::order::acq_rel, detail::order::relaxed));
      }
      o = next;
    }
  }
  /// Retire by a completion of this QP (see the top of this header). Returns true when it
  /// retired at least one WR.
  bool retire(const ibv_wc &wc) noexcept {
    if (wc.status != IBV_WC_SUCCESS || !is_send_opcode(wc.opcode)) return false;
    const std::uint32_t ep = epoch.load(detail::order::relaxed);
    const std::uint32_t h = head.load(detail::order::acquire);
    const std::uint32_t t = tail.load(detail::order::relaxed);
    for (std::uint32_t p = t; p != h; ++p) {
      if (ids[p % max_post] == wc.wr_id) {
        retire_through(p, ep);
        return true;
      }
    }
    return false;
  }
  /// The QP went through RESET: the provider starts its send queue anew.
  void reset() noexcept {
    head.store(0, detail::order::relaxed);
    tail.store(0, detail::order::relaxed);
    epoch.fetch_add(1, detail::order::relaxed);
    nreq.store(0, detail::order::relaxed);
    refused = false;
    settle_orphans(true); // their work requests are gone
  }
  /// Completions of work on the send queue (a successful one's opcode): every IBV_WC_* below
  /// IBV_WC_RECV, and the driver opcodes mlx5 reports for its send-queue work (IBV_WC_DRIVER1
  /// for a UMR, cq.c:193-196; DRIVER2 raw WQE, DRIVER3 MMO, qp.c:1259-1264).
  [[nodiscard]] static constexpr bool is_send_opcode(ibv_wc_opcode op) noexcept {
    return op < IBV_WC_RECV || op == IBV_WC_DRIVER1 || op == IBV_WC_DRIVER2 || op == IBV_WC_DRIVER3;
  }

  /// The credit of `q` (installed), or nullptr.
  [[nodiscard]] static sq_credit *of(const ibv_qp_ex *q) noexcept {
    return q ? static_cast<sq_credit *>(q->qp_base.qp_context) : nullptr;
  }
  [[nodiscard]] static sq_credit *of(const ibv_qp *q) noexcept {
    return q ? static_cast<sq_credit *>(q->qp_context) : nullptr;
  }

  /// Count the send queue of `q` (granted max_send_wr `max_post`; `node`: the QP's child
  /// counter): allocates the credit, points qp_context at it and routes each entry the provider
  /// filled in through the credit. Returns false (nothing changed) when out of memory.
  [[nodiscard]] static bool install(ibv_qp_ex *q, std::uint32_t max_post, parent_node *node) noexcept {
    if (!q || max_post == 0) return false;
    auto *c = new (std::nothrow) sq_credit;
    if (!c) return false;
    c->ids = new (std::nothrow) std::uint64_t[max_post];
    if (!c->ids) {
      delete c;
      return false;
    }
    c->max_post = max_post;
    c->qp_node = node;
    route(q, c);
    q->qp_base.qp_context = c;
    return true;
  }
  /// After a state change of `q`: route again each entry the provider rewrote (rdma-core >= 40
  /// rewrites wr_complete at every transition, see the top of this header); entries still
  /// routed through the credit are left alone. Nothing when `q` has no credit. Not while a batch
  /// is open on `q` (a transition never is).
  static void reroute(ibv_qp_ex *q) noexcept {
    if (sq_credit *c = of(q)) route(q, c);
  }
  /// Free the credit of a destroyed QP (the qp_context it had; null: none), settling the
  /// operations it adopted first (their work requests went with the QP).
  static void free(void *qp_context) noexcept {
    auto *c = static_cast<sq_credit *>(qp_context);
    if (c) c->settle_orphans(true);
    delete c;
  }

private:
  enum kind { op, setter };
  template <auto F, kind K, class Fn>
  struct entry;
  template <auto F, kind K, class... A>
  struct entry<F, K, void (*)(ibv_qp_ex *, A...)> {
    static void call(ibv_qp_ex *q, A... a) noexcept {
      sq_credit *c = of(q);
      if (!c) [[unlikely]] return; // never: installed with the entry (said for GCC 12's warnings)
      if (K == op ? !c->admit(q) : c->refused) return; // the provider's entry is never reached
      (c->saved.*F)(q, a...);
    }
  };
  // Route entry F of `q` through `ours`, keeping the provider's in `c->saved`: an entry the QP
  // lacks stays absent, one already routed stays as it is (reroute() after a transition).
  template <auto F, class Fn>
  static void hook_to(ibv_qp_ex *q, sq_credit *c, Fn ours) noexcept {
    if (!(q->*F) || q->*F == ours) return;
    c->saved.*F = q->*F;
    q->*F = ours;
  }
/// hook_to() of ibv_qp_ex::M with our entry of kind K, inside route() only (undefined after it):
/// a macro, not a function template per member (one instantiation fewer per hooked member in
/// every TU that includes the header).
#define RDMAXX_SQ_HOOK_(M, K) hook_to<&ibv_qp_ex::M>(q, c, &entry<&ibv_qp_ex::M, K, decltype(ibv_qp_ex::M)>::call)
  // Every entry the credit counts through: the op entries admit, the setters follow a refusal,
  // and the batch verbs open, ring and abort.
  static void route(ibv_qp_ex *q, sq_credit *c) noexcept {
    RDMAXX_SQ_HOOK_(wr_atomic_cmp_swp, op);
    RDMAXX_SQ_HOOK_(wr_atomic_fetch_add, op);
    RDMAXX_SQ_HOOK_(wr_bind_mw, op);
    RDMAXX_SQ_HOOK_(wr_local_inv, op);
    RDMAXX_SQ_HOOK_(wr_rdma_read, op);
    RDMAXX_SQ_HOOK_(wr_rdma_write, op);
    RDMAXX_SQ_HOOK_(wr_rdma_write_imm, op);
    RDMAXX_SQ_HOOK_(wr_send, op);
    RDMAXX_SQ_HOOK_(wr_send_imm, op);
    RDMAXX_SQ_HOOK_(wr_send_inv, op);
    RDMAXX_SQ_HOOK_(wr_send_tso, op);
    RDMAXX_SQ_HOOK_(wr_atomic_write, op);
    RDMAXX_SQ_HOOK_(wr_set_ud_addr, setter);
    RDMAXX_SQ_HOOK_(wr_set_xrc_srqn, setter);
    RDMAXX_SQ_HOOK_(wr_set_inline_data, setter);
    RDMAXX_SQ_HOOK_(wr_set_inline_data_list, setter);
    RDMAXX_SQ_HOOK_(wr_set_sge, setter);
    RDMAXX_SQ_HOOK_(wr_set_sge_list, setter);
    hook_to<&ibv_qp_ex::wr_start>(q, c, &start);
    hook_to<&ibv_qp_ex::wr_complete>(q, c, &complete);
    hook_to<&ibv_qp_ex::wr_abort>(q, c, &abort);
  }
#undef RDMAXX_SQ_HOOK_
  static void start(ibv_qp_ex *q) noexcept {
    sq_credit *c = of(q);
    if (!c) [[unlikely]] return;
    c->saved.wr_start(q); // takes the provider's send-queue lock
    // A transition rdmaxx did not make (reroute() not called) rewrote wr_complete: take it back
    // before anything of the batch is built (under the provider's lock).
    if (q->wr_complete != &complete) [[unlikely]] hook_to<&ibv_qp_ex::wr_complete>(q, c, &complete);
    c->nreq.store(0, detail::order::relaxed);
    c->refused = false;
  }
  static int complete(ibv_qp_ex *q) noexcept {
    sq_credit *c = of(q);
    if (!c) [[unlikely]] return EINVAL;
    const std::uint32_t n = c->nreq.load(detail::order::relaxed);
    c->nreq.store(0, detail::order::relaxed);
    if (c->refused) {
      c->refused = false;
      c->saved.wr_abort(q); // rolls the provider back and releases its lock
      return refused_rc;
    }
    const int rc = c->saved.wr_complete(q);
    if (rc == 0) c->head.fetch_add(n, detail::order::release);
    return rc;
  }
  static void abort(ibv_qp_ex *q) noexcept {
    sq_credit *c = of(q);
    if (!c) [[unlikely]] return;
    c->nreq.store(0, detail::order::relaxed);
    c->refused = false;
    c->saved.wr_abort(q);
  }
};

} // namespace rdmaxx::detail
