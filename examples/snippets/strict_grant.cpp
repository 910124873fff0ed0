// README "Grants a hostile peer cannot break": the library's grant mechanism for the device,
// granted, ended, granted again and revoked; each grant and revoke waited for on `cq`.
#include <rdmaxx/rdmaxx.hpp>

#include <span>

namespace {
// Wait for one completion of `g`'s window and hand it over; a failed one is an error_code.
rdmaxx::result<void> confirm(rdmaxx::CompletionQueue &cq, rdmaxx::StrictGrant &g) noexcept {
  ibv_wc wc{};
  RDMAXX_TRYV(cq.wait(std::span(&wc, 1), 5000));
  (void)g.window().complete(wc);
  if (auto ec = rdmaxx::wc_error(wc)) return ec;
  return rdmaxx::success();
}
} // namespace

rdmaxx::result<void> strict_grant(rdmaxx::ProtectionDomain &peer_pd, rdmaxx::QueuePair &qp,
                                  rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &mr) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(g, StrictGrant::create(peer_pd, mr, {.offset = 4097, .length = 3001}));
  RDMAXX_TRY(d, g.grant(qp, access::remote_write | access::remote_read)); // grant
  RDMAXX_TRYV(confirm(cq, g));
  // ... send d.encode() to the peer; it reads and writes ...
  (void)d;
  RDMAXX_TRYV(g.revoke(qp));     // end this grant, keep the slot
  RDMAXX_TRYV(confirm(cq, g));
  RDMAXX_TRY(d2, g.grant(qp, access::remote_read));                     // grant again
  RDMAXX_TRYV(confirm(cq, g));
  (void)d2;
  return g.destroy();             // for good: window deallocated, exact region deregistered
}
