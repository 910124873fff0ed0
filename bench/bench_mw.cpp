// bench/bench_mw: grant+revoke cycles through memory windows, raw rdma-core against rdmaxx,
// interleaved in one run. Each cycle grants a peer 4 KiB of a 1 MiB region and revokes it:
//   - type 1: bind (ibv_bind_mw, one completion) + unbind (zero-length bind, one completion)
//   - type 2: bind (ibv_wr_bind_mw) + local invalidate chained in one batch, one completion
// The rdmaxx side also does its checks (PD, range, rights) and state tracking (complete()).
// For scale, reg+dereg of a fresh 1 MiB MR (the grant+revoke a window replaces) is measured too.
#include "common.hpp"
#include "harness.hpp"

#include <vector>

using namespace rdmaxx;

int main() {
  bench::loopback s;
  bench::must(bench::make_loopback(s), "setup");
  std::vector<unsigned char> buf(1 << 20);
  const access_flags acc = access::local_write | access::remote_write | access::remote_read |
                           access::mw_bind;
  auto mr = bench::must(MemoryRegion::reg(s.pd, buf.data(), buf.size(), acc), "reg");
  auto w1 = bench::must(MemoryWindow::alloc(s.pd, mw_type::type1), "alloc type 1");
  auto w2 = bench::must(MemoryWindow::alloc(s.pd, mw_type::type2, bench::accept_risk), "alloc type 2");
  // Raw windows: allocated by hand, freed at the end.
  ibv_mw *r1 = ibv_alloc_mw(s.pd.native_handle(), IBV_MW_TYPE_1);
  ibv_mw *r2 = ibv_alloc_mw(s.pd.native_handle(), IBV_MW_TYPE_2);
  if (!r1 || !r2) return 1;
  ibv_qp *qp = s.a.native_handle();
  ibv_qp_ex *qpx = s.a.native_handle_ex();
  ibv_cq *cq = s.cq_a.native_handle();
  const access_flags rights = access::remote_write | access::remote_read;
  const window_range range{8192, 4096};
  const int reps = 11;
  bool ok = true;
  ibv_wc wc{};

  ok = ok && bench::compare("grant+revoke type-1 window (bind+unbind)", reps, bench::scaled(2000),
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          ibv_mw_bind b{};
          b.wr_id = 1;
          b.send_flags = IBV_SEND_SIGNALED;
          b.bind_info = {mr.native_handle(), mr.iova() + range.offset, range.length,
                         unsigned(rights.native())};
          if (ibv_bind_mw(qp, r1, &b) || !bench::raw_wait(cq, wc)) return false;
          b.bind_info = {mr.native_handle(), 0, 0, 0};
          if (ibv_bind_mw(qp, r1, &b) || !bench::raw_wait(cq, wc)) return false;
        }
        return true;
      },
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          if (!w1.bind(s.a, mr, range, rights) || !bench::rdmaxx_wait(s.cq_a, wc)) return false;
          w1.complete(wc);
          if (!w1.unbind(s.a) || !bench::rdmaxx_wait(s.cq_a, wc)) return false;
          w1.complete(wc);
        }
        return true;
      });

  std::uint32_t key2 = r2->rkey;
  ok = ok && bench::compare("grant+revoke type-2 window (bind+inv, 1 completion)", reps,
      bench::scaled(2000),
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          key2 = ibv_inc_rkey(key2);
          const ibv_mw_bind_info info{mr.native_handle(), mr.iova() + range.offset, range.length,
                                      unsigned(rights.native())};
          ibv_wr_start(qpx);
          qpx->wr_id = 1;
          qpx->wr_flags = 0;
          ibv_wr_bind_mw(qpx, r2, key2, &info);
          qpx->wr_id = 2;
          qpx->wr_flags = IBV_SEND_SIGNALED;
          ibv_wr_local_inv(qpx, key2);
          r2->rkey = key2; // the provider does not; without it the next bind fails
          if (int rc = ibv_wr_complete(qpx)) {
            std::fprintf(stderr, "raw type-2: ibv_wr_complete %d\n", rc);
            return false;
          }
          if (!bench::raw_wait(cq, wc)) {
            std::fprintf(stderr, "raw type-2: %s (wr %llu)\n", ibv_wc_status_str(wc.status),
                         (unsigned long long)wc.wr_id);
            return false;
          }
        }
        return true;
      },
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          auto batch = s.a.start_send();
          if (auto r = w2.bind(batch, s.a, mr, range, rights, {1, {}}); !r) {
            std::fprintf(stderr, "bind: %s\n", r.error().message().c_str());
            return false;
          }
          if (auto r = w2.invalidate(batch, s.a, {2, send_flag::signaled}); !r) {
            std::fprintf(stderr, "invalidate: %s\n", r.error().message().c_str());
            return false;
          }
          if (!batch.submit() || !bench::rdmaxx_wait(s.cq_a, wc)) {
            std::fprintf(stderr, "rdmaxx type-2: %s\n", ibv_wc_status_str(wc.status));
            return false;
          }
          w2.complete(wc);
        }
        return true;
      });

  ok = ok && bench::compare("grant+revoke by reg+dereg of 1MiB (for scale)", reps, bench::scaled(300),
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          ibv_mr *m = ibv_reg_mr(s.pd.native_handle(), buf.data(), buf.size(), int(acc.native()));
          if (!m || ibv_dereg_mr(m)) return false;
        }
        return true;
      },
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          auto m = MemoryRegion::reg(s.pd, buf.data(), buf.size(), acc);
          if (!m || !m.value().destroy()) return false;
        }
        return true;
      });
  ibv_dealloc_mw(r1);
  ibv_dealloc_mw(r2);
  if (!ok) {
    std::fprintf(stderr, "bench_mw: an operation failed\n");
    return 1;
  }
  return 0;
}
