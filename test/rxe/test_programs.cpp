// [program] The grant promise in the program around the objects, as a user writes it: several
// grant forms sharing one QP, one CQ and one region, each posting with the library's default
// work request ids, and a completion loop that hands every completion to every object (or, worse,
// to the wrong object only). The peer is plain libibverbs (peer_post). What is checked:
//   - an object reads as granted or revoked only once its own completion was handed to it,
//     whatever other object's completion it is handed, in every order;
//   - every revoked key is refused afterwards and the owner's memory is untouched;
//   - CompletionDispatcher routes the same completions itself: settle() returns once the
//     object's own operation is confirmed, the program's completions wait for its poll();
//   - a grant holds the memory it reaches: a rereg that would move it answers
//     errc::region_granted and changes nothing (the peer's write lands only where the live grant
//     allows).
#include "fixture.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

using namespace rxe;

namespace {

constexpr access_flags rights = access::remote_write;
constexpr std::size_t span_len = 4096;

// One device, one owner QP (b), one CQ for it, one region every object grants from.
struct world {
  loopback lb;
  MemoryRegion mr = need(MemoryRegion::allocate(lb.pd, 16 * span_len, access::local_write | access::mw_bind), "owner");
  std::vector<unsigned char> src = std::vector<unsigned char>(64, 0x5A);
  MemoryRegion src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  // Where the owner's own writes go (the program's "other work" on the same QP).
  std::vector<unsigned char> sink = std::vector<unsigned char>(64, 0);
  MemoryRegion sink_mr = need(MemoryRegion::reg(lb.pd, sink.data(), sink.size(),
                                                access::local_write | access::remote_write), "sink");
  [[nodiscard]] unsigned char *data() const { return static_cast<unsigned char *>(mr.address()); }
  [[nodiscard]] bool untouched() const { return all_equal(data(), mr.length(), 0); }
  // The peer writes 64 bytes: true when refused with no byte of the region changed.
  bool refused(const remote_descriptor &d) {
    const bool denied = is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), d.addr, d.rkey));
    const bool clean = untouched();
    lb.recover();
    return denied && clean;
  }
  // The peer writes 64 bytes at the start of `d`: lands exactly at `at`, then cleared.
  bool lands(const remote_descriptor &d, std::size_t at) {
    if (peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), d.addr, d.rkey) != IBV_WC_SUCCESS) {
      lb.recover();
      return false;
    }
    const bool ok = all_equal(data() + at, 64, 0x5A);
    std::memset(data() + at, 0, 64);
    return ok && untouched();
  }
  // The program's own work on the owner's QP: a signaled RDMA write of its own id.
  void post_own_write(std::uint64_t id) {
    auto b = lb.b.start_send();
    b.write({id, send_flag::signaled}, {std::uint64_t(std::uintptr_t(sink.data())), sink_mr.rkey()}, src_mr.sge(0, 16));
    need(b.submit(), "submit own write");
  }
};

// --- the forms, each over its own 4 KiB of the shared region, with the library's default ids ---

struct strict_form {
  static constexpr const char *name = "StrictGrant";
  static constexpr bool grant_signaled = true, revoke_posted = true;
  world &w;
  std::size_t at;
  StrictGrant g;
  strict_form(world &wo, std::size_t i)
      : w(wo), at((2 + 2 * i) * span_len), g(need(StrictGrant::create(wo.lb.pd, wo.mr, {at, span_len}), "StrictGrant")) {}
  remote_descriptor post_grant() { return need(g.grant(w.lb.b, rights), "grant"); }
  void post_revoke() { need(g.revoke(w.lb.b), "revoke"); }
  void complete(const ibv_wc &wc) { (void)g.window().complete(wc); }
  [[nodiscard]] bool granted() const { return g.window().state() == mw_state::bound && g.window().pending() == 0; }
  [[nodiscard]] bool revoked() const { return g.window().state() != mw_state::bound && g.window().pending() == 0; }
  StrictGrant &target() { return g; }
};

