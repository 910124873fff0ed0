/// \file
/// rdmaxx/probe.hpp: live device probes that need whole objects (PD, CQ, QPs, MRs, windows),
/// so that they cannot live in device.hpp: probe_window_bounds().
///
/// Each probe creates scratch objects on the device, uses them, and destroys them before
/// returning; none of them is on a fast path.
#pragma once

#include "access.hpp"
#include "completion_queue.hpp"
#include "detail/clock.hpp"
#include "detail/span.hpp"
#include "device.hpp"
#include "error.hpp"
#include "memory_region.hpp"
#include "memory_window.hpp"
#include "protection_domain.hpp"
#include "queue_pair.hpp"

#include <cstdint>
#include <span>

namespace rdmaxx {

/// Probe on the live device whether window bounds are enforced: bind a window over 256 bytes in
/// the middle of an 8 KiB region, read inside it through a loopback QP pair, then read the 64
/// bytes just past its end (inside the region). Sets caps.mw_bounds_enforced (yes: refused with a
/// remote access error; no: the read succeeded, as on rxe; unknown: the probe could not tell) and
/// returns it. Creates and destroys a PD, CQs, QPs, MRs and a window
/// (type 1 where the device has it; a type-2 window only where that is not refused, see
/// MemoryWindow::alloc). The QPs connect from the GID `gid_index` names, as connections pick
/// it: gid_auto (the default) chooses by type (detail::select_gid_index: on RoCE a v2 GID, an
/// IPv4-mapped one first; on InfiniBand index 0).
/// \errors
/// - errc::null_handle: `ctx` is null.
/// - errc::unsupported: no window type.
/// - errc::unsafe_grant: only type-2 windows, on a device where they expose the kernel.
/// - the errors of the scratch objects; gid_auto: those of detail::select_gid_index
///   (errc::no_device: no usable GID on port 1).
/// \mallocs The scratch objects (their nodes and what verbs allocates), freed before returning.
[[nodiscard]] inline result<tristate> probe_window_bounds(const Context &ctx, Capabilities &caps,
                                                          int gid_index = gid_auto) noexcept {
  if (!ctx) return make_error_code(errc::null_handle);
  if (!caps.mw_type2b && !caps.mw_type1) return make_error_code(errc::unsupported);
  caps.mw_bounds_enforced = tristate::unknown;
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(cq, CompletionQueue::create(ctx, 8));
  RDMAXX_TRY(a, QueuePair::create(pd, cq, cq));
  RDMAXX_TRY(b, QueuePair::create(pd, cq, cq));
  connect_options o;
  o.gid_index = gid_index;
  RDMAXX_TRYV(connect_loopback(a, b, o));
  RDMAXX_TRY(target, MemoryRegion::allocate(pd, 8192, access::local_write | access::mw_bind));
  RDMAXX_TRY(local, MemoryRegion::allocate(pd, 4096, access::local_write));
  // Type 1 where the device has it: a type-2 window, even for the probe's few milliseconds,
  // would expose a kernel with the remote-invalidate defect to every peer (see type2_risk).
  RDMAXX_TRY(mw, MemoryWindow::alloc(pd, caps.mw_type1 ? mw_type::type1 : mw_type::type2));
  auto wait = [&](ibv_wc &wc) -> bool {
    const std::int64_t deadline = detail::monotonic_ms() + 5000;
    while (detail::monotonic_ms() < deadline) {
      auto n = cq.poll(detail::span_of(&wc, 1));
      if (!n) return false;
      if (n.value() == 1) return true;
    }
    return false;
  };
  ibv_wc wc{};
  // The window is bound through the target's QP (a type-2B window serves the QP it is bound through).
  RDMAXX_TRY(d, mw.bind(b, target, {4096, 256}, access::remote_read, {1, send_flag::signaled}));
  if (!wait(wc) || wc.status != IBV_WC_SUCCESS) return caps.mw_bounds_enforced;
  (void)mw.complete(wc);
  auto read = [&](std::uint64_t off, std::uint64_t id) -> int {
    auto batch = a.start_send();
    batch.read({id, send_flag::signaled}, d.at(off), local.sge(0, 64));
    if (!batch.submit()) return -1;
    if (!wait(wc)) return -1;
    return wc.status;
  };
  if (read(0, 2) != IBV_WC_SUCCESS) return caps.mw_bounds_enforced;
  const int outside = read(256, 3);
  if (outside == IBV_WC_SUCCESS) caps.mw_bounds_enforced = tristate::no;
  else if (outside == IBV_WC_REM_ACCESS_ERR) caps.mw_bounds_enforced = tristate::yes;
  // The window goes before the QP it is bound through (see the lifetime rules above).
  RDMAXX_TRYV(mw.destroy());
  return caps.mw_bounds_enforced;
}

} // namespace rdmaxx
