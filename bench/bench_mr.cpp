// bench/bench_mr: memory registration, raw rdma-core against rdmaxx, interleaved in one run.
//   - reg + dereg of 4 KiB, 1 MiB, 64 MiB (MemoryRegion::reg and its destructor vs
//     ibv_reg_mr + ibv_dereg_mr)
//   - re-registration of the access rights by replacement (MemoryRegion::rereg with
//     rereg_policy::replacement_only vs a hand-written ibv_reg_mr of the new MR + ibv_dereg_mr
//     of the old one): the goal is <= 1.05x, i.e. no hidden extra system calls.
#include "harness.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <sys/mman.h>

using namespace rdmaxx;

int main() {
  auto ctx = Context::open_first();
  if (!ctx) {
    std::fprintf(stderr, "bench_mr: %s\n", ctx.error().message().c_str());
    return 1;
  }
  auto pd = ProtectionDomain::alloc(ctx.value());
  if (!pd) return 1;
  ibv_pd *rpd = pd.value().native_handle();
  const int reps = 11;
  bool ok = true;
  struct size_case { const char *name; std::size_t bytes; long iters; };
  const size_case sizes[] = {{"4KiB", 4096, 2000}, {"1MiB", 1 << 20, 300}, {"64MiB", 64 << 20, 10}};
  const access_flags acc = access::local_write | access::remote_write | access::remote_read;
  const access_flags acc2 = access::local_write | access::remote_read;
  for (const auto &sz : sizes) {
    void *buf = ::mmap(nullptr, sz.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1;
    std::memset(buf, 0, sz.bytes); // fault the pages in once, outside the timing
    const long n = bench::scaled(sz.iters);
    ok = ok && bench::compare(std::string("reg+dereg ") + sz.name, reps, n,
                              [&](long k) {
                                for (long i = 0; i < k; ++i) {
                                  ibv_mr *mr = ibv_reg_mr(rpd, buf, sz.bytes, int(acc.native()));
                                  if (!mr || ibv_dereg_mr(mr)) return false;
                                }
                                return true;
                              },
                              [&](long k) {
                                for (long i = 0; i < k; ++i) {
                                  auto mr = MemoryRegion::reg(pd.value(), buf, sz.bytes, acc);
                                  if (!mr || !mr.value().destroy()) return false;
                                }
                                return true;
                              });
    // Rereg by replacement: flip between two access sets, k times.
    ibv_mr *raw_mr = ibv_reg_mr(rpd, buf, sz.bytes, int(acc.native()));
    auto mr = MemoryRegion::reg(pd.value(), buf, sz.bytes, acc);
    if (!raw_mr || !mr) return 1;
    int raw_flip = 0; // the raw MR starts with acc; each body flips its own MR's access
    ok = ok && bench::compare(std::string("rereg access (replacement) ") + sz.name, reps, n,
                              [&](long k) {
                                for (long i = 0; i < k; ++i, ++raw_flip) {
                                  const int a = int((raw_flip % 2 ? acc : acc2).native());
                                  ibv_mr *fresh = ibv_reg_mr(rpd, buf, sz.bytes, a);
                                  if (!fresh) std::perror("raw ibv_reg_mr");
                                  if (!fresh || ibv_dereg_mr(raw_mr)) return false;
                                  raw_mr = fresh;
                                }
                                return true;
                              },
                              [&](long k) {
                                for (long i = 0; i < k; ++i) {
                                  const access_flags to = mr.value().access() == acc ? acc2 : acc;
                                  auto r = mr.value().rereg(change_access(to),
                                                            rereg_policy::replacement_only);
                                  if (!r) {
                                    std::fprintf(stderr, "rereg: %s\n", r.error().message().c_str());
                                    return false;
                                  }
                                }
                                return true;
                              });
    ibv_dereg_mr(raw_mr);
    mr.value() = MemoryRegion{};
    ::munmap(buf, sz.bytes);
  }
  if (!ok) {
    std::fprintf(stderr, "bench_mr: a registration failed\n");
    return 1;
  }
  return 0;
}
