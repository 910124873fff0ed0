/// \file
/// rdmaxx/indirect_key.hpp: IndirectKey (user-mode memory registration). What a peer receives is
/// an ikey_descriptor (ikey_descriptor.hpp); the peer writes and reads through it with
/// write_indirect / read_indirect (indirect_access.hpp).
///
/// An IndirectKey presents several registered regions (and other keys) as one zero-based address
/// space, described by a layout (layout.hpp). Two backends, one API:
///   - mlx5 (hardware UMR through mlx5dv, mlx5/indirect_key_mlx5.hpp): one mkey; configure() posts
///     an mkey-configure work request; lkey()/rkey() address the whole layout; the descriptor has
///     one segment. Compiled and contract-tested, not run on hardware.
///   - software (every other device): the layout is flattened into (MR, address, length)
///     segments. Local use expands a window of the key into SGEs (sges()). Remote use grants
///     each segment through the device's grant mechanism (Capabilities::grant, chosen at
///     create(); mechanism()) as StrictGrant grants its range: a region of exactly the segment's
///     bytes at the same device address, and a window over all of it, so that every segment key
///     reaches exactly its segment's bytes (the region's bounds, which every device enforces);
///     the window is type 1 on rxe (grant_mechanism::type1_exact_region: no peer's
///     send-with-invalidate can panic the kernel), type 2B elsewhere or with ikey_options::grant
///     (grant_mechanism::type2_window). configure() adds the binds to the send batch; the
///     descriptor carries the segments' window rkeys, and the initiator splits a write or read
///     into one work request per touched segment (write_indirect / read_indirect). revoke()
///     deallocates the windows: the peer's keys stop working at once. Each segment is a grant
///     slot (detail/grant_slot.hpp, as in StrictGrant and GrantPool). The exact regions stay
///     after revoke(), so that configuring the same segments again registers nothing (a
///     repeated layout costs a window bind per segment); the next configure
///     deregisters those its layout does not use, destroy_kept_regions() all of them. While the
///     key holds an exact region it counts as a child of the underlying MemoryRegion: destroy()
///     of that answers errc::region_granted (destroy_kept_regions() first; a destructor defers
///     the deregistration instead). There is no single lkey/rkey (both are 0).
/// The backend is chosen at creation: mlx5 where mlx5dv_is_supported, DEVX QUERY_HCA_CAP answers
/// (a failed query fails closed), the device allows UMR atomics and an mkey can be created,
/// software otherwise; forced to software by ikey_options::backend or RDMAXX_UMR=software.
/// Configure keys through a QP from create_indirect_key_qp() (mlx5::create_umr_qp on mlx5): on
/// mlx5 an ordinary QP lacks the builders and configure() refuses it (errc::not_umr_qp).
///
/// Differences that remain between the backends (see the README):
///   - software segments need the bytes of a MemoryRegion (a raw region_ref cannot be granted
///     remotely: there is nothing to register again);
///   - a software key nested in another is copied at configure time: invalidating the inner key
///     does not revoke the outer one (on mlx5 it does).
///
/// Lifetime: borrows its ProtectionDomain (destroy the key first). While configured with remote
/// rights it counts as a child of the QP its windows were bound through (destroy or revoke
/// the key before that QP: rxe blocks for tens of seconds destroying a QP with bound type-2 windows: README).
/// A key with a configure (or mlx5 invalidate) in an open batch must stay alive, at its address,
/// until that batch is submitted or dropped: a dropped batch or a failed submit() undoes the
/// operation through it.
///
/// mlx5, an operation posted and unconfirmed (pending()): only its own completion settles it
/// (complete(); an error or flushed one rolls it back). Until then the UMR QP's to_reset() and
/// reset_and_reconnect() answer errc::busy (RESET would drop that completion, mlx5_cq_clean, and
/// a configure whose outcome is unknown may have made the mkey live): rdmaxx never guesses the
/// outcome. To give up on an operation, move the QP to ERR (QueuePair::to_error) and hand the
/// flushed completion over; then reset. destroy() answers errc::operation_unconfirmed meanwhile.
/// The destructor and a move assignment onto the key never destroy the mkey under the posted
/// UMR or local invalidate: on a UMR QP from create_umr_qp (its send queue counted) the
/// destruction is deferred, as a parent's is while children live (reported through the
/// destroy-failure hook: errc::busy, one QueuePair still using it), until the queue shows the
/// operation ended: its completion (or any later one of the QP) handed to QueuePair::retire(),
/// or the QP reset (to_reset() no longer waits for it) or destroyed. The mkey is then destroyed
/// and the layout's regions and nested keys and the PD let go. On a QP whose queue is not
/// counted nothing tells when it ends: the mkey, its state and its layout's links are kept for
/// good (reported, EBUSY), only the QP is let go.
///
/// Threads: an IndirectKey is used by one thread at a time, like the SendBatch it posts through
/// (the provider holds the QP's send-queue lock from ibv_wr_start to ibv_wr_complete, so a
/// thread must not configure or revoke while another thread's batch is open on that QP).
/// Every member, const ones included, reads state another thread's configure(), revoke()
/// or complete() writes without a lock: give a key and the completions that concern it to one
/// thread (the one polling its QP's CQ), or serialize them. On mlx5 an outer key reads the state
/// of the keys nested in it (stale()): nested keys follow the same rule together. What is shared
/// with other threads is synchronized by rdmaxx: the UMR QP's send-queue credit (atomics:
/// QueuePair::retire may run on the polling thread), the deferred destruction (handles' nodes),
/// the process-wide tag variant and the quarantine of mkey indexes (mlx5/indirect_key_mlx5.hpp).
///
/// Allocation: IndirectKey::create() allocates the key's state (new(nothrow)) and, software, its
/// segment table and its table of grant slots; mlx5dv_create_mkey allocates inside the provider. configure()
/// (software, remote rights) allocates one window per segment (ibv_alloc_mw) and, with the
/// exact-region mechanism, registers one region per segment whose bytes changed since the last
/// configure (ibv_reg_mr_iova2). ikey_descriptor is
/// a fixed-size value; write_indirect, read_indirect, sges() and descriptor() allocate nothing.
#pragma once

#include "access.hpp"
#include "detail/grant_slot.hpp"
#include "detail/handle.hpp"
#include "detail/object_ids.hpp"
#include "detail/span.hpp"
#include "device.hpp"
#include "error.hpp"
#include "ikey_descriptor.hpp"
#include "layout.hpp"
#include "memory_region.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#if RDMAXX_HAVE_MLX5
#include "mlx5/context_mlx5.hpp"
#include "mlx5/indirect_key_mlx5.hpp"
#endif

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <utility>

struct mlx5dv_mkey;

