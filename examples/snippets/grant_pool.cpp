// README "Request-scoped grants": one request whose 4 KiB buffer the server may RDMA-read while
// the request is outstanding. `pool` was created on the connection's PD over `buffers`
// (GrantPool::create(conn.pd(), buffers, {.slot_size = 4096})); a receive for the reply is posted.
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>
#include <cstring>
#include <span>

rdmaxx::result<void> one_request(rdmaxx::GrantPool &pool, rdmaxx::QueuePair &qp,
                                 rdmaxx::CompletionQueue &cq) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(lease, pool.acquire());             // a slot; lease.buffer() is yours while ready
  std::memset(lease.buffer().data(), 'x', lease.buffer().size());
  auto batch = qp.start_send();
  RDMAXX_TRY(d, pool.grant(batch, qp, lease, access::remote_read)); // the bind, unsignaled
  grant_list g;
  RDMAXX_TRYV(g.push(d));                        // compact: 18 B a grant
  std::array<std::byte, grant_list::encoded_size(1)> header{};
  RDMAXX_TRY(len, g.encode_to(header));
  batch.send_inline({.id = 1, .flags = send_flag::fence | send_flag::signaled},
                    std::span(header).first(len)); // the request, after the bind
  RDMAXX_TRYV(batch.submit());                   // one post
  // Our send's completion, then the server's reply; the pool takes the completions it owns.
  for (int seen = 0; seen < 2;) {
    std::array<ibv_wc, 4> wcs{};
    RDMAXX_TRY(n, cq.wait(wcs, 20000));
    for (ibv_wc &wc : pool.complete(std::span(wcs).first(n))) {
      if (auto ec = wc_error(wc)) return ec;
      ++seen;
    }
  }
  RDMAXX_TRYV(pool.revoke(qp, lease));           // on reply, abort or timeout (twice is harmless)
  while (lease.state() != lease_state::ready) {  // the revoke's completion goes to the pool
    std::array<ibv_wc, 4> wcs{};
    RDMAXX_TRY(n, cq.wait(wcs, 20000));
    for (ibv_wc &wc : pool.complete(std::span(wcs).first(n)))
      if (auto ec = wc_error(wc)) return ec;     // not the pool's: this program expects none
  }
  return pool.release(lease);                    // the buffer is ours again
}
