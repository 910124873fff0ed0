/// \file
/// rdmaxx/send_batch.hpp: SendBatch, an open send batch of one QP (ibv_wr_start(3) ..
/// ibv_wr_complete), and the list of window and key operations a batch rolls back when nothing of
/// it is posted.
///
/// A batch is opened by QueuePair::start_send() (queue_pair.hpp) through detail::batch_access,
/// which is also how the batch-form operations of the types built on it register their undo:
/// this header names none of them.
///
/// Allocation: none; every member is inline and noexcept.
#pragma once

#include "detail/atomic.hpp"
#include "detail/flags.hpp"
#include "detail/handle.hpp"
#include "detail/sq_credit.hpp"
#include "error.hpp"
#include "work_request.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace rdmaxx {
namespace detail {
// rxe fails a post before RTS (EINVAL) but keeps the work requests and runs them once the QP is
// connected, so rdmaxx never posts before RTS. qp->state is verbs' own record of the last
// ibv_modify_qp (raw calls on native_handle() included); SendBatch does not read it (the
// QueuePair's posting pointer, detail::qpx_ptr), the posting forms of MemoryWindow do.
[[nodiscard]] inline bool before_rts(const ibv_qp &qp) noexcept { return qp.state < IBV_QPS_RTS; }

// What a batch of a QueuePair that cannot post goes to: a stand-in ibv_qp_ex whose ibv_wr_*
// entries do nothing, whose wr_complete fails (EINVAL) and whose state is RESET. null_qp while
// the QueuePair is null (default-constructed, moved from, destroyed), unready_qp while rdmaxx has
// not moved it to RTS or later (detail::qpx_ptr): start_send() and submit() test nothing, and
// submit()'s cold failure path names the stand-in's refusal (errc::null_handle,
// errc::wrong_state); nothing reached the real QP, so nothing is to be aborted there. One of each
// for the process, constant-initialised (no guard, no TLS lookup): begin() writes their wr_id
// and wr_flags with relaxed atomic stores (set_wr), so that threads posting to them at once do
// not race.
[[nodiscard]] constexpr ibv_qp_ex make_null_qp() noexcept {
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
}
inline constinit ibv_qp_ex null_qp = make_null_qp();
inline constinit ibv_qp_ex unready_qp = make_null_qp();

// The wr_id and wr_flags of the work request being built (what ibv_wr_* reads from the
// ibv_qp_ex). Relaxed atomic stores: plain moves on x86-64 and arm64, and race-free on the
// null_qp that the null QueuePairs of all threads share.
inline void set_wr(ibv_qp_ex *qp, std::uint64_t id, unsigned flags) noexcept {
  detail::atomic_store(qp->wr_id, id, detail::order::relaxed);
  detail::atomic_store(qp->wr_flags, flags, detail::order::relaxed);
}

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
struct batch_access; // after SendBatch
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
/// moved-from Connection's qp()), as it does on a QP that rdmaxx has not moved to RTS (rxe would
/// otherwise keep the refused work requests and run them once the QP is connected): such a batch
/// goes to a stand-in (detail::unready_qp), nothing of it reaches the QP. The QP's state is the
/// one rdmaxx's transitions set when the batch was opened (QueuePair::native_handle()).
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
/// to the ibv_wr_* calls only the load of its posting pointer from the QueuePair: a null
/// QueuePair's batches and those before RTS go to stand-ins whose wr_complete fails
/// (detail::null_qp, detail::unready_qp; README, "The fast path as users build it").
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
  [[gnu::always_inline]] ~SendBatch();

  /// Window and key operations (those that register an undo) one batch can carry.
  static constexpr std::size_t max_undo = detail::undo_list::capacity;