namespace rdmaxx {

// ---------------------------------------------------------------------------------------------
// IndirectKey

/// Choices at IndirectKey creation.
struct ikey_options {
  /// umr_backend::none: automatic (mlx5 where it works, unless RDMAXX_UMR=software).
  umr_backend backend = umr_backend::none;
  /// Software: flat segments the key can hold after expansion (0: 8 x max_entries, at least 64,
  /// at most ikey_descriptor::max_segments).
  std::uint32_t max_segments = 0;
  /// mlx5: let peers invalidate the key with a send-with-invalidate (SendBatch::send_inv);
  /// creates the mkey with MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE. Without it such a send
  /// fails at the peer's side. Off by default: any peer holding the key could revoke it.
  bool remote_invalidate = false;
  /// Software: how the segments are granted, as for every grant form (grant_options, as
  /// grant_pool_options::grant): grant.trusted_peers / grant.type2 choose type-2 windows (the
  /// device's mechanism, Capabilities::grant, by default); grant.caps spares the
  /// ibv_query_device_ex at create().
  grant_options grant = {};
};

namespace detail {
struct ikey_state {
  umr_backend backend = umr_backend::software;
  std::uint64_t id = object_ids::acquire(); // the key's own work request id (IndirectKey::wr_id())
  ibv_pd *pd = nullptr;
  std::uint32_t max_entries = 0;
  std::uint32_t max_segments = 0;
  key_segment *segs = nullptr; // software: capacity max_segments
  // Software: one grant slot per segment (detail/grant_slot.hpp, the mechanism StrictGrant and
  // GrantPool share): its window while configured with remote rights and a region of exactly
  // the segment's bytes (the window, type 1 or 2 as `grant` says, is bound over all of it) with a
  // count on the underlying MemoryRegion (links). The
  // exact regions outlive revoke(): the next configure reuses those whose segment is
  // unchanged and deregisters the others (destroy_kept_regions() all of them).
  grant_slot *slots = nullptr;
  child_link *links = nullptr;
  std::uint32_t nsegs = 0;
  std::uint32_t nwindows = 0; // slots [0, nwindows) may hold a window
  std::uint32_t nkept = 0;    // slots [0, nkept) may hold an exact region
  grant_mechanism grant = grant_mechanism::none; // chosen by create(), which fails closed
  bool grant_unsafe = false; // no safe grant mechanism here (remote rights: errc::unsafe_grant)
  // software with remote rights: the binds were posted and their last (signaled) completion,
  // matched by wr_id and QP, has not been handed to complete() yet: no descriptor until then.
  bool binds_unconfirmed = false;
  std::uint64_t bind_wr_id = 0;
  std::uint32_t bind_qp_num = 0;
  std::uint64_t length = 0;
  access_flags access{};
  bool configured = false;
  bool all_mw_bind = false;
  ::mlx5dv_mkey *mkey = nullptr;
#if RDMAXX_HAVE_MLX5
  mlx5::key_state mk; // mlx5: what the device did (mk.mkey == mkey)
  // How configure() reaches the mlx5dv_qp_ex of a batch's QP; contract tests hand a recorder's.
  mlx5::to_dv_qp to_dv = mlx5::dv_qp_of;
  // How the mkey is destroyed (mlx5dv_destroy_mkey); contract tests hand a recorder.
  int (*destroy_mkey)(::mlx5dv_mkey *) = &::mlx5dv_destroy_mkey;
  // What the HCA said at create() (QUERY_HCA_CAP): max_indirection, repeated_block_disabled.
  mlx5::umr_hca_caps hca{};
  // The configured layout's levels of indirection (layout::depth), for keys nesting this one.
  std::uint8_t depth = 0;
#endif

  // Deallocating (not invalidating) the windows: never a local invalidate of a type-2 window
  // that may not be bound (rxe panics), and the peer's rkeys die at once. Returns the first
  // errno; the windows that could not be deallocated stay (and so do the regions under them).
  int destroy_windows() noexcept {
    int first = 0;
    for (std::uint32_t i = 0; i < nwindows; ++i)
      if (slots[i].window)
        if (auto r = slots[i].window.destroy(); !r && first == 0) first = r.error().value();
    if (first == 0) nwindows = 0;
    return first;
  }
  // Slot i's exact region and the count on its underlying region (after its window).
  int destroy_region(std::uint32_t i) noexcept {
    if (slots[i].region)
      if (auto r = slots[i].region.destroy(); !r) return r.error().value();
    slots[i].data = nullptr;
    links[i].drop();
    return 0;
  }
  // The exact regions of slots [from, nkept).
  int destroy_regions(std::uint32_t from = 0) noexcept {
    int first = 0;
    for (std::uint32_t i = from; i < nkept; ++i)
      if (const int rc = destroy_region(i); rc != 0 && first == 0) first = rc;
    if (first == 0 && nkept > from) nkept = from;
    return first;
  }
  // Windows, then exact regions (a region with a bound window cannot be deregistered).
  int destroy_all() noexcept {
    if (const int rc = destroy_windows()) return rc;
    return destroy_regions();
  }
  ~ikey_state() {
    delete[] segs;
    delete[] slots; // windows before regions (grant_slot's member order), regions before links
    delete[] links;
  }
};

/// The mlx5 verbs IndirectKey::create calls to choose and make its backend (the contract tests
/// of test/unit/test_mlx5_contract.cpp hand stand-ins to IndirectKey::create_with).
struct ikey_mlx5_verbs {
#if RDMAXX_HAVE_MLX5
  bool (*is_mlx5)(ibv_device *) = &::mlx5dv_is_supported;    ///< mlx5dv_is_supported
  mlx5::devx_cmd_verb devx_cmd = &::mlx5dv_devx_general_cmd; ///< QUERY_HCA_CAP (query_umr_atomic)
  mlx5::create_mkey_verb create_mkey = &::mlx5dv_create_mkey; ///< the indirect mkey (create_mkey)
  mlx5::destroy_mkey_verb destroy_mkey = &::mlx5dv_destroy_mkey; ///< mlx5dv_destroy_mkey
#endif
};

// IndirectKey's destroy function (impl/indirect_key.ipp): its windows or its mkey, then the state.
inline int destroy_ikey(ikey_state *s) noexcept;
} // namespace detail

/// An indirect key (user-mode memory registration): one zero-based address space over several
/// registered regions and configured keys, described by a layout; hardware UMR on mlx5, memory
/// windows elsewhere (see the top of this header). Move-only, null after move; on destruction the
/// windows are deallocated and the mlx5 mkey destroyed (failures reported through the
/// destroy-failure hook).
class IndirectKey {
public:
  /// An empty (null) key.
  IndirectKey() noexcept = default;
  /// Destroys the key as destroy() does, reporting failures through the destroy-failure hook;
  /// under an unconfirmed mlx5 operation the destruction is deferred (see the class comment).
  ~IndirectKey() { orphan_pending(); }
  /// Takes `o`'s key; `o` is null after.
  IndirectKey(IndirectKey &&) noexcept = default;
  /// Destroys the key held before (as the destructor does), then takes `o`'s.
  IndirectKey &operator=(IndirectKey &&o) noexcept {
    if (this != &o) {
      orphan_pending();
      h_ = std::move(o.h_);
    }
    return *this;
  }

