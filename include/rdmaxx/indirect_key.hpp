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
///     segments. Local use expands a window of the key into SGEs (sges()). Remote use binds one
///     type-2 memory window per segment (configure() adds the binds to the send batch); the
///     descriptor carries the segments' window rkeys, and the initiator splits a write or read
///     into one work request per touched segment (write_indirect / read_indirect). invalidate()
///     deallocates the windows: the peer's keys stop working at once. There is no single
///     lkey/rkey (both are 0).
/// The backend is chosen at creation: mlx5 where mlx5dv_is_supported and an mkey can be created,
/// software otherwise; forced to software by ikey_options::backend or RDMAXX_UMR=software.
///
/// Differences that remain between the backends (see the README):
///   - software bounds are enforced by the initiator (rdmaxx refuses windows outside the layout
///     before posting); rxe does not enforce memory-window bounds, so a peer using raw verbs can
///     reach the rest of an underlying MR through a window rkey until invalidation;
///   - a software key nested in another is copied at configure time: invalidating the inner key
///     does not revoke the outer one (on mlx5 it does).
///
/// Lifetime: borrows its ProtectionDomain (destroy the key first). While configured with remote
/// rights it counts as a child of the QP its windows were bound through (destroy or invalidate
/// the key before that QP: rxe blocks ~50 s destroying a QP with bound type-2 windows).
///
/// Allocation: IndirectKey::create() allocates the key's state (new(nothrow)) and, software, its
/// segment table and window table; mlx5dv_create_mkey allocates inside the provider. configure()
/// (software, remote rights) allocates one window per segment (ibv_alloc_mw). ikey_descriptor is
/// a fixed-size value; write_indirect, read_indirect, sges() and descriptor() allocate nothing.
#pragma once

#include "access.hpp"
#include "detail/handle.hpp"
#include "device.hpp"
#include "error.hpp"
#include "ikey_descriptor.hpp"
#include "layout.hpp"
#include "memory_region.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"
#if RDMAXX_HAVE_MLX5
#include "mlx5/indirect_key_mlx5.hpp"
#endif

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>

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
};

namespace detail {
struct ikey_state {
  umr_backend backend = umr_backend::software;
  ibv_pd *pd = nullptr;
  std::uint32_t max_entries = 0;
  std::uint32_t max_segments = 0;
  key_segment *segs = nullptr; // software: capacity max_segments
  ibv_mw **windows = nullptr;  // software: one per segment while configured with remote rights
  std::uint32_t nsegs = 0;
  std::uint32_t nwindows = 0;
  std::uint64_t length = 0;
  access_flags access{};
  bool configured = false;
  bool all_mw_bind = false;
  ::mlx5dv_mkey *mkey = nullptr;

  // Deallocating (not invalidating) the windows: never a local invalidate of a type-2 window
  // that may not be bound (rxe panics), and the peer's rkeys die at once.
  int release_windows() noexcept {
    int first = 0;
    for (std::uint32_t i = 0; i < nwindows; ++i) {
      if (windows[i]) {
        if (const int rc = ::ibv_dealloc_mw(windows[i]); rc != 0 && first == 0) first = rc;
        windows[i] = nullptr;
      }
    }
    nwindows = 0;
    return first;
  }
  ~ikey_state() {
    delete[] segs;
    delete[] windows;
  }
};
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

