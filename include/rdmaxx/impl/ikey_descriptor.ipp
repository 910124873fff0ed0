/// \file
/// rdmaxx/impl/ikey_descriptor.ipp: the longer bodies of ikey_descriptor.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of ikey_descriptor.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

inline result<std::size_t> ikey_descriptor::encode(std::span<std::byte> out) const noexcept {
  if (n_ == 0) return make_error_code(errc::zero_length);
  if (out.size() < encoded_size(n_)) return make_error_code(errc::buffer_too_small);
  detail::wire_writer w(out);
  descriptor_header{descriptor_version, std::uint8_t(descriptor_kind::indirect_key),
                    std::uint16_t(body_header_size + n_ * segment_size)}
      .write(w);
  w.u8(detail::rights_to_wire(rights_));
  w.u8(0);
  w.u16(std::uint16_t(n_));
  w.u32(0);
  w.u64(length_);
  for (const auto &s : segments()) {
    w.u64(s.addr);
    w.u32(s.length);
    w.u32(s.rkey);
  }
  return w.size();
}

inline result<ikey_descriptor> ikey_descriptor::decode(std::span<const std::byte> in) noexcept {
  RDMAXX_TRY(h, descriptor_header::peek(in));
  if (h.kind != std::uint8_t(descriptor_kind::indirect_key))
    return descriptor_kind_error(std::uint8_t(descriptor_kind::indirect_key), h.kind);
  auto r = detail::wire_reader::after(in, descriptor_header::size);
  const std::uint8_t bits = r.u8();
  const std::uint8_t reserved8 = r.u8();
  const std::uint16_t n = r.u16();
  const std::uint32_t reserved32 = r.u32();
  const std::uint64_t total = r.u64();
  if (r.failed()) return make_error_code(errc::malformed_input);
  if ((bits & ~detail::wire_rights_mask) != 0 || bits == 0 || reserved8 != 0 || reserved32 != 0)
    return make_error_code(errc::malformed_input);
  if (n == 0) return make_error_code(errc::malformed_input);
  if (n > max_segments) return make_error_code(errc::too_many_entries);
  if (h.body_length != body_header_size + std::size_t(n) * segment_size)
    return make_error_code(errc::malformed_input);
  if (in.size() > encoded_size(n)) return descriptor_trailing_error(in.size() - encoded_size(n));
  if (in.size() != encoded_size(n)) return make_error_code(errc::malformed_input);
  ikey_descriptor d;
  for (std::uint16_t i = 0; i < n; ++i) {
    remote_segment s;
    s.addr = r.u64();
    s.length = r.u32();
    s.rkey = r.u32();
    if (s.length == 0) return make_error_code(errc::malformed_input);
    if (__builtin_add_overflow(d.length_, std::uint64_t(s.length), &d.length_))
      return make_error_code(errc::malformed_input);
    d.s_[d.n_++] = s;
  }
  if (r.failed() || r.remaining() != 0 || d.length_ != total)
    return make_error_code(errc::malformed_input);
  d.rights_ = detail::rights_from_wire(bits);
  return d;
}

} // namespace rdmaxx