  // Each operation: start the WR with its op verb (which takes id and flags), then its data.
  /// RDMA write of one local SGE to `r` (ibv_wr_rdma_write).
  SendBatch &write(wr w, remote_addr r, const ibv_sge &s) noexcept;
  /// RDMA write gathering several local SGEs (ibv_wr_rdma_write, ibv_wr_set_sge_list).
  SendBatch &write(wr w, remote_addr r, std::span<const ibv_sge> s) noexcept;
  /// IBV_SEND_INLINE write: the bytes are copied at post time, no lkey needed.
  SendBatch &write_inline(wr w, remote_addr r, std::span<const std::byte> data) noexcept;
  /// RDMA write with immediate (ibv_wr_rdma_write_imm); imm_be in network byte order.
  SendBatch &write_imm(wr w, remote_addr r, std::uint32_t imm_be, const ibv_sge &s) noexcept;
  /// RDMA read from `r` into one local SGE (ibv_wr_rdma_read).
  SendBatch &read(wr w, remote_addr r, const ibv_sge &s) noexcept;
  /// RDMA read scattering into several local SGEs (ibv_wr_rdma_read, ibv_wr_set_sge_list).
  SendBatch &read(wr w, remote_addr r, std::span<const ibv_sge> s) noexcept;
  /// Send of one SGE (ibv_wr_send); consumes a receive the peer posted.
  SendBatch &send(wr w, const ibv_sge &s) noexcept;
  /// Send gathering several SGEs (ibv_wr_send, ibv_wr_set_sge_list).
  SendBatch &send(wr w, std::span<const ibv_sge> s) noexcept;
  /// Send that copies `data` at post time (IBV_SEND_INLINE; no lkey needed).
  SendBatch &send_inline(wr w, std::span<const std::byte> data) noexcept;
  /// imm_be is in network byte order, as the verbs API wants it.
  SendBatch &send_imm(wr w, std::uint32_t imm_be, const ibv_sge &s) noexcept;
  /// Send that invalidates the peer's rkey `invalidate_rkey` (a type-2 window or an indirect key).
  SendBatch &send_inv(wr w, std::uint32_t invalidate_rkey, std::span<const ibv_sge> s) noexcept;
  /// Invalidate a local key (ibv_wr_local_inv): a type-2 window or an indirect key.
  SendBatch &local_inv(wr w, std::uint32_t key) noexcept;
  /// Atomic compare-and-swap of the 8 bytes at `r` (ibv_wr_atomic_cmp_swp); the old value
  /// is written to result8.
  SendBatch &atomic_cmp_swp(wr w, remote_addr r, std::uint64_t compare, std::uint64_t swap,
                            const ibv_sge &result8) noexcept;
  /// Atomic fetch-and-add on the 8 bytes at `r` (ibv_wr_atomic_fetch_add); the old value
  /// is written to result8.
  SendBatch &atomic_fetch_add(wr w, remote_addr r, std::uint64_t add, const ibv_sge &result8) noexcept;
  /// Raw type-2 window bind (ibv_wr_bind_mw). MemoryWindow::bind() is the checked way.
  SendBatch &bind_mw(wr w, ibv_mw *mw, std::uint32_t rkey, const ibv_mw_bind_info &info) noexcept;

