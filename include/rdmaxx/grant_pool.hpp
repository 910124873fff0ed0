/// \file
/// rdmaxx/grant_pool.hpp: GrantPool and GrantLease, request-scoped grants at service scale: "let
/// the peer reach this buffer for one request, and never after", one call on the request path,
/// no allocation and no system call of its own, safe under timeouts, aborts and disconnects.
///
/// How a request goes (client side; the server only uses the descriptors it receives):
/// ```
///   auto lease = pool.acquire();                  // a buffer slot, not granted: lease.buffer()
///   fill(lease->buffer().value());                // result<span>: refused unless ready
///   auto batch = qp.start_send();
///   auto d = pool.grant(batch, qp, *lease, access::remote_read);   // the bind, in your batch
///   batch.send_inline({id, send_flag::fence | send_flag::signaled}, header_with(d));
///   batch.submit();                                // bind and request: one post
///   for (ibv_wc &wc : pool.complete(polled)) ...   // the pool takes its own completions
///   pool.revoke(qp, *lease);                       // on reply, abort or timeout
///   ... once lease->state() == lease_state::ready: read lease->buffer(), reuse or give_back() it
/// ```
///
/// Design decisions:
///   - One pool per connection (per QP, on that connection's PD). A type-2 window is bound
///     through one QP and its completions come from that QP; a disconnect revokes exactly that
///     connection's grants (revoke_all); and type-1 keys (the safe mechanism on rxe) work from
///     every QP of their PD, so isolation between peers needs a PD per peer anyway. Several pools
///     may share a QP and a CQ: each tags its work requests with its own id.
///   - Everything is allocated at create() (or, with grant_pool_options::lazy_slots, each slot at
///     its first acquire()): per slot a region of exactly the slot's bytes (so the
///     grant's bounds hold on devices that check only region bounds, rxe) and a window of the
///     mechanism the library chooses for the device (detail::grant_for: type-1 on rxe, type-2B
///     where remote invalidation is safe). A grant is one window bind added to the caller's send
///     batch (posted with the request, one doorbell), a revocation one unbind or local invalidate
///     (or the peer's send-with-invalidate, type 2 only).
///   - The buffer is reachable only through its lease, and only while no peer can reach it:
///     GrantLease::buffer() answers errc::grant_outstanding (a result, never an empty span to
///     write through) while the slot is granted or its revocation unconfirmed, and give_back()
///     refuses a lease in those states. A revocation counts only once its completion
///     (or the receive of the peer's send-with-invalidate) was handed to complete(), or after
///     revoke_all() deallocated the windows. Completions the caller forgets to hand over keep
///     slots out of use; they never make a granted buffer reusable.
///   - The grant always covers the whole slot (the exact region): a smaller grant would, on rxe,
///     still expose the slot's other bytes.
///
/// Per device: rxe (Capabilities::remote_inv_unbound_mw_panics) type-1 windows over the exact
/// regions, revoked by the owner (a peer's send-with-invalidate is refused with
/// IBV_WC_REM_INV_REQ_ERR and breaks the connection, never the kernel); devices without the defect
/// (mlx5) type-2B windows, revocable by the peer's send-with-invalidate when the offer (offer())
/// said so. grant_options::trusted_peers forces type 2 where the device is not known to panic;
/// on rxe only grant_options::type2 (type2_risk::accept_kernel_panic_by_any_peer) does.
///
/// A late access (the peer reads or writes after the revocation executed) fails on the peer with
/// IBV_WC_REM_ACCESS_ERR and moves both QPs of the connection to ERR: call revoke_all() once the
/// QP is in ERR and its completions were polled, then reconnect (a new QP on the same PD) and go
/// on with the same pool.
///
/// Threads: one thread at a time per pool and its leases (like the QP it posts on).
///
/// Allocation: create() allocates the slots, the free list and the key index (new(nothrow)) besides
/// what verbs allocates (with lazy_slots, each slot at its first acquire() instead); revoke_all()
/// reallocates windows (verbs); acquire (of a made slot), grant, revoke, complete and give_back
/// allocate nothing.
#pragma once

#include "access.hpp"
#include "detail/atomic.hpp"
#include "detail/counted.hpp"
#include "detail/grant_slot.hpp"
#include "detail/handle.hpp"
#include "device.hpp"
#include "error.hpp"
#include "memory_region.hpp"
#include "memory_window.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#include "remote_descriptor.hpp"

#include "detail/owned_array.hpp"
#include "detail/span.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <utility>

