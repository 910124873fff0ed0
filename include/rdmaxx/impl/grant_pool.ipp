/// \file
/// rdmaxx/impl/grant_pool.ipp: the longer bodies of grant_pool.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of grant_pool.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<GrantPool> GrantPool::create(const ProtectionDomain &pd, const MemoryRegion &buffers,
                                              grant_pool_options o) noexcept {
  if (!pd) return make_error_code(errc::null_handle);
  if (auto ec = buffers.usable()) return ec;
  if (buffers.native_handle()->context != pd.context()) return make_error_code(errc::context_mismatch);
  if (o.slot_size == 0) return make_error_code(errc::zero_length);
  if (o.slot_size > 0xFFFFFFFFull) return make_error_code(errc::out_of_range);
  const std::size_t fit = std::size_t(buffers.length() / o.slot_size);
  const std::size_t n = o.slots == 0 ? fit : o.slots;
  if (n == 0) return make_error_code(errc::zero_length);
  if (n > fit || n > 0x7FFFFFFFu) return make_error_code(errc::out_of_range);
  RDMAXX_TRY(g, detail::grant_for(pd.context(), o.grant));
  if (g.mechanism == grant_mechanism::none)
    return make_error_code(g.unsafe ? errc::unsafe_grant : errc::unsupported);

  GrantPool p;
  p.st_ = detail::counted_ptr<detail::grant_pool_state>(new (std::nothrow) detail::grant_pool_state);
  if (!p.st_) return std::make_error_code(std::errc::not_enough_memory);
  detail::grant_pool_state &st = *p.st_;
  st.type = g.mechanism == grant_mechanism::type1_exact_region ? mw_type::type1 : mw_type::type2;
  st.slot_size = o.slot_size;
  st.pd = pd.native_handle();
  st.pd_link = detail::child_link(detail::handle_access::node(pd), child_kind::grant_pool);
  st.buffers_link = detail::child_link(detail::handle_access::node(buffers), child_kind::grant_pool);
  st.id = detail::pool_ids::acquire();
  if (st.id == detail::pool_ids::none) return make_error_code(errc::too_many_entries);
  st.tag = grant_pool_wr_tag | (std::uint64_t(st.id) << 32);
  if (!st.slots.allocate(n, true) || !st.free.allocate(n, false) || !st.index.allocate(n, false))
    return std::make_error_code(std::errc::not_enough_memory);
  st.region_access = (buffers.access() & access::local_write) | access::mw_bind;
  for (std::size_t i = 0; i < n; ++i) {
    st.slots[i].data = buffers.data() + i * o.slot_size;
    // grant_for chose type 2 only where it is safe or accepted in `o.grant`.
    if (!o.lazy_slots) RDMAXX_TRYV(st.make(std::uint32_t(i)));
  }
  for (std::size_t i = n; i-- > 0;) st.free.push_back(std::uint32_t(i)); // slot 0 first out
  st.rebuild_index();
  return p;
}

inline std::span<ibv_wc> GrantPool::complete(std::span<ibv_wc> wcs) noexcept {
  if (!st_) return wcs;
  std::size_t k = 0;
  for (ibv_wc &wc : wcs) {
    if (owns(wc)) {
      const std::uint32_t s = std::uint32_t(wc.wr_id & 0x7FFFFFFFu);
      if (s < st_->slots.size()) {
        if (wc.status != IBV_WC_SUCCESS) ++st_->stats.failed_completions;
        st_->slots[s].window.complete(wc);
        st_->settle(s);
      }
      continue;
    }
    if (st_->type == mw_type::type2 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
        !(wc.wc_flags & IBV_WC_WITH_IMM) && wc.invalidated_rkey != 0)
      remote_invalidated(wc);
    if (&wcs[k] != &wc) wcs[k] = wc;
    ++k;
  }
  return detail::span_of(wcs.data(), k);
}

inline result<void> GrantPool::revoke_all() noexcept {
  if (!st_) return make_error_code(errc::null_handle);
  std::error_code first;
  for (std::uint32_t i = 0; i < st_->slots.size(); ++i) {
    detail::grant_slot &s = st_->slots[i];
    if (!s.window) continue;
    if (s.window.state() != mw_state::bound && s.window.pending() == 0) continue;
    // The replacement first, as grant_slot::renew(): while the old window is allocated the
    // device cannot give its index (and with it the old keys) to the new one.
    auto fresh = detail::mw_access::alloc_on(st_->pd_link.parent(), st_->pd, st_->type);
    if (auto r = s.window.destroy(); !r) {
      if (!first) first = r.error();
      continue; // still allocated, key perhaps alive: the slot stays out of use (`fresh` freed)
    }
    ++st_->stats.revoked_by_dealloc;
    s.key_changes = 0;
    if (fresh) {
      s.window = std::move(fresh).value();
    } else if (!first) {
      first = fresh.error();
    }
    st_->settle(i);
  }
  st_->rebuild_index();
  if (first) return first;
  return success();
}

} // namespace rdmaxx