  /// Create a key on `pd` whose layouts hold up to `max_entries` entries. mlx5:
  /// mlx5dv_create_mkey (indirect) for `max_entries` + 1 entries (a repeat layout's header takes
  /// one), with MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG where the kernel allows it (then each
  /// configure after the first rotates the mkey's tag; see configure()); max_entries() reads back
  /// the provider's rounded-up value.
  /// Software: allocates the segment table (windows are allocated by configure()).
  /// \errors
  /// - errc::null_handle: `pd` is null.
  /// - errc::zero_length: `max_entries` is 0.
  /// - errc::out_of_range: `max_entries` above 65535, or max_segments above
  ///   ikey_descriptor::max_segments; mlx5 (forced, or chosen automatically on an mlx5 device):
  ///   `max_entries` above mlx5::max_mkey_entries (65532: the provider's round-up to a multiple
  ///   of 4 would wrap its 16-bit field to 0).
  /// - errc::unsupported: backend mlx5 forced on a device or build without it, or on a device
  ///   reporting umr_modify_atomic_disabled or umr_indirect_mkey_disabled (mlx5::query_umr_caps;
  ///   chosen automatically, such a device gets the software backend).
  /// - mlx5 forced: the errno of DEVX QUERY_HCA_CAP when it fails (a failed query fails closed;
  ///   chosen automatically, such a device gets the software backend, whose own query decides).
  /// - the errno of mlx5dv_create_mkey when mlx5 is forced.
  /// - software: the errno of ibv_query_device_ex (the grant mechanism is chosen from it; no key
  ///   rather than a guess; not called when o.grant.caps is given); errc::context_mismatch:
  ///   o.grant.caps of another device.
  /// - ENOMEM.
  /// \mallocs The key's state (new(nothrow)) and, software, its segment table and window table;
  /// mlx5dv_create_mkey allocates inside the provider.
  [[nodiscard]] static result<IndirectKey> create(const ProtectionDomain &pd, std::uint32_t max_entries,
                                                  ikey_options o = {}) noexcept {
    return create_with(pd, max_entries, o, {});
  }
  /// create() through the given mlx5 verbs (mlx5dv_is_supported, mlx5dv_devx_general_cmd,
  /// mlx5dv_create_mkey): the seam the contract tests use with stand-ins. Every query that
  /// decides the backend or the grant mechanism fails closed: a failed QUERY_HCA_CAP chooses no
  /// mlx5 backend, a failed ibv_query_device_ex makes no software key (never a guessed type-2
  /// fallback).
  /// \errors As create().
  /// \mallocs As create().
  [[nodiscard]] static result<IndirectKey> create_with(const ProtectionDomain &pd, std::uint32_t max_entries,
                                                       ikey_options o,
                                                       const detail::ikey_mlx5_verbs &v) noexcept;

  // ---- accessors ----
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The backend chosen at creation (umr_backend::none when null).
  [[nodiscard]] umr_backend backend() const noexcept { return h_ ? st().backend : umr_backend::none; }
  /// The mlx5 mkey (nullptr for the software backend).
  [[nodiscard]] ::mlx5dv_mkey *native_handle() const noexcept { return h_ ? st().mkey : nullptr; }
  /// Layout entries allowed (mlx5: as created and rounded up by the provider, at least the number
  /// asked for plus one).
  [[nodiscard]] std::uint32_t max_entries() const noexcept { return h_ ? st().max_entries : 0; }
  /// Software: flat segments the key can hold.
  [[nodiscard]] std::uint32_t max_segments() const noexcept { return h_ ? st().max_segments : 0; }
  /// True from a successful configure() (its operations added to the batch) until revoke().
  /// mlx5: until the revoke (a local invalidate) is confirmed (the key may work until then), see pending().
  [[nodiscard]] bool configured() const noexcept { return h_ && st().configured; }
  /// A configure (or, mlx5, a revoke) added to a batch is not confirmed yet (hand its
  /// completion to complete(); a dropped batch or a failed submit() undoes it).
  [[nodiscard]] bool pending() const noexcept;
  /// mlx5: configured over a nested key that has since been invalidated or re-tagged (or is
  /// itself stale): the device refuses every access through this key, so descriptor(), sges()
  /// and nesting answer errc::stale_key until it is revoked and configured again. Software:
  /// false (a nested software key is copied at configure time).
  [[nodiscard]] bool stale() const noexcept {
#if RDMAXX_HAVE_MLX5
    return h_ && st().mkey && st().mk.phase == mlx5::key_phase::configured && mlx5::stale(st().mk);
#else
    return false;
#endif
  }
  /// Bytes of the configured layout (0 when not configured).
  [[nodiscard]] std::uint64_t length() const noexcept { return configured() ? st().length : 0; }
  /// The rights the key was configured with (empty when not configured).
  [[nodiscard]] access_flags access() const noexcept { return configured() ? st().access : access_flags{}; }
  /// mlx5: the mkey's lkey / rkey (equal). Software: 0 (there is no single key: use sges() and
  /// descriptor()).
  [[nodiscard]] std::uint32_t lkey() const noexcept { return h_ && st().mkey ? mkey_lkey() : 0; }
  /// mlx5: the mkey's rkey. Software: 0 (peers use descriptor()).
  [[nodiscard]] std::uint32_t rkey() const noexcept { return h_ && st().mkey ? mkey_rkey() : 0; }
  /// Software: the flat segments (rkey: the window's when configured with remote rights).
  [[nodiscard]] std::span<const key_segment> segments() const noexcept {
    return configured() ? detail::span_of<const key_segment>(st().segs, st().nsegs) : std::span<const key_segment>{};
  }
  /// Software: the grant mechanism chosen at create() (Capabilities::grant, or ikey_options::grant's
  /// choice): how configure() grants each segment remotely; none without a safe window type.
  /// mlx5 (the mkey is no window) and null: none.
  [[nodiscard]] grant_mechanism mechanism() const noexcept {
    return h_ && st().backend == umr_backend::software ? st().grant : grant_mechanism::none;
  }
  /// The PD the key was created on, or nullptr when null.
  [[nodiscard]] ibv_pd *pd() const noexcept { return h_ ? st().pd : nullptr; }
  /// The key's own work request id (detail::object_ids: never handed to another object of this
  /// process): what its configure and revoke carry when given own_wr_id (the default), and
  /// so what their completions carry. 0 when null.
  [[nodiscard]] std::uint64_t wr_id() const noexcept { return h_ ? st().id : 0; }

  /// The limits a layout must respect to configure this key through `qp`.
  [[nodiscard]] layout_limits limits(const QueuePair &qp) const noexcept;

  /// A view of this key for a layout entry of another key (nesting). A key that is not
  /// configured gives a ref that validation refuses with errc::wrong_state.
  operator region_ref() const noexcept; // NOLINT: implicit on purpose ({key, off, len})