// A GrantPool of one slot over the form's bytes: its bind is unsignaled (granted at once), its
// revoke signaled.
struct lease_form {
  static constexpr const char *name = "GrantPool lease";
  static constexpr bool grant_signaled = false, revoke_posted = true;
  world &w;
  std::size_t at;
  MemoryRegion slot;
  GrantPool pool;
  GrantLease l;
  lease_form(world &wo, std::size_t i)
      : w(wo), at((2 + 2 * i) * span_len),
        slot(need(MemoryRegion::reg(wo.lb.pd, wo.data() + at, span_len, access::local_write), "slot")),
        pool(need(GrantPool::create(wo.lb.pd, slot, {.slot_size = span_len, .slots = 1}), "pool")),
        l(need(pool.acquire(), "acquire")) {}
  remote_descriptor post_grant() {
    auto b = w.lb.b.start_send();
    const remote_descriptor d = need(pool.grant(b, w.lb.b, l, rights), "grant");
    need(b.submit(), "submit grant");
    return d;
  }
  void post_revoke() { need(pool.revoke(w.lb.b, l), "revoke"); }
  void complete(const ibv_wc &wc) {
    ibv_wc copy = wc;
    (void)pool.complete(std::span<ibv_wc>(&copy, 1));
  }
  [[nodiscard]] bool granted() const { return l.state() == lease_state::granted; }
  [[nodiscard]] bool revoked() const { return l.state() == lease_state::ready; }
  GrantPool &target() { return pool; }
};

// A software IndirectKey of one segment: its configure is a signaled bind; its invalidate
// deallocates the window (no work request).
struct ikey_form {
  static constexpr const char *name = "software IndirectKey";
  static constexpr bool grant_signaled = true, revoke_posted = false;
  world &w;
  std::size_t at;
  IndirectKey k;
  ikey_form(world &wo, std::size_t i)
      : w(wo), at((2 + 2 * i) * span_len),
        k(need(IndirectKey::create(wo.lb.pd, 4, {.backend = umr_backend::software}), "IndirectKey")) {}
  remote_descriptor post_grant() {
    need(k.configure(w.lb.b, layout::list({{w.mr, at, span_len}}), access::local_write | rights), "configure");
    const key_segment &s = k.segments()[0];
    return {s.addr, s.length, s.rkey, rights, false};
  }
  void post_revoke() { need(k.revoke(), "invalidate"); }
  void complete(const ibv_wc &wc) { (void)k.complete(wc); }
  [[nodiscard]] bool granted() const { return k.configured() && k.descriptor().has_value(); }
  [[nodiscard]] bool revoked() const { return !k.configured(); }
  IndirectKey &target() { return k; }
};

// A plain type-1 window over the form's bytes of the shared region.
struct window_form {
  static constexpr const char *name = "MemoryWindow (type 1)";
  static constexpr bool grant_signaled = true, revoke_posted = true;
  world &w;
  std::size_t at;
  MemoryWindow mw;
  window_form(world &wo, std::size_t i)
      : w(wo), at((2 + 2 * i) * span_len), mw(need(MemoryWindow::alloc(wo.lb.pd, mw_type::type1), "window")) {}
  remote_descriptor post_grant() { return need(mw.bind(w.lb.b, w.mr, {at, span_len}, rights), "bind"); }
  void post_revoke() { need(mw.unbind(w.lb.b), "unbind"); }
  void complete(const ibv_wc &wc) { (void)mw.complete(wc); }
  [[nodiscard]] bool granted() const { return mw.state() == mw_state::bound && mw.pending() == 0; }
  [[nodiscard]] bool revoked() const { return mw.state() != mw_state::bound && mw.pending() == 0; }
  MemoryWindow &target() { return mw; }
};

// Completions of one phase, each with its owner: 0 = x, 1 = y, 2 = the program's own.
struct owned_wc {
  ibv_wc wc;
  int owner;
};