  /// ibv_wr_complete: post everything added. Nothing of a failed batch is posted, and the window
  /// and key operations it carried are rolled back before it returns.
  /// \errors
  /// - errc::null_handle: the batch was started on a null QueuePair (moved from, destroyed).
  /// - errc::wrong_state: the batch is not open (already submitted, or moved from); or rdmaxx
  ///   had not moved the QP to RTS when the batch was opened (nothing of it reached the QP).
  /// - errc::provider_defect: an operation this device's provider would have got wrong (the
  ///   batch was aborted).
  /// - errc::send_queue_full: a counted send queue (an mlx5 UMR QP, see
  ///   QueuePair::send_queue_room()) had no room for one of the work requests: nothing of the
  ///   batch reached the provider's builders from that one on, and it was aborted.
  /// - the errno of ibv_wr_complete (ENOMEM: send queue full, EINVAL: a malformed work
  ///   request).
  /// \mallocs None.
  [[gnu::always_inline]] result<void> submit() noexcept;
  /// The QP's ibv_qp_ex while the batch is open (&detail::null_qp for a null QueuePair's);
  /// nullptr after submit() or a move.
  [[nodiscard]] ibv_qp_ex *native_handle() const noexcept { return qp_.get() ? owner_ : nullptr; }

private:
  friend struct detail::batch_access; // QueuePair opens batches; windows and keys add undos
  // `q`, never null: where the batch posts (the QP, or a stand-in: detail::null_qp,
  // detail::unready_qp); `owner`: the QP's (or &detail::null_qp). Starts the batch on `q`.
  SendBatch(ibv_qp_ex *q, ibv_qp_ex *owner, bool sge_list_defect) noexcept;
  ibv_qp_ex *q() const noexcept { return qp_.get(); }
  // False when the batch is not open (submitted or moved from): the operation is then ignored
  // and submit() answers errc::wrong_state.
  [[nodiscard]] bool begin(wr w) noexcept;
  void set(const ibv_sge &s) noexcept { ::ibv_wr_set_sge(q(), s.lkey, s.addr, s.length); }
  void set(std::span<const ibv_sge> s) noexcept { ::ibv_wr_set_sge_list(q(), s.size(), s.data()); }
  void set_inline(std::span<const std::byte> d) noexcept {
    ::ibv_wr_set_inline_data(q(), const_cast<std::byte *>(d.data()), d.size());
  }
  // The rxe defect (see the class comment) bites only SGE lists of unequal lengths.
  [[nodiscard]] bool split_needed(std::span<const ibv_sge> s) const noexcept;
  SendBatch &split(wr w, remote_addr r, std::span<const ibv_sge> s, bool read) noexcept;
  // One RDMA write/read per SGE at consecutive remote addresses: the same bytes land, and only
  // the last WR signals (the caller still sees one completion with its wr_id). Static, as are
  // the other cold parts: a pointer to the batch would keep an inlined batch out of registers.
  // Declared inline here, with noinline; defined below the class without the keyword (an
  // `inline` after the noinline declaration is a GCC warning).
  [[gnu::cold, gnu::noinline]] static inline void split_wrs(ibv_qp_ex *qp, wr w, remote_addr r,
                                                            std::span<const ibv_sge> s, bool read) noexcept;
  // Abort the batch (nothing of it is posted); submit() then answers `e`.
  SendBatch &fail(errc e) noexcept;
  [[gnu::cold, gnu::noinline]] static void abort_open(ibv_qp_ex *qp) noexcept { ::ibv_wr_abort(qp); }
  // submit() of a batch that is not open: answers its fault, else wrong_state.
  [[gnu::cold, gnu::noinline]] static std::error_code refused(errc fault) noexcept {
    return make_error_code(fault != errc{} ? fault : errc::wrong_state);
  }
  // The stand-ins' refusals (a null QueuePair; one not at RTS) and a counted send queue's
  // (detail::sq_credit) have their own codes.
  [[gnu::cold, gnu::noinline]] static std::error_code complete_failed(const ibv_qp_ex *qp, int rc) noexcept {
    if (qp == &detail::null_qp) return make_error_code(errc::null_handle);
    if (qp == &detail::unready_qp) return make_error_code(errc::wrong_state);
    if (rc == detail::sq_credit::refused_rc && detail::sq_credit::of(qp)) return make_error_code(errc::send_queue_full);
    return errno_code(rc);
  }
  // The failed result, built in place: a constructor left out of line would be handed the
  // caller's result, which the compiler then keeps in memory on the hot path too (clang).
  [[gnu::always_inline, gnu::flatten]] static result<void> failure(std::error_code e) noexcept {
    return e;
  }

  detail::moved_ptr<ibv_qp_ex> qp_;
  ibv_qp_ex *owner_; // read only by native_handle(): a plain batch never loads it
  bool sge_list_defect_ = false;
  errc fault_{};
  detail::undo_list undo_;
};