  /// Configure the key with layout `l` and rights `acc`, as operations of `batch` (opened on
  /// `qp`; they take effect when it is submitted, in order with what follows on that QP).
  /// mlx5: one mkey-configure work request (IBV_SEND_INLINE added to w.flags). Software: the
  /// layout is flattened now; with remote rights, one window per segment is allocated and bound
  /// (ibv_wr_bind_mw; w.flags' signaled bit on the last bind only) over a region of exactly the
  /// segment registered by the key (type 1 or 2 as mechanism() says), so the underlying regions
  /// need no remote rights and no MW_BIND (remote write/atomic: LOCAL_WRITE). mlx5: every
  /// underlying region grants the rights.
  /// mlx5: `qp` must come from mlx5::create_umr_qp (or create_indirect_key_qp); the work request
  /// is posted signaled whatever w.flags says, and the key is pending until that completion
  /// (this QP, w.id, MLX5DV_WC_UMR) is handed to complete(): descriptor(), sges() and nesting
  /// refuse until then. Give w.id a value no other outstanding work request of the QP has. Each
  /// configure after the first gives the mkey a new 8-bit tag, so lkey()/rkey() change and no
  /// rkey of an earlier configure answers again; while configured the key counts as a child of
  /// each MemoryRegion and nested key of its layout (a region's destroy() and rereg() answer
  /// errc::region_granted, a nested key's destroy() errc::busy). If the batch is dropped or its submit() fails, the batch undoes the configure
  /// (mlx5: the operation is dropped, its tag given back; software: the windows are deallocated, the key
  /// is not configured): keep the key alive and in place until then.
  /// \errors Nothing is then added to the batch:
  /// - errc::null_handle: a null key or QP.
  /// - errc::foreign_wr_id: `w.id` is another window's or key's own id (leave own_wr_id).
  /// - errc::already_bound: configured (revoke first).
  /// - errc::operation_unconfirmed: mlx5: an operation is unconfirmed.
  /// - errc::not_umr_qp: mlx5: `qp` lacks the mlx5 UMR send operations.
  /// - errc::key_retired: mlx5: the mkey's tags are used up (the second configure where the
  ///   kernel has no tag update, the 257th otherwise): create a new key.
  /// - errc::send_queue_full: mlx5: the UMR QP's counted send queue has no room (rdma-core 44
  ///   would write the configure into the last posted work request): hand the QP its send
  ///   completions (QueuePair::retire; this key's own through complete()).
  /// - errc::qp_mismatch: batch not of `qp`.
  /// - errc::wrong_state: batch submitted.
  /// - errc::too_many_pending: the batch already carries SendBatch::max_undo window and key
  ///   operations.
  /// - errc::pd_mismatch: `qp` is on another PD than the key.
  /// - errc::unsafe_grant: remote rights where the only window type would let a peer panic the
  ///   kernel (see grant_options::type2, ikey_options::grant).
  /// - errc::unsupported: remote rights on a device without memory windows.
  /// - the layout_category() codes of layout::validate (naming the entry), expand and (mlx5)
  ///   mlx5::check_provider_limits (errc::provider_limit: a list entry over 2 GiB, a list of
  ///   2 GiB or more in total). mlx5, from the HCA's capabilities read at create():
  ///   errc::unsupported for a repeat layout where it reports repeated_block_disabled, and
  ///   errc::out_of_range naming the entry of a nested key that would make this key deeper than
  ///   its max_indirection (a key over regions only is one level; not enforced where the HCA
  ///   reports 0).
  /// - the errno of ibv_alloc_mw / ibv_reg_mr_iova2.
  /// \mallocs mlx5: none. Software with remote rights: one window per segment (ibv_alloc_mw)
  /// and, with the exact-region mechanism, one region per segment whose bytes changed since the
  /// last configure (ibv_reg_mr_iova2, inside verbs, and its node).
  [[nodiscard]] result<void> configure(SendBatch &batch, QueuePair &qp, const layout &l,
                                       access_flags acc, wr w = {window_wr_id}) noexcept;

  /// Revoke: the key stops working and the object stays (configure it again). mlx5: a local
  /// invalidate of the mkey added to `batch` (ibv_wr_local_inv), posted signaled whatever w.flags says; the key stays configured() (it
  /// may still work) and pending() until that completion (this QP, w.id, IBV_WC_LOCAL_INV) is
  /// handed to complete(); a dropped batch or a failed submit() undoes
  /// it (the key stays configured). Software: the windows are deallocated now (ibv_dealloc_mw), so
  /// peers' rkeys fail at once; nothing is added to the batch. Either way the key can be
  /// configured again.
  /// \errors
  /// - errc::null_handle: the key is null.
  /// - errc::foreign_wr_id: `w.id` is another window's or key's own id (leave own_wr_id).
  /// - errc::not_bound: not configured.
  /// - errc::wrong_state: mlx5: batch submitted.
  /// - errc::too_many_pending: mlx5: the batch already carries SendBatch::max_undo window and key
  ///   operations.
  /// - errc::operation_unconfirmed: mlx5: an operation is unconfirmed.
  /// - errc::send_queue_full: mlx5: the QP's counted send queue has no room.
  /// - the errno of ibv_dealloc_mw (the key is invalid regardless).
  /// \mallocs None.
  [[nodiscard]] result<void> revoke(SendBatch &batch, wr w = {window_wr_id}) noexcept;
  /// Software only: revoke now, without a work request (as above: ibv_dealloc_mw per window).
  /// \errors
  /// - errc::null_handle: the key is null.
  /// - errc::not_bound: not configured.
  /// - errc::wrong_type: mlx5 (use the batch form).
  /// - the errno of ibv_dealloc_mw.
  /// \mallocs None.
  [[nodiscard]] result<void> revoke() noexcept;
  /// The former name of revoke(SendBatch &, wr).
  [[deprecated("use revoke()")]] [[nodiscard]] result<void> invalidate(SendBatch &batch,
                                                                       wr w = {window_wr_id}) noexcept {
    return revoke(batch, w);
  }
  /// The former name of revoke().
  [[deprecated("use revoke()")]] [[nodiscard]] result<void> invalidate() noexcept { return revoke(); }

  /// Software, exact-region mechanism: deregister the regions the key kept for its next
  /// configure (ibv_dereg_mr each) and drop its counts on the underlying MemoryRegions, so those
  /// can be destroyed. Nothing to do on mlx5 or when none is kept.
  /// \errors
  /// - errc::null_handle: the key is null.
  /// - errc::already_bound: configured (its layout uses them: revoke first).
  /// - the errno of ibv_dereg_mr (the regions not deregistered stay kept).
  /// \mallocs None.
  result<void> destroy_kept_regions() noexcept;
  /// The former name of destroy_kept_regions().
  [[deprecated("use destroy_kept_regions()")]] result<void> release_regions() noexcept {
    return destroy_kept_regions();
  }
  /// Software: exact regions the key holds (its layout's while configured; kept for the next
  /// configure after revoke()).
  [[nodiscard]] std::uint32_t kept_regions() const noexcept {
    if (!h_ || st().backend != umr_backend::software) return 0;
    std::uint32_t k = 0;
    for (std::uint32_t i = 0; i < st().nkept; ++i) k += st().slots[i].region ? 1u : 0u;
    return k;
  }

  /// Local use: SGEs for bytes [offset, offset + length) of the key, into `out` (give it the
  /// QP's max_send_sge entries). mlx5: one SGE {offset, length, lkey} (zero-based), to be posted
  /// only on a QP with scatter-to-CQE disabled (every QP rdmaxx creates on mlx5; not a QP made
  /// with raw verbs): sges(qp, ...) checks that. Software: one SGE per touched segment. Returns the number written.
  /// Inline.
  /// \errors
  /// - errc::null_handle: the key is null.
  /// - errc::wrong_state: not configured.
  /// - errc::operation_unconfirmed: mlx5: the configure or a revoke is unconfirmed (work on
  ///   another QP is not ordered after the configure, and it may still fail).
  /// - errc::stale_key: mlx5: a key nested in the layout was invalidated or re-tagged (stale()).
  /// - errc::zero_length: `length` is 0.
  /// - errc::out_of_range: beyond the layout.
  /// - errc::buffer_too_small: more SGEs than `out` holds.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> sges(std::uint64_t offset, std::uint64_t length,
                                         std::span<ibv_sge> out) const noexcept;

  /// sges() for work on `qp`. mlx5: refused unless `qp` has scatter-to-CQE disabled
  /// (QueuePair::scatter_to_cqe_disabled(): every QP rdmaxx creates on mlx5): with the provider's
  /// default (verbs.c:2330-2331) it copies a small receive or read response itself to the SGE's
  /// address taken as a pointer (cq.c:237-242, 778-783 for a read response), but the key's SGE
  /// is zero-based ({offset, length, lkey}). Software: as sges(). Inline.
  /// \errors
  /// - errc::scatter_to_cqe: mlx5: `qp` keeps scatter-to-CQE (also a null `qp`).
  /// - those of sges().
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> sges(const QueuePair &qp, std::uint64_t offset, std::uint64_t length,
                                         std::span<ibv_sge> out) const noexcept;