  /// Create a key on `pd` whose layouts hold up to `max_entries` entries. mlx5:
  /// mlx5dv_create_mkey (indirect); max_entries() reads back the provider's rounded-up value.
  /// Software: allocates the segment table (windows are allocated by configure()).
  /// Errors: errc::null_handle, errc::zero_length (max_entries 0), errc::out_of_range
  /// (max_entries above 65535, or max_segments above ikey_descriptor::max_segments),
  /// errc::unsupported (backend mlx5 forced on a device or build without it), errno of
  /// mlx5dv_create_mkey when mlx5 is forced, ENOMEM.
  [[nodiscard]] static result<IndirectKey> create(const ProtectionDomain &pd, std::uint32_t max_entries,
                                                  ikey_options o = {}) noexcept {
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
      want_mlx5 = ::mlx5dv_is_supported(pd.context()->device);
#endif
    }
    if (want_mlx5) {
#if RDMAXX_HAVE_MLX5
      std::uint32_t granted = max_entries;
      auto k = mlx5::create_mkey(st->pd, granted);
      if (k) {
        st->backend = umr_backend::mlx5;
        st->mkey = k.value();
        st->max_entries = granted;
        return IndirectKey(st, pd);
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
    st->windows = new (std::nothrow) ibv_mw *[segs]();
    if (!st->segs || !st->windows) {
      delete st;
      return std::make_error_code(std::errc::not_enough_memory);
    }
    return IndirectKey(st, pd);
  }

  // ---- accessors ----
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The backend chosen at creation (umr_backend::none when null).
  [[nodiscard]] umr_backend backend() const noexcept { return h_ ? st().backend : umr_backend::none; }
  /// The mlx5 mkey (nullptr for the software backend).
  [[nodiscard]] ::mlx5dv_mkey *native_handle() const noexcept { return h_ ? st().mkey : nullptr; }
  /// Layout entries allowed (mlx5: as rounded up by the provider).
  [[nodiscard]] std::uint32_t max_entries() const noexcept { return h_ ? st().max_entries : 0; }
  /// Software: flat segments the key can hold.
  [[nodiscard]] std::uint32_t max_segments() const noexcept { return h_ ? st().max_segments : 0; }
  /// True from a successful configure() (its operations added to the batch) until invalidate().
  [[nodiscard]] bool configured() const noexcept { return h_ && st().configured; }
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
    return configured() ? std::span<const key_segment>(st().segs, st().nsegs) : std::span<const key_segment>{};
  }
  /// The PD the key was created on, or nullptr when null.
  [[nodiscard]] ibv_pd *pd() const noexcept { return h_ ? st().pd : nullptr; }

  /// The limits a layout must respect to configure this key through `qp`.
  [[nodiscard]] layout_limits limits(const QueuePair &qp) const noexcept {
    layout_limits l;
    if (!h_) return l;
#if RDMAXX_HAVE_MLX5
    if (st().backend == umr_backend::mlx5)
      return mlx5::limits_for({qp.caps().max_inline_data, st().max_entries});
#endif
    (void)qp;
    l.max_entries = st().max_entries < layout::capacity ? st().max_entries : std::uint32_t(layout::capacity);
    l.max_repeat_entries = l.max_entries;
    l.max_segments = st().max_segments;
    l.nested_software_only = true;
    l.remote_needs_mw_bind = true;
    return l;
  }

  /// A view of this key for a layout entry of another key (nesting). A key that is not
  /// configured gives a ref that validation refuses with errc::wrong_state.
  operator region_ref() const noexcept { // NOLINT: implicit on purpose ({key, off, len})
    region_ref r;
    if (!h_) {
      r.problem = errc::null_handle;
      return r;
    }
    if (!st().configured) {
      r.problem = errc::wrong_state;
      return r;
    }
    r.indirect = true;
    r.pd = st().pd;
    r.length = st().length;
    r.access = st().access;
    if (st().mkey) {
      r.lkey = mkey_lkey();
      r.rkey = mkey_rkey();
    } else {
      r.segments = st().segs;
      r.nsegments = st().nsegs;
      if (st().all_mw_bind) r.access |= access::mw_bind;
    }
    return r;
  }

