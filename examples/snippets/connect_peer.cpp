// docs/connecting.md, the peer (client): connect by address, decode the grant from
// the accept's private data, RDMA-write `src` through it and check the completion.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <span>

rdmaxx::result<void> peer(std::span<unsigned char> src) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(to, address::parse("192.0.2.1:7471")); // a host address: a wildcard is refused
  RDMAXX_TRY(c, Connection::connect(to, {.timeout_ms = 20000},
                                    {.total_ms = 60000})); // retried while nobody listens yet
  // The accept's private data: the descriptor, padded with zeros to 196 bytes by the transport.
  RDMAXX_TRY(grant, remote_descriptor::decode_private_data(c.peer_private_data()));
  RDMAXX_TRY(where, grant.slice(0, src.size()));     // errc::out_of_range past the grant
  RDMAXX_TRY(src_mr, MemoryRegion::reg(c.pd(), src.data(), src.size(), access::local_write));
  auto b = c.qp().start_send();                     // the QP is an ordinary rdmaxx QueuePair
  b.write({.id = 1, .flags = send_flag::signaled}, where, src_mr.sge());
  RDMAXX_TRYV(b.submit());
  RDMAXX_TRYV(c.cq().wait_for(1, 20000));           // e.g. remote access error once revoked
  return success();                                 // c's destructor disconnects
}
