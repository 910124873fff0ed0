// examples/01_loopback_write: the smallest complete rdmaxx program.
// Opens the first RDMA device, connects two RC queue pairs to each other, RDMA-writes a message
// from one registered buffer into another and checks the bytes that arrived.
//
//   tools/rxe-vm build/examples/01_loopback_write
#include <rdmaxx/rdmaxx.hpp>

#include <cstdio>
#include <cstring>

namespace {
rdmaxx::result<void> run() {
  using namespace rdmaxx;
  RDMAXX_TRY(ctx, Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(cq, CompletionQueue::create(ctx, 16));
  RDMAXX_TRY(a, QueuePair::create(pd, cq, cq));
  RDMAXX_TRY(b, QueuePair::create(pd, cq, cq));
  RDMAXX_TRYV(connect_loopback(a, b));

  char src[64] = "hello from rdmaxx";
  char dst[64] = {};
  RDMAXX_TRY(src_mr, MemoryRegion::reg(pd, src, sizeof src, access::local_write));
  RDMAXX_TRY(dst_mr, MemoryRegion::reg(pd, dst, sizeof dst,
                                       access::local_write | access::remote_write));

  // One signalled RDMA write from a to b's buffer, posted as a batch.
  auto batch = a.start_send();
  batch.write({.id = 1, .flags = send_flag::signaled}, {dst_mr.iova(), dst_mr.rkey()},
              src_mr.sge());
  RDMAXX_TRYV(batch.submit());

  ibv_wc wc[1];
  for (int spins = 0;; ++spins) {
    RDMAXX_TRY(n, cq.poll(wc));
    if (n == 1) break;
    if (spins > 50'000'000) return make_error_code(errc::timeout);
  }
  if (auto ec = wc_error(wc[0])) return ec;
  if (std::memcmp(src, dst, sizeof src) != 0) return make_error_code(errc::invalid_argument);
  std::printf("%s: wrote %zu bytes, received \"%s\"\n", ctx.name().data(), sizeof src, dst);
  return success();
}
} // namespace

int main() {
  if (auto r = run(); !r) {
    std::fprintf(stderr, "01_loopback_write failed: %s\n", r.error().message().c_str());
    return 1;
  }
  return 0;
}
