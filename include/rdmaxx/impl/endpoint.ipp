/// \file
/// rdmaxx/impl/endpoint.ipp: the longer bodies of endpoint.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of endpoint.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<endpoint> endpoint::decode(std::span<const std::byte> in) noexcept {
  RDMAXX_TRY(h, descriptor_header::peek(in));
  if (h.kind != std::uint8_t(descriptor_kind::endpoint))
    return descriptor_kind_error(std::uint8_t(descriptor_kind::endpoint), h.kind);
  if (h.body_length == body_size && in.size() > encoded_size)
    return descriptor_trailing_error(in.size() - encoded_size);
  if (h.body_length != body_size || in.size() != encoded_size)
    return make_error_code(errc::malformed_input);
  auto r = detail::wire_reader::after(in, descriptor_header::size);
  endpoint e;
  e.qpn = r.u32();
  e.psn = r.u32();
  for (auto &b : e.gid.raw) b = r.u8();
  e.lid = r.u16();
  const std::uint8_t mtu = r.u8();
  const std::uint8_t reserved = r.u8();
  if (r.failed() || r.remaining() != 0 || reserved != 0) return make_error_code(errc::malformed_input);
  if (e.qpn == 0 || e.qpn > 0xffffff || e.psn > 0xffffff || mtu < IBV_MTU_256 || mtu > IBV_MTU_4096)
    return make_error_code(errc::malformed_input);
  e.mtu = ibv_mtu(mtu);
  return e;
}

} // namespace rdmaxx