// Hand `wcs` in the order `perm`, each to every object (x then y, or y then x), checking after
// each that an object reads `done` only once its own completion was handed.
template <class X, class Y, class Done>
void hand_in_order(X &x, Y &y, const std::vector<owned_wc> &wcs, const std::vector<std::size_t> &perm,
                   bool y_first, Done done) {
  bool handed[2] = {false, false};
  bool expect_x = done(x, -1), expect_y = done(y, -1); // nothing to wait for: already done
  for (std::size_t p : perm) {
    const owned_wc &o = wcs[p];
    if (y_first) {
      y.complete(o.wc);
      x.complete(o.wc);
    } else {
      x.complete(o.wc);
      y.complete(o.wc);
    }
    if (o.owner < 2) handed[o.owner] = true;
    INFO("completion #" << p << " of owner " << o.owner << (y_first ? ", y first" : ", x first"));
    CHECK(done(x, 0) == (expect_x || handed[0]));
    CHECK(done(y, 1) == (expect_y || handed[1]));
  }
}

template <class X, class Y>
void shared_qp_program() {
  world w;
  X x(w, 0);
  Y y(w, 1);
  INFO(X::name << " and " << Y::name << " on one QP and one CQ, default work request ids");
  std::vector<std::size_t> grant_perm, revoke_perm;
  bool first = true;
  int cycles = 0;
  auto granted = [](const auto &f, int) { return f.granted(); };
  auto revoked = [](const auto &f, int) { return f.revoked(); };
  // Every order of each phase's completions: the grant phase has up to 2, the revoke phase up to
  // 4 (x's revoke, two writes of the program's own, y's revoke).
  std::size_t n_grant = std::size_t(X::grant_signaled) + std::size_t(Y::grant_signaled);
  std::size_t n_revoke = std::size_t(X::revoke_posted) + 2 + std::size_t(Y::revoke_posted);
  grant_perm.resize(n_grant);
  revoke_perm.resize(n_revoke);
  std::iota(grant_perm.begin(), grant_perm.end(), 0);
  std::iota(revoke_perm.begin(), revoke_perm.end(), 0);
  do {
    do {
      const bool y_first = (cycles & 1) != 0;
      ++cycles;
      // Grant both; the completions come in posting order on one send queue.
      const remote_descriptor dx = x.post_grant();
      const remote_descriptor dy = y.post_grant();
      std::vector<owned_wc> g;
      {
        const auto wcs = wait_wc(w.lb.cq_b, n_grant);
        REQUIRE(wcs.size() == n_grant);
        std::size_t i = 0;
        if (X::grant_signaled) g.push_back({wcs[i++], 0});
        if (Y::grant_signaled) g.push_back({wcs[i++], 1});
      }
      // Each completion to the wrong object only: nothing is confirmed.
      for (const owned_wc &o : g) (o.owner == 0 ? static_cast<void>(y.complete(o.wc)) : x.complete(o.wc));
      CHECK(x.granted() == !X::grant_signaled);
      CHECK(y.granted() == !Y::grant_signaled);
      hand_in_order(x, y, g, grant_perm, y_first, granted);
      REQUIRE(x.granted());
      REQUIRE(y.granted());
      if (first) { // each key reaches its own bytes
        CHECK(w.lands(dx, x.at));
        CHECK(w.lands(dy, y.at));
      }

      // Revoke x, then the program's own work, then y: y's revoke queued behind other work.
      x.post_revoke();
      w.post_own_write(0);
      w.post_own_write(0xC1);
      y.post_revoke();
      std::vector<owned_wc> r;
      {
        const auto wcs = wait_wc(w.lb.cq_b, n_revoke);
        REQUIRE(wcs.size() == n_revoke);
        std::size_t i = 0;
        if (X::revoke_posted) r.push_back({wcs[i++], 0});
        r.push_back({wcs[i++], 2});
        r.push_back({wcs[i++], 2});
        if (Y::revoke_posted) r.push_back({wcs[i++], 1});
      }
      for (const owned_wc &o : r)
        if (o.owner == 0) y.complete(o.wc);
        else if (o.owner == 1) x.complete(o.wc);
      CHECK(x.revoked() == !X::revoke_posted);
      CHECK(y.revoked() == !Y::revoke_posted);
      hand_in_order(x, y, r, revoke_perm, y_first, revoked);
      REQUIRE(x.revoked());
      REQUIRE(y.revoked());
      if (first) { // late writes through both revoked keys: refused, nothing written
        CHECK(w.refused(dx));
        CHECK(w.refused(dy));
        first = false;
      }
    } while (std::next_permutation(revoke_perm.begin(), revoke_perm.end()));
  } while (std::next_permutation(grant_perm.begin(), grant_perm.end()));
  CHECK(w.untouched());
  CHECK(all_equal(w.sink.data() + 16, 48, 0)); // the program's writes: 16 bytes each, no more
}

} // namespace

