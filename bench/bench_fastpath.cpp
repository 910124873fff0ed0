// bench/bench_fastpath: the fast path, raw rdma-core against rdmaxx on the same QPs and CQs.
//   - post+poll of one signalled 64 B RDMA write, one at a time
//   - a batch of 16 writes (one signalled) posted with one ibv_wr_start/complete, then polled
//   - send/recv ping-pong (post_recv, send, poll both sides)
// Raw bodies call ibv_wr_* / ibv_poll_cq / ibv_post_recv on the native handles; rdmaxx bodies call
// SendBatch / CompletionQueue::poll / QueuePair::post_recv.
//
// `bench_fastpath count raw|rdmaxx N` runs only the instruction-count bodies (for callgrind with
// --toggle-collect=count_*): N rounds of {post 1 write, then 16 writes in one batch; each waited
// for, then polled once}, so that every counted poll finds the same completions ready and the
// count is deterministic.
// `bench_fastpath count1 raw|rdmaxx N` counts one work request per batch: N rounds of {start,
// one signalled 64 B write, submit; wait until it completed; poll 1}. Post and poll are separate
// count_* functions, so callgrind_annotate splits the figure between them.
// `bench_fastpath loops N` runs a user's loop, raw and rdmaxx in the same process: post, wait,
// poll written in one function, 1 WR per batch and 16 WRs per batch, N rounds of each. Whether
// SendBatch::submit() is inlined into such a loop is the compiler's choice, so
// `tools/bench fastpath-builds` compiles this TU with the flags of common build types and counts
// each count_*_loop function (callgrind --toggle-collect='*count_*', callgrind_annotate
// --inclusive=yes); the wait is count_pause, whose own toggle takes it out of the count.
#include "common.hpp"
#include "harness.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <cstring>
#include <thread>

using namespace rdmaxx;

