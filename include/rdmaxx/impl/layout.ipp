/// \file
/// rdmaxx/impl/layout.ipp: the longer bodies of layout.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of layout.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

// The flat pieces of [off, off+len) of a source (expand() below uses it).
template <class F>
inline void layout::emit(const region_ref &s, std::uint64_t off, std::uint64_t len, F &&f) noexcept {
  if (!s.segments) {
    f(key_segment{s.iova + off, std::uint32_t(len), s.lkey, s.rkey, s.mr,
                  s.data ? s.data + off : nullptr, s.node});
    return;
  }
  std::uint64_t base = 0;
  for (std::uint32_t k = 0; k < s.nsegments && len > 0; ++k) {
    const key_segment &g = s.segments[k];
    const std::uint64_t end = base + g.length;
    if (off < end) {
      const std::uint64_t in = off - base;
      const std::uint64_t take = g.length - in < len ? g.length - in : len;
      f(key_segment{g.addr + in, std::uint32_t(take), g.lkey, g.rkey, g.mr,
                    g.data ? g.data + in : nullptr, g.node});
      off += take;
      len -= take;
    }
    base = end;
  }
}

[[nodiscard]] inline std::error_code layout::validate(const layout_limits &lim, access_flags acc,
                                       ibv_pd *pd) const noexcept {
  if (error_ != errc{}) return layout_error(error_, error_entry_);
  if (!acc.subset_of(lim.allowed_access)) return layout_error(errc::unknown_access_flag, no_entry);
  if (auto ec = check_access(acc)) return layout_error(errc(ec.value()), no_entry);
  if (n_ == 0) return layout_error(errc::zero_length, no_entry);
  if (kind_ == kind::repeat && !lim.repeat_layouts) return layout_error(errc::unsupported, no_entry);
  const std::uint32_t max = kind_ == kind::list ? lim.max_entries : lim.max_repeat_entries;
  if (n_ > max) return layout_error(errc::too_many_entries, max);
  if (kind_ == kind::repeat && repeat_ == 0) return layout_error(errc::zero_length, no_entry);
  const access_flags rights =
      acc & (access::local_write | access::remote_read | access::remote_write | access::remote_atomic);
  std::uint64_t block = 0;
  for (std::size_t i = 0; i < n_; ++i) {
    const entry &e = e_[i];
    const region_ref &s = e.source;
    if (s.problem != errc{}) return layout_error(s.problem, i);
    if (s.length == 0 && !s.indirect) return layout_error(errc::null_handle, i);
    if (s.indirect && (lim.nested_hardware_only && s.segments))
      return layout_error(errc::wrong_type, i);
    if (s.indirect && lim.nested_software_only && !s.segments)
      return layout_error(errc::wrong_type, i);
    if (s.indirect && std::uint32_t(s.depth) + 1 > lim.max_depth) return layout_error(errc::out_of_range, i);
    if (e.length == 0) return layout_error(errc::zero_length, i);
    if (e.length > UINT32_MAX) return layout_error(errc::out_of_range, i);
    // the bytes of the region this entry touches: [offset, offset + span)
    std::uint64_t span = e.length;
    if (kind_ == kind::repeat) {
      const std::uint64_t stride = e.length + e.skip;
      if (lim.interleave_16bit && (e.length > 0xffff || stride > 0xffff))
        return layout_error(errc::out_of_range, i);
      if (__builtin_mul_overflow(stride, std::uint64_t(repeat_ - 1), &span) ||
          __builtin_add_overflow(span, e.length, &span))
        return layout_error(errc::out_of_range, i);
    }
    if (e.offset > s.length || span > s.length - e.offset) return layout_error(errc::out_of_range, i);
    if (pd && s.pd && s.pd != pd) return layout_error(errc::pd_mismatch, i);
    access_flags need = rights;
    if (lim.remote_rights_own && !s.indirect) { // a nested key grants only what it has
      need = rights & access::local_write;
      if (rights.any(access::remote_write | access::remote_atomic)) need |= access::local_write;
    }
    if (!s.access.has(need) && !need.empty()) return layout_error(errc::missing_access, i);
    if (lim.remote_needs_mw_bind &&
        rights.any(access::remote_read | access::remote_write | access::remote_atomic) &&
        !s.access.any(access::mw_bind))
      return layout_error(errc::missing_access, i);
    if (__builtin_add_overflow(block, e.length, &block)) return layout_error(errc::out_of_range, i);
  }
  std::uint64_t total = 0;
  if (__builtin_mul_overflow(block, std::uint64_t(repeat_count()), &total))
    return layout_error(errc::out_of_range, no_entry);
  if (piece_count() > lim.max_segments) return layout_error(errc::too_many_entries, no_entry);
  return {};
}

[[nodiscard]] inline result<std::size_t> layout::expand(std::span<key_segment> out) const noexcept {
  std::size_t n = 0;
  std::size_t pieces = 0;
  const std::uint32_t reps = repeat_count();
  for (std::uint32_t r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < n_; ++i) {
      const entry &e = e_[i];
      const std::uint64_t off = e.offset + std::uint64_t(r) * (e.length + e.skip);
      bool ok = true;
      emit(e.source, off, e.length, [&](const key_segment &s) {
        if (++pieces > out.size()) {
          ok = false;
          return;
        }
        if (n > 0) {
          key_segment &p = out[n - 1];
          if (p.lkey == s.lkey && p.rkey == s.rkey && p.mr == s.mr && p.addr + p.length == s.addr &&
              std::uint64_t(p.length) + s.length <= UINT32_MAX) {
            p.length += s.length;
            return;
          }
        }
        out[n++] = s;
      });
      if (!ok) return layout_error(errc::too_many_entries, i);
    }
  }
  return n;
}

} // namespace rdmaxx
