// examples/04_indirect_scatter: one contiguous message lands scattered over several regions.
// The target builds an IndirectKey over pieces of three registered buffers (odd offsets and
// lengths, no alignment), configures it through its QP and hands the peer an encoded
// descriptor. The initiator writes one contiguous message through it: one RDMA write per
// touched piece, one completion. Every byte is checked, including the ones between pieces.
// On rxe this uses the software backend (memory windows); on mlx5, hardware UMR, which needs
// the target's QP from create_indirect_key_qp (mlx5::create_umr_qp there: an ordinary QP lacks
// the UMR send operations) and the configure's completion before the key is handed out.
//
//   tools/rxe-vm build/examples/04_indirect_scatter
#include <rdmaxx/rdmaxx.hpp>
#include <rdmaxx/indirect_key.hpp>

#include <array>
#include <cstdio>
#include <cstring>

namespace {
using namespace rdmaxx;

result<void> run() {
  RDMAXX_TRY(ctx, Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(cq_a, CompletionQueue::create(ctx, 16));
  RDMAXX_TRY(cq_b, CompletionQueue::create(ctx, 16));
  RDMAXX_TRY(a, QueuePair::create(pd, cq_a, cq_a)); // the initiator
  RDMAXX_TRY(b, create_indirect_key_qp(pd, cq_b, cq_b)); // the target: configures the key
  RDMAXX_TRYV(connect_loopback(a, b));

  // ---- target: three buffers, one key over five pieces of them ----
  static char r1[100], r2[64], r3[200];
  std::memset(r1, '.', sizeof r1);
  std::memset(r2, '.', sizeof r2);
  std::memset(r3, '.', sizeof r3);
  // On rxe (software backend, exact regions) the regions need only local_write (README:
  // "exact regions need no remote rights and no MW_BIND"); remote_write and mw_bind are here for
  // the backends that bind type-2 windows over these MRs (trusted peers, devices without type 1).
  const access_flags acc = access::local_write | access::remote_write | access::mw_bind;
  RDMAXX_TRY(m1, MemoryRegion::reg(pd, r1, sizeof r1, acc));
  RDMAXX_TRY(m2, MemoryRegion::reg(pd, r2, sizeof r2, acc));
  RDMAXX_TRY(m3, MemoryRegion::reg(pd, r3, sizeof r3, acc));
  const layout l = layout::list({{m1, 3, 6}, {m3, 101, 5}, {m2, 7, 9}, {m1, 50, 4}, {m3, 0, 13}});
  RDMAXX_TRY(key, IndirectKey::create(pd, 8));
  // The target's CQ through a dispatcher: the key gets its own completions.
  RDMAXX_TRY(disp, CompletionDispatcher::create(cq_b));
  RDMAXX_TRYV(disp.attach(key));
  // one batch of its own, submitted; a failed submit leaves the key unconfigured
  RDMAXX_TRYV(key.configure(b, l, access::local_write | access::remote_write));
  RDMAXX_TRYV(disp.settle(key, 5000)); // confirmed by its own completion (descriptor() refuses before)
  RDMAXX_TRY(desc, key.descriptor());
  std::array<std::byte, ikey_descriptor::max_encoded_size> wire{};
  RDMAXX_TRY(wire_len, desc.encode(wire));

  // ---- initiator: decode what it received and write one contiguous message ----
  RDMAXX_TRY(peer, ikey_descriptor::decode(std::span<const std::byte>(wire.data(), wire_len)));
  static char msg[] = "One message, five places: 37 bytes!!";
  static_assert(sizeof msg == 37); // with its NUL: exactly the key's length
  if (peer.length() != 37) return make_error_code(errc::out_of_range);
  RDMAXX_TRY(src, MemoryRegion::reg(pd, msg, sizeof msg, access::local_write));
  auto batch = a.start_send();
  RDMAXX_TRY(wrs, write_indirect(batch, {.id = 2, .flags = send_flag::signaled}, peer, 0,
                                 src.sge(0, 37)));
  RDMAXX_TRYV(batch.submit());
  RDMAXX_TRYV(cq_a.wait_for(2, 5000));

  // ---- check: the pieces hold the message in order, everything else is untouched ----
  static char e1[100], e2[64], e3[200];
  std::memset(e1, '.', sizeof e1);
  std::memset(e2, '.', sizeof e2);
  std::memset(e3, '.', sizeof e3);
  const char *p = msg;
  auto put = [&](char *dst, std::size_t n) { std::memcpy(dst, p, n); p += n; };
  put(e1 + 3, 6);
  put(e3 + 101, 5);
  put(e2 + 7, 9);
  put(e1 + 50, 4);
  put(e3, 13);
  if (std::memcmp(r1, e1, sizeof r1) || std::memcmp(r2, e2, sizeof r2) || std::memcmp(r3, e3, sizeof r3))
    return make_error_code(errc::malformed_input);
  RDMAXX_TRYV(key.revoke(b)); // mlx5: a signaled local invalidate; software: windows revoked at once
  RDMAXX_TRYV(disp.settle(key, 5000)); // mlx5: revoked once the invalidate has completed
  if (key.configured()) return make_error_code(errc::wrong_state);
  std::printf("%s: %zu-byte message landed in %zu pieces over 3 regions (%u RDMA writes, %s backend, "
              "%zu-byte descriptor): r1[3..8]=\"%.6s\" r3[0..12]=\"%.13s\"\n",
              ctx.name().data(), std::size_t(37), desc.segments().size(), wrs,
              key.backend() == umr_backend::mlx5 ? "mlx5" : "software", wire_len, r1 + 3, r3);
  return success();
}
} // namespace

int main() {
  if (auto r = run(); !r) {
    std::fprintf(stderr, "04_indirect_scatter failed: %s\n", r.error().message().c_str());
    return 1;
  }
  return 0;
}
