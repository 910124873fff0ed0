// README.md "Example": one RDMA write between two connected QPs, completion and bytes checked.
#include <rdmaxx/rdmaxx.hpp>

#include <cstring>

rdmaxx::result<void> loopback_write() noexcept {
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

  auto batch = a.start_send();                       // ibv_wr_start
  batch.write({.id = 1, .flags = send_flag::signaled}, {dst_mr.iova(), dst_mr.rkey()},
              src_mr.sge());
  RDMAXX_TRYV(batch.submit());                       // ibv_wr_complete; dropped = ibv_wr_abort

  RDMAXX_TRYV(cq.wait_for(1, 5000));  // wr 1's completion; errc::timeout, or a failed
                                      // completion as an error_code (wc_error)
  if (std::memcmp(src, dst, sizeof src) != 0) return make_error_code(errc::malformed_input);
  return success();
}
