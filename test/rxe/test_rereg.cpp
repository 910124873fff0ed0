// [rereg] MemoryRegion re-registration on rxe, with real traffic. rxe has no ibv_rereg_mr, so the
// default policy's replacement path carries every successful change here.
#include "fixture.hpp"

#include <sys/mman.h>

#include <cstring>
#include <vector>

using namespace rxe;

namespace {
constexpr access_flags local_only = access::local_write;

struct rereg_env : loopback {
  std::vector<unsigned char> src = std::vector<unsigned char>(4096);
  MemoryRegion msrc;
  rereg_env() {
    fill(src.data(), src.size(), 9);
    msrc = need(MemoryRegion::reg(pd, src.data(), src.size(), access::local_write), "reg src");
  }
};
} // namespace

TEST_CASE("rereg: granting and revoking remote write", "[rereg]") {
  rereg_env e;
  std::vector<unsigned char> dst(4096, 0x33);
  auto mr = need(MemoryRegion::reg(e.pd, dst.data(), dst.size(), local_only), "reg dst");
  const auto lkey0 = mr.lkey();

  auto grant = need(mr.rereg(change_access(remote_rw)), "rereg grant");
  CHECK(grant.path == rereg_path::replacement); // rxe: the fallback ran
  CHECK(grant.keys_changed);
  CHECK(mr.lkey() != lkey0);
  CHECK(mr.access() == remote_rw);
  CHECK(e.pd.live_children() == 4); // still one MR of ours (plus msrc and the two QPs)
  REQUIRE(e.write(e.msrc.sge(0, 1024), {mr.iova() + 512, mr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(dst.data() + 512, e.src.data(), 1024) == 0);
  CHECK(all_equal(dst.data(), 512, 0x33));

  const std::uint32_t granted_rkey = mr.rkey();
  std::fill(dst.begin(), dst.end(), 0x44);
  auto revoke = need(mr.rereg(change_access(local_only)), "rereg revoke");
  CHECK(revoke.path == rereg_path::replacement);
  CHECK(mr.access() == local_only);
  // The peer still holds the granted key: its write must fail and change nothing.
  CHECK(e.write(e.msrc.sge(0, 1024), {mr.iova() + 512, granted_rkey}) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(dst.data(), dst.size(), 0x44));
  e.recover();
  // And the key the MR has now does not allow remote writes either.
  CHECK(e.write(e.msrc.sge(0, 64), {mr.iova(), mr.rkey()}) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(dst.data(), dst.size(), 0x44));
}

TEST_CASE("rereg: a translation change moves writes to the new buffer", "[rereg]") {
  rereg_env e;
  std::vector<unsigned char> first(4096, 0x01), second(8192, 0x02);
  auto mr = need(MemoryRegion::reg(e.pd, first.data(), first.size(), remote_rw), "reg first");
  const auto old_rkey = mr.rkey();
  const auto old_iova = mr.iova();
  auto info = need(mr.rereg(change_translation(second.data(), second.size())), "rereg translation");
  CHECK(info.keys_changed);
  CHECK(mr.address() == second.data());
  CHECK(mr.length() == second.size());
  CHECK(mr.iova() == reinterpret_cast<std::uintptr_t>(second.data()));
  REQUIRE(e.write(e.msrc.sge(0, 4096), {mr.iova() + 4096, mr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(second.data() + 4096, e.src.data(), 4096) == 0);
  CHECK(all_equal(second.data(), 4096, 0x02));
  CHECK(all_equal(first.data(), first.size(), 0x01)); // the old buffer is untouched
  // The old key and address lead nowhere now.
  CHECK(e.write(e.msrc.sge(0, 64), {old_iova, old_rkey}) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(first.data(), first.size(), 0x01));
}

TEST_CASE("rereg: a PD change lets the new PD's QPs in and keeps the old PD's out", "[rereg]") {
  rereg_env e; // pd with pair a->b
  auto pd2 = need(ProtectionDomain::alloc(e.ctx), "pd2");
  qp_pair p2(e.ctx, pd2);
  std::vector<unsigned char> dst(4096, 0x55), src2(4096);
  fill(src2.data(), src2.size(), 11);
  auto msrc2 = need(MemoryRegion::reg(pd2, src2.data(), src2.size(), access::local_write), "reg src2");
  auto mr = need(MemoryRegion::reg(e.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  CHECK(e.pd.live_children() == 4); // msrc, mr, QPs a and b
  need(mr.rereg(change_pd(pd2)), "rereg pd");
  CHECK(mr.pd() == pd2.native_handle());
  CHECK(e.pd.live_children() == 3);
  CHECK(pd2.live_children() == 4); // msrc2, mr, two QPs
  // A QP of the new PD can write.
  REQUIRE(p2.write(msrc2.sge(0, 256), {mr.iova(), mr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(dst.data(), src2.data(), 256) == 0);
  // A QP of the old PD cannot.
  std::vector<unsigned char> before(dst);
  CHECK(e.write(e.msrc.sge(0, 256), {mr.iova() + 1024, mr.rkey()}) == IBV_WC_REM_ACCESS_ERR);
  CHECK(dst == before);
  // The old PD can now go away before the MR, the new one cannot.
  CHECK(pd2.destroy().error() == errc::busy);
}

TEST_CASE("rereg: translation, PD and access changed together", "[rereg]") {
  rereg_env e;
  auto pd2 = need(ProtectionDomain::alloc(e.ctx), "pd2");
  qp_pair p2(e.ctx, pd2);
  std::vector<unsigned char> a(4096, 0xA0), b(4096, 0xB0), src2(4096);
  fill(src2.data(), src2.size(), 12);
  auto msrc2 = need(MemoryRegion::reg(pd2, src2.data(), src2.size(), access::local_write), "reg src2");
  auto mr = need(MemoryRegion::reg(e.pd, a.data(), a.size(), local_only), "reg a");
  auto info = need(mr.rereg(change_translation(b.data(), b.size()) | change_pd(pd2) |
                           change_access(access::local_write | access::remote_read)),
                   "rereg all three");
  CHECK(info.keys_changed);
  CHECK(mr.access() == (access::local_write | access::remote_read));
  // Read allowed through the new PD, from the new buffer.
  std::vector<unsigned char> got(256, 0);
  auto mgot = need(MemoryRegion::reg(pd2, got.data(), got.size(), access::local_write), "reg got");
  REQUIRE(read_one(p2.a, p2.cq_a, mgot.sge(), {mr.iova() + 100, mr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(got.data(), b.data() + 100, 256) == 0);
  // Write not allowed (no remote write): fails, memory unchanged.
  CHECK(p2.write(msrc2.sge(0, 64), {mr.iova(), mr.rkey()}) == IBV_WC_REM_ACCESS_ERR);
  CHECK(all_equal(b.data(), b.size(), 0xB0));
  CHECK(all_equal(a.data(), a.size(), 0xA0));
}

TEST_CASE("rereg: the native path on rxe", "[rereg]") {
  rereg_env e;
  std::vector<unsigned char> dst(4096, 0x66);
  auto mr = need(MemoryRegion::reg(e.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const auto lkey = mr.lkey(), rkey = mr.rkey();

  SECTION("bad input answered by the verb itself (-1) leaves the old MR valid") {
    struct row { int flags; void *addr; std::size_t len; int access; };
    const row rows[] = {
        {IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, 4096, 0}, // translation without an address
        {IBV_REREG_MR_CHANGE_PD, nullptr, 0, IBV_ACCESS_LOCAL_WRITE}, // access without CHANGE_ACCESS
        {1 << 5, nullptr, 0, 0},                                    // unknown flag bit
    };
    for (const auto &r : rows) {
      auto res = mr.rereg_native_unchecked(r.flags, &e.pd, r.addr, r.len, r.access);
      REQUIRE_FALSE(res);
      INFO("flags " << r.flags << " access " << r.access << ": " << res.error().message());
      CHECK(res.error().category() == rereg_category());
      CHECK(rereg_state_of(res.error()) == rereg_state::old_valid);
      CHECK(res.error() == std::errc::invalid_argument);
      CHECK(res.error().message().find("IBV_REREG_MR_ERR_INPUT") != std::string::npos);
      CHECK(mr.state() == mr_state::valid);
      CHECK(mr.lkey() == lkey);
      CHECK(mr.rkey() == rkey);
    }
    REQUIRE(e.write(e.msrc.sge(0, 128), {mr.iova(), mr.rkey()}) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.data(), e.src.data(), 128) == 0);
  }

  SECTION("native only: unsupported, and the MR is unchanged and still carries traffic") {
    auto r = mr.rereg(change_access(local_only), rereg_policy::native_only);
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::unsupported);
    CHECK(is_unsupported(r.error()));
    CHECK(mr.state() == mr_state::valid);
    CHECK(mr.access() == remote_rw);
    CHECK(mr.lkey() == lkey);
    CHECK(mr.rkey() == rkey);
    REQUIRE(e.write(e.msrc.sge(0, 128), {mr.iova(), rkey}) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(dst.data(), e.src.data(), 128) == 0);
    // Asking again gives the same answer.
    CHECK(mr.rereg(change_access(local_only), rereg_policy::native_only).error() == errc::unsupported);
  }

  SECTION("the EOPNOTSUPP answer itself: -4 mapped to unsupported-unchanged, not unusable") {
    auto r = mr.rereg_native_unchecked(IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                                       IBV_ACCESS_LOCAL_WRITE);
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::unsupported);
    CHECK(mr.state() == mr_state::valid);
    REQUIRE(e.write(e.msrc.sge(0, 64), {mr.iova(), rkey}) == IBV_WC_SUCCESS);
  }

  SECTION("default policy: the replacement runs") {
    auto r = need(mr.rereg(change_access(local_only)), "rereg default");
    CHECK(r.path == rereg_path::replacement);
    CHECK(mr.access() == local_only);
    CHECK(e.write(e.msrc.sge(0, 64), {mr.iova(), rkey}) == IBV_WC_REM_ACCESS_ERR);
    CHECK(all_equal(dst.data(), dst.size(), 0x66));
  }
}

TEST_CASE("rereg: a failing replacement leaves the old MR working", "[rereg]") {
  rereg_env e;
  std::vector<unsigned char> dst(4096, 0x77);
  auto mr = need(MemoryRegion::reg(e.pd, dst.data(), dst.size(), remote_rw), "reg dst");
  const auto lkey = mr.lkey(), rkey = mr.rkey();
  // New memory the kernel cannot pin: registration of it fails (EFAULT).
  void *none = ::mmap(nullptr, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(none != MAP_FAILED);
  auto r = mr.rereg(change_translation(none, 8192), rereg_policy::replacement_only);
  ::munmap(none, 8192);
  REQUIRE_FALSE(r);
  INFO(r.error().message());
  CHECK(rereg_state_of(r.error()) == rereg_state::old_valid);
  CHECK(mr.state() == mr_state::valid);
  CHECK(mr.address() == dst.data());
  CHECK(mr.lkey() == lkey);
  CHECK(mr.rkey() == rkey);
  CHECK(e.pd.live_children() == 4);
  REQUIRE(e.write(e.msrc.sge(0, 2048), {mr.iova() + 1000, rkey}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(dst.data() + 1000, e.src.data(), 2048) == 0);
  CHECK(all_equal(dst.data(), 1000, 0x77));
}

TEST_CASE("rereg: requests refused before verbs", "[rereg]") {
  rereg_env e;
  std::vector<unsigned char> dst(4096);
  auto mr = need(MemoryRegion::reg(e.pd, dst.data(), dst.size(), remote_rw), "reg");
  const auto lkey = mr.lkey();
  auto other = open_device(); // a second context: its PD belongs to "another device"
  auto other_pd = need(ProtectionDomain::alloc(other), "other pd");
  ProtectionDomain empty;
  struct row { rereg_changes c; std::error_code expect; };
  const row rows[] = {
      {rereg_changes{}, errc::nothing_to_change},
      {change_access(remote_rw), errc::nothing_to_change},                 // same access
      {change_pd(e.pd), errc::nothing_to_change},                       // same PD
      {change_translation(dst.data(), dst.size()), errc::nothing_to_change}, // same range
      {change_translation(nullptr, 4096), errc::null_address},
      {change_translation(dst.data() + 1, 0), errc::zero_length},
      {change_access(access::remote_write), errc::remote_write_needs_local_write},
      {change_access(access::remote_atomic), errc::remote_atomic_needs_local_write},
      {change_pd(empty), errc::null_handle},
      {change_pd(other_pd), errc::pd_mismatch},
  };
  for (const auto &r : rows) {
    auto res = mr.rereg(r.c);
    REQUIRE_FALSE(res);
    INFO(res.error().message());
    CHECK(res.error() == r.expect);
    CHECK(mr.lkey() == lkey);
  }
  // An allocate()d MR owns its memory: no translation change, but access and PD may change.
  auto owned = need(MemoryRegion::allocate(e.pd, 8192, local_only), "allocate");
  CHECK(owned.rereg(change_translation(dst.data(), dst.size())).error() == errc::wrong_type);
  auto info = need(owned.rereg(change_access(remote_rw)), "rereg owned access");
  CHECK(owned.kind() == mr_kind::allocated);
  REQUIRE(e.write(e.msrc.sge(0, 4096), {owned.iova() + 4096, owned.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(owned.data() + 4096, e.src.data(), 4096) == 0);
  CHECK(info.path == rereg_path::replacement);
  MemoryRegion moved_from = std::move(owned);
  CHECK(owned.rereg(change_access(local_only)).error() == errc::null_handle);
}