namespace rdmaxx {

/// Where a leased slot stands.
enum class lease_state : std::uint8_t {
  ready,    ///< not granted and no revocation in flight: the buffer is the caller's
  granted,  ///< a bind was posted: the peer may use the descriptor
  revoking, ///< a revocation was posted and is not confirmed yet (or a failed bind was not
            ///< confirmed as failed): hand the pool its completions
};

/// What GrantPool::create needs.
struct grant_pool_options {
  /// Bytes per slot (one request buffer); 1 .. 2^32 - 1.
  std::uint64_t slot_size = 4096;
  /// Slots; 0: as many as fit in the region.
  std::size_t slots = 0;
  /// See grant_options (trusted_peers and type2 for type-2 windows).
  grant_options grant{};
  /// Make each slot (register its exact region, allocate its window) at its first acquire()
  /// instead of at create(): a large pool of which a connection uses few slots costs only what
  /// it uses (kernel objects and pinned pages; README, "How cost grows"). acquire() can then fail
  /// with the errno of ibv_reg_mr / ibv_alloc_mw (the slot stays free, nothing is left
  /// allocated).
  bool lazy_slots = false;
};

/// What the owner of a pool lets its peer do, sent at connection setup (rdma_cm private data):
/// kind 5 under the common descriptor header, 12 bytes:
/// ```
///        8    1 flags         bit 0: the peer may revoke with send-with-invalidate
///        9    3 reserved      0
/// ```
struct grant_offer {
  /// Encoded bytes.
  static constexpr std::size_t encoded_size = descriptor_header::size + 4;
  /// The peer may answer with send-with-invalidate naming a grant's rkey (type-2 windows on a
  /// device where that is safe).
  bool remote_invalidate = false;

