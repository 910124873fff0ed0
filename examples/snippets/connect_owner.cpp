// docs/connecting.md, the owner (server): grant 256 bytes of `mem` to the peer that
// connects, through the library's default grant (StrictGrant), in the accept's private data.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <span>

rdmaxx::result<void> owner(std::span<unsigned char> mem) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(at, address::parse("7471"));                // any local IPv4 address, port 7471
  RDMAXX_TRY(l, Listener::listen(at));
  RDMAXX_TRY(req, l.get_request(60000));
  RDMAXX_TRY(conn, req.prepare({.timeout_ms = 20000})); // Context, PD, CQ, QP on the request's device
  RDMAXX_TRY(mr, MemoryRegion::reg(conn.pd(), mem.data(), mem.size(), access::local_write));
  RDMAXX_TRY(g, StrictGrant::create(conn.pd(), mr, {.offset = 1024, .length = 256}));
  RDMAXX_TRY(disp, CompletionDispatcher::create(conn.cq())); // hands g its own completions
  RDMAXX_TRYV(disp.attach(g));
  RDMAXX_TRY(desc, g.grant(conn.qp(), access::remote_write)); // signaled bind
  RDMAXX_TRYV(disp.settle(g, 20000));            // the descriptor is valid once the bind executed
  RDMAXX_TRYV(conn.accept(desc.encode()));       // the grant travels in the accept (<= 196 B)
  RDMAXX_TRYV(conn.wait_established());
  RDMAXX_TRY(gone, conn.wait_disconnected(20000)); // the peer writes mem[1024, 1280), then leaves
  if (!gone) return make_error_code(errc::timeout);
  return g.destroy();                             // window deallocated: the key is dead now
}
