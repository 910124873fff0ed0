// README "Memory windows": an explicit window of the caller's type (here type 1) over part of
// `mr` (registered with access::mw_bind), bound through `qp`, waited for, then deallocated.
// Prefer StrictGrant (next section): it picks the type that is safe on the device.
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>
#include <span>

rdmaxx::result<void> window_grant(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp,
                                  rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &mr,
                                  std::array<std::byte, rdmaxx::remote_descriptor::encoded_size> &wire) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(mw, MemoryWindow::alloc(pd, mw_type::type1));
  RDMAXX_TRY(desc, mw.bind(qp, mr, {.offset = 1024, .length = 256}, access::remote_write));
  ibv_wc wc{};
  RDMAXX_TRYV(cq.wait(std::span(&wc, 1), 5000));
  (void)mw.complete(wc);         // a failed bind rolls state and key back
  if (auto ec = wc_error(wc)) return ec;
  wire = desc.encode();          // 32 bytes for the peer; remote_descriptor::decode() on its side
  // ... the peer uses it ...
  return mw.dealloc();           // revoke for good: the key is dead when this returns
}