  /// What a peer needs (send it encoded), only once the configure is confirmed by its own
  /// completion (complete()): a configure that fails at submit or completion must not hand a
  /// peer a key. mlx5: one segment {0, length, rkey}. Software: the segments with their window
  /// rkeys.
  /// \errors
  /// - errc::null_handle: the key is null.
  /// - errc::wrong_state: not configured.
  /// - errc::operation_unconfirmed: the configure's completion was not handed to complete() yet
  ///   (mlx5: also an unconfirmed revoke).
  /// - errc::stale_key: mlx5: a key nested in the layout was invalidated or re-tagged since the
  ///   configure (stale()): the device would refuse the peer; revoke and configure again.
  /// - errc::missing_access: no remote rights.
  /// - errc::too_many_entries / out_of_range: an mlx5 key longer than one segment can say (more
  ///   than 4 GiB).
  /// \mallocs None.
  [[nodiscard]] result<ikey_descriptor> descriptor() const noexcept;

  /// Destroy now: software windows deallocated, mlx5 mkey destroyed (mlx5dv_destroy_mkey). The
  /// destructor does the same, except under an unconfirmed mlx5 operation: see the class
  /// comment (the destruction deferred until the operation ended, and the destroy-failure hook
  /// told).
  /// \errors On failure the key stays valid:
  /// - errc::operation_unconfirmed: mlx5: a configure or revoke is posted and its completion
  ///   not handed to complete() (the device may still be writing the mkey).
  /// - errc::busy: mlx5: an outer key configured over this one is alive.
  /// - the errno of the verbs.
  /// \mallocs None.
  result<void> destroy() noexcept {
#if RDMAXX_HAVE_MLX5
    if (h_ && st().mkey && st().mk.pending()) return make_error_code(errc::operation_unconfirmed);
#endif
    return h_.destroy();
  }

  /// Hand a completion to the key (mlx5, see mlx5::complete_key): the unconfirmed operation's own
  /// completion (the QP it was posted on, its wr_id and, when successful, its opcode) confirms
  /// it (success) or undoes it (error: configure -> not configured, revoke -> still
  /// configured); no other completion confirms anything. A receive completion with
  /// IBV_WC_WITH_INV naming the key's rkey (a peer's send-with-invalidate) revokes it when the
  /// key was created with ikey_options::remote_invalidate and the receive arrived on the QP the
  /// key was configured through (a receive on another QP: complete(wc, qp)); the same rkey value
  /// on any other QP is not this key's (another device numbers its keys alike). The
  /// operation's own successful completion also gives its room (and that of every earlier work
  /// request) back to the UMR QP's counted send queue (QueuePair::send_queue_room); while
  /// unconfirmed, the operation counts as a child of that QP. Returns true when the key's state
  /// changed. Software with remote rights: the configure's last bind is
  /// always signaled; its completion (matched by the configure's wr_id and QP) confirms the binds
  /// (descriptor() refuses before), an error one (a failed or flushed bind) undoes the configure
  /// (the windows go, the key is not configured); true when it concerned the key.
  /// Inline, allocation-free.
  bool complete(const ibv_wc &wc) noexcept;
  /// complete(wc), where a peer's send-with-invalidate counts when it arrived on `qp` (wc.qp_num
  /// is qp's, and qp is on the key's PD: mlx5 invalidates an mkey only for a QP of its PD)
  /// instead of on the QP the key was configured through. Software: as complete(wc).
  /// Inline, allocation-free.
  bool complete(const ibv_wc &wc, const QueuePair &qp) noexcept;
  /// No effect (kept for source compatibility). An operation added to a batch is undone by that
  /// batch when nothing of it is posted (the batch dropped, or its submit() failed); once a
  /// submit() succeeded the device may run it (a configure may write the mkey with its new tag),
  /// so only its own completion settles it (complete(): an error or flushed one rolls it back;
  /// to give up on it, move the QP to ERR, see QueuePair::to_reset). While its batch is still
  /// open, undoing it here would leave the work request in the batch: the batch's own undo
  /// covers that case too. Before, this undid the state and gave back a tag a posted UMR may
  /// have written.
  void cancel_pending() noexcept;

  /// The batch form with the arguments in the order of 0.1 (QP first). Every other batch form
  /// takes (batch, qp, ...): MemoryWindow::bind, StrictGrant::grant, GrantPool::grant.
  [[deprecated("IndirectKey::configure takes (batch, qp, layout, rights, wr), as bind() does")]]
  [[nodiscard]] result<void> configure(QueuePair &qp, SendBatch &batch, const layout &l,
                                       access_flags acc, wr w = {window_wr_id}) noexcept {
    return configure(batch, qp, l, acc, w);
  }

  /// Configure through a batch of its own on `qp` (start_send, configure, submit); the work
  /// request is signaled (mlx5: always). Never call it while a batch of this thread is open on
  /// `qp`: the provider's send-queue lock is held from ibv_wr_start to ibv_wr_complete
  /// (qp.c:1180, 1215), so a second start deadlocks; use the batch form. If the submit fails the key is left as
  /// before (the batch's undo: mlx5 the operation dropped; software: the windows are deallocated).
  /// mlx5: hand the completion to complete() before descriptor().
  /// \errors
  /// - those of the batch form.
  /// - errc::wrong_state: also when the QP has not reached RTS.
  /// - the errno of ibv_wr_complete.
  /// \mallocs As the batch form.
  [[nodiscard]] result<void> configure(QueuePair &qp, const layout &l, access_flags acc,
                                       wr w = {window_wr_id, send_flag::signaled}) noexcept {
    auto batch = qp.start_send();
    RDMAXX_TRYV(configure(batch, qp, l, acc, w));
    return batch.submit(); // a failed submit undid the configure
  }
  /// Revoke through a batch of its own on `qp` (mlx5: always signaled; hand the completion to
  /// complete(); never while a batch is open on `qp`, see configure(qp, l, acc)); software: as
  /// revoke(). If the submit fails the key stays configured.
  /// \errors
  /// - those of revoke(batch, w).
  /// - errc::wrong_state: also when the QP has not reached RTS.
  /// - the errno of ibv_wr_complete.
  /// \mallocs None.
  [[nodiscard]] result<void> revoke(QueuePair &qp, wr w = {window_wr_id, send_flag::signaled}) noexcept {
    if (backend() != umr_backend::mlx5) return revoke();
    auto batch = qp.start_send();
    RDMAXX_TRYV(revoke(batch, w));
    return batch.submit(); // a failed submit undid the revoke
  }
  /// The former name of revoke(qp, w).
  [[deprecated("use revoke()")]] [[nodiscard]] result<void>
  invalidate(QueuePair &qp, wr w = {window_wr_id, send_flag::signaled}) noexcept {
    return revoke(qp, w);
  }

private:
  // Two parents: the PD and, software, the QP the windows were bound through.
  using traits = detail::deleter<detail::ikey_state, detail::destroy_ikey, "IndirectKey",
                                 "ibv_dealloc_mw / mlx5dv_destroy_mkey", 2>;
  friend struct detail::test_access;
  IndirectKey(detail::ikey_state *s, const ProtectionDomain &pd, detail::parent_node *own = nullptr) noexcept
      : h_(s, detail::handle_access::node(pd), own) {}
  [[nodiscard]] detail::ikey_state &st() const noexcept { return *h_.get(); }
  // The undo a batch-form configure or (mlx5) invalidate registers with its batch: nothing of the
  // batch was posted. mlx5: the unconfirmed operation is dropped; software (a configure): the
  // windows go, the key is not configured.
  static void undo_op(void *key, std::uint64_t) noexcept;
  // mlx5: local use (sges(), nesting) only once the configure is confirmed: work on another QP
  // is not ordered after the UMR, and a configure may still fail.
  [[nodiscard]] bool usable_locally() const noexcept;
  // Before the handle lets go: an unconfirmed mlx5 operation on a counted send queue defers the
  // destruction until the queue shows it ended (mlx5::orphan_key).
  void orphan_pending() noexcept {
#if RDMAXX_HAVE_MLX5
    if (h_ && st().mkey && st().mk.pending()) mlx5::orphan_key(st().mk, h_.node());
#endif
  }
#if RDMAXX_HAVE_MLX5
  void sync_mlx5() noexcept { st().configured = st().mk.live(); }
  // The limits of a configure through `qp`: its granted inline size, the mkey's entries, and
  // what the HCA reported at create() (max_indirection, repeated_block_disabled).
  [[nodiscard]] mlx5::umr_limits umr_limits_for(const QueuePair &qp) const noexcept {
    return {qp.caps().max_inline_data, st().max_entries, st().hca.max_indirection,
            st().hca.repeated_block_disabled};
  }
#endif
  // Per segment, a region of exactly its bytes at the same device address (ibv_reg_mr_iova2:
  // the descriptor is unchanged) with a count on the underlying MemoryRegion, and a window of the
  // key's mechanism bound over all of it in `batch` (bounds are the exact region's, which every
  // device enforces; a peer's send-with-invalidate of a type-1 key is refused). A slot whose kept region already holds the segment's bytes keeps it (a
  // repeated layout registers nothing); regions of the previous layout beyond this one's
  // segments are released. On failure nothing is added to the batch and no window is left; the
  // regions registered so far stay kept (valid registrations of the segments' bytes).
  [[nodiscard]] result<void> configure_exact(SendBatch &batch, QueuePair &qp, access_flags remote,
                                             std::size_t n, wr w) noexcept;
  // One fresh window of `type` per segment (ibv_alloc_mw), each bound over its segment in
  // `batch` (through the slot's exact region where it has one), w.flags' signaled bit on the
  // last bind only. Every bind is checked before any is added, so a refusal adds nothing; the
  // windows are then deallocated.
  [[nodiscard]] result<void> bind_windows(SendBatch &batch, QueuePair &qp, access_flags remote,
                                          std::size_t n, wr w, mw_type type) noexcept;
#if RDMAXX_HAVE_MLX5
  [[nodiscard]] std::uint32_t mkey_lkey() const noexcept { return st().mkey->lkey; }
  [[nodiscard]] std::uint32_t mkey_rkey() const noexcept { return st().mkey->rkey; }
#else
  [[nodiscard]] std::uint32_t mkey_lkey() const noexcept { return 0; }
  [[nodiscard]] std::uint32_t mkey_rkey() const noexcept { return 0; }
#endif