namespace {

struct setup : bench::loopback {
  std::vector<unsigned char> src = std::vector<unsigned char>(4096, 1);
  std::vector<unsigned char> dst = std::vector<unsigned char>(4096, 0);
  MemoryRegion msrc, mdst;
};

result<void> make(setup &s) {
  RDMAXX_TRYV(bench::make_loopback(s));
  RDMAXX_TRY(ms, MemoryRegion::reg(s.pd, s.src.data(), s.src.size(), access::local_write));
  s.msrc = std::move(ms);
  RDMAXX_TRY(md, MemoryRegion::reg(s.pd, s.dst.data(), s.dst.size(),
                                   access::local_write | access::remote_write));
  s.mdst = std::move(md);
  return success();
}

constexpr std::uint32_t len = 64;

// ---- raw rdma-core ----
[[gnu::noinline]] bool raw_write_poll(ibv_qp_ex *qpx, ibv_cq *cq, ibv_sge sge, std::uint64_t raddr,
                                      std::uint32_t rkey, long n) {
  ibv_wc wc[1];
  for (long i = 0; i < n; ++i) {
    ibv_wr_start(qpx);
    qpx->wr_id = std::uint64_t(i);
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(qpx, rkey, raddr);
    ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
    if (ibv_wr_complete(qpx)) return false;
    int got;
    while ((got = ibv_poll_cq(cq, 1, wc)) == 0) {}
    if (got < 0 || wc[0].status != IBV_WC_SUCCESS) return false;
  }
  return true;
}
[[gnu::noinline]] void count_raw_post(ibv_qp_ex *qpx, ibv_sge sge, std::uint64_t raddr,
                                      std::uint32_t rkey, int k) {
  ibv_wr_start(qpx);
  for (int i = 0; i < k; ++i) {
    qpx->wr_id = std::uint64_t(i);
    qpx->wr_flags = i == k - 1 ? IBV_SEND_SIGNALED : 0;
    ibv_wr_rdma_write(qpx, rkey, raddr);
    ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
  }
  if (ibv_wr_complete(qpx)) std::abort();
}
// One signalled write per batch: what a latency-bound caller posts.
[[gnu::noinline]] void count_raw_post1(ibv_qp_ex *qpx, ibv_sge sge, std::uint64_t raddr,
                                       std::uint32_t rkey, std::uint64_t id) {
  ibv_wr_start(qpx);
  qpx->wr_id = id;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(qpx, rkey, raddr);
  ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
  if (ibv_wr_complete(qpx)) std::abort();
}
// Both poll bodies hand back the count, or -1 when the provider reports an error: the check any
// real caller of ibv_poll_cq makes.
[[gnu::noinline]] int count_raw_poll(ibv_cq *cq, ibv_wc *wc, int n) {
  const int got = ibv_poll_cq(cq, n, wc);
  return got < 0 ? -1 : got;
}
[[gnu::noinline]] bool raw_pingpong(ibv_qp *rq, ibv_qp_ex *sqx, ibv_cq *scq, ibv_cq *rcq, ibv_sge s,
                                    ibv_sge r, long n) {
  ibv_wc wc[1];
  for (long i = 0; i < n; ++i) {
    ibv_recv_wr w{};
    w.wr_id = std::uint64_t(i);
    w.sg_list = &r;
    w.num_sge = 1;
    ibv_recv_wr *bad;
    if (ibv_post_recv(rq, &w, &bad)) return false;
    ibv_wr_start(sqx);
    sqx->wr_id = std::uint64_t(i);
    sqx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(sqx);
    ibv_wr_set_sge(sqx, s.lkey, s.addr, s.length);
    if (ibv_wr_complete(sqx)) return false;
    int got;
    while ((got = ibv_poll_cq(scq, 1, wc)) == 0) {}
    if (got < 0 || wc[0].status) return false;
    while ((got = ibv_poll_cq(rcq, 1, wc)) == 0) {}
    if (got < 0 || wc[0].status) return false;
  }
  return true;
}

// Wait (without polling) until the writes of a batch have certainly completed.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
// Named count_* so that callgrind's --toggle-collect='*count_*' switches counting off inside it.
[[gnu::noinline]] void count_pause() { settle(); }

// A user's loop, raw: K writes per batch (the last signalled), then wait, then one poll.
template <int K>
[[gnu::noinline]] bool count_raw_loop(ibv_qp_ex *qpx, ibv_cq *cq, ibv_sge sge, std::uint64_t raddr,
                                      std::uint32_t rkey, long n) {
  ibv_wc wc[K];
  for (long i = 0; i < n; ++i) {
    ibv_wr_start(qpx);
    for (int j = 0; j < K; ++j) {
      qpx->wr_id = std::uint64_t(i);
      qpx->wr_flags = j == K - 1 ? IBV_SEND_SIGNALED : 0;
      ibv_wr_rdma_write(qpx, rkey, raddr);
      ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
    }
    if (ibv_wr_complete(qpx)) return false;
    count_pause();
    if (ibv_poll_cq(cq, K, wc) != 1 || wc[0].status != IBV_WC_SUCCESS) return false;
  }
  return true;
}

// ---- rdmaxx ----
[[gnu::noinline]] bool rdmaxx_write_poll(QueuePair &qp, CompletionQueue &cq, const ibv_sge &sge,
                                         remote_addr r, long n) {
  ibv_wc wc[1];
  for (long i = 0; i < n; ++i) {
    auto batch = qp.start_send();
    batch.write({std::uint64_t(i), send_flag::signaled}, r, sge);
    if (!batch.submit()) return false;
    std::size_t got = 0;
    while (got == 0) {
      auto p = cq.poll(wc);
      if (!p) return false;
      got = p.value();
    }
    if (wc[0].status != IBV_WC_SUCCESS) return false;
  }
  return true;
}
[[gnu::noinline]] void count_rdmaxx_post(QueuePair &qp, const ibv_sge &sge, remote_addr r, int k) {
  auto batch = qp.start_send();
  for (int i = 0; i < k; ++i)
    batch.write({std::uint64_t(i), i == k - 1 ? send_flags(send_flag::signaled) : send_flags{}}, r, sge);
  if (!batch.submit()) std::abort();
}
[[gnu::noinline]] void count_rdmaxx_post1(QueuePair &qp, const ibv_sge &sge, remote_addr r,
                                          std::uint64_t id) {
  auto batch = qp.start_send();
  batch.write({id, send_flag::signaled}, r, sge);
  if (!batch.submit()) std::abort();
}
[[gnu::noinline]] int count_rdmaxx_poll(CompletionQueue &cq, std::span<ibv_wc> wc) {
  auto p = cq.poll(wc);
  return p ? int(p.value()) : -1;
}
[[gnu::noinline]] bool rdmaxx_pingpong(QueuePair &rq, QueuePair &sq, CompletionQueue &scq,
                                       CompletionQueue &rcq, const ibv_sge &s, const ibv_sge &r, long n) {
  ibv_wc wc[1];
  for (long i = 0; i < n; ++i) {
    if (!rq.post_recv(std::uint64_t(i), r)) return false;
    auto batch = sq.start_send();
    batch.send({std::uint64_t(i), send_flag::signaled}, s);
    if (!batch.submit()) return false;
    for (CompletionQueue *cq : {&scq, &rcq}) {
      std::size_t got = 0;
      while (got == 0) {
        auto p = cq->poll(wc);
        if (!p) return false;
        got = p.value();
      }
      if (wc[0].status) return false;
    }
  }
  return true;
}

// The same loop through rdmaxx.
template <int K>
[[gnu::noinline]] bool count_rdmaxx_loop(QueuePair &qp, CompletionQueue &cq, ibv_sge sge,
                                         remote_addr r, long n) {
  ibv_wc wc[K];
  for (long i = 0; i < n; ++i) {
    auto batch = qp.start_send();
    for (int j = 0; j < K; ++j)
      batch.write({std::uint64_t(i), j == K - 1 ? send_flags(send_flag::signaled) : send_flags{}},
                  r, sge);
    if (!batch.submit()) return false;
    count_pause();
    auto p = cq.poll(wc); // checked as RDMAXX_TRY does: the error, then assume_value()
    if (!p || p.assume_value() != 1 || wc[0].status != IBV_WC_SUCCESS) return false;
  }
  return true;
}

} // namespace

