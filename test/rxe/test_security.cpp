// [security] memory windows on a real rxe device: revocation matrix (every way of revoking, old
// key must fail for reads and writes, memory byte-for-byte unchanged), window bounds (the probe,
// strict grants), the sequences that panic rxe (refused by the library), pre-post checks on every
// bind path.
#include "fixture.hpp"

#include <rdmaxx/memory_window.hpp>
#include <rdmaxx/probe.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace rxe;

namespace {

constexpr access_flags owner_access = access::local_write | access::mw_bind;
constexpr access_flags rw_rights = access::remote_read | access::remote_write;

struct tally {
  int attempts = 0;
  int breaches = 0;
};
tally &totals() {
  static tally t;
  return t;
}

remote_descriptor bind_wait(MemoryWindow &mw, QueuePair &qp, CompletionQueue &cq, const MemoryRegion &mr,
                            window_range r, access_flags rights, std::uint64_t id = 100) {
  auto d = need(mw.bind(qp, mr, r, rights, {id, send_flag::signaled}), "bind");
  CHECK(mw.complete(wait_one(cq)));
  return d;
}

enum class revocation { local_invalidate, remote_invalidate, type1_unbind, type1_rebind, type2_rebind,
                    type1_dealloc, type2_dealloc };

const char *name(revocation r) {
  switch (r) {
  case revocation::local_invalidate: return "type 2, local invalidate";
  case revocation::remote_invalidate: return "type 2, remote invalidate (send with invalidate)";
  case revocation::type1_unbind: return "type 1, unbind";
  case revocation::type1_rebind: return "type 1, rebind to another range";
  case revocation::type2_rebind: return "type 2, invalidate + rebind to another range";
  case revocation::type1_dealloc: return "type 1, dealloc";
  case revocation::type2_dealloc: return "type 2, dealloc";
  }
  return "?";
}

} // namespace

TEST_CASE("revocation matrix: the old key fails for reads and writes, memory unchanged", "[security][mw]") {
  const revocation how = GENERATE(revocation::local_invalidate, revocation::remote_invalidate, revocation::type1_unbind,
                              revocation::type1_rebind, revocation::type2_rebind, revocation::type1_dealloc,
                              revocation::type2_dealloc);
  INFO(name(how));
  const bool t1 = how == revocation::type1_unbind || how == revocation::type1_rebind || how == revocation::type1_dealloc;
  loopback lb;
  std::vector<unsigned char> mem(8192), src(512, 0xF0), back(512, 0), msg(8, 0), rbuf(8, 0);
  fill(mem.data(), mem.size(), 21);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");
  auto mm = need(MemoryRegion::reg(lb.pd, msg.data(), msg.size(), access::local_write), "reg msg");
  auto mrb = need(MemoryRegion::reg(lb.pd, rbuf.data(), rbuf.size(), access::local_write), "reg rbuf");
  auto mw = need(MemoryWindow::alloc(lb.pd, t1 ? mw_type::type1 : mw_type::type2, accept_risk), "alloc_mw");
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {1024, 512}, rw_rights);
  // The grant works before it is revoked.
  REQUIRE(lb.read(mb.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), mem.data() + 1024, 512) == 0);

  switch (how) {
  case revocation::local_invalidate:
    need(mw.invalidate(lb.b, {2, send_flag::signaled}), "invalidate");
    CHECK(mw.complete(wait_one(lb.cq_b)));
    break;
  case revocation::remote_invalidate: {
    need(lb.b.post_recv(3, mrb.sge()), "post_recv");
    auto batch = lb.a.start_send();
    const ibv_sge s = mm.sge();
    batch.send_inv({4, send_flag::signaled}, d.rkey, std::span<const ibv_sge>(&s, 1));
    need(batch.submit(), "send_inv");
    wait_one(lb.cq_a);
    CHECK(mw.complete(wait_one(lb.cq_b)));
    CHECK(mw.state() == mw_state::invalidated);
    break;
  }
  case revocation::type1_unbind:
    need(mw.unbind(lb.b, {5, send_flag::signaled}), "unbind");
    CHECK(mw.complete(wait_one(lb.cq_b)));
    break;
  case revocation::type1_rebind:
    bind_wait(mw, lb.b, lb.cq_b, mr, {4096, 512}, rw_rights, 6);
    CHECK(mr.bound_windows() == 1);
    break;
  case revocation::type2_rebind:
    need(mw.invalidate(lb.b, {7, send_flag::signaled}), "invalidate");
    CHECK(mw.complete(wait_one(lb.cq_b)));
    bind_wait(mw, lb.b, lb.cq_b, mr, {4096, 512}, rw_rights, 8);
    break;
  case revocation::type1_dealloc:
  case revocation::type2_dealloc:
    need(mw.destroy(), "dealloc");
    break;
  }
  // Invalidated windows keep their key (dead until the next bind); every other way changes it.
  CHECK((mw.state() != mw_state::bound || mw.rkey() != d.rkey));

  const std::vector<unsigned char> before = mem;
  auto &t = totals();
  // Write with the old key.
  ++t.attempts;
  const auto ws = lb.write(ms.sge(), d.at(0));
  CHECK(ws == IBV_WC_REM_ACCESS_ERR);
  const bool write_breach = ws == IBV_WC_SUCCESS || mem != before;
  t.breaches += write_breach;
  CHECK(mem == before);
  lb.recover();
  // Read with the old key.
  ++t.attempts;
  std::memset(back.data(), 0, back.size());
  const auto rs = lb.read(mb.sge(), d.at(0));
  CHECK(rs == IBV_WC_REM_ACCESS_ERR);
  const bool read_breach = rs == IBV_WC_SUCCESS || !all_equal(back.data(), back.size(), 0);
  t.breaches += read_breach;
  CHECK(all_equal(back.data(), back.size(), 0));
  CHECK(mem == before);
  std::printf("revocation matrix: %-50s write %-22s read %-22s\n", name(how), ibv_wc_status_str(ws),
              ibv_wc_status_str(rs));
  std::printf("revocation matrix: %d attempts with revoked keys so far, %d breaches\n", t.attempts,
              t.breaches);
  lb.recover();
  if (how == revocation::type2_rebind) {
    need(mw.invalidate(lb.b, {9, send_flag::signaled}), "final invalidate");
    CHECK(mw.complete(wait_one(lb.cq_b)));
  }
}

