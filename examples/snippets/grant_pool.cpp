// docs/request-grants.md: one request whose 4 KiB buffer the server may RDMA-read while
// the request is outstanding. `pool` was created on the connection's PD (grant_pool_client.cpp);
// a receive for the reply is posted with wr_id 2.
#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cstddef>
#include <cstring>
#include <span>

rdmaxx::result<void> one_request(rdmaxx::GrantPool &pool, rdmaxx::QueuePair &qp,
                                 rdmaxx::CompletionQueue &cq) noexcept {
  using namespace rdmaxx;
  RDMAXX_TRY(lease, pool.acquire());             // a slot, ready: its buffer is yours
  RDMAXX_TRY(buf, lease.buffer());               // errc::grant_outstanding unless ready
  std::memset(buf.data(), 'x', buf.size());
  auto batch = qp.start_send();
  RDMAXX_TRY(d, pool.grant(batch, qp, lease, access::remote_read)); // the bind, unsignaled
  grant_list g;
  RDMAXX_TRYV(g.push(d));                        // compact: 18 B a grant
  std::array<std::byte, grant_list::encoded_size(1)> header{};
  RDMAXX_TRY(len, g.encode_to(header));
  batch.send_inline({.id = 1, .flags = send_flag::fence | send_flag::signaled},
                    std::span(header).first(len)); // the request, after the bind
  RDMAXX_TRYV(batch.submit());                   // one post
  // The server's reply (receive 2); what else completes meanwhile: the pool's own go to the
  // pool, our send's (1) is noted, anything else is an error.
  bool sent = false, stray = false;
  const auto others = [&](std::span<ibv_wc> wcs) {
    for (ibv_wc &wc : pool.complete(wcs)) (wc.wr_id == 1 && !wc_error(wc) ? sent : stray) = true;
  };
  RDMAXX_TRYV(cq.wait_for(2, 20000, others));    // the reply; a failed one is its wc_error()
  if (!sent) RDMAXX_TRYV(cq.wait_for(1, 20000, others));
  if (stray) return make_error_code(errc::unexpected_completion);
  RDMAXX_TRYV(pool.revoke(qp, lease));           // on reply, abort or timeout (twice is harmless)
  while (lease.state() != lease_state::ready) {  // the revoke's completion goes to the pool
    std::array<ibv_wc, 4> wcs{};
    RDMAXX_TRY(n, cq.wait(wcs, 20000));
    if (!pool.complete(std::span(wcs).first(n)).empty()) return make_error_code(errc::unexpected_completion);
  }
  return pool.give_back(lease);                  // the buffer is ours again
}