  /// The 12-byte encoding. Never fails.
  [[nodiscard]] std::array<std::byte, encoded_size> encode() const noexcept {
    std::array<std::byte, encoded_size> out{};
    detail::wire_writer w(out.data(), out.size());
    descriptor_header{descriptor_version, std::uint8_t(descriptor_kind::grant_offer), 4}.write(w);
    w.u8(remote_invalidate ? 1 : 0);
    w.u8(0);
    w.u16(0);
    return out;
  }
  /// Decode from the front of `in` (private data arrives padded with zeros: bytes after the
  /// offer are ignored, unlike the other decoders, so ConnectRequest::private_data() can be
  /// passed as it is).
  /// \errors
  /// - errc::malformed_input: truncated, wrong magic or body length, unknown flag or reserved bits.
  /// - errc::wrong_version: another encoding version.
  /// - descriptor_kind_error() (wrong_type in descriptor_category()): a valid header of another
  ///   descriptor kind; the message names the kind expected and the kind found.
  /// \mallocs None.
  [[nodiscard]] static result<grant_offer> decode(std::span<const std::byte> in) noexcept {
    RDMAXX_TRY(h, descriptor_header::peek(in));
    if (h.kind != std::uint8_t(descriptor_kind::grant_offer))
      return descriptor_kind_error(std::uint8_t(descriptor_kind::grant_offer), h.kind);
    if (h.body_length != 4 || in.size() < encoded_size) return make_error_code(errc::malformed_input);
    detail::wire_reader r(in.data() + descriptor_header::size, 4); // in.size() >= encoded_size
    const std::uint8_t fl = r.u8();
    const std::uint8_t r1 = r.u8();
    const std::uint16_t r2 = r.u16();
    if (r.failed() || (fl & ~0x1u) != 0 || r1 != 0 || r2 != 0) return make_error_code(errc::malformed_input);
    return grant_offer{(fl & 1) != 0};
  }
};

/// Counters of a pool (for tests and benchmarks; plain integers, never reset).
struct grant_pool_stats {
  std::uint64_t grants = 0;              ///< binds posted
  std::uint64_t revokes = 0;             ///< unbinds / local invalidates posted
  std::uint64_t remote_invalidations = 0; ///< grants the peer revoked (send-with-invalidate)
  std::uint64_t failed_completions = 0;  ///< pool work requests that completed in error (flush too)
  std::uint64_t revoked_by_dealloc = 0;  ///< windows revoke_all() deallocated
  std::uint64_t windows_renewed = 0;     ///< windows replaced before a key would repeat
  std::uint64_t slots_made = 0;          ///< slots whose exact region and window exist
};

/// The top 16 bits of every work request id a GrantPool posts ("RG"): keep them out of yours.
/// Below them: the pool's id (16 bits, unique among the live pools of the process), then bit 31
/// set for a revoke, then the slot (31 bits).
inline constexpr std::uint64_t grant_pool_wr_tag = 0x5247ull << 48;
/// The bit of a GrantPool work request id that marks a revoke (unbind or local invalidate): a
/// grant's bind and its revoke never share an id, so a failed revoke's completion undoes the
/// revoke alone. (With one id, the flush of a revoke posted to a QP the device had moved to ERR
/// also undid the grant before it, which had executed unsignaled: the slot read ready while the
/// grant's key still worked.)
inline constexpr std::uint64_t grant_pool_revoke_bit = 0x80000000ull;

class GrantPool;

namespace detail {
struct pool_access; // the pool's and a lease's state, by address (completion_targets.hpp)
// A fixed-capacity array allocated once with new(nothrow) (no exception, no reallocation): the
// pool's slots, free list and key index.
template <class T>
class fixed_vector {
public:
  // Capacity `cap`; `filled`: `cap` value-initialized elements, else none. False when out of memory.
  [[nodiscard]] bool allocate(std::size_t cap, bool filled) noexcept {
    p_.reset(new (std::nothrow) T[cap]());
    cap_ = p_ ? cap : 0;
    n_ = filled ? cap_ : 0;
    return bool(p_);
  }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  [[nodiscard]] T *data() const noexcept { return p_.get(); }
  [[nodiscard]] T *begin() const noexcept { return p_.get(); }
  [[nodiscard]] T *end() const noexcept { return p_.get() + n_; }
  [[nodiscard]] T &operator[](std::size_t i) const noexcept { return p_[i]; }
  [[nodiscard]] T &back() const noexcept { return p_[n_ - 1]; }
  void push_back(T v) noexcept { p_[n_++] = std::move(v); } // n_ < capacity: the caller's rule
  void pop_back() noexcept { p_[--n_] = T{}; }
  void clear() noexcept {
    while (n_ != 0) pop_back();
  }
  void erase(T *at) noexcept {
    for (T *p = at; p + 1 != end(); ++p) *p = std::move(p[1]);
    pop_back();
  }
  void insert(T *at, T v) noexcept {
    for (T *p = end(); p != at; --p) *p = std::move(p[-1]);
    *at = std::move(v);
    ++n_;
  }
  // The first element not less than v (elements sorted by <). Loops of our own instead of
  // <algorithm>'s, which cost every TU that includes the pool more than the pool's own code.
  [[nodiscard]] T *lower_bound(const T &v) const noexcept {
    T *lo = begin();
    for (std::size_t n = n_; n != 0;) {
      const std::size_t half = n / 2;
      if (lo[half] < v) {
        lo += half + 1;
        n -= half + 1;
      } else {
        n = half;
      }
    }
    return lo;
  }
  // Sort by < (heapsort: O(n log n), no allocation).
  void sort() noexcept {
    T *a = begin();
    const auto sift = [a](std::size_t i, std::size_t n) noexcept {
      for (std::size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && a[c] < a[c + 1]) ++c;
        if (!(a[i] < a[c])) return;
        exchange(a[i], a[c]);
      }
    };
    for (std::size_t i = n_ / 2; i-- > 0;) sift(i, n_);
    for (std::size_t n = n_; n > 1; --n) {
      exchange(a[0], a[n - 1]);
      sift(0, n - 1);
    }
  }
  // Destroy the elements and the storage.
  void destroy_all() noexcept {
    p_.reset();
    cap_ = n_ = 0;
  }

private:
  // Swap two elements by copy (trivially copyable here), not std::swap's constrained template.
  static void exchange(T &x, T &y) noexcept {
    const T t = x;
    x = y;
    y = t;
  }
  detail::owned_array<T> p_;
  std::size_t cap_ = 0, n_ = 0;
};

// An entry of a pool's key index: a window's key (rkey >> 8, the part a rebind keeps) and its
// slot, ordered by key then slot (std::pair's ordering, without its three-way comparison
// machinery in every TU).
struct key_entry {
  std::uint32_t key = 0;
  std::uint32_t slot = 0;
  friend constexpr bool operator<(key_entry a, key_entry b) noexcept {
    return a.key < b.key || (a.key == b.key && a.slot < b.slot);
  }
  friend constexpr bool operator==(key_entry a, key_entry b) noexcept { return a.key == b.key && a.slot == b.slot; }
};

// The 16-bit ids of the pools alive in this process: a pool's work request ids carry its id, so
// two live pools never share one (a counter masked to 16 bits gave a live pool's id to the
// 65,537th pool after it). Ids are handed out round-robin from a moving start, so a recently freed
// id is the last to come back (a late completion of a gone pool meets no new pool of its id).
class pool_ids {
public:
  static constexpr std::uint32_t count = 1u << 16;
  static constexpr std::int32_t none = -1;
  // A free id, or `none` when `count` pools are alive.
  [[nodiscard]] static std::int32_t acquire() noexcept {
    const std::uint32_t start = cursor().fetch_add(1, detail::order::relaxed);
    for (std::uint32_t k = 0; k < count; ++k) {
      const std::uint32_t id = (start + k) % count;
      const std::uint64_t bit = std::uint64_t(1) << (id % 64);
      detail::atomic<std::uint64_t> &w = words()[id / 64];
      if ((w.load(detail::order::relaxed) & bit) == 0 && (w.fetch_or(bit, detail::order::acq_rel) & bit) == 0)
        return std::int32_t(id);
    }
    return none;
  }
  static void give_back(std::uint16_t id) noexcept {
    words()[id / 64].fetch_and(~(std::uint64_t(1) << (id % 64)), detail::order::acq_rel);
  }

private:
  static detail::atomic<std::uint32_t> &cursor() noexcept {
    static detail::atomic<std::uint32_t> c{0};
    return c;
  }
  static std::array<detail::atomic<std::uint64_t>, count / 64> &words() noexcept {
    static std::array<detail::atomic<std::uint64_t>, count / 64> w{};
    return w;
  }
};

// The pool's state lives apart from the GrantPool object so that moving the pool keeps its
// leases valid, and a lease that outlives its pool finds it closed instead of dangling.
struct grant_pool_state {
  grant_pool_state() = default;
  grant_pool_state(const grant_pool_state &) = delete;
  grant_pool_state &operator=(const grant_pool_state &) = delete;
  ~grant_pool_state() {
    if (id != pool_ids::none) pool_ids::give_back(std::uint16_t(id));
  }
  std::int32_t id = pool_ids::none; // held while the state lives (leases included)