int main(int argc, char **argv) {
  setup s;
  if (auto r = make(s); !r) {
    std::fprintf(stderr, "bench_fastpath: setup failed: %s\n", r.error().message().c_str());
    return 1;
  }
  const ibv_sge sge = s.msrc.sge(0, len);
  const remote_addr dst{s.mdst.iova(), s.mdst.rkey()};
  ibv_qp_ex *qpx = s.a.native_handle_ex();
  ibv_cq *cq = s.cq_a.native_handle();

  if (argc == 4 && std::strcmp(argv[1], "count") == 0) {
    const bool raw = std::strcmp(argv[2], "raw") == 0;
    const long rounds = std::atol(argv[3]);
    ibv_wc wc[16];
    for (long i = 0; i < rounds; ++i) {
      for (int k : {1, 16}) {
        if (raw) count_raw_post(qpx, sge, dst.addr, dst.rkey, k);
        else count_rdmaxx_post(s.a, sge, dst, k);
        settle();
        const int got = raw ? count_raw_poll(cq, wc, 16) : count_rdmaxx_poll(s.cq_a, wc);
        if (got != 1 || wc[0].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "count: unexpected completion (%d)\n", got);
          return 1;
        }
      }
    }
    std::printf("counted %ld rounds of {1 write, 16 writes} (%s)\n", rounds, raw ? "raw" : "rdmaxx");
    return 0;
  }

  if (argc == 4 && std::strcmp(argv[1], "count1") == 0) {
    const bool raw = std::strcmp(argv[2], "raw") == 0;
    const long rounds = std::atol(argv[3]);
    ibv_wc wc[1];
    for (long i = 0; i < rounds; ++i) {
      if (raw) count_raw_post1(qpx, sge, dst.addr, dst.rkey, std::uint64_t(i));
      else count_rdmaxx_post1(s.a, sge, dst, std::uint64_t(i));
      settle();
      const int got = raw ? count_raw_poll(cq, wc, 1) : count_rdmaxx_poll(s.cq_a, wc);
      if (got != 1 || wc[0].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "count1: unexpected completion (%d)\n", got);
        return 1;
      }
    }
    std::printf("counted %ld rounds of {1 write per batch} (%s)\n", rounds, raw ? "raw" : "rdmaxx");
    return 0;
  }

  if (argc == 3 && std::strcmp(argv[1], "loops") == 0) {
    const long rounds = std::atol(argv[2]);
    // Warm the provider's paths (and lazy symbol binding) outside the counted functions.
    bool ok = raw_write_poll(qpx, cq, sge, dst.addr, dst.rkey, 10) &&
              rdmaxx_write_poll(s.a, s.cq_a, sge, dst, 10);
    ok = ok && count_raw_loop<1>(qpx, cq, sge, dst.addr, dst.rkey, rounds);
    ok = ok && count_rdmaxx_loop<1>(s.a, s.cq_a, sge, dst, rounds);
    ok = ok && count_raw_loop<16>(qpx, cq, sge, dst.addr, dst.rkey, rounds);
    ok = ok && count_rdmaxx_loop<16>(s.a, s.cq_a, sge, dst, rounds);
    if (!ok) {
      std::fprintf(stderr, "loops: a work request failed\n");
      return 1;
    }
    std::printf("counted %ld rounds of each loop (1 and 16 writes per batch, raw and rdmaxx)\n", rounds);
    return 0;
  }

  const int reps = 11;
  bool ok = true;
  ok = ok && bench::compare("post+poll 64B RDMA write", reps, bench::scaled(20000),
                            [&](long n) { return raw_write_poll(qpx, cq, sge, dst.addr, dst.rkey, n); },
                            [&](long n) { return rdmaxx_write_poll(s.a, s.cq_a, sge, dst, n); });
  ibv_wc wc[16];
  auto batch16 = [&](bool raw, long n) {
    for (long i = 0; i < n; ++i) {
      if (raw) count_raw_post(qpx, sge, dst.addr, dst.rkey, 16);
      else count_rdmaxx_post(s.a, sge, dst, 16);
      int got;
      while ((got = raw ? count_raw_poll(cq, wc, 16) : count_rdmaxx_poll(s.cq_a, wc)) == 0) {}
      if (got != 1 || wc[0].status) return false;
    }
    return true;
  };
  ok = ok && bench::compare("post+poll batch of 16 64B writes (per batch)", reps, bench::scaled(5000),
                            [&](long n) { return batch16(true, n); },
                            [&](long n) { return batch16(false, n); });
  const ibv_sge rsge = s.mdst.sge(0, len);
  ok = ok && bench::compare("send/recv ping-pong 64B", reps, bench::scaled(10000),
                            [&](long n) {
                              return raw_pingpong(s.b.native_handle(), qpx, cq, s.cq_b.native_handle(),
                                                  sge, rsge, n);
                            },
                            [&](long n) { return rdmaxx_pingpong(s.b, s.a, s.cq_a, s.cq_b, sge, rsge, n); });
  if (!ok) {
    std::fprintf(stderr, "bench_fastpath: a work request failed\n");
    return 1;
  }
  return 0;
}