  /// Configure the key with layout `l` and rights `acc`, as operations of `batch` (opened on
  /// `qp`; they take effect when it is submitted, in order with what follows on that QP).
  /// mlx5: one mkey-configure work request (IBV_SEND_INLINE added to w.flags). Software: the
  /// layout is flattened now; with remote rights, one type-2 window per segment is allocated and
  /// bound (ibv_wr_bind_mw; w.flags' signaled bit on the last bind only). Rights: local_write,
  /// remote_read, remote_write, remote_atomic, each granted by every underlying region (software
  /// remote rights also need IBV_ACCESS_MW_BIND on the MRs).
  /// Errors (nothing added to the batch): errc::null_handle, errc::already_bound (configured:
  /// invalidate first), errc::qp_mismatch (batch not of `qp`), errc::wrong_state (batch
  /// submitted), errc::pd_mismatch, the layout_category() codes of layout::validate (naming the
  /// entry) and expand, errno of ibv_alloc_mw.
  [[nodiscard]] result<void> configure(QueuePair &qp, SendBatch &batch, const layout &l,
                                       access_flags acc, wr w = {}) noexcept {
    if (!h_ || !qp) return make_error_code(errc::null_handle);
    detail::ikey_state &s = st();
    if (s.configured) return make_error_code(errc::already_bound);
    if (auto ec = detail::check_batch_of(batch, qp)) return ec;
    if (qp.pd() != s.pd) return make_error_code(errc::pd_mismatch);
#if RDMAXX_HAVE_MLX5
    if (s.backend == umr_backend::mlx5) {
      ibv_qp_ex *qpx = batch.native_handle();
      RDMAXX_TRYV(mlx5::post_configure(qpx, ::mlx5dv_qp_ex_from_ibv_qp_ex(qpx), s.mkey, s.pd, w, l,
                                       acc, {qp.caps().max_inline_data, s.max_entries}));
      s.length = l.total_length();
      s.access = acc;
      s.configured = true;
      return success();
    }
#endif
    if (auto ec = l.validate(limits(qp), acc, s.pd)) return ec;
    RDMAXX_TRY(n, l.expand(std::span<key_segment>(s.segs, s.max_segments)));
    const access_flags remote = acc & ikey_descriptor::remote_rights;
    bool all_bind = true;
    for (const auto &e : l.entries()) all_bind = all_bind && e.source.access.any(access::mw_bind);
    if (!remote.empty()) {
      for (std::size_t i = 0; i < n; ++i)
        if (!s.segs[i].mr) return layout_error(errc::null_handle, no_entry); // raw region
      for (std::size_t i = 0; i < n; ++i) {
        s.windows[i] = ::ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
        s.nwindows = std::uint32_t(i + 1);
        if (!s.windows[i]) {
          const auto ec = last_errno();
          s.release_windows();
          return ec;
        }
      }
      const send_flags quiet = w.flags & ~send_flags(send_flag::signaled);
      for (std::size_t i = 0; i < n; ++i) {
        key_segment &g = s.segs[i];
        // rxe does not update mw->rkey on a type-2 bind: the key chosen here is the one to use
        const std::uint32_t rkey = ::ibv_inc_rkey(s.windows[i]->rkey);
        const ibv_mw_bind_info info{g.mr, g.addr, g.length, unsigned(remote.native())};
        batch.bind_mw({w.id, i + 1 == n ? w.flags : quiet}, s.windows[i], rkey, info);
        g.rkey = rkey;
      }
      h_.set_parent<detail::parent_slot::second>(qp.h_.node());
    }
    s.nsegs = std::uint32_t(n);
    s.length = l.total_length();
    s.access = acc;
    s.all_mw_bind = all_bind;
    s.configured = true;
    return success();
  }

  /// Invalidate: the key stops working. mlx5: a local invalidate of the mkey added to `batch`
  /// (ibv_wr_local_inv). Software: the windows are deallocated now (ibv_dealloc_mw), so peers'
  /// rkeys fail at once; nothing is added to the batch. Either way the key can be configured
  /// again. Errors: errc::null_handle, errc::not_bound (not configured), errc::wrong_state
  /// (mlx5: batch submitted), errno of ibv_dealloc_mw (the key is invalid regardless).
  [[nodiscard]] result<void> invalidate(SendBatch &batch, wr w = {}) noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    if (!st().configured) return make_error_code(errc::not_bound);
#if RDMAXX_HAVE_MLX5
    if (st().backend == umr_backend::mlx5) {
      if (!batch.native_handle()) return make_error_code(errc::wrong_state);
      RDMAXX_TRYV(mlx5::post_invalidate(batch.native_handle(), st().mkey, w));
      st().configured = false;
      return success();
    }
#endif
    (void)batch;
    (void)w;
    return invalidate();
  }
  /// Software only: invalidate now, without a work request (as above). Errors:
  /// errc::null_handle, errc::not_bound, errc::wrong_type (mlx5: use the batch form),
  /// errno of ibv_dealloc_mw.
  [[nodiscard]] result<void> invalidate() noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    detail::ikey_state &s = st();
    if (s.backend != umr_backend::software) return make_error_code(errc::wrong_type);
    if (!s.configured) return make_error_code(errc::not_bound);
    const int rc = s.release_windows();
    s.configured = false;
    s.nsegs = 0;
    s.length = 0;
    h_.set_parent<detail::parent_slot::second>(nullptr);
    if (rc != 0) return errno_code(rc);
    return success();
  }

  /// Local use: SGEs for bytes [offset, offset + length) of the key, into `out` (give it the
  /// QP's max_send_sge entries). mlx5: one SGE {offset, length, lkey} (zero-based). Software: one
  /// SGE per touched segment. Returns the number written.
  /// Errors: errc::null_handle, errc::wrong_state (not configured), errc::zero_length,
  /// errc::out_of_range (beyond the layout), errc::buffer_too_small (more SGEs than `out` holds).
  /// Inline, allocation-free.
  [[nodiscard]] result<std::size_t> sges(std::uint64_t offset, std::uint64_t length,
                                         std::span<ibv_sge> out) const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    const detail::ikey_state &s = st();
    if (!s.configured) return make_error_code(errc::wrong_state);
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

  /// What a peer needs (send it encoded). mlx5: one segment {0, length, rkey}. Software: the
  /// segments with their window rkeys. Errors: errc::null_handle, errc::wrong_state (not
  /// configured), errc::missing_access (no remote rights), errc::too_many_entries / out_of_range
  /// (an mlx5 key longer than one segment can say: more than 4 GiB).
  [[nodiscard]] result<ikey_descriptor> descriptor() const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    const detail::ikey_state &s = st();
    if (!s.configured) return make_error_code(errc::wrong_state);
    const access_flags rights = s.access & ikey_descriptor::remote_rights;
    if (rights.empty()) return make_error_code(errc::missing_access);
    std::array<remote_segment, ikey_descriptor::max_segments> rs;
    if (s.mkey) {
      if (s.length > UINT32_MAX) return make_error_code(errc::out_of_range);
      rs[0] = {0, std::uint32_t(s.length), mkey_rkey()};
      return ikey_descriptor::make(std::span<const remote_segment>(rs.data(), 1), rights);
    }
    for (std::uint32_t i = 0; i < s.nsegs; ++i) rs[i] = {s.segs[i].addr, s.segs[i].length, s.segs[i].rkey};
    return ikey_descriptor::make(std::span<const remote_segment>(rs.data(), s.nsegs), rights);
  }

  /// Destroy now: software windows deallocated, mlx5 mkey destroyed (mlx5dv_destroy_mkey).
  /// Errors: errno of the verbs; on failure the key stays valid.
  result<void> destroy() noexcept { return h_.destroy(); }