TEST_CASE("bounds: the probe tells the truth about the device, strict grants hold on rxe", "[security][mw]") {
  loopback lb;
  auto caps = need(lb.ctx.query_capabilities(), "query_capabilities");
  const auto probed = need(probe_window_bounds(lb.ctx, caps), "probe_window_bounds");
  CHECK(probed == caps.mw_bounds_enforced);
  const bool is_rxe = std::string(caps.name).rfind("rxe", 0) == 0;
  std::printf("window bounds enforced on %s: %s\n", caps.name,
              probed == tristate::yes ? "yes" : probed == tristate::no ? "no" : "unknown");

  std::vector<unsigned char> mem(8192), src(64, 0xBD), back(64, 0);
  fill(mem.data(), mem.size(), 33);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto ms = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "reg src");
  auto mb = need(MemoryRegion::reg(lb.pd, back.data(), back.size(), access::local_write), "reg back");

  // A plain window over part of the region: check what the device does just past its end, and
  // that the probe said the same.
  {
    auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");
    const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {4096, 256}, access::remote_read);
    const auto st = lb.read(mb.sge(), d.at(256)); // just outside, inside the region
    const tristate seen = st == IBV_WC_SUCCESS ? tristate::no
                          : st == IBV_WC_REM_ACCESS_ERR ? tristate::yes : tristate::unknown;
    CHECK(seen == probed);
    if (is_rxe) CHECK(probed == tristate::no); // measured rxe defect (REFERENCE section 2)
    if (st != IBV_WC_SUCCESS) lb.recover();
    need(mw.destroy(), "dealloc");
  }

  // Strict grant: the window sits on a region of exactly the granted bytes.
  const mw_type t = GENERATE(mw_type::type1, mw_type::type2);
  INFO((t == mw_type::type1 ? "type 1" : "type 2B"));
  auto g = need(StrictGrant::create(lb.pd, mr, {4096, 256}, t, accept_risk), "strict grant");
  CHECK(g.region().length() == 256);
  auto d = need(g.grant(lb.b, rw_rights, {1, send_flag::signaled}), "strict bind");
  CHECK(g.window().complete(wait_one(lb.cq_b)));
  CHECK(d.length == 256);
  REQUIRE(lb.read(mb.sge(), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(back.data(), mem.data() + 4096, 64) == 0);
  REQUIRE(lb.read(mb.sge(0, 64), d.at(256 - 64)) == IBV_WC_SUCCESS); // last bytes inside
  const std::vector<unsigned char> before = mem;
  // Just past the end: refused, on rxe too.
  CHECK(lb.write(ms.sge(), d.at(256)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(mem == before);
  lb.recover();
  CHECK(lb.write(ms.sge(0, 8), {d.addr - 8, d.rkey}) == IBV_WC_REM_ACCESS_ERR); // just before
  CHECK(mem == before);
  lb.recover();
  // Straddling the end.
  CHECK(lb.write(ms.sge(), d.at(256 - 32)) == IBV_WC_REM_ACCESS_ERR);
  CHECK(mem == before);
  lb.recover();
  need(g.destroy(), "revoke strict grant");
  CHECK(mr.bound_windows() == 0);
}

TEST_CASE("sequences that panic rxe are refused with clear errors, and the run goes on", "[security][mw]") {
  loopback lb;
  std::vector<unsigned char> mem(4096, 0), msg(8, 0), rbuf(8, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg owner");
  auto mm = need(MemoryRegion::reg(lb.pd, msg.data(), msg.size(), access::local_write), "reg msg");
  auto mrb = need(MemoryRegion::reg(lb.pd, rbuf.data(), rbuf.size(), access::local_write), "reg rbuf");
  auto mw = need(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk), "alloc_mw");

  // 1. Invalidate a never-bound window.
  auto r1 = mw.invalidate(lb.b);
  REQUIRE_FALSE(r1);
  CHECK(r1.error() == errc::not_bound);
  INFO(r1.error().message());
  {
    auto batch = lb.b.start_send();
    CHECK(mw.invalidate(batch, lb.b).error() == errc::not_bound);
  }
  expect_no_completion(lb.cq_b, 100ms); // nothing was posted

  // 2. Invalidate twice.
  bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights);
  need(mw.invalidate(lb.b, {2, send_flag::signaled}), "invalidate");
  CHECK(mw.complete(wait_one(lb.cq_b)));
  CHECK(mw.invalidate(lb.b).error() == errc::not_bound);
  // Also within one batch, before anything completed.
  bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights, 3);
  {
    auto batch = lb.b.start_send();
    REQUIRE(mw.invalidate(batch, lb.b, {4, send_flag::signaled}).has_value());
    CHECK(mw.invalidate(batch, lb.b, {5}).error() == errc::not_bound);
    need(batch.submit(), "submit");
  }
  CHECK(mw.complete(wait_one(lb.cq_b)));
  CHECK(mw.state() == mw_state::invalidated);
  expect_no_completion(lb.cq_b, 100ms); // only one invalidate reached the device

  // 3. Remote invalidate, then local invalidate.
  const auto d = bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights, 6);
  need(lb.b.post_recv(7, mrb.sge()), "post_recv");
  {
    auto batch = lb.a.start_send();
    const ibv_sge s = mm.sge();
    batch.send_inv({8, send_flag::signaled}, d.rkey, std::span<const ibv_sge>(&s, 1));
    need(batch.submit(), "send_inv");
  }
  wait_one(lb.cq_a);
  CHECK(mw.complete(wait_one(lb.cq_b)));
  auto r3 = mw.invalidate(lb.b);
  REQUIRE_FALSE(r3);
  CHECK(r3.error() == errc::not_bound);

  // 4. Other refusals: wrong type, rebinding a bound type-2 window, another QP.
  auto w1 = need(MemoryWindow::alloc(lb.pd, mw_type::type1), "alloc type 1");
  CHECK(w1.invalidate(lb.b).error() == errc::wrong_type);
  CHECK(mw.unbind(lb.b).error() == errc::wrong_type);
  CHECK(w1.unbind(lb.b).error() == errc::not_bound);
  bind_wait(mw, lb.b, lb.cq_b, mr, {0, 64}, rw_rights, 9);
  CHECK(mw.bind(lb.b, mr, {0, 64}, rw_rights).error() == errc::already_bound);
  CHECK(mw.invalidate(lb.a).error() == errc::qp_mismatch); // not the QP it was bound through
  {
    auto batch = lb.a.start_send();
    CHECK(mw.invalidate(batch, lb.b).error() == errc::qp_mismatch); // batch of another QP
  }
  expect_no_completion(lb.cq_a, 100ms);
  expect_no_completion(lb.cq_b, 100ms);
  // Unconfirmed operations of one window stay on one QP (two QPs could reorder them).
  need(w1.bind(lb.b, mr, {0, 64}, access::remote_read, {10, send_flag::signaled}), "bind w1");
  CHECK(w1.pending() == 1);
  CHECK(w1.unbind(lb.a).error() == errc::wrong_state);
  CHECK(w1.complete(wait_one(lb.cq_b)));
  need(w1.unbind(lb.a, {11, send_flag::signaled}), "unbind w1 through another QP once confirmed");
  CHECK(w1.complete(wait_one(lb.cq_a)));
  CHECK(w1.state() == mw_state::unbound);
  // Revoked for good: deallocated, not left allocated and unbound.
  need(mw.destroy(), "dealloc");
  CHECK(mr.bound_windows() == 0);
  CHECK(lb.b.live_children() == 0);
  // The device still works: the run went on.
  CHECK(need(lb.b.state(), "state b") == IBV_QPS_RTS);
}