TEST_CASE("program: two StrictGrants on one QP, every completion to every object, in every order", "[program]") {
  shared_qp_program<strict_form, strict_form>();
}
TEST_CASE("program: a StrictGrant and a GrantPool lease on one QP, in every order", "[program]") {
  shared_qp_program<strict_form, lease_form>();
}
TEST_CASE("program: two software IndirectKeys on one QP, in every order", "[program]") {
  shared_qp_program<ikey_form, ikey_form>();
}
TEST_CASE("program: a MemoryWindow and an IndirectKey on one QP, in every order", "[program]") {
  shared_qp_program<window_form, ikey_form>();
}

TEST_CASE("program: default ids are the objects' own, and another object's id is refused", "[program][bad-input]") {
  world w;
  strict_form a(w, 0), b(w, 1);
  ikey_form k(w, 2);
  CHECK(a.g.window().wr_id() != 0);
  CHECK(a.g.window().wr_id() != b.g.window().wr_id());
  CHECK((a.g.window().wr_id() >> 48) == (object_wr_tag >> 48));
  CHECK(k.k.wr_id() != 0);
  CHECK(k.k.wr_id() != a.g.window().wr_id());
  // The default id is written into the work request: the completion carries the window's own id.
  (void)a.post_grant();
  const ibv_wc own = wait_one(w.lb.cq_b);
  CHECK(own.wr_id == a.g.window().wr_id());
  a.complete(own);
  // Another object's own id: refused before anything is posted; the grant unchanged.
  auto r = a.g.revoke(w.lb.b, {b.g.window().wr_id(), send_flag::signaled});
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::foreign_wr_id);
  CHECK(std::string(r.error().message()).find("own_wr_id") != std::string::npos);
  auto g2 = b.g.grant(w.lb.b, rights, {k.k.wr_id(), send_flag::signaled});
  REQUIRE_FALSE(g2);
  CHECK(g2.error() == errc::foreign_wr_id);
  auto c = k.k.configure(w.lb.b, layout::list({{w.mr, 0, 64}}), access::local_write | rights,
                         {a.g.window().wr_id(), send_flag::signaled});
  REQUIRE_FALSE(c);
  CHECK(c.error() == errc::foreign_wr_id);
  CHECK_FALSE(k.k.configured());
  expect_no_completion(w.lb.cq_b);
  CHECK(a.granted());
  CHECK(b.revoked());
  // A caller's own id (no library tag) is taken as given; the object's own id too.
  need(a.g.revoke(w.lb.b, {a.g.window().wr_id(), send_flag::signaled}), "revoke with its own id");
  const ibv_wc rv = wait_one(w.lb.cq_b);
  CHECK(rv.wr_id == a.g.window().wr_id());
  a.complete(rv);
  CHECK(a.revoked());
  const remote_descriptor d = need(a.g.grant(w.lb.b, rights, {0x1234, send_flag::signaled}), "grant with the caller's id");
  const ibv_wc mine = wait_one(w.lb.cq_b);
  CHECK(mine.wr_id == 0x1234);
  a.complete(mine);
  CHECK(a.granted());
  CHECK(w.lands(d, a.at));
}

