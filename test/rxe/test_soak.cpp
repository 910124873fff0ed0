// [soak] Bounded soak on rxe (about a minute in all): thousands of grant/revoke cycles through
// windows, re-registration replacement cycles and indirect-key configure/invalidate cycles, with
// traffic checked along the way; kernel resource counts (`rdma resource show`) must be identical
// before and after. (The rxe suite script also fails the run on any kernel warning in dmesg.)
#include "fixture.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using namespace rxe;

namespace {
using clock_type = std::chrono::steady_clock;
bool in_budget(clock_type::time_point start, std::chrono::seconds budget) {
  return clock_type::now() - start < budget;
}
} // namespace

TEST_CASE("soak: grant/revoke, rereg and indirect-key cycles leave no kernel resource behind", "[soak]") {
  const std::string before = kernel_resources();
  INFO("before:\n" << before);
  REQUIRE(before.find("rxe0") != std::string::npos);
  long window_cycles = 0, rereg_cycles = 0, ikey_cycles = 0, writes_checked = 0;
  {
    loopback lb;
    std::vector<unsigned char> target(1 << 16, 0), src(4096);
    fill(src.data(), src.size(), 21);
    const access_flags acc = remote_rw | access::mw_bind;
    auto mt = need(MemoryRegion::reg(lb.pd, target.data(), target.size(), acc), "reg target");
    auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
    auto w = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc mw");
    ibv_wc wc{};

    // Windows: bind on b (the owner), the peer a writes through it every 64th cycle, invalidate.
    auto start = clock_type::now();
    for (long i = 0; i < 3000 && in_budget(start, std::chrono::seconds(25)); ++i) {
      const window_range r{std::uint64_t(i % 15) * 4096, 4096};
      {
        auto batch = lb.b.start_send();
        auto d = w.bind(batch, lb.b, mt, r, access::remote_write, {1, send_flag::signaled});
        REQUIRE(d.has_value());
        need(batch.submit(), "submit bind");
        wc = wait_one(lb.cq_b);
        w.complete(wc);
        if (i % 64 == 0) {
          REQUIRE(lb.write(ms.sge(0, 128), {d.value().addr, d.value().rkey}) == IBV_WC_SUCCESS);
          REQUIRE(std::memcmp(target.data() + r.offset, src.data(), 128) == 0);
          ++writes_checked;
        }
      }
      need(w.invalidate(lb.b, {2, send_flag::signaled}), "invalidate");
      wc = wait_one(lb.cq_b);
      w.complete(wc);
      ++window_cycles;
    }
    need(w.destroy(), "dealloc mw");

    // Rereg by replacement, flipping remote write on and off.
    std::vector<unsigned char> rr(1 << 20, 0);
    auto mr = need(MemoryRegion::reg(lb.pd, rr.data(), rr.size(), access::local_write), "reg rr");
    start = clock_type::now();
    for (long i = 0; i < 600 && in_budget(start, std::chrono::seconds(15)); ++i) {
      need(mr.rereg(change_access(i % 2 ? access_flags(access::local_write) : remote_rw)), "rereg");
      ++rereg_cycles;
    }

    // Indirect keys: configure over three pieces, write through it, invalidate.
    auto key = need(IndirectKey::create(lb.pd, 4), "create key");
    const layout l = layout::list({{mt, 100, 300}, {mt, 9000, 200}, {mt, 30000, 500}});
    start = clock_type::now();
    for (long i = 0; i < 400 && in_budget(start, std::chrono::seconds(15)); ++i) {
      {
        auto batch = lb.b.start_send();
        need(key.configure(batch, lb.b, l, access::local_write | access::remote_write,
                           {3, send_flag::signaled}),
             "configure");
        need(batch.submit(), "submit configure");
      }
      REQUIRE(key.complete(wait_one(lb.cq_b)));
      if (i % 32 == 0) {
        auto d = need(key.descriptor(), "descriptor");
        auto batch = lb.a.start_send();
        REQUIRE(need(write_indirect(batch, {4, send_flag::signaled}, d, 0, ms.sge(0, 1000)),
                     "write_indirect") == 3);
        need(batch.submit(), "submit write");
        wait_one(lb.cq_a);
        REQUIRE(std::memcmp(target.data() + 100, src.data(), 300) == 0);
        REQUIRE(std::memcmp(target.data() + 9000, src.data() + 300, 200) == 0);
        REQUIRE(std::memcmp(target.data() + 30000, src.data() + 500, 500) == 0);
        ++writes_checked;
      }
      need(key.revoke(), "invalidate key");
      ++ikey_cycles;
    }
  }
  std::printf("soak: %ld window grant/revoke cycles, %ld rereg replacements, %ld indirect-key "
              "configure/invalidate cycles, %ld writes verified\n",
              window_cycles, rereg_cycles, ikey_cycles, writes_checked);
  CHECK(window_cycles >= 500);
  CHECK(rereg_cycles >= 100);
  CHECK(ikey_cycles >= 50);
  const std::string after = kernel_resources();
  INFO("after:\n" << after);
  CHECK(after == before);
}
