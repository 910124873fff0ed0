// bench/common.hpp: the loopback setup every device benchmark uses (not timed).
#pragma once

#include <rdmaxx/rdmaxx.hpp>

#include <cstdio>
#include <cstdlib>

namespace bench {

/// A device, a PD and two RC QPs connected to each other: `a` initiates, `b` is the target.
struct loopback {
  rdmaxx::Context ctx;
  rdmaxx::ProtectionDomain pd;
  rdmaxx::CompletionQueue cq_a, cq_b;
  rdmaxx::QueuePair a, b;
};

inline rdmaxx::result<void> make_loopback(loopback &s, std::uint32_t depth = 128) {
  using namespace rdmaxx;
  RDMAXX_TRY(ctx, Context::open_first());
  s.ctx = std::move(ctx);
  RDMAXX_TRY(pd, ProtectionDomain::alloc(s.ctx));
  s.pd = std::move(pd);
  RDMAXX_TRY(ca, CompletionQueue::create(s.ctx, int(2 * depth)));
  s.cq_a = std::move(ca);
  RDMAXX_TRY(cb, CompletionQueue::create(s.ctx, int(2 * depth)));
  s.cq_b = std::move(cb);
  qp_caps caps;
  caps.max_send_wr = depth;
  caps.max_recv_wr = depth;
  RDMAXX_TRY(a, QueuePair::create(s.pd, s.cq_a, s.cq_a, caps));
  s.a = std::move(a);
  RDMAXX_TRY(b, QueuePair::create(s.pd, s.cq_b, s.cq_b, caps));
  s.b = std::move(b);
  return connect_loopback(s.a, s.b);
}

/// Exit with a message when a setup step fails.
template <class T>
T must(rdmaxx::result<T> r, const char *what) {
  if (!r) {
    std::fprintf(stderr, "bench: %s: %s\n", what, r.error().message().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}
inline void must(rdmaxx::result<void> r, const char *what) {
  if (!r) {
    std::fprintf(stderr, "bench: %s: %s\n", what, r.error().message().c_str());
    std::exit(1);
  }
}

/// Spin on a raw CQ for one completion; false on a failed status or poll error.
inline bool raw_wait(ibv_cq *cq, ibv_wc &wc) {
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {}
  return n == 1 && wc.status == IBV_WC_SUCCESS;
}
/// The same through rdmaxx.
inline bool rdmaxx_wait(rdmaxx::CompletionQueue &cq, ibv_wc &wc) {
  for (;;) {
    auto p = cq.poll({&wc, 1});
    if (!p) return false;
    if (p.value() == 1) return wc.status == IBV_WC_SUCCESS;
  }
}

} // namespace bench