#if RDMAXX_HAVE_MLX5
  /// An RC QP that can configure mlx5 keys: mlx5dv_create_qp with the UMR send operations and
  /// local invalidate; caps.max_inline_data sizes the layouts (default 512: 32 list entries).
  /// The QP does not count as a child of its CQs (destroy it before them).
  /// Errors: errc::null_handle, errc::unsupported (not an mlx5 device), errno of mlx5dv_create_qp.
  [[nodiscard]] static result<QueuePair> create_umr_qp(const ProtectionDomain &pd,
                                                       const CompletionQueue &send_cq,
                                                       const CompletionQueue &recv_cq,
                                                       qp_caps caps = {.max_inline_data = 512},
                                                       send_ops ops = all_send_ops) noexcept {
    if (!pd || !send_cq || !recv_cq) return make_error_code(errc::null_handle);
    if (!::mlx5dv_is_supported(pd.context()->device)) return make_error_code(errc::unsupported);
    detail::parent_node *node = detail::new_parent_node();
    if (!node) return std::make_error_code(std::errc::not_enough_memory);
    ibv_qp_init_attr_ex a;
    mlx5dv_qp_init_attr dv;
    mlx5::umr_qp_attrs(pd.native_handle(), send_cq.native_handle(), recv_cq.native_handle(), caps,
                       ops, a, dv);
    ibv_qp *qp = ::mlx5dv_create_qp(pd.context(), &a, &dv);
    if (!qp) {
      const auto ec = last_errno();
      delete node;
      return ec;
    }
    QueuePair r;
    r.h_ = detail::handle<QueuePair::traits>(qp, pd.node(), node);
    r.qpx_.reset(::ibv_qp_to_qp_ex(qp));
    r.caps_ = {a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge,
               a.cap.max_inline_data};
    return r;
  }
#endif

private:
  struct traits {
    using native = detail::ikey_state;
    static constexpr const char *object = "IndirectKey";
    static constexpr const char *verb = "ibv_dealloc_mw / mlx5dv_destroy_mkey";
    static constexpr std::size_t parents = 2; // PD, software: the QP the windows were bound through
    static int destroy(native *s) noexcept {
      if (const int rc = s->release_windows()) return rc;
#if RDMAXX_HAVE_MLX5
      if (s->mkey) {
        if (const int rc = ::mlx5dv_destroy_mkey(s->mkey)) return rc;
        s->mkey = nullptr;
      }
#endif
      delete s;
      return 0;
    }
  };
  IndirectKey(detail::ikey_state *s, const ProtectionDomain &pd) noexcept
      : h_(s, pd.node(), nullptr) {}
  [[nodiscard]] detail::ikey_state &st() const noexcept { return *h_.get(); }
#if RDMAXX_HAVE_MLX5
  [[nodiscard]] std::uint32_t mkey_lkey() const noexcept { return st().mkey->lkey; }
  [[nodiscard]] std::uint32_t mkey_rkey() const noexcept { return st().mkey->rkey; }
#else
  [[nodiscard]] std::uint32_t mkey_lkey() const noexcept { return 0; }
  [[nodiscard]] std::uint32_t mkey_rkey() const noexcept { return 0; }
#endif

  detail::handle<traits> h_;
};

} // namespace rdmaxx