namespace detail {
/// What the types built on SendBatch reach of it, instead of being its friends: QueuePair opens a
/// batch (open()); the batch-form operations of windows and keys register their rollback with it
/// (undo()).
struct batch_access {
  /// A batch started on `q` (never null: the QP, or a stand-in) for the QP `owner` (the
  /// QueuePair's, &detail::null_qp when null).
  [[gnu::always_inline]] static SendBatch open(ibv_qp_ex *q, ibv_qp_ex *owner, bool sge_list_defect) noexcept {
    return SendBatch(q, owner, sge_list_defect);
  }
  /// True while the batch is open on its QP itself, not on a stand-in (detail::null_qp,
  /// detail::unready_qp): what posts through native_handle() with other builders (mlx5dv) needs.
  [[nodiscard]] static bool on_qp(const SendBatch &b) noexcept {
    return b.qp_.get() == b.owner_ && b.owner_ != &null_qp;
  }
  /// The batch's list of rollbacks.
  static undo_list &undo(SendBatch &b) noexcept { return b.undo_; }
  /// The batch's list of rollbacks, to test (full()).
  static const undo_list &undo(const SendBatch &b) noexcept { return b.undo_; }
};
} // namespace detail

// ---- SendBatch: the bodies ----

inline SendBatch::~SendBatch() {
  if (ibv_qp_ex *q = qp_.release()) [[unlikely]] abort_open(q);
  undo_.run(); // after the abort, as in submit(): rollbacks run with no batch open
}

inline SendBatch &SendBatch::write(wr w, remote_addr r, const ibv_sge &s) noexcept {
  if (begin(w)) { ::ibv_wr_rdma_write(q(), r.rkey, r.addr); set(s); }
  return *this;
}
inline SendBatch &SendBatch::write(wr w, remote_addr r, std::span<const ibv_sge> s) noexcept {
  if (split_needed(s)) [[unlikely]] return split(w, r, s, false);
  if (begin(w)) { ::ibv_wr_rdma_write(q(), r.rkey, r.addr); set(s); }
  return *this;
}
inline SendBatch &SendBatch::write_inline(wr w, remote_addr r, std::span<const std::byte> data) noexcept {
  w.flags |= send_flag::inline_data;
  if (begin(w)) { ::ibv_wr_rdma_write(q(), r.rkey, r.addr); set_inline(data); }
  return *this;
}
inline SendBatch &SendBatch::write_imm(wr w, remote_addr r, std::uint32_t imm_be, const ibv_sge &s) noexcept {
  if (begin(w)) { ::ibv_wr_rdma_write_imm(q(), r.rkey, r.addr, imm_be); set(s); }
  return *this;
}
inline SendBatch &SendBatch::read(wr w, remote_addr r, const ibv_sge &s) noexcept {
  if (begin(w)) { ::ibv_wr_rdma_read(q(), r.rkey, r.addr); set(s); }
  return *this;
}
inline SendBatch &SendBatch::read(wr w, remote_addr r, std::span<const ibv_sge> s) noexcept {
  if (split_needed(s)) [[unlikely]] return split(w, r, s, true);
  if (begin(w)) { ::ibv_wr_rdma_read(q(), r.rkey, r.addr); set(s); }
  return *this;
}
inline SendBatch &SendBatch::send(wr w, const ibv_sge &s) noexcept {
  if (begin(w)) { ::ibv_wr_send(q()); set(s); }
  return *this;
}
inline SendBatch &SendBatch::send(wr w, std::span<const ibv_sge> s) noexcept {
  if (split_needed(s)) [[unlikely]] return fail(errc::provider_defect);
  if (begin(w)) { ::ibv_wr_send(q()); set(s); }
  return *this;
}
inline SendBatch &SendBatch::send_inline(wr w, std::span<const std::byte> data) noexcept {
  w.flags |= send_flag::inline_data;
  if (begin(w)) { ::ibv_wr_send(q()); set_inline(data); }
  return *this;
}
inline SendBatch &SendBatch::send_imm(wr w, std::uint32_t imm_be, const ibv_sge &s) noexcept {
  if (begin(w)) { ::ibv_wr_send_imm(q(), imm_be); set(s); }
  return *this;
}
inline SendBatch &SendBatch::send_inv(wr w, std::uint32_t invalidate_rkey, std::span<const ibv_sge> s) noexcept {
  if (split_needed(s)) [[unlikely]] return fail(errc::provider_defect);
  if (begin(w)) { ::ibv_wr_send_inv(q(), invalidate_rkey); set(s); }
  return *this;
}
inline SendBatch &SendBatch::local_inv(wr w, std::uint32_t key) noexcept {
  if (begin(w)) { ::ibv_wr_local_inv(q(), key); }
  return *this;
}
inline SendBatch &SendBatch::atomic_cmp_swp(wr w, remote_addr r, std::uint64_t compare, std::uint64_t swap,
                                            const ibv_sge &result8) noexcept {
  if (begin(w)) { ::ibv_wr_atomic_cmp_swp(q(), r.rkey, r.addr, compare, swap); set(result8); }
  return *this;
}
inline SendBatch &SendBatch::atomic_fetch_add(wr w, remote_addr r, std::uint64_t add,
                                              const ibv_sge &result8) noexcept {
  if (begin(w)) { ::ibv_wr_atomic_fetch_add(q(), r.rkey, r.addr, add); set(result8); }
  return *this;
}
inline SendBatch &SendBatch::bind_mw(wr w, ibv_mw *mw, std::uint32_t rkey, const ibv_mw_bind_info &info) noexcept {
  if (begin(w)) { ::ibv_wr_bind_mw(q(), mw, rkey, &info); }
  return *this;
}