TEST_CASE("program: CompletionDispatcher routes each completion to its object, the rest to the program", "[program]") {
  world w;
  strict_form x(w, 0);
  lease_form y(w, 1);
  ikey_form k(w, 2);
  auto disp = need(CompletionDispatcher::create(w.lb.cq_b), "dispatcher");
  need(disp.attach(x.target()), "attach x");
  need(disp.attach(y.target()), "attach y");
  need(disp.attach(k.target()), "attach k");
  need(disp.attach(x.target()), "attach x again: nothing changes");
  CHECK(disp.attached() == 3);

  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    const remote_descriptor dx = x.post_grant();
    const remote_descriptor dy = y.post_grant();
    const remote_descriptor dk = k.post_grant();
    // k's completion is behind x's: settling k routes x's to x.
    need(disp.settle(k.target(), 5000), "settle k");
    CHECK(k.granted());
    CHECK(x.granted());
    need(disp.settle(x.target(), 5000), "settle x: confirmed already");
    CHECK(y.granted());
    if (round == 0) {
      CHECK(w.lands(dx, x.at));
      CHECK(w.lands(dy, y.at));
      CHECK(w.lands(dk, k.at));
    }
    x.post_revoke();
    w.post_own_write(0xC0);
    y.post_revoke();
    w.post_own_write(0xC1);
    // Settle the lease first: x's revoke and the program's first write are routed on the way.
    need(disp.settle(y.l, 5000), "settle the lease's revoke");
    CHECK(y.revoked());
    CHECK(x.revoked());
    k.post_revoke();
    // The program's completions waited in the dispatcher; the CQ holds the second write.
    ibv_wc out[4];
    std::vector<std::uint64_t> ids;
    for (int tries = 0; tries < 100 && ids.size() < 2; ++tries) {
      const std::size_t n = need(disp.wait(out, 2000), "wait");
      for (std::size_t i = 0; i < n; ++i) ids.push_back(out[i].wr_id);
    }
    CHECK(ids == std::vector<std::uint64_t>{0xC0, 0xC1});
    CHECK(disp.stashed() == 0);
    CHECK(w.refused(dx));
    CHECK(w.refused(dy));
    CHECK(w.refused(dk));
  }

  // A failed operation: settle returns its error, the object rolled back.
  need(w.lb.b.to_error(), "owner QP to ERR");
  const remote_descriptor flushed = x.post_grant();
  auto s = disp.settle(x.target(), 5000);
  REQUIRE_FALSE(s);
  CHECK(s.error() == wc_error(IBV_WC_WR_FLUSH_ERR));
  CHECK(x.revoked());
  w.lb.recover();
  CHECK(w.refused(flushed));

  // Bad input: an object not attached, a deadline of 0 with nothing pending, a null dispatcher.
  strict_form other(w, 3);
  (void)other.post_grant();
  auto na = disp.settle(other.target(), 1000);
  REQUIRE_FALSE(na);
  CHECK(na.error() == errc::wrong_state);
  CHECK_FALSE(other.granted()); // nothing was polled for it
  need(disp.attach(other.target()), "attach other");
  need(disp.settle(other.target(), 5000), "settle other");
  CHECK(other.granted());
  need(disp.settle(k.target(), 0), "nothing pending: at once");
  // A wait on a destroyed (null) object: refused, nothing polled.
  strict_form gone(w, 4);
  need(disp.attach(gone.target()), "attach gone");
  need(gone.g.destroy(), "destroy gone");
  CHECK(disp.settle(gone.target(), 1000).error() == errc::null_handle);
  disp.detach(gone.target());
  disp.detach(other.target());
  CHECK(disp.attached() == 3);
  CompletionDispatcher moved = std::move(disp);
  CHECK_FALSE(disp);
  ibv_wc one[1];
  CHECK(disp.poll(one).error() == errc::null_handle);
  CHECK(disp.settle(x.target(), 0).error() == errc::null_handle);
  CompletionQueue none;
  CHECK(CompletionDispatcher::create(none).error() == errc::null_handle);
  CHECK(CompletionDispatcher::create(w.lb.cq_b, {.max_targets = 0}).error() == errc::zero_length);
  auto tiny = need(CompletionDispatcher::create(w.lb.cq_b, {.max_targets = 1}), "one target");
  need(tiny.attach(x.target()), "attach one");
  CHECK(tiny.attach(k.target()).error() == errc::too_many_entries);
  need(other.g.revoke(w.lb.b), "revoke other");
  CHECK(moved.settle(other.target(), 5000).error() == errc::wrong_state); // detached
  need(moved.attach(other.target()), "attach other again");
  need(moved.settle(other.target(), 5000), "settle other's revoke");
  CHECK(other.revoked());
}

