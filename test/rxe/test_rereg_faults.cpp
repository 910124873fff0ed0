// [rereg][fault-injection] The rows of the ibv_rereg_mr(3) return-code table that rxe cannot
// produce. FAULT INJECTION: fault_injection::set_rereg_mr substitutes the return value and errno
// of ibv_rereg_mr; everything else (the MR, its traffic, its deregistration) is real rxe.
// The real-device rows (-1 and -4/EOPNOTSUPP) are in test_rereg.cpp.
#include "fixture.hpp"

#include <cstring>
#include <vector>

using namespace rxe;

namespace {
int fake_rc = 0;
int fake_errno = 0;
int fake_rereg(ibv_mr *, int, ibv_pd *, void *, std::size_t, int) {
  errno = fake_errno;
  return fake_rc;
}
struct injected {
  explicit injected(int rc, int err) {
    fake_rc = rc;
    fake_errno = err;
    fault_injection::set_rereg_mr(&fake_rereg);
  }
  ~injected() { fault_injection::set_rereg_mr(nullptr); }
};
} // namespace

TEST_CASE("rereg fault injection: every failure code leaves the state the man page gives", "[rereg][fault-injection]") {
  loopback lb;
  std::vector<unsigned char> src(1024), dst(4096, 0x21);
  fill(src.data(), src.size(), 13);
  auto msrc = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");

  struct row { int rc; int err; rereg_state state; mr_state after; };
  const row rows[] = {
      {IBV_REREG_MR_ERR_DONT_FORK_NEW, ENOMEM, rereg_state::old_valid, mr_state::valid},
      {IBV_REREG_MR_ERR_DO_FORK_OLD, ENOMEM, rereg_state::new_valid, mr_state::valid},
      {IBV_REREG_MR_ERR_CMD, EIO, rereg_state::unusable, mr_state::unusable},
      {IBV_REREG_MR_ERR_CMD, EINVAL, rereg_state::unusable, mr_state::unusable},
      {IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW, ENOMEM, rereg_state::unusable, mr_state::unusable},
      {-9, EIO, rereg_state::unusable, mr_state::unusable}, // undocumented: assume the worst
  };
  for (const auto &r : rows) {
    INFO("ibv_rereg_mr -> " << r.rc << " errno " << r.err);
    auto mr = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
    {
      injected inj(r.rc, r.err);
      // Under the default policy too: only -4/EOPNOTSUPP may fall back to the replacement.
      auto res = mr.rereg(change_access(access::local_write | access::remote_read));
      REQUIRE_FALSE(res);
      CHECK(res.error().category() == rereg_category());
      CHECK(rereg_state_of(res.error()) == r.state);
      CHECK(res.error() == std::error_condition(r.err, std::generic_category()));
      CHECK(mr.state() == r.after);
    }
    if (r.after == mr_state::unusable) {
      // Only destruction is allowed.
      CHECK(mr.slice(0, 64).error() == errc::unusable);
      CHECK(mr.rereg(change_access(remote_rw)).error() == errc::unusable);
      CHECK(mr.rereg_native_unchecked(IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0).error() ==
            errc::unusable);
      CHECK(lb.pd.live_children() == 4);
      REQUIRE(mr.destroy().has_value()); // still deregistered
      CHECK(lb.pd.live_children() == 3);
    } else {
      // Valid: the real MR still carries traffic.
      REQUIRE(lb.write(msrc.sge(), {mr.iova(), mr.rkey()}) == IBV_WC_SUCCESS);
      CHECK(std::memcmp(dst.data(), src.data(), src.size()) == 0);
      std::fill(dst.begin(), dst.end(), 0x21);
      if (r.state == rereg_state::new_valid)
        CHECK(mr.access() == (access::local_write | access::remote_read)); // refreshed
      else
        CHECK(mr.access() == remote_rw);
    }
  }
  // The substitute is gone: the real verb answers again (rxe: unsupported).
  auto mr = need(MemoryRegion::reg(lb.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  CHECK(mr.rereg(change_access(access::local_write), rereg_policy::native_only).error() == errc::unsupported);
}
