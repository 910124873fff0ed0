/// \file
/// rdmaxx/impl/remote_descriptor.ipp: the longer bodies of remote_descriptor.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of remote_descriptor.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<remote_descriptor> remote_descriptor::decode(const std::byte *in,
                                                                        std::size_t n) noexcept {
  RDMAXX_TRY(h, descriptor_header::peek(in, n));
  if (h.kind != std::uint8_t(descriptor_kind::window))
    return descriptor_kind_error(std::uint8_t(descriptor_kind::window), h.kind);
  if (h.body_length == body_size && n > encoded_size) return descriptor_trailing_error(n - encoded_size);
  if (h.body_length != body_size || n != encoded_size) return make_error_code(errc::malformed_input);
  detail::wire_reader r(in + descriptor_header::size, n - descriptor_header::size); // n == encoded_size
  remote_descriptor d;
  d.addr = r.u64();
  d.length = r.u64();
  d.rkey = r.u32();
  const std::uint8_t rights = r.u8();
  const std::uint8_t fl = r.u8();
  const std::uint16_t reserved = r.u16();
  if (r.failed() || r.remaining() != 0) return make_error_code(errc::malformed_input);
  if ((rights & ~detail::wire_rights_mask) != 0 || rights == 0 || (fl & ~0x1u) != 0 || reserved != 0)
    return make_error_code(errc::malformed_input);
  if (d.length == 0 || d.addr + d.length < d.addr) return make_error_code(errc::malformed_input);
  d.rights = detail::rights_from_wire(rights);
  d.zero_based = (fl & 1) != 0;
  return d;
}

inline std::string detail::descriptor_category_impl::message(int v) const {
  const int e = v & 0xff, reason = (v >> 24) & 0xf;
  // snprintf and join_text, not std::to_string and string +: their templates cost every TU.
  char b[160];
  if (reason == 1) {
    const auto want = std::uint8_t((v >> 8) & 0xff), got = std::uint8_t((v >> 16) & 0xff);
    std::snprintf(b, sizeof b, "a descriptor of kind %d (%s) where kind %d (%s) was expected", int(got),
                  descriptor_kind_name(got), int(want), descriptor_kind_name(want));
    return join_text("descriptor: ", b);
  }
  if (reason == 2) {
    std::snprintf(b, sizeof b, "%d", (v >> 8) & 0xffff);
    return join_text("descriptor: ", b,
                     " byte(s) after the descriptor: decode exactly descriptor_header::peek(in).total_size() "
                     "bytes (rdma_cm private data is padded with zeros)");
  }
  return join_text("descriptor: ", errc_text(e));
}

} // namespace rdmaxx