  fixed_vector<grant_slot> slots;
  fixed_vector<std::uint32_t> free;                            // capacity slots.size()
  fixed_vector<key_entry> index; // by (rkey >> 8, slot)
  child_link pd_link;                                         // windows are reallocated on it
  child_link buffers_link; // the region the slots' bytes belong to: not moved while the pool lives
  ibv_pd *pd = nullptr;
  std::uint64_t tag = 0;
  std::uint64_t slot_size = 0;
  mw_type type = mw_type::type1;
  access_flags region_access; // of each exact region
  grant_pool_stats stats;
  ref_count<> refs; // the pool and every live lease (counted_ptr)
  bool open = true;

  [[nodiscard]] lease_state state_of(std::uint32_t s) const noexcept {
    if (!open) return lease_state::ready; // the pool deallocated every window
    const MemoryWindow &w = slots[s].window;
    if (!w) return lease_state::ready; // deallocated: no key is alive
    if (w.state() == mw_state::bound) return lease_state::granted;
    return w.pending() != 0 ? lease_state::revoking : lease_state::ready;
  }
  // Register slot `s`'s exact region and allocate its window (at create(), or at the slot's first
  // lease with grant_pool_options::lazy_slots). Nothing is left allocated on failure.
  [[nodiscard]] result<void> make(std::uint32_t s) noexcept {
    RDMAXX_TRY(made, grant_slot::make_on(pd_link.parent(), pd, slots[s].data, std::size_t(slot_size),
                                         region_access, type));
    slots[s] = std::move(made);
    ++stats.slots_made;
    return success();
  }
  void put_back(std::uint32_t s) noexcept {
    slots[s].in_use = grant_slot::use::free;
    free.push_back(s); // never reallocates: capacity is slots.size()
  }
  // A dropped lease's slot returns to the free list once nothing can reach it.
  void settle(std::uint32_t s) noexcept {
    if (slots[s].in_use == grant_slot::use::dropped && state_of(s) == lease_state::ready)
      slots[s].window ? put_back(s) : void(slots[s].in_use = grant_slot::use::retired);
  }
  void rebuild_index() noexcept {
    index.clear();
    for (std::uint32_t s = 0; s < slots.size(); ++s)
      if (slots[s].window) index.push_back(key_entry{slots[s].window.native_handle()->rkey >> 8, s});
    index.sort();
  }
  void reindex(std::uint32_t old_key, std::uint32_t s) noexcept {
    const auto old = index.lower_bound(key_entry{old_key >> 8, s});
    if (old != index.end() && old->slot == s) index.erase(old);
    add_to_index(s);
  }
  void add_to_index(std::uint32_t s) noexcept {
    if (!slots[s].window) return;
    const key_entry e{slots[s].window.native_handle()->rkey >> 8, s};
    index.insert(index.lower_bound(e), e); // capacity: slots.size()
  }
  [[nodiscard]] const grant_slot *find_key(std::uint32_t rkey) const noexcept {
    const auto it = index.lower_bound(key_entry{rkey >> 8, 0u});
    if (it == index.end() || it->key != (rkey >> 8)) return nullptr;
    return &slots[it->slot];
  }
};
} // namespace detail

/// One leased buffer slot of a GrantPool: the only way to the slot's bytes. Move-only, null after
/// move. Destroying a lease gives its slot back once nothing can reach it (at once when ready;
/// after its revocation is confirmed, or at revoke_all(), otherwise).
class GrantLease {
public:
  /// A null lease.
  GrantLease() noexcept = default;
  /// Takes over `o`'s slot; `o` is left null.
  GrantLease(GrantLease &&o) noexcept : st_(std::move(o.st_)), slot_(std::exchange(o.slot_, 0)) {}
  /// Gives up this lease's slot (as the destructor does), takes over `o`'s.
  GrantLease &operator=(GrantLease &&o) noexcept {
    if (this != &o) {
      drop();
      st_ = std::move(o.st_);
      slot_ = std::exchange(o.slot_, 0);
    }
    return *this;
  }
  ~GrantLease() { drop(); }

