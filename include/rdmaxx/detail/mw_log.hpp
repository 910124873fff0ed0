/// \file
/// rdmaxx/detail/mw_log.hpp: the log of a memory window's posted, unconfirmed operations.
///
/// A window applies each bind, unbind or invalidate when it is posted; the log keeps, per
/// operation, how to recognise its completion (wr_id, QP, the opcode a success reports) and the
/// binding before it, so that a failed completion can put the window back. It knows nothing of
/// ibv_mw or of a device: it moves bindings and child links, and says what a completion did.
///
/// Links: the current binding's MR and QP registrations live in the owner's handle (H, a
/// detail::handle with parent slots second = the MR, third = the QP); an entry keeps the
/// registrations of the binding before it in the binding's own mr_link / qp_link, so that MR
/// and QP stay counted until the operation is confirmed. Binding: default-constructible,
/// movable, with child_link members mr_link and qp_link.
#pragma once

#include "handle.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace rdmaxx::detail {

/// What a completion handed to mw_log::complete did.
enum class mw_outcome : std::uint8_t {
  ignored,     ///< not one of the log's operations: nothing changed
  confirmed,   ///< a success: the matching entry and every earlier one are dropped
  rolled_back, ///< a failure: the binding before the newest match is current again
  invalidated, ///< the peer invalidated the current binding: every entry is dropped
};

/// Up to N unconfirmed operations, oldest first. Inline, allocation-free, not thread-safe.
template <class Binding, std::size_t N>
class mw_log {
public:
  /// One posted, unconfirmed operation and the binding before it.
  struct entry {
    std::uint64_t wr_id = 0;
    std::uint32_t qp_num = 0;
    ibv_wc_opcode opcode = IBV_WC_BIND_MW; // what a successful completion of it reports
    std::uint32_t seq = 0; // names it for the undo of its batch (indexes shift on confirm)
    bool signaled = true;  // a success reports it (an unsignaled one completes silently)
    Binding before;
  };

  static constexpr std::size_t capacity = N;

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  /// The caller checks this before push() (the window answers errc::too_many_pending).
  [[nodiscard]] bool full() const noexcept { return n_ == N; }
  /// Entry i, 0 the oldest (i < size()).
  [[nodiscard]] const entry &operator[](std::size_t i) const noexcept { return e_[i]; }

  /// Record a posted operation (the log must not be full): `cur`, with the MR and QP links
  /// taken out of `h`'s slots, becomes the entry's binding-before; `cur` is left empty and `h`'s
  /// slots null, for the caller to fill with the new binding.
  /// Returns the entry's sequence number (for undo()).
  template <class H>
  std::uint32_t push(std::uint64_t wr_id, std::uint32_t qp_num, ibv_wc_opcode op, Binding &cur,
                     H &h, bool signaled = true) noexcept {
    entry &p = e_[n_++];
    p.wr_id = wr_id;
    p.qp_num = qp_num;
    p.opcode = op;
    p.signaled = signaled;
    p.seq = ++seq_;
    p.before = std::move(cur);
    p.before.mr_link = h.template take_link<parent_slot::second>();
    p.before.qp_link = h.template take_link<parent_slot::third>();
    cur = Binding{};
    return p.seq;
  }

  /// Undo the entry numbered `seq` and every later one (a dropped batch's undo). Returns false
  /// when no entry has that number (confirmed already, or cleared).
  template <class H>
  bool undo(std::uint32_t seq, Binding &cur, H &h) noexcept {
    for (std::size_t i = 0; i < n_; ++i)
      if (e_[i].seq == seq) {
        rollback(i, cur, h);
        return true;
      }
    return false;
  }

  /// Hand a completion to the log. `peer_invalidated`: the owner found that `wc` is a receive
  /// whose sender invalidated the current binding; then every entry is dropped (the operations
  /// before it executed) and the owner ends the binding itself (its links are still in `h`).
  /// Otherwise, only an entry with wc's wr_id and qp_num counts. A success is the oldest
  /// signaled such entry whose opcode it reports: it and every earlier one are confirmed (a send
  /// queue completes in order; unsignaled operations complete silently). A failure (flushed
  /// included: its opcode is not reliable) undoes the newest such entry and every later one (see
  /// rollback). Entries that share a wr_id cannot be told apart by a failure: an unsignaled one
  /// may have executed silently before a later one failed. Taking the newest keeps such an entry
  /// (its binding stays counted as possibly live), and as a queue in ERR flushes every
  /// outstanding request, each in order, the log is exact again once every failure was handed
  /// over. Entries with wr_ids of their own (GrantPool's) are exact at every completion.
  template <class H>
  [[nodiscard]] mw_outcome complete(const ibv_wc &wc, bool peer_invalidated, Binding &cur, H &h) noexcept {
    if (peer_invalidated) {
      confirm(n_);
      return mw_outcome::invalidated;
    }
    if (n_ == 0) return mw_outcome::ignored;
    if (wc.status == IBV_WC_SUCCESS) {
      for (std::size_t i = 0; i < n_; ++i) // oldest signaled match: confirms it and all before it
        if (e_[i].signaled && matches(e_[i], wc) && wc.opcode == e_[i].opcode) {
          confirm(i + 1);
          return mw_outcome::confirmed;
        }
      return mw_outcome::ignored;
    }
    for (std::size_t i = n_; i-- > 0;) // newest match: undo it and all after it
      if (matches(e_[i], wc)) {
        rollback(i, cur, h);
        return mw_outcome::rolled_back;
      }
    return mw_outcome::ignored;
  }

  /// Undo every entry (nothing of them reached the device: a dropped batch, a failed submit).
  /// Returns false when the log was empty (nothing changed).
  template <class H>
  bool cancel(Binding &cur, H &h) noexcept {
    if (n_ == 0) return false;
    rollback(0, cur, h);
    return true;
  }

  /// Drop every entry, releasing what they kept counted (the window is deallocated or moved).
  void clear() noexcept { confirm(n_); }

private:
  [[nodiscard]] static bool matches(const entry &p, const ibv_wc &wc) noexcept {
    return p.wr_id == wc.wr_id && p.qp_num == wc.qp_num;
  }
  // Drop the first k entries (their operations are done): releases what they kept counted.
  void confirm(std::size_t k) noexcept {
    std::size_t m = 0;
    for (std::size_t i = k; i < n_; ++i) e_[m++] = std::move(e_[i]);
    for (std::size_t i = m; i < n_; ++i) e_[i] = entry{};
    n_ = m;
  }
  // Entry i and all after it did not happen: the binding before entry i is current again, its
  // links back in `h`'s slots (releasing those of the binding they replace), then the later
  // entries' links are released.
  template <class H>
  void rollback(std::size_t i, Binding &cur, H &h) noexcept {
    cur = std::move(e_[i].before);
    h.template set_link<parent_slot::second>(std::move(cur.mr_link));
    h.template set_link<parent_slot::third>(std::move(cur.qp_link));
    for (std::size_t j = i; j < n_; ++j) e_[j] = entry{};
    n_ = i;
  }

  entry e_[N];
  std::size_t n_ = 0;
  std::uint32_t seq_ = 0; // the last entry::seq handed out
};

} // namespace rdmaxx::detail
