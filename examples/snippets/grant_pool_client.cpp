// docs/request-grants.md, the connection: with the default options the Connection makes
// its own PD, so resolve() first, create the pool on that PD, and send the pool's offer in the
// connect request (connect_with); then one request (grant_pool.cpp).
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>
#include <span>

rdmaxx::result<void> one_request(rdmaxx::GrantPool &pool, rdmaxx::QueuePair &qp,
                                 rdmaxx::CompletionQueue &cq) noexcept; // grant_pool.cpp

rdmaxx::result<void> grant_pool_client(std::span<std::byte> buffers) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(to, address::parse("192.0.2.1:7472"));
  RDMAXX_TRY(c, Connection::resolve(to, {.timeout_ms = 20000})); // PD, CQ, QP; nothing sent yet
  RDMAXX_TRY(mr, MemoryRegion::reg(c.pd(), buffers.data(), buffers.size(), access::local_write));
  RDMAXX_TRY(pool, GrantPool::create(c.pd(), mr, {.slot_size = 4096})); // declared after c:
                                                                        // destroyed before it
  RDMAXX_TRYV(c.connect_with(pool.offer().encode())); // 12 bytes in the connect request
  RDMAXX_TRYV(c.wait_established());
  std::array<std::byte, 64> reply{};
  RDMAXX_TRY(rmr, MemoryRegion::reg(c.pd(), reply.data(), reply.size(), access::local_write));
  RDMAXX_TRYV(c.qp().post_recv(2, rmr.sge()));      // for the server's reply
  return one_request(pool, c.qp(), c.cq());
}
