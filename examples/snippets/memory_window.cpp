// docs/grants.md "MemoryWindow": an explicit window of the caller's type (here type 1) over part of
// `mr` (registered with access::mw_bind), bound through `qp`, confirmed, then deallocated.
// Prefer StrictGrant (next section): it picks the type that is safe on the device.
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>

rdmaxx::result<void> window_grant(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp,
                                  rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &mr,
                                  std::array<std::byte, rdmaxx::remote_descriptor::encoded_size> &wire) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(mw, MemoryWindow::alloc(pd, mw_type::type1));
  RDMAXX_TRY(disp, CompletionDispatcher::create(cq));
  RDMAXX_TRYV(disp.attach(mw));
  RDMAXX_TRY(desc, mw.bind(qp, mr, {.offset = 1024, .length = 256}, access::remote_write));
  RDMAXX_TRYV(disp.settle(mw, 5000)); // a failed bind: its error, state and key rolled back
  wire = desc.encode();          // 32 bytes for the peer; remote_descriptor::decode() on its side
  // ... the peer uses it ...
  disp.detach(mw);
  return mw.destroy();           // revoke for good: the key is dead when this returns
}