  detail::handle<traits> h_;
};

// ---- IndirectKey: the longer bodies ----

inline result<IndirectKey> IndirectKey::create_with(const ProtectionDomain &pd, std::uint32_t max_entries,
                                                    ikey_options o,
                                                    [[maybe_unused]] const detail::ikey_mlx5_verbs &v) noexcept {
  if (!pd) return make_error_code(errc::null_handle);
  if (max_entries == 0) return make_error_code(errc::zero_length);
  if (max_entries > 0xffff || o.max_segments > ikey_descriptor::max_segments)
    return make_error_code(errc::out_of_range);
  auto *st = new (std::nothrow) detail::ikey_state;
  if (!st) return std::make_error_code(std::errc::not_enough_memory);
  st->pd = pd.native_handle();
  st->max_entries = max_entries;
  bool want_mlx5 = o.backend == umr_backend::mlx5;
  if (o.backend == umr_backend::none && !detail::umr_forced_software()) {
#if RDMAXX_HAVE_MLX5
    want_mlx5 = v.is_mlx5(pd.context()->device);
#endif
  }
  if (want_mlx5) {
#if RDMAXX_HAVE_MLX5
    if (max_entries > mlx5::max_mkey_entries) {
      delete st;
      return make_error_code(errc::out_of_range);
    }
    // A device that cannot modify an mkey's atomic right through a UMR fails every configure
    // of rdma-core 44 (the setter always sets that bit): the software backend, or refused. A
    // failed query is no answer: no mlx5 backend either (automatic: software, whose own
    // device query decides; forced: the command's errno).
    // So does one that cannot configure indirect mkeys through a UMR (umr_indirect_mkey_disabled).
    int qerr = 0;
    const bool known = mlx5::query_umr_caps(pd.context(), st->hca, v.devx_cmd, &qerr);
    if (!known || st->hca.atomic_disabled || st->hca.indirect_mkey_disabled) {
      if (o.backend == umr_backend::mlx5) {
        delete st;
        if (known) return make_error_code(errc::unsupported);
        return errno_code(qerr);
      }
      want_mlx5 = false;
    }
#endif
  }
  if (want_mlx5) {
#if RDMAXX_HAVE_MLX5
    // One entry more than asked: `max_entries` repeat entries are promised (mkey_entries_for).
    // Without tag update an mkey's only rkey is index << 8: one on an index whose rkey was
    // handed out before is refused (mlx5::seen_indexes), another one asked for.
    auto k = mlx5::create_fresh_mkey(st->pd, mlx5::mkey_entries_for(max_entries), o.remote_invalidate,
                                     v.create_mkey, v.destroy_mkey, pd.context()->device);
    if (k) {
      // The key's child counter: an outer key nesting this one, while configured, counts here.
      detail::parent_node *node = detail::new_parent_node();
      if (!node) {
        (void)v.destroy_mkey(k.value().mkey);
        delete st;
        return std::make_error_code(std::errc::not_enough_memory);
      }
      st->backend = umr_backend::mlx5;
      st->mkey = k.value().mkey;
      st->destroy_mkey = v.destroy_mkey;
      mlx5::init_key(st->mk, k.value().mkey, k.value().update_tag, o.remote_invalidate);
      // Tag update: a variant of its own before the first configure. Without: the quarantine of
      // its device (create_fresh_mkey made sure the index is not in it).
      mlx5::start_at_variant(st->mk, mlx5::next_variant());
      st->mk.seen = k.value().seen;
      st->max_entries = k.value().max_entries;
      return IndirectKey(st, pd, node);
    }
    if (o.backend == umr_backend::mlx5) {
      delete st;
      return k.error();
    }
    // automatic: no DEVX context or no UMR here: fall back to software
#else
    delete st;
    return make_error_code(errc::unsupported);
#endif
  }
  st->backend = umr_backend::software;
  std::uint32_t segs = o.max_segments;
  if (segs == 0) {
    segs = max_entries * 8 < 64 ? 64 : max_entries * 8;
    if (segs > ikey_descriptor::max_segments) segs = ikey_descriptor::max_segments;
  }
  st->max_segments = segs;
  st->segs = new (std::nothrow) key_segment[segs];
  st->slots = new (std::nothrow) detail::grant_slot[segs];
  st->links = new (std::nothrow) detail::child_link[segs];
  // A failed device query fails closed: no key rather than a guess at the mechanism.
  auto g = detail::grant_for(pd.context(), o.grant);
  if (!g) {
    delete st;
    return g.error();
  }
  st->grant = g.value().mechanism;
  st->grant_unsafe = g.value().unsafe;
  if (!st->segs || !st->slots || !st->links) {
    delete st;
    return std::make_error_code(std::errc::not_enough_memory);
  }
  return IndirectKey(st, pd);
}

inline bool IndirectKey::pending() const noexcept {
  if (!h_) return false;
  if (st().binds_unconfirmed) return true;
#if RDMAXX_HAVE_MLX5
  return st().mkey && st().mk.pending();
#else
  return false;
#endif
}

