// examples/00_devinfo: a focused ibv_devinfo for memory registration, windows and indirect keys.
// For each RDMA device: memory-window types and limits, native re-registration (live probe),
// the indirect-key backend and why the mlx5 one is or is not chosen, whether window bounds are
// enforced (live probe on loopback QPs), the known remote-invalidate kernel defect and the grant
// mechanism the library uses, with the reason.
//
//   tools/rxe-vm build/examples/00_devinfo
#include <rdmaxx/rdmaxx.hpp>

#include <cstdio>

namespace {
using namespace rdmaxx;

const char *yes_no(tristate t) {
  return t == tristate::yes ? "yes" : t == tristate::no ? "no" : "unknown";
}
const char *yes_no(bool b) { return b ? "yes" : "no"; }
const char *mechanism(grant_mechanism g) {
  return g == grant_mechanism::type1_exact_region ? "type-1 window over an exact region"
         : g == grant_mechanism::type2_window     ? "type-2B window over an exact region"
                                                  : "none";
}
const char *backend(umr_backend b) {
  return b == umr_backend::mlx5 ? "mlx5 (hardware UMR)"
         : b == umr_backend::software ? "software (one grant per segment, by the grant mechanism)"
                                      : "none (local use only)";
}

result<void> show(ibv_device *dev) {
  RDMAXX_TRY(ctx, Context::open(dev));
  RDMAXX_TRY(caps, ctx.query_capabilities());
  const auto bounds = probe_window_bounds(ctx, caps);
  std::printf("%s (vendor 0x%x, part %u, %u port(s))\n", caps.name, caps.vendor_id,
              caps.vendor_part_id, unsigned(caps.phys_port_cnt));
  std::printf("  memory regions      max %u, max size %llu, max sge %u\n", caps.max_mr,
              static_cast<unsigned long long>(caps.max_mr_size), caps.max_sge);
  std::printf("  native rereg        %s\n", yes_no(caps.native_rereg));
  std::printf("  memory windows      type 1: %s, type 2A: %s, type 2B: %s, max %u\n",
              yes_no(caps.mw_type1), yes_no(caps.mw_type2a), yes_no(caps.mw_type2b), caps.max_mw);
  std::printf("  window bounds       %s%s\n", yes_no(caps.mw_bounds_enforced),
              bounds ? "" : " (probe could not run)");
  std::printf("  remote-inv panic    %s%s%s%s\n", yes_no(caps.remote_inv_unbound_mw_panics),
              *caps.defect_measured_on ? " (measured on " : "", caps.defect_measured_on,
              *caps.defect_measured_on ? ")" : "");
  std::printf("  grant mechanism     %s: %s\n", mechanism(caps.grant), caps.grant_reason);
  std::printf("  indirect keys       %s; mlx5dv %s\n", backend(caps.umr), yes_no(caps.mlx5dv));
  std::printf("  mlx5 backend        %s%s", caps.umr_why == umr_reason::chosen ? "chosen: " : "not chosen: ",
              umr_reason_text(caps.umr_why));
  if (caps.umr_errno != 0) std::printf(" (errno %d)", caps.umr_errno);
  std::printf("\n");
  std::printf("  QP                  max wr %u, max inline %u, max rd atomic %u, atomics %s\n",
              caps.max_qp_wr, caps.max_inline_data, caps.max_qp_rd_atom, yes_no(caps.atomics));
  return success();
}
} // namespace

int main() {
  auto list = DeviceList::get();
  if (!list) {
    std::fprintf(stderr, "00_devinfo: %s\n", list.error().message().c_str());
    return 1;
  }
  if (list.value().empty()) {
    std::fprintf(stderr, "00_devinfo: no RDMA device (run it through tools/rxe-vm)\n");
    return 1;
  }
  int status = 0;
  for (ibv_device *d : list.value().devices()) {
    if (auto r = show(d); !r) {
      std::fprintf(stderr, "%s: %s\n", ibv_get_device_name(d), r.error().message().c_str());
      status = 1;
    }
  }
  return status;
}