  /// True unless null (default-constructed, moved from or given back).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(st_); }
  /// Where the slot stands (ready when null or when the pool was destroyed: no key is alive).
  [[nodiscard]] lease_state state() const noexcept {
    return st_ ? st_->state_of(slot_) : lease_state::ready;
  }
  /// The slot's bytes (GrantPool::slot_size() of them), only while the lease is ready. A checked
  /// accessor rather than an empty span: a caller that copies into the buffer of a granted slot
  /// gets an error it must look at (RDMAXX_TRY, or .value(), which throws or terminates), never
  /// a null pointer to write through, and never the bytes a peer may still read or write.
  /// \errors
  /// - errc::null_handle: a null lease (default-constructed, moved from, given back), or its pool
  ///   was destroyed.
  /// - errc::grant_outstanding: granted or revoking: revoke it and hand the pool the completion
  ///   (state() says when it is ready again).
  /// \mallocs None.
  [[nodiscard]] result<std::span<std::byte>> buffer() const noexcept {
    if (!st_ || !st_->open) return make_error_code(errc::null_handle);
    if (state() != lease_state::ready) return make_error_code(errc::grant_outstanding);
    return detail::span_of(st_->slots[slot_].data, std::size_t(st_->slot_size));
  }
  /// The grant as the peer must use it (meaningful while granted).
  [[nodiscard]] remote_descriptor descriptor() const noexcept {
    if (!st_ || !st_->open) return {};
    return st_->slots[slot_].window.descriptor();
  }
  /// The slot's index in its pool.
  [[nodiscard]] std::uint32_t slot() const noexcept { return slot_; }

private:
  friend class GrantPool;
  friend struct detail::pool_access;
  GrantLease(const detail::counted_ptr<detail::grant_pool_state> &st, std::uint32_t s) noexcept
      : st_(st.share()), slot_(s) {}
  void drop() noexcept {
    detail::counted_ptr<detail::grant_pool_state> st = std::move(st_);
    if (!st) return;
    if (st->open) {
      st->slots[slot_].in_use = detail::grant_slot::use::dropped;
      st->settle(slot_);
    }
  }
  detail::counted_ptr<detail::grant_pool_state> st_; // one of the state's holders
  std::uint32_t slot_ = 0;
};

/// A pool of request-scoped grants over fixed buffer slots of one MemoryRegion, for one
/// connection (see the top of this header). Move-only, null after move; destruction deallocates
/// every window (ibv_dealloc_mw: every key is dead when it returns) and deregisters the exact
/// regions. Not thread-safe.
class GrantPool {
public:
  /// A null pool.
  GrantPool() noexcept = default;
  /// Takes over `o`'s slots (its leases stay valid); `o` is left null.
  GrantPool(GrantPool &&o) noexcept = default;
  /// Closes this pool (as the destructor does), takes over `o`'s.
  GrantPool &operator=(GrantPool &&o) noexcept {
    if (this != &o) {
      drop_state();
      st_ = std::move(o.st_);
    }
    return *this;
  }
  /// Deallocates the windows, deregisters the exact regions (failures go to the destroy-failure
  /// hook). Leases still held become null-like: buffer() answers null_handle, state ready.
  ~GrantPool() { drop_state(); }

  /// Cut `buffers` into o.slots slots of o.slot_size bytes from its start and, per slot, register
  /// its bytes again alone on `pd` (ibv_reg_mr with MW_BIND and the region's LOCAL_WRITE; `pd`
  /// may be another PD of the same device: the connection's) and allocate a window of the type
  /// the device's grant mechanism calls for (detail::grant_for: one ibv_query_device_ex).
  /// The memory of `buffers` must outlive the pool: the pool counts as a child of `buffers`, so
  /// until the pool is destroyed `buffers.destroy()` and a rereg of its translation or PD answer
  /// errc::region_granted (leases that outlive the pool do not count: it deallocated every key).
  /// \errors
  /// - errc::null_handle: `pd` or `buffers` is null.
  /// - errc::unusable: `buffers` is unusable.
  /// - errc::context_mismatch: `pd` of another device, or o.grant.caps of another device.
  /// - errc::zero_length: o.slot_size is 0, or no slot fits.
  /// - errc::out_of_range: o.slot_size of 2^32 or more, or o.slots slots do not fit `buffers`.
  /// - errc::too_many_entries: 65,536 pools are alive in this process (their work request ids
  ///   carry a 16-bit pool id): destroy one, or share pools.
  /// - errc::unsupported: no memory windows here.
  /// - errc::unsafe_grant: only type-2 windows on a device where a peer could panic the kernel
  ///   with them (see type2_risk; grant_options::type2 accepts the risk).
  /// - the errno of ibv_query_device_ex (not called when o.grant.caps is given), ibv_reg_mr (ENOMEM: too many pinned pages, see
  ///   `ulimit -l`) and ibv_alloc_mw (with o.lazy_slots: at acquire() instead); ENOMEM when
  ///   the arrays cannot be allocated. Nothing is left allocated.
  /// \mallocs The state, three arrays of o.slots entries, each exact region's node, and what
  /// verbs allocates.
  [[nodiscard]] static result<GrantPool> create(const ProtectionDomain &pd, const MemoryRegion &buffers,
                                                grant_pool_options o = {}) noexcept;

