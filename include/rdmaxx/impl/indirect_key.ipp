/// \file
/// rdmaxx/impl/indirect_key.ipp: the longer bodies of indirect_key.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of indirect_key.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

inline IndirectKey::operator region_ref() const noexcept {
  region_ref r;
  if (!h_) {
    r.problem = errc::null_handle;
    return r;
  }
  if (!st().configured) {
    r.problem = errc::wrong_state;
    return r;
  }
  if (!usable_locally()) {
    r.problem = errc::operation_unconfirmed;
    return r;
  }
  if (stale()) {
    r.problem = errc::stale_key;
    return r;
  }
  r.indirect = true;
  r.pd = st().pd;
  r.length = st().length;
  r.access = st().access;
  if (st().mkey) {
    r.lkey = mkey_lkey();
    r.rkey = mkey_rkey();
    r.node = h_.node(); // an outer key configured over this one counts as its child
#if RDMAXX_HAVE_MLX5
    r.depth = st().depth;
    r.hw_key = &st().mk; // an outer key tells when this one was re-tagged (mlx5::stale)
#endif
  } else {
    r.segments = st().segs;
    r.nsegments = st().nsegs;
    if (st().all_mw_bind) r.access |= access::mw_bind;
  }
  return r;
}

inline int detail::destroy_ikey(ikey_state *s) noexcept {
#if RDMAXX_HAVE_MLX5
  // Never under a posted UMR or local invalidate: destroy() refuses before, the destructor
  // and move assignment defer on a counted queue (orphan_pending) and reach here once the
  // queue settled the operation; on a QP not counted the mkey, the state and the layout's
  // links are kept (reported, EBUSY) and only the QP is let go (see the class comment).
  if (s->mkey && s->mk.pending() && !s->mk.qp_settled) {
    mlx5::abandon_key(s->mk);
    return EBUSY;
  }
#endif
  if (const int rc = s->destroy_all()) return rc;
#if RDMAXX_HAVE_MLX5
  if (s->mkey) {
    if (const int rc = s->destroy_mkey(s->mkey)) return rc;
    s->mkey = nullptr;
  }
#endif
  delete s;
  return 0;
}

} // namespace rdmaxx