// CompletionDispatcher::route(obj): the object is attached while its Route lives and detached
// when it ends: at scope end, on an early return of the function holding it, after the
// dispatcher moved (the Route follows the table, not the dispatcher object), and after the
// dispatcher is gone (nothing touched, nothing leaked: ASan in CI). A one-target dispatcher shows
// it: a second object is refused while the Route lives and taken after. The routed grant is
// confirmed through the dispatcher while routed.
TEST_CASE("program: a dispatcher's Route detaches its object when it ends, on every path", "[program]") {
  world w;
  auto g1 = need(StrictGrant::create(w.lb.pd, w.mr, {2 * span_len, span_len}), "grant 1");
  auto g2 = need(StrictGrant::create(w.lb.pd, w.mr, {4 * span_len, span_len}), "grant 2");
  auto disp = need(CompletionDispatcher::create(w.lb.cq_b, {.max_targets = 1}), "one target");
  {
    auto r = need(disp.route(g1), "route g1");
    CHECK(bool(r));
    CHECK(disp.attached() == 1);
    CHECK(disp.attach(g2).error() == errc::too_many_entries);
    need(g1.grant(w.lb.b, rights), "grant g1");
    need(disp.settle(g1, 5000), "settle g1's grant (routed)");
    need(g1.revoke(w.lb.b), "revoke g1");
    need(disp.settle(g1, 5000), "settle g1's revoke (routed)");
  }
  CHECK(disp.attached() == 0);
  need(disp.attach(g2), "attach g2 after the route ended");
  disp.detach(g2);
  auto early = [&]() -> result<void> {
    RDMAXX_TRY(r, disp.route(g1));
    return make_error_code(errc::timeout); // an early return: the Route goes with the frame
  };
  CHECK(early().error() == errc::timeout);
  CHECK(disp.attached() == 0);
  Route moved_route = need(disp.route(g1), "route g1 again");
  CompletionDispatcher moved = std::move(disp);
  CHECK(moved.attached() == 1);
  moved_route.reset(); // ends in the moved-to dispatcher's table
  CHECK_FALSE(moved_route);
  CHECK(moved.attached() == 0);
  Route outliving = need(moved.route(g2), "route g2");
  { CompletionDispatcher gone = std::move(moved); } // the dispatcher goes first
  outliving.reset();                                  // its table is still there to detach from
  CHECK_FALSE(outliving);
  CompletionDispatcher null_disp;
  CHECK(null_disp.route(g1).error() == errc::null_handle);
}

// --- lifetimes: a grant holds the memory it reaches ---

