// docs/indirect-keys.md: one key over pieces of three regions, configured through `qp` (from
// create_indirect_key_qp), confirmed, and its descriptor encoded into `wire` for the peer
// (`wire_len` bytes). The key is returned: it must outlive the peer's use of it.
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>
#include <span>

rdmaxx::result<rdmaxx::IndirectKey> indirect_key(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp,
                                         rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &m1,
                                         rdmaxx::MemoryRegion &m2, rdmaxx::MemoryRegion &m3,
                                         std::span<std::byte, rdmaxx::ikey_descriptor::max_encoded_size> wire,
                                         std::size_t &wire_len) noexcept {
  using namespace rdmaxx;
  const layout l = layout::list({{m1, 3, 6}, {m3, 101, 5}, {m2, 7, 9}}); // (region, offset, length)
  RDMAXX_TRY(key, IndirectKey::create(pd, 8));
  {
    RDMAXX_TRY(disp, CompletionDispatcher::create(cq));
    RDMAXX_TRYV(disp.attach(key));
    RDMAXX_TRYV(key.configure(qp, l, access::local_write | access::remote_write));
    RDMAXX_TRYV(disp.settle(key, 5000)); // confirmed by its own completion (descriptor() waits for it)
  } // the dispatcher goes before the key is moved out
  RDMAXX_TRY(desc, key.descriptor());
  // The peer: ikey_descriptor::decode(), then write_indirect(batch, wr, desc, offset, local_sge):
  // one RDMA write per segment.
  RDMAXX_TRY(n, desc.encode(wire));
  wire_len = n;
  return key;
}