  // ---- accessors ----
  /// True unless null (default-constructed or moved from).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(st_); }
  /// Slots in all.
  [[nodiscard]] std::size_t size() const noexcept { return st_ ? st_->slots.size() : 0; }
  /// Slots not leased.
  [[nodiscard]] std::size_t available() const noexcept { return st_ ? st_->free.size() : 0; }
  /// Bytes per slot.
  [[nodiscard]] std::uint64_t slot_size() const noexcept { return st_ ? st_->slot_size : 0; }
  /// The mechanism the pool's grants use (none when null).
  [[nodiscard]] grant_mechanism mechanism() const noexcept {
    if (!st_) return grant_mechanism::none;
    return st_->type == mw_type::type1 ? grant_mechanism::type1_exact_region
                                       : grant_mechanism::type2_window;
  }
  /// What to offer the peer at connection setup: send-with-invalidate only with type-2 windows
  /// (the library chose them where that is safe, or the caller trusts the peers).
  [[nodiscard]] grant_offer offer() const noexcept {
    return {mechanism() == grant_mechanism::type2_window};
  }
  /// The pool's counters.
  [[nodiscard]] const grant_pool_stats &stats() const noexcept {
    static const grant_pool_stats none{};
    return st_ ? st_->stats : none;
  }
  /// True when `wc` is the completion of one of this pool's work requests.
  [[nodiscard]] bool owns(const ibv_wc &wc) const noexcept {
    return st_ && (wc.wr_id & ~0xFFFFFFFFull) == st_->tag;
  }

  // ---- the request path (inline, allocation-free) ----

  /// Lease a free slot (ready: its buffer is the caller's). With grant_pool_options::lazy_slots,
  /// a slot's first lease first registers its exact region and allocates its window.
  /// \errors
  /// - errc::null_handle: a null pool.
  /// - errc::pool_exhausted: every slot is leased or waits for its revocation.
  /// - lazy_slots, a slot's first lease: the errno of ibv_reg_mr (ENOMEM: too many pinned pages,
  ///   see `ulimit -l`; EFAULT: the slot's pages are not accessible) or ibv_alloc_mw. The slot
  ///   stays free and unmade (the next acquire() tries it again), nothing is left allocated.
  /// \mallocs None (lazy_slots, a slot's first lease: its exact region's node and what verbs
  /// allocates).
  [[nodiscard]] result<GrantLease> acquire() noexcept {
    if (!st_) return make_error_code(errc::null_handle);
    if (st_->free.empty()) return make_error_code(errc::pool_exhausted);
    const std::uint32_t s = st_->free.back();
    if (!st_->slots[s].made()) [[unlikely]] RDMAXX_TRYV(make_lazily(s));
    st_->free.pop_back();
    st_->slots[s].in_use = detail::grant_slot::use::leased;
    return GrantLease(st_, s);
  }

  /// Add the grant of `l`'s whole slot with `rights` to an open batch of `qp` (a window bind,
  /// unsignaled, with this pool's wr_id; MemoryWindow::bind's batch form). Add the request's
  /// send after it in the same batch with send_flag::fence, so that the peer cannot see the
  /// request before the grant works. If the batch is then dropped or its submit() fails, the
  /// batch rolls the grant back itself (lease ready again). Inline.
  /// \errors
  /// - errc::null_handle: a null pool, lease or QP.
  /// - errc::pool_mismatch: a lease of another pool.
  /// - errc::grant_outstanding: the slot is granted or its revocation is not confirmed.
  /// - errc::unusable: the slot lost its window (a failed revoke_all()).
  /// - those of MemoryWindow::bind (batch form): pd_mismatch (the QP is not on the pool's PD),
  ///   bad_grant_rights (rights other than remote read/write/atomic, e.g. local_write, or none),
  ///   qp_mismatch, wrong_state, too_many_pending.
  /// - the errno of ibv_alloc_mw / ibv_dealloc_mw when the slot's window is replaced first (see
  ///   max_key_changes; the slot then keeps its window, nothing is posted).
  /// \mallocs None (what ibv_alloc_mw allocates when the window is replaced).
  [[nodiscard]] result<remote_descriptor> grant(SendBatch &batch, QueuePair &qp, GrantLease &l,
                                                access_flags rights) noexcept {
    RDMAXX_TRY(s, slot_of(l));
    if (st_->state_of(l.slot_) != lease_state::ready) return make_error_code(errc::grant_outstanding);
    if (s->keys_used_up()) RDMAXX_TRYV(rotate(l.slot_));
    RDMAXX_TRY(d, s->bind(batch, qp, rights, {st_->tag | l.slot_, {}}));
    ++st_->stats.grants;
    return d;
  }