inline result<void> SendBatch::submit() noexcept {
  ibv_qp_ex *qp = qp_.release();
  if (!qp) [[unlikely]] {
    const std::error_code e = refused(fault_);
    undo_.run();
    return failure(e);
  }
  // A QP that cannot post has a stand-in here, whose wr_complete fails (complete_failed).
  if (const int rc = ::ibv_wr_complete(qp)) [[unlikely]] {
    undo_.run();
    return failure(complete_failed(qp, rc));
  }
  undo_.clear(); // posted: the operations stand
  return success();
}

inline SendBatch::SendBatch(ibv_qp_ex *q, ibv_qp_ex *owner, bool sge_list_defect) noexcept
    : qp_(q), owner_(owner), sge_list_defect_(sge_list_defect) {
  // Never null: a null QueuePair hands over &detail::null_qp. Said to the compiler too, so
  // that begin() of an inlined batch tests nothing until submit() (clang does not infer it
  // from the dereference in ibv_wr_start).
  if (!q) __builtin_unreachable();
  ::ibv_wr_start(q);
}

// After ibv_wr_start dereferenced the QP the compiler knows it is not null, so an inlined batch
// pays nothing for the test.
inline bool SendBatch::begin(wr w) noexcept {
  ibv_qp_ex *qp = q();
  if (!qp) [[unlikely]] return false;
  detail::set_wr(qp, w.id, w.flags.native());
  return true;
}
inline bool SendBatch::split_needed(std::span<const ibv_sge> s) const noexcept {
  if (!sge_list_defect_) return false;
  for (const ibv_sge &e : s)
    if (e.length != s.front().length) [[unlikely]] return true;
  return false;
}
inline SendBatch &SendBatch::split(wr w, remote_addr r, std::span<const ibv_sge> s, bool read) noexcept {
  if (ibv_qp_ex *qp = q()) split_wrs(qp, w, r, s, read);
  return *this;
}
// Inline by its declaration in the class: `inline` here would redeclare a noinline function
// inline (a GCC warning).
void SendBatch::split_wrs(ibv_qp_ex *qp, wr w, remote_addr r, std::span<const ibv_sge> s, bool read) noexcept {
  const send_flags last_only = send_flag::signaled | send_flag::solicited;
  std::uint64_t at = r.addr;
  for (std::size_t i = 0; i < s.size(); ++i) {
    wr part = w;
    if (i + 1 < s.size()) part.flags &= ~last_only;
    if (i > 0) part.flags &= ~send_flags(send_flag::fence);
    detail::set_wr(qp, part.id, part.flags.native());
    if (read)
      ::ibv_wr_rdma_read(qp, r.rkey, at);
    else
      ::ibv_wr_rdma_write(qp, r.rkey, at);
    ::ibv_wr_set_sge(qp, s[i].lkey, s[i].addr, s[i].length);
    at += s[i].length;
  }
}
inline SendBatch &SendBatch::fail(errc e) noexcept {
  if (ibv_qp_ex *qp = qp_.release()) abort_open(qp);
  fault_ = e;
  return *this;
}

} // namespace rdmaxx