TEST_CASE("pre-post checks on every bind path: MW_BIND, range, rights, one PD", "[security][mw]") {
  loopback lb;
  auto pd2 = need(ProtectionDomain::alloc(lb.ctx), "pd2");
  qp_pair p2(lb.ctx, pd2);
  std::vector<unsigned char> mem(4096, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), owner_access), "reg");
  auto no_bind = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), access::local_write), "reg no bind");
  auto ro_mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), access_flags(access::mw_bind)), "reg ro");
  auto mr2 = need(MemoryRegion::reg(pd2, mem.data(), mem.size(), owner_access), "reg pd2");

  enum class path { ibv_bind_mw, batch };
  for (auto t : {mw_type::type1, mw_type::type2})
    for (auto p : {path::ibv_bind_mw, path::batch}) {
      INFO((t == mw_type::type1 ? "type 1" : "type 2B") << (p == path::batch ? ", batch" : ", direct"));
      auto mw = need(MemoryWindow::alloc(lb.pd, t, accept_risk), "alloc");
      auto mw2 = need(MemoryWindow::alloc(pd2, t, accept_risk), "alloc pd2");
      auto try_bind = [&](MemoryWindow &w, QueuePair &qp, const MemoryRegion &m, window_range r,
                          access_flags rights) -> std::error_code {
        if (p == path::batch) {
          auto batch = qp.start_send();
          auto res = w.bind(batch, qp, m, r, rights);
          return res ? std::error_code{} : res.error();
        }
        auto res = w.bind(qp, m, r, rights);
        return res ? std::error_code{} : res.error();
      };
      CHECK(try_bind(mw, lb.b, no_bind, {0, 64}, access::remote_read) == errc::missing_access);
      CHECK(try_bind(mw, lb.b, ro_mr, {0, 64}, access::remote_write) == errc::missing_access);
      CHECK(try_bind(mw, lb.b, ro_mr, {0, 64}, access::remote_atomic) == errc::missing_access);
      CHECK(try_bind(mw, lb.b, mr, {4000, 97}, access::remote_read) == errc::out_of_range);
      CHECK(try_bind(mw, lb.b, mr, {0, 0}, access::remote_read) == errc::zero_length);
      // rxe binds a type-2 window of pd2 to an MR of pd1 through a pd2 QP: refused here.
      CHECK(try_bind(mw2, p2.b, mr, {0, 64}, access::remote_read) == errc::pd_mismatch);
      CHECK(try_bind(mw, p2.b, mr, {0, 64}, access::remote_read) == errc::pd_mismatch);
      CHECK(try_bind(mw, lb.b, mr2, {0, 64}, access::remote_read) == errc::pd_mismatch);
      CHECK(mw.state() == mw_state::unbound);
      CHECK(mw.pending() == 0);
      CHECK(mr.bound_windows() == 0);
      CHECK(mr2.bound_windows() == 0);
    }
  expect_no_completion(lb.cq_b, 100ms);
  expect_no_completion(p2.cq_b, 100ms);
}