  /// Revoke `l`'s grant, posted now (signaled, this pool's wr_id): type 1 an unbind
  /// (ibv_bind_mw, length 0), type 2 a local invalidate. Nothing is posted when the grant is
  /// already revoked or revoking (the peer's send-with-invalidate, an earlier revoke) or was never
  /// made: a second revoke is harmless. The buffer is ready again once the completion was handed
  /// to complete().
  /// \errors
  /// - errc::null_handle: a null pool, lease or QP.
  /// - errc::pool_mismatch: a lease of another pool.
  /// - errc::wrong_state: the QP is in ERR as verbs last recorded it (ibv_modify_qp,
  ///   ibv_query_qp): the revoke would be flushed; use revoke_all(). A QP the device moved to ERR
  ///   by itself (a remote error) still reads RTS there: its revoke is posted and flushed, and the
  ///   flush leaves the grant live (the lease stays granted): then revoke_all() as well.
  /// - those of MemoryWindow::unbind / invalidate (posting forms): wrong_state (the QP is not at
  ///   RTS: after a disconnect use revoke_all()), qp_mismatch (type 2: another QP than the one
  ///   bound through), too_many_pending, the errno of the post.
  /// \mallocs None.
  result<void> revoke(QueuePair &qp, GrantLease &l) noexcept {
    RDMAXX_TRY(s, slot_of(l));
    if (s->window.state() != mw_state::bound) return success();
    // A revoke posted to a QP in ERR would be flushed, and the flush would roll it back: the key
    // would stay live while the caller was told it is revoking.
    if (qp && qp.native_handle()->state == IBV_QPS_ERR) return make_error_code(errc::wrong_state);
    RDMAXX_TRYV(s->unbind(qp, {st_->tag | grant_pool_revoke_bit | l.slot_, send_flag::signaled}));
    ++st_->stats.revokes;
    return success();
  }
  /// As above, added to an open batch of `qp` (e.g. the next request's): if the batch is dropped
  /// or its submit() fails, the batch rolls the revoke back itself (lease granted again).
  /// \errors
  /// - those of revoke(QueuePair&, GrantLease&), with the batch-form checks of MemoryWindow
  ///   (qp_mismatch: a batch of another QP; wrong_state: the batch is not open).
  /// \mallocs None.
  result<void> revoke(SendBatch &batch, QueuePair &qp, GrantLease &l) noexcept {
    RDMAXX_TRY(s, slot_of(l));
    if (s->window.state() != mw_state::bound) return success();
    if (qp && qp.native_handle()->state == IBV_QPS_ERR) return make_error_code(errc::wrong_state);
    RDMAXX_TRYV(s->unbind(batch, qp, {st_->tag | grant_pool_revoke_bit | l.slot_, send_flag::signaled}));
    ++st_->stats.revokes;
    return success();
  }

  /// Undo every unconfirmed grant and revoke operation of `l` (MemoryWindow::cancel_pending), for
  /// a caller that knows none of them will execute (e.g. its QP was reset before they ran). Not
  /// needed after a dropped batch or a failed submit(): the batch undoes its own.
  void cancel(GrantLease &l) noexcept {
    if (auto s = slot_of(l)) s.value()->window.cancel_pending();
  }

  /// Hand the pool every completion polled from the CQ(s) of its QP, in bulk: the pool's own
  /// (its wr_ids, success or error) confirm or roll back its slots; a successful receive whose
  /// send-with-invalidate named a granted key (type 2) revokes that grant. Returns the
  /// completions that are not the pool's, moved to the front of `wcs` in their order: the
  /// caller's, receives included. Inline, allocation-free.
  std::span<ibv_wc> complete(std::span<ibv_wc> wcs) noexcept;

  /// Give a ready slot back to the pool (no verb: the slot's region and window stay, for the
  /// next acquire()); `l` becomes null.
  /// \errors
  /// - errc::null_handle: a null pool or lease.
  /// - errc::pool_mismatch: a lease of another pool.
  /// - errc::grant_outstanding: granted or revoking: revoke it and hand the pool the completion,
  ///   or revoke_all() after a disconnect; `l` is unchanged.
  /// \mallocs None.
  result<void> give_back(GrantLease &l) noexcept {
    RDMAXX_TRY(s, slot_of(l));
    (void)s;
    if (st_->state_of(l.slot_) != lease_state::ready) return make_error_code(errc::grant_outstanding);
    l = GrantLease{};
    return success();
  }
  /// The former name of give_back() ("release" now means only giving up ownership).
  [[deprecated("use give_back()")]] result<void> release(GrantLease &l) noexcept { return give_back(l); }

  // ---- disconnect ----

  /// Revoke every grant of the pool for good, synchronously: every window that is bound or has
  /// unconfirmed operations is deallocated (ibv_dealloc_mw: its key is dead when it returns) and
  /// a fresh one allocated for the slot. For a connection that went down (DISCONNECTED, a QP in
  /// ERR): call it once the QP's completions were polled (so the QP no longer reads or writes the
  /// buffers) and before reusing any buffer or reconnecting. Leases stay leased and become ready;
  /// slots of dropped leases return to the pool.
  /// \errors
  /// - errc::null_handle: a null pool.
  /// - the first errno of ibv_dealloc_mw or ibv_alloc_mw: every slot is still handled; a slot
  ///   whose window could not be replaced keeps no live key and is retired (grant() on it answers
  ///   errc::unusable; it does not return to the pool).
  /// \mallocs What ibv_alloc_mw allocates.
  result<void> revoke_all() noexcept;

