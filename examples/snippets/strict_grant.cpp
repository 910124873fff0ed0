// docs/grants.md "StrictGrant": the library's grant mechanism for the device,
// granted, ended, granted again and revoked; each one confirmed through a CompletionDispatcher
// of `cq` (the CQ `qp` sends to), which hands the grant its own completions.
#include <rdmaxx/rdmaxx.hpp>

rdmaxx::result<void> strict_grant(rdmaxx::ProtectionDomain &peer_pd, rdmaxx::QueuePair &qp,
                                  rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &mr) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(g, StrictGrant::create(peer_pd, mr, {.offset = 4097, .length = 3001}));
  RDMAXX_TRY(disp, CompletionDispatcher::create(cq));
  RDMAXX_TRYV(disp.attach(g));   // g stays in place while attached
  RDMAXX_TRY(d, g.grant(qp, access::remote_write | access::remote_read)); // grant
  RDMAXX_TRYV(disp.settle(g, 5000)); // confirmed, or its error with g rolled back
  // ... send d.encode() to the peer; it reads and writes ...
  (void)d;
  RDMAXX_TRYV(g.revoke(qp));     // end this grant, keep the slot
  RDMAXX_TRYV(disp.settle(g, 5000)); // the old key is dead now
  RDMAXX_TRY(d2, g.grant(qp, access::remote_read));                     // grant again
  RDMAXX_TRYV(disp.settle(g, 5000));
  (void)d2;
  disp.detach(g);
  return g.destroy();             // for good: window deallocated, exact region deregistered
}