inline layout_limits IndirectKey::limits(const QueuePair &qp) const noexcept {
  layout_limits l;
  if (!h_) return l;
#if RDMAXX_HAVE_MLX5
  if (st().backend == umr_backend::mlx5)
    return mlx5::limits_for(umr_limits_for(qp));
#endif
  (void)qp;
  l.max_entries = st().max_entries < layout::capacity ? st().max_entries : std::uint32_t(layout::capacity);
  l.max_repeat_entries = l.max_entries;
  l.max_segments = st().max_segments;
  l.nested_software_only = true;
  // Exact regions: the key's own registrations carry the remote rights and MW_BIND.
  l.remote_rights_own = true;
  l.remote_needs_mw_bind = false;
  return l;
}

inline result<void> IndirectKey::configure(SendBatch &batch, QueuePair &qp, const layout &l, access_flags acc,
                                           wr w) noexcept {
  if (!h_ || !qp) return make_error_code(errc::null_handle);
  detail::ikey_state &s = st();
  if (auto ec = detail::resolve_wr(w, s.id)) return ec;
#if RDMAXX_HAVE_MLX5
  if (s.backend == umr_backend::mlx5 && s.mk.pending()) return make_error_code(errc::operation_unconfirmed);
#endif
  if (s.configured) return make_error_code(errc::already_bound);
  if (auto ec = detail::check_batch_of(batch, qp)) return ec;
  if (detail::batch_access::undo(batch).full()) return make_error_code(errc::too_many_pending);
  if (qp.pd() != s.pd) return make_error_code(errc::pd_mismatch);
#if RDMAXX_HAVE_MLX5
  if (s.backend == umr_backend::mlx5) {
    // The mlx5dv builders post through the QP itself: not on the stand-in of a QP before RTS.
    if (!detail::batch_access::on_qp(batch)) return make_error_code(errc::wrong_state);
    RDMAXX_TRYV(mlx5::configure_key(s.mk, qp.mlx5_send_ops(), batch.native_handle(), s.pd, w, l,
                                    acc, umr_limits_for(qp), s.to_dv));
    s.depth = std::uint8_t(l.depth() < 255 ? l.depth() : 255); // validated against max_indirection
    s.length = l.total_length();
    s.access = acc;
    s.configured = s.mk.live();
    detail::batch_access::undo(batch).add(&undo_op, this, 0);
    return success();
  }
#endif
  if (auto ec = l.validate(limits(qp), acc, s.pd)) return ec;
  RDMAXX_TRY(n, l.expand(detail::span_of(s.segs, s.max_segments)));
  const access_flags remote = acc & ikey_descriptor::remote_rights;
  bool all_bind = true;
  for (const auto &e : l.entries()) all_bind = all_bind && e.source.access.any(access::mw_bind);
  if (!remote.empty() && s.grant == grant_mechanism::none)
    return make_error_code(s.grant_unsafe ? errc::unsafe_grant : errc::unsupported);
  if (!remote.empty()) {
    for (std::size_t i = 0; i < n; ++i)
      if (!s.segs[i].mr || !s.segs[i].data) return layout_error(errc::null_handle, no_entry);
    RDMAXX_TRYV(configure_exact(batch, qp, remote, n, w));
    // Type-1 windows do not hang on the QP, but their binds are posted through it: the key
    // counts as its child as with type-2 windows (one rule for both mechanisms).
    h_.set_parent<detail::parent_slot::second>(detail::handle_access::node(qp));
  }
  if (!remote.empty()) {
    s.binds_unconfirmed = true;
    s.bind_wr_id = w.id;
    s.bind_qp_num = qp.qp_num();
  }
  s.nsegs = std::uint32_t(n);
  s.length = l.total_length();
  s.access = acc;
  s.all_mw_bind = all_bind;
  s.configured = true;
  detail::batch_access::undo(batch).add(&undo_op, this, 0);
  return success();
}

inline result<void> IndirectKey::revoke(SendBatch &batch, wr w) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (auto ec = detail::resolve_wr(w, st().id)) return ec;
  if (!st().configured) return make_error_code(errc::not_bound);
#if RDMAXX_HAVE_MLX5
  if (st().backend == umr_backend::mlx5) {
    if (!detail::batch_access::on_qp(batch)) return make_error_code(errc::wrong_state); // stand-in
    if (detail::batch_access::undo(batch).full()) return make_error_code(errc::too_many_pending);
    RDMAXX_TRYV(mlx5::invalidate_key(st().mk, batch.native_handle(), w));
    detail::batch_access::undo(batch).add(&undo_op, this, 0);
    return success();
  }
#endif
  (void)batch;
  (void)w;
  return revoke();
}

inline result<void> IndirectKey::revoke() noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  detail::ikey_state &s = st();
  if (s.backend != umr_backend::software) return make_error_code(errc::wrong_type);
  if (!s.configured) return make_error_code(errc::not_bound);
  const int rc = s.destroy_windows(); // the exact regions stay for the next configure
  s.configured = false;
  s.binds_unconfirmed = false;
  s.nsegs = 0;
  s.length = 0;
  h_.set_parent<detail::parent_slot::second>(nullptr);
  if (rc != 0) return errno_code(rc);
  return success();
}

inline result<void> IndirectKey::destroy_kept_regions() noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (st().configured) return make_error_code(errc::already_bound);
  if (st().backend != umr_backend::software) return success();
  if (const int rc = st().destroy_regions()) return errno_code(rc);
  return success();
}

inline result<std::size_t> IndirectKey::sges(std::uint64_t offset, std::uint64_t length,
                                             std::span<ibv_sge> out) const noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  const detail::ikey_state &s = st();
  if (!s.configured) return make_error_code(errc::wrong_state);
  if (!usable_locally()) return make_error_code(errc::operation_unconfirmed);
  if (stale()) return make_error_code(errc::stale_key);
  if (length == 0) return make_error_code(errc::zero_length);
  if (offset > s.length || length > s.length - offset) return make_error_code(errc::out_of_range);
  if (s.mkey) {
    if (length > UINT32_MAX) return make_error_code(errc::out_of_range);
    if (out.empty()) return make_error_code(errc::buffer_too_small);
    out[0] = {offset, std::uint32_t(length), mkey_lkey()};
    return std::size_t(1);
  }
  auto len_of = [&](std::size_t i) { return std::uint64_t(s.segs[i].length); };
  std::size_t n = 0;
  (void)for_each_piece(s.nsegs, len_of, offset, length, [&](const window_piece &) { ++n; });
  if (n > out.size()) return make_error_code(errc::buffer_too_small);
  std::size_t k = 0;
  (void)for_each_piece(s.nsegs, len_of, offset, length, [&](const window_piece &p) {
    const key_segment &g = s.segs[p.segment];
    out[k++] = {g.addr + p.segment_offset, p.length, g.lkey};
  });
  return n;
}

inline result<std::size_t> IndirectKey::sges(const QueuePair &qp, std::uint64_t offset, std::uint64_t length,
                                             std::span<ibv_sge> out) const noexcept {
#if RDMAXX_HAVE_MLX5
  if (h_ && st().mkey && !qp.scatter_to_cqe_disabled()) return make_error_code(errc::scatter_to_cqe);
#else
  (void)qp;
#endif
  return sges(offset, length, out);
}

inline result<ikey_descriptor> IndirectKey::descriptor() const noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  const detail::ikey_state &s = st();
  if (!s.configured) return make_error_code(errc::wrong_state);
