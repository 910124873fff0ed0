// docs/rereg.md: grant a peer remote write on `mr`, then revoke it by re-registering
// (examples/02_rereg.cpp). `send_to_peer` stands for the application's own channel.
#include <rdmaxx/rdmaxx.hpp>

#include <cstdint>

rdmaxx::result<void> grant_then_revoke(rdmaxx::MemoryRegion &mr,
                                       rdmaxx::result<void> (*send_to_peer)(std::uint64_t addr,
                                                                           std::uint32_t rkey)) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(info, mr.rereg(change_access(access::local_write | access::remote_write)));
  (void)info.keys_changed;                        // keys may change: always re-read them
  RDMAXX_TRYV(send_to_peer(mr.iova(), mr.rkey()));
  // ... the peer writes ...
  RDMAXX_TRYV(mr.rereg(change_access(access::local_write)));  // the old rkey is dead now
  // Any combination: mr.rereg(change_translation(p, n) | change_pd(pd2) | change_access(a)).
  return success();
}
