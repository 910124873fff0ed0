/// \file
/// rdmaxx/impl/grant_list.ipp: the longer bodies of grant_list.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of grant_list.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<std::size_t> grant_list::encode_to(std::span<std::byte> out) const noexcept {
  if (count_ == 0) return make_error_code(errc::zero_length);
  const std::size_t n = encoded_size(count_);
  if (out.size() < n) return make_error_code(errc::buffer_too_small);
  detail::wire_writer w(out.data(), n);
  descriptor_header{descriptor_version, kind, std::uint16_t(n - descriptor_header::size)}.write(w);
  w.u8(std::uint8_t(count_));
  w.u8(0);
  for (const remote_descriptor &d : grants()) {
    w.u64(d.addr);
    w.u32(std::uint32_t(d.length));
    w.u32(d.rkey);
    w.u8(detail::rights_to_wire(d.rights));
    w.u8(d.zero_based ? 1 : 0);
  }
  return n;
}

[[nodiscard]] inline result<grant_list> grant_list::decode(std::span<const std::byte> in) noexcept {
  RDMAXX_TRY(h, descriptor_header::peek(in));
  if (h.kind != kind) return descriptor_kind_error(kind, h.kind);
  if (in.size() > h.total_size() && h.body_length >= 2)
    return descriptor_trailing_error(in.size() - h.total_size());
  if (in.size() != h.total_size() || h.body_length < 2) return make_error_code(errc::malformed_input);
  auto r = detail::wire_reader::after(in, descriptor_header::size);
  const std::uint8_t count = r.u8();
  const std::uint8_t reserved = r.u8();
  if (count == 0 || count > max_grants || reserved != 0 ||
      h.body_length != 2 + entry_size * count)
    return make_error_code(errc::malformed_input);
  grant_list l;
  for (std::uint8_t i = 0; i < count; ++i) {
    remote_descriptor d;
    d.addr = r.u64();
    d.length = r.u32();
    d.rkey = r.u32();
    const std::uint8_t rights = r.u8();
    const std::uint8_t fl = r.u8();
    if (r.failed()) return make_error_code(errc::malformed_input);
    if ((rights & ~detail::wire_rights_mask) != 0 || rights == 0 || (fl & ~0x1u) != 0)
      return make_error_code(errc::malformed_input);
    if (d.length == 0 || d.addr + d.length < d.addr) return make_error_code(errc::malformed_input);
    d.rights = detail::rights_from_wire(rights);
    d.zero_based = (fl & 1) != 0;
    l.grants_[l.count_++] = d;
  }
  if (r.remaining() != 0) return make_error_code(errc::malformed_input);
  return l;
}

} // namespace rdmaxx
