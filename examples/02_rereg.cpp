// examples/02_rereg: grant and revoke a peer's remote-write access to a region by re-registering
// it. The peer's first write lands; after the revoke its write (with the key it was given) fails
// with a remote access error and the region is unchanged. On rxe, which has no ibv_rereg_mr, the
// default policy re-registers by make-before-break replacement (the keys change; see the output).
//
//   tools/rxe-vm build/examples/02_rereg
#include <rdmaxx/rdmaxx.hpp>

#include <cstdio>
#include <cstring>

namespace {
using namespace rdmaxx;

// Post one signalled write from `qp` and wait for its completion status.
result<ibv_wc_status> write_and_wait(QueuePair &qp, CompletionQueue &cq, const ibv_sge &src,
                                     remote_addr dst) {
  auto batch = qp.start_send();
  batch.write({.id = 1, .flags = send_flag::signaled}, dst, src);
  RDMAXX_TRYV(batch.submit());
  ibv_wc wc[1];
  for (long spins = 0;; ++spins) {
    RDMAXX_TRY(n, cq.poll(wc));
    if (n == 1) return wc[0].status;
    if (spins > 100'000'000) return make_error_code(errc::timeout);
  }
}

result<void> run() {
  RDMAXX_TRY(ctx, Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(cq_peer, CompletionQueue::create(ctx, 16));
  RDMAXX_TRY(cq_owner, CompletionQueue::create(ctx, 16));
  RDMAXX_TRY(peer, QueuePair::create(pd, cq_peer, cq_peer));
  RDMAXX_TRY(owner, QueuePair::create(pd, cq_owner, cq_owner));
  RDMAXX_TRYV(connect_loopback(peer, owner));

  char region[256] = {};
  char message[32] = "written by the peer";
  RDMAXX_TRY(msg_mr, MemoryRegion::reg(pd, message, sizeof message, access::local_write));
  // The owner's region starts with local access only.
  RDMAXX_TRY(mr, MemoryRegion::reg(pd, region, sizeof region, access::local_write));

  // Grant: add remote write. The key to hand to the peer is the one the MR has now.
  RDMAXX_TRY(grant, mr.rereg(change_access(access::local_write | access::remote_write)));
  std::printf("granted remote write via %s, rkey 0x%x\n",
              grant.path == rereg_path::native ? "ibv_rereg_mr" : "replacement", mr.rkey());
  const remote_addr granted{mr.iova() + 16, mr.rkey()};
  RDMAXX_TRY(st1, write_and_wait(peer, cq_peer, msg_mr.sge(), granted));
  if (st1 != IBV_WC_SUCCESS || std::strcmp(region + 16, message) != 0) {
    std::fprintf(stderr, "peer write did not land: %s\n", ibv_wc_status_str(st1));
    return make_error_code(errc::wrong_state);
  }
  std::printf("peer wrote \"%s\"\n", region + 16);

  // Revoke: back to local access only. The peer still holds the granted key.
  RDMAXX_TRYV(mr.rereg(change_access(access::local_write)));
  std::memset(region, '.', sizeof region);
  RDMAXX_TRY(st2, write_and_wait(peer, cq_peer, msg_mr.sge(), granted));
  bool untouched = true;
  for (char c : region) untouched = untouched && c == '.';
  std::printf("after revoke, peer write: %s; region %s\n", ibv_wc_status_str(st2),
              untouched ? "untouched" : "CHANGED");
  if (st2 != IBV_WC_REM_ACCESS_ERR || !untouched) return make_error_code(errc::wrong_state);
  return success();
}
} // namespace

int main() {
  if (auto r = run(); !r) {
    std::fprintf(stderr, "02_rereg failed: %s\n", r.error().message().c_str());
    return 1;
  }
  return 0;
}
