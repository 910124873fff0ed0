// bench/bench_ikey: a write through a software indirect key (write_indirect: one RDMA write per
// touched segment, one batch, one completion) against a hand-written chain of the same RDMA
// writes in raw rdma-core, interleaved in one run. Also checks that posting through a configured
// key allocates nothing (global operator new is counted).
#include "common.hpp"
#include "harness.hpp"

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

// Every replaced operator new below uses malloc and every delete free, so they match; GCC cannot
// see that through the inlined library code.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<long> allocations{0};
}
void *operator new[](std::size_t n) { return operator new(n); }
void *operator new[](std::size_t n, const std::nothrow_t &t) noexcept { return operator new(n, t); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
void *operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

using namespace rdmaxx;

int main() {
  bench::loopback s;
  bench::must(bench::make_loopback(s), "setup");
  // Target: three regions; the key scatters over six odd pieces of them.
  std::vector<unsigned char> t1(8192), t2(8192), t3(8192), src(2048, 7);
  const access_flags acc = access::local_write | access::remote_write | access::mw_bind;
  auto m1 = bench::must(MemoryRegion::reg(s.pd, t1.data(), t1.size(), acc), "reg t1");
  auto m2 = bench::must(MemoryRegion::reg(s.pd, t2.data(), t2.size(), acc), "reg t2");
  auto m3 = bench::must(MemoryRegion::reg(s.pd, t3.data(), t3.size(), acc), "reg t3");
  auto ms = bench::must(MemoryRegion::reg(s.pd, src.data(), src.size(), access::local_write), "reg src");
  const layout l = layout::list({{m1, 3, 301}, {m2, 100, 333}, {m3, 7, 350},
                                 {m1, 4000, 299}, {m3, 5000, 360}, {m2, 6000, 355}});
  // the software backend on every device (this compares against its segment chain; on mlx5 the
  // automatic backend would need a UMR QP)
  auto key = bench::must(IndirectKey::create(s.pd, 8, {.backend = umr_backend::software}), "create key");
  {
    auto batch = s.b.start_send();
    bench::must(key.configure(batch, s.b, l, access::local_write | access::remote_write,
                              {1, send_flag::signaled}),
                "configure");
    bench::must(batch.submit(), "submit configure");
    ibv_wc wc{};
    if (!bench::rdmaxx_wait(s.cq_b, wc) || !key.complete(wc)) return 1;
  }
  const auto desc = bench::must(key.descriptor(), "descriptor");
  const auto segs = desc.segments();
  const std::uint32_t total = std::uint32_t(desc.length());
  ibv_qp_ex *qpx = s.a.native_handle_ex();
  ibv_cq *cq = s.cq_a.native_handle();
  const ibv_sge local = ms.sge(0, total);
  ibv_wc wc{};
  long allocs_in_rdmaxx = 0;

  const bool ok = bench::compare("indirect-key write 1998B over 6 segments", 11, bench::scaled(5000),
      [&](long n) {
        for (long i = 0; i < n; ++i) {
          ibv_wr_start(qpx);
          std::uint64_t done = 0;
          for (std::size_t k = 0; k < segs.size(); ++k) {
            qpx->wr_id = 1;
            qpx->wr_flags = k + 1 == segs.size() ? IBV_SEND_SIGNALED : 0;
            ibv_wr_rdma_write(qpx, segs[k].rkey, segs[k].addr);
            ibv_wr_set_sge(qpx, local.lkey, local.addr + done, segs[k].length);
            done += segs[k].length;
          }
          if (ibv_wr_complete(qpx) || !bench::raw_wait(cq, wc)) return false;
        }
        return true;
      },
      [&](long n) {
        const long before = allocations.load();
        for (long i = 0; i < n; ++i) {
          auto batch = s.a.start_send();
          if (!write_indirect(batch, {1, send_flag::signaled}, desc, 0, local)) return false;
          if (!batch.submit() || !bench::rdmaxx_wait(s.cq_a, wc)) return false;
        }
        allocs_in_rdmaxx += allocations.load() - before;
        return true;
      });
  std::printf("allocations while posting through the indirect key: %ld\n", allocs_in_rdmaxx);
  return ok && allocs_in_rdmaxx == 0 ? 0 : 1;
}