TEST_CASE("program: rereg under a grant answers region_granted and changes nothing", "[program][rereg]") {
  world w;
  std::vector<unsigned char> user(16 * span_len, 0);
  std::vector<unsigned char> fresh(16 * span_len, 0);
  auto mr = need(MemoryRegion::reg(w.lb.pd, user.data(), user.size(), access::local_write | access::mw_bind), "user region");
  auto pd2 = need(ProtectionDomain::alloc(w.lb.ctx), "pd2");
  const std::size_t at = 2 * span_len;
  auto move_it = [&] { return mr.rereg(change_translation(fresh.data(), fresh.size())); };
  auto refused_now = [&](const char *what) {
    INFO(what);
    auto r = move_it();
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::region_granted);
    CHECK(r.error() == std::errc::device_or_resource_busy);
    CHECK(std::string(r.error().message()).find("StrictGrant") != std::string::npos);
    auto p = mr.rereg(change_pd(pd2));
    REQUIRE_FALSE(p);
    CHECK(p.error() == errc::region_granted);
    CHECK(mr.destroy().error() == errc::region_granted);
    CHECK(mr.address() == user.data()); // unchanged
    CHECK(mr.pd() == w.lb.pd.native_handle());
    CHECK(mr.live_grants() == 1);
  };
  auto lands_in_user = [&](const remote_descriptor &d) {
    if (peer_post(w.lb.a, w.lb.cq_a, IBV_WR_RDMA_WRITE, w.src_mr.sge(0, 64), d.addr, d.rkey) != IBV_WC_SUCCESS) {
      w.lb.recover();
      return false;
    }
    const bool ok = all_equal(user.data() + at, 64, 0x5A) && all_equal(fresh.data(), fresh.size(), 0);
    std::memset(user.data() + at, 0, 64);
    return ok;
  };

  SECTION("StrictGrant") {
    auto g = need(StrictGrant::create(w.lb.pd, mr, {at, span_len}), "grant");
    const remote_descriptor d = need(g.grant(w.lb.b, rights), "grant");
    g.window().complete(wait_one(w.lb.cq_b));
    refused_now("StrictGrant");
    CHECK(lands_in_user(d));
    // An access change alone leaves the memory where it is: allowed under the grant.
    need(mr.rereg(change_access(access::local_write | access::mw_bind | access::remote_read)), "access change");
    CHECK(lands_in_user(d));
    need(g.destroy(), "destroy the grant");
    CHECK(mr.live_grants() == 0);
    need(move_it(), "rereg once the grant is gone");
    CHECK(is_denial(peer_post(w.lb.a, w.lb.cq_a, IBV_WR_RDMA_WRITE, w.src_mr.sge(0, 64), d.addr, d.rkey)));
    w.lb.recover();
  }
  SECTION("ExactGrant") {
    auto g = need(ExactGrant::create(w.lb.pd, mr, {at, span_len}, rights), "grant");
    const remote_descriptor d = g.descriptor();
    refused_now("ExactGrant");
    CHECK(lands_in_user(d));
    need(g.destroy(), "revoke");
    CHECK(mr.live_grants() == 0);
    need(move_it(), "rereg once the grant is revoked");
    CHECK(is_denial(peer_post(w.lb.a, w.lb.cq_a, IBV_WR_RDMA_WRITE, w.src_mr.sge(0, 64), d.addr, d.rkey)));
    w.lb.recover();
  }
  SECTION("GrantPool") {
    auto pool = need(GrantPool::create(w.lb.pd, mr, {.slot_size = span_len, .slots = 4}), "pool");
    auto l = need(pool.acquire(), "acquire");
    refused_now("GrantPool");
    auto b = w.lb.b.start_send();
    const remote_descriptor d = need(pool.grant(b, w.lb.b, l, rights), "grant");
    need(b.submit(), "submit");
    const std::size_t slot_at = std::size_t(l.slot()) * span_len;
    CHECK(peer_post(w.lb.a, w.lb.cq_a, IBV_WR_RDMA_WRITE, w.src_mr.sge(0, 64), d.addr, d.rkey) == IBV_WC_SUCCESS);
    CHECK(all_equal(user.data() + slot_at, 64, 0x5A));
    CHECK(all_equal(fresh.data(), fresh.size(), 0));
    std::memset(user.data() + slot_at, 0, 64);
    need(pool.destroy(), "destroy the pool");
    CHECK(mr.live_grants() == 0); // the lease outlives the pool but reaches nothing
    need(move_it(), "rereg once the pool is gone");
    CHECK(is_denial(peer_post(w.lb.a, w.lb.cq_a, IBV_WR_RDMA_WRITE, w.src_mr.sge(0, 64), d.addr, d.rkey)));
    w.lb.recover();
  }
  SECTION("software IndirectKey") {
    auto k = need(IndirectKey::create(w.lb.pd, 4, {.backend = umr_backend::software}), "key");
    need(k.configure(w.lb.b, layout::list({{mr, at, span_len}}), access::local_write | rights), "configure");
    k.complete(wait_one(w.lb.cq_b));
    const key_segment s = k.segments()[0];
    const remote_descriptor d{s.addr, s.length, s.rkey, rights, false};
    refused_now("IndirectKey");
    // Under an IndirectKey even an access change is refused: the key refers to this registration.
    CHECK(mr.rereg(change_access(access::local_write | access::mw_bind | access::remote_read)).error() ==
          errc::region_granted);
    CHECK(lands_in_user(d));
    need(k.revoke(), "invalidate");
    need(k.destroy_kept_regions(), "release the kept regions");
    CHECK(mr.live_grants() == 0);
    need(move_it(), "rereg once the key let go");
    CHECK(is_denial(peer_post(w.lb.a, w.lb.cq_a, IBV_WR_RDMA_WRITE, w.src_mr.sge(0, 64), d.addr, d.rkey)));
    w.lb.recover();
  }
  CHECK(all_equal(fresh.data(), fresh.size(), 0));
}