#if RDMAXX_HAVE_MLX5
  if (s.mkey && s.mk.pending()) return make_error_code(errc::operation_unconfirmed);
#endif
  if (s.binds_unconfirmed) return make_error_code(errc::operation_unconfirmed);
  if (stale()) return make_error_code(errc::stale_key);
  const access_flags rights = s.access & ikey_descriptor::remote_rights;
  if (rights.empty()) return make_error_code(errc::missing_access);
  std::array<remote_segment, ikey_descriptor::max_segments> rs;
  if (s.mkey) {
    if (s.length > UINT32_MAX) return make_error_code(errc::out_of_range);
    rs[0] = {0, std::uint32_t(s.length), mkey_rkey()};
    return ikey_descriptor::make(detail::span_of(std::as_const(rs).data(), 1), rights);
  }
  for (std::uint32_t i = 0; i < s.nsegs; ++i) rs[i] = {s.segs[i].addr, s.segs[i].length, s.segs[i].rkey};
  // A const pointer, as ikey_descriptor::segments() builds its span from: one iterator type
  // for the compiler to check (a std::span's constructor costs every TU per iterator type).
  return ikey_descriptor::make(detail::span_of(std::as_const(rs).data(), s.nsegs), rights);
}

inline bool IndirectKey::complete(const ibv_wc &wc) noexcept {
  if (!h_) return false;
#if RDMAXX_HAVE_MLX5
  if (st().mkey) {
    const bool changed = mlx5::complete_key(st().mk, wc);
    sync_mlx5();
    return changed;
  }
#endif
  detail::ikey_state &s = st();
  if (!s.binds_unconfirmed || wc.wr_id != s.bind_wr_id || wc.qp_num != s.bind_qp_num) return false;
  s.binds_unconfirmed = false;
  // The last bind's own completion: the earlier, unsignaled binds of the configure executed
  // before it (one send queue, in order), so it confirms (or, failed, rolls back) every window.
  for (std::uint32_t i = 0; i < s.nwindows; ++i) (void)s.slots[i].window.complete(wc);
  if (wc.status != IBV_WC_SUCCESS) (void)revoke(); // a bind failed or was flushed: no key
  return true;
}

inline bool IndirectKey::complete(const ibv_wc &wc, const QueuePair &qp) noexcept {
#if RDMAXX_HAVE_MLX5
  if (h_ && st().mkey) {
    // A send-with-invalidate counts on `qp` only if it is on the key's PD; else on no QP.
    const std::uint32_t on = qp && qp.pd() == st().pd ? qp.qp_num() : st().mk.conf_qp_num;
    const bool changed = mlx5::complete_key_on(st().mk, wc, on);
    sync_mlx5();
    return changed;
  }
#endif
  (void)qp;
  return complete(wc);
}
inline void IndirectKey::cancel_pending() noexcept {}

inline void IndirectKey::undo_op(void *key, std::uint64_t) noexcept {
  auto *self = static_cast<IndirectKey *>(key);
  if (!self->h_) return;
#if RDMAXX_HAVE_MLX5
  if (self->st().mkey) { // nothing of the batch was posted: the operation never reached the device
    mlx5::cancel_key(self->st().mk);
    self->sync_mlx5();
    return;
  }
#endif
  if (self->st().configured) (void)self->revoke();
}

inline bool IndirectKey::usable_locally() const noexcept {
#if RDMAXX_HAVE_MLX5
  return !st().mkey || st().mk.phase == mlx5::key_phase::configured;
#else
  return true;
#endif
}

inline result<void> IndirectKey::configure_exact(SendBatch &batch, QueuePair &qp, access_flags remote,
                                                 std::size_t n, wr w) noexcept {
  detail::ikey_state &s = st();
  const bool writes = remote.any(access::remote_write | access::remote_atomic);
  const access_flags racc = access::mw_bind | (writes ? access::local_write : access_flags{});
  for (std::uint32_t i = 0; i < n; ++i) {
    const key_segment &g = s.segs[i];
    if (i < s.nkept && s.slots[i].holds(g.data, g.length, g.addr, racc) &&
        s.links[i].parent() == g.node)
      continue;
    if (i < s.nkept)
      if (const int rc = s.destroy_region(i)) return errno_code(rc);
    if (i >= s.nkept) s.nkept = i + 1;
    RDMAXX_TRYV(s.slots[i].reg_exact(h_.parent(), s.pd, g.data, g.length, g.addr, racc));
    s.links[i] = detail::child_link(g.node, child_kind::indirect_key);
  }
  if (const int rc = s.destroy_regions(std::uint32_t(n))) return errno_code(rc);
  return bind_windows(batch, qp, remote, n, w,
                      s.grant == grant_mechanism::type1_exact_region ? mw_type::type1 : mw_type::type2);
}

inline result<void> IndirectKey::bind_windows(SendBatch &batch, QueuePair &qp, access_flags remote,
                                              std::size_t n, wr w, mw_type type) noexcept {
  detail::ikey_state &s = st();
  for (std::uint32_t i = 0; i < n; ++i) {
    s.nwindows = i + 1;
    if (auto r = s.slots[i].alloc_window(h_.parent(), s.pd, type); !r) {
      s.destroy_windows();
      return r.error();
    }
  }
  // Each bind is checked against its slot's exact region (configure_exact made one per
  // segment); `own` is what a segment's region without one would need.
  const access_flags own = access::mw_bind | access::local_write;
  for (std::uint32_t i = 0; i < n; ++i) {
    const key_segment &g = s.segs[i];
    if (auto ec = s.slots[i].check_segment(qp, g.mr, own, g.length, remote)) {
      s.destroy_windows();
      return ec;
    }
  }
  const send_flags quiet = w.flags & ~send_flags(send_flag::signaled);
  for (std::uint32_t i = 0; i < n; ++i) {
    key_segment &g = s.segs[i];
    s.slots[i].bind_segment(batch, qp, g.mr, g.node, g.addr, g.length, remote,
                            {w.id, i + 1 == n ? w.flags | send_flag::signaled : quiet});
    g.rkey = s.slots[i].window.rkey();
  }
  return success();
}

/// The QP to configure indirect keys through, on any device: mlx5::create_umr_qp on an mlx5
/// device in a build with the mlx5 option (an ordinary QP lacks the mlx5 UMR send operations
/// and IndirectKey::configure refuses it with errc::not_umr_qp), QueuePair::create elsewhere.
/// On mlx5 `caps.max_inline_data` below 512 is raised to 512 (32 inline list entries). Its
/// scatter-to-CQE is disabled, as on every QP rdmaxx creates on mlx5 (see mlx5/umr_qp.hpp).
/// \errors
/// - those of the function used.
/// \mallocs As the function used (QueuePair::create: one node, besides what verbs allocates).
[[nodiscard]] inline result<QueuePair> create_indirect_key_qp(const ProtectionDomain &pd,
                                                              const CompletionQueue &send_cq,
                                                              const CompletionQueue &recv_cq,
                                                              qp_caps caps = {},
                                                              send_ops ops = all_send_ops) noexcept {
#if RDMAXX_HAVE_MLX5
  if (pd && ::mlx5dv_is_supported(pd.context()->device)) {
    if (caps.max_inline_data < mlx5::umr_default_caps.max_inline_data)
      caps.max_inline_data = mlx5::umr_default_caps.max_inline_data;
    return mlx5::create_umr_qp(pd, send_cq, recv_cq, caps, ops);
  }
#endif
  return QueuePair::create(pd, send_cq, recv_cq, caps, ops);
}

} // namespace rdmaxx

#include "impl/indirect_key.ipp"
