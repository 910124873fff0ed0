/// \file
/// rdmaxx/indirect_access.hpp: the initiator's side of an indirect key: write or read a window of
/// a peer's key (an ikey_descriptor) as one work request per touched segment, in the caller's
/// send batch. Needs no IndirectKey, only the descriptor the peer sent.
///
/// Allocation: none.
#pragma once

#include "access.hpp"
#include "error.hpp"
#include "ikey_descriptor.hpp"
#include "layout.hpp"
#include "queue_pair.hpp"

#include <infiniband/verbs.h>

#include <cstdint>

namespace rdmaxx {

namespace detail {
template <bool Write>
[[nodiscard]] inline result<std::uint32_t> post_indirect(SendBatch &b, wr w, const ikey_descriptor &d,
                                                         std::uint64_t offset,
                                                         const ibv_sge &local) noexcept {
  if (!b.native_handle()) return make_error_code(errc::wrong_state);
  if (local.length == 0) return make_error_code(errc::zero_length);
  if (!d.rights().any(Write ? access::remote_write : access::remote_read))
    return make_error_code(errc::missing_access);
  const auto segs = d.segments();
  if (offset > d.length() || local.length > d.length() - offset)
    return make_error_code(errc::out_of_range);
  std::uint32_t pieces = 0;
  (void)for_each_piece(segs.size(), [&](std::size_t i) { return std::uint64_t(segs[i].length); },
                       offset, local.length, [&](const window_piece &) { ++pieces; });
  std::uint32_t k = 0;
  const send_flags quiet = w.flags & ~send_flags(send_flag::signaled);
  (void)for_each_piece(segs.size(), [&](std::size_t i) { return std::uint64_t(segs[i].length); },
                       offset, local.length, [&](const window_piece &p) {
                         const remote_segment &s = segs[p.segment];
                         const ibv_sge part{local.addr + p.done, p.length, local.lkey};
                         const wr one{w.id, ++k == pieces ? w.flags : quiet};
                         const remote_addr ra{s.addr + p.segment_offset, s.rkey};
                         if constexpr (Write) b.write(one, ra, part);
                         else b.read(one, ra, part);
                       });
  return pieces;
}
} // namespace detail

/// Write `local` to bytes [offset, offset + local.length) of the peer's key `d`: one RDMA write
/// (ibv_wr_rdma_write) per touched segment, added to batch `b`; only the last carries w.flags'
/// signaled bit (one completion), all carry w.id. Returns the number of work requests added.
/// Inline.
/// \errors Nothing is then added:
/// - errc::wrong_state: batch already submitted.
/// - errc::zero_length: `local.length` is 0.
/// - errc::missing_access: the key grants no remote write.
/// - errc::out_of_range: beyond the layout.
/// \mallocs None.
[[nodiscard]] inline result<std::uint32_t> write_indirect(SendBatch &b, wr w, const ikey_descriptor &d,
                                                          std::uint64_t offset,
                                                          const ibv_sge &local) noexcept {
  return detail::post_indirect<true>(b, w, d, offset, local);
}
/// Read bytes [offset, offset + local.length) of the peer's key `d` into `local`: one RDMA read
/// (ibv_wr_rdma_read) per touched segment, signalled once.
/// \errors
/// - those of write_indirect (errc::missing_access: the key grants no remote read).
/// \mallocs None.
[[nodiscard]] inline result<std::uint32_t> read_indirect(SendBatch &b, wr w, const ikey_descriptor &d,
                                                         std::uint64_t offset,
                                                         const ibv_sge &local) noexcept {
  return detail::post_indirect<false>(b, w, d, offset, local);
}

} // namespace rdmaxx