  /// Destroy now, checked (what the destructor does, with the failures returned instead of
  /// reported through the destroy-failure hook): per slot the window is deallocated
  /// (ibv_dealloc_mw: every key the pool handed out is dead when this returns, granted or not),
  /// then the exact region deregistered (ibv_dereg_mr). The pool is null afterwards, whatever the
  /// outcome; its leases become null-like (ready; buffer() answers null_handle).
  /// \errors
  /// - errc::null_handle: a null pool.
  /// - the first errno of ibv_dealloc_mw / ibv_dereg_mr: every slot is still handled; an object
  ///   that could not be destroyed is reported through the hook when the pool's state goes.
  /// \mallocs None.
  result<void> destroy() noexcept {
    if (!st_) return make_error_code(errc::null_handle);
    std::error_code first;
    for (detail::grant_slot &s : st_->slots) {
      if (s.window)
        if (auto r = s.window.destroy(); !r && !first) first = r.error();
      if (s.region && !s.window)
        if (auto r = s.region.destroy(); !r && !first) first = r.error();
    }
    drop_state();
    if (first) return first;
    return success();
  }

  /// Keys one window takes before the pool replaces it: only the low 8 bits of a window's key
  /// change from bind to bind, so after 256 changes an old key would come back and a very late
  /// access could reach a later request's buffer. Each grant takes one key (and a type-1 revoke
  /// another); before a grant would reach this, the slot's window is deallocated and a fresh one
  /// allocated (a new key index): two verbs calls every 127 requests of a slot (type 1).
  static constexpr std::uint32_t max_key_changes = detail::grant_slot::max_key_changes;
  /// Grants a slot's window makes before it is replaced (127 with type-1 windows, whose revoke
  /// takes a key too; 255 with type 2).
  [[nodiscard]] std::uint32_t grants_per_window() const noexcept {
    return st_ ? detail::grant_slot::grants_per_window(st_->type) : 0;
  }

private:
  // A lazy slot's first lease: make it, and index its window's key (for send-with-invalidate).
  [[gnu::cold, gnu::noinline]] result<void> make_lazily(std::uint32_t s) noexcept {
    RDMAXX_TRYV(st_->make(s));
    st_->add_to_index(s);
    return success();
  }
  // A fresh window for a ready slot whose keys are used up (detail::grant_slot::renew); on
  // failure the slot keeps its window and nothing is posted.
  [[gnu::cold]] result<void> rotate(std::uint32_t i) noexcept {
    detail::grant_slot &s = st_->slots[i];
    const std::uint32_t old_key = s.window.native_handle()->rkey;
    RDMAXX_TRYV(s.renew());
    ++st_->stats.windows_renewed;
    st_->reindex(old_key, i);
    return success();
  }
  [[nodiscard]] result<detail::grant_slot *> slot_of(const GrantLease &l) noexcept {
    if (!st_ || !l) return make_error_code(errc::null_handle);
    if (l.st_.get() != st_.get()) return make_error_code(errc::pool_mismatch);
    detail::grant_slot &s = st_->slots[l.slot_];
    if (!s.window) return make_error_code(errc::unusable);
    return &s;
  }
  void remote_invalidated(const ibv_wc &wc) noexcept {
    const detail::grant_slot *c = st_->find_key(wc.invalidated_rkey);
    if (!c) return;
    auto &s = const_cast<detail::grant_slot &>(*c);
    if (s.window.complete(wc)) {
      ++st_->stats.remote_invalidations;
      st_->settle(std::uint32_t(&s - st_->slots.data()));
    }
  }
  // The unchecked destruction (destructor, move assignment, and destroy() after its checked pass).
  void drop_state() noexcept {
    detail::counted_ptr<detail::grant_pool_state> st = std::move(st_);
    if (!st) return;
    st->open = false;
    st->slots.destroy_all(); // per slot the window first, then the region (grant_slot's member order)
    st->free.destroy_all();
    st->index.destroy_all();
    st->pd_link.drop();
    st->buffers_link.drop(); // no exact region reaches the bytes any more
    st.reset();
  }

  friend struct detail::pool_access;
  detail::counted_ptr<detail::grant_pool_state> st_; // one of the state's holders
};

namespace detail {
// What identifies a pool to the completion table: its state, which its leases share.
struct pool_access {
  [[nodiscard]] static const void *state(const GrantPool &p) noexcept { return p.st_.get(); }
  [[nodiscard]] static const void *state(const GrantLease &l) noexcept { return l.st_.get(); }
};
} // namespace detail

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/grant_pool.ipp"
