// [bad-input] The shared objects of the bad-input suite (bad_inputs.hpp), the check that every
// public type has its case, the end-of-run count, and the rows of Context (with DeviceList and
// probe_window_bounds), ProtectionDomain, access and CompletionQueue (with CompletionChannel).
// The other types' rows are in test_bad_inputs_*.cpp, one test case per type:
//   rxe-tests '[bad-input]'        every type (one test case each)
//   rxe-tests '[bad-input][mr]'    the MemoryRegion rows alone
// At the end of the run a listener prints how many rows ran, per type and in total
// ("bad inputs tried: N rows in M cases"; README, "Tests", has the figures of the last run).
//
// The one MR left unusable is made so by a failed re-registration substituted through
// fault_injection::set_rereg_mr (rxe has no native rereg that could fail that way).

// The listener below (end-of-run totals) needs Catch's reporter interfaces.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "bad_inputs.hpp"

#include <iostream>
#include <set>

using namespace rxe;
using namespace rxe::bad_input;

namespace rxe::bad_input {

std::map<std::string, std::size_t> &rows_run() {
  static std::map<std::string, std::size_t> m;
  return m;
}

bad_input_world::bad_input_world() {
  fill(tgt.data(), N, 1);
  fill(tgt2.data(), N, 2);
  fill(tgt_x.data(), N, 3);
  fill(src.data(), N, 4);
  fill(dst.data(), N, 5);
  fill(rbuf.data(), N, 6);
  fill(aux.data(), N, 7);
  mt = need(MemoryRegion::reg(pd, tgt.data(), N, target_access), "reg target");
  mt2 = need(MemoryRegion::reg(pd2, tgt2.data(), N, target_access), "reg target on pd2");
  mt_x = need(MemoryRegion::reg(pd_x, tgt_x.data(), N, target_access), "reg target, other context");
  ms = need(MemoryRegion::reg(pd, src.data(), N, access::local_write), "reg source");
  md = need(MemoryRegion::reg(pd, dst.data(), N, remote_rw), "reg destination");
  mrr = need(MemoryRegion::reg(pd, rbuf.data(), N, remote_rw), "reg rereg subject");
  ma = need(MemoryRegion::allocate(pd, N, remote_rw), "allocate");
  fill(ma.address(), N, 8);
  m_nobind = need(MemoryRegion::reg(pd, tgt.data(), N, access::local_write | access::remote_read),
                       "reg target without MW_BIND");
  m_nolw = need(MemoryRegion::reg(pd, tgt.data(), N, access::mw_bind | access::remote_read),
                     "reg target without LOCAL_WRITE");
  mu = need(MemoryRegion::reg(pd, aux.data(), N, target_access), "reg, to be left unusable");
  {
    fault_injection::set_rereg_mr(&rereg_fails_unusable);
    auto r = mu.rereg(change_access(access::local_write), rereg_policy::native_only);
    fault_injection::set_rereg_mr(nullptr);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(mu.state() == mr_state::unusable);
  }
  mrr_lkey = mrr.lkey();
  mrr_rkey = mrr.rkey();

  // Windows: unbound of each type, bound of each type, an invalidated one, one of pd2.
  w1 = need(MemoryWindow::alloc(pd, mw_type::type1), "alloc w1");
  w2 = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc w2");
  w1b = need(MemoryWindow::alloc(pd, mw_type::type1), "alloc w1b");
  w2b = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc w2b");
  w2i = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc w2i");
  w2x = need(MemoryWindow::alloc(pd2, mw_type::type2, accept_risk), "alloc w2x");
  bind_wait(w1b, lb.b, lb.cq_b, mt, {0, 1024}, access::remote_read, 11);
  d2b = bind_wait(w2b, lb.b, lb.cq_b, mt, {1024, 1024}, rw_rights, 12);
  bind_wait(w2i, lb.b, lb.cq_b, mt, {0, 64}, access::remote_read, 13);
  need(w2i.invalidate(lb.b, {14, send_flag::signaled}), "invalidate w2i");
  CHECK(w2i.complete(wait_one(lb.cq_b)));
  REQUIRE(w2i.state() == mw_state::invalidated);

  g = need(StrictGrant::create(pd, mt, {2048, 512}, mw_type::type2, accept_risk), "strict grant");

  // Indirect keys: unconfigured, configured with remote rights, configured local-only, of pd2.
  k = need(IndirectKey::create(pd, 8), "key");
  kc = need(IndirectKey::create(pd, 8), "configured key");
  kl = need(IndirectKey::create(pd, 8), "local-only key");
  k2 = need(IndirectKey::create(pd2, 8), "key on pd2");
  kt = need(IndirectKey::create(pd, 8, {.grant = {.trusted_peers = true, .type2 = accept_risk}}), "type-2 software key");
  {
    auto b = lb.b.start_send();
    need(kc.configure(b, lb.b, layout::list({{mt, 3000, 100}, {mt, 100, 50}}), remote_rw,
                      {15, send_flag::signaled}),
         "configure kc");
    need(b.submit(), "submit kc");
    const ibv_wc wc = wait_one(lb.cq_b);
    CHECK(wc.wr_id == 15);
    CHECK(kc.complete(wc));
    auto bl = lb.a.start_send();
    need(kl.configure(bl, lb.a, layout::list({{ms, 0, 64}}), access::local_write), "configure kl");
    need(bl.submit(), "submit kl (empty)");
  }
  dk = need(kc.descriptor(), "kc descriptor");
  dk_ro = need(ikey_descriptor::make(dk.segments(), access::remote_read), "read-only");
  dk_wo =
      need(ikey_descriptor::make(dk.segments(), access::remote_write), "write-only");

  // Moved-from handles of every type.
  ctx_moved = open_device();
  move_away(ctx_moved);
  pd_moved = need(ProtectionDomain::alloc(ctx), "pd to move");
  move_away(pd_moved);
  mr_moved = need(MemoryRegion::reg(pd, src.data(), N, access::local_write), "mr to move");
  move_away(mr_moved);
  ch_moved = need(CompletionChannel::create(ctx), "channel to move");
  move_away(ch_moved);
  cq_moved = need(CompletionQueue::create(ctx, 4), "cq to move");
  move_away(cq_moved);
  qp_moved = need(QueuePair::create(pd, cq_s, cq_s), "qp to move");
  move_away(qp_moved);
  w_moved = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "window to move");
  move_away(w_moved);
  g_moved = need(StrictGrant::create(pd, mt, {0, 64}, mw_type::type2, accept_risk), "grant to move");
  move_away(g_moved);
  k_moved = need(IndirectKey::create(pd, 4), "key to move");
  move_away(k_moved);

  snap_tgt = tgt;
  snap_tgt2 = tgt2;
  snap_tgt_x = tgt_x;
  snap_src = src;
  snap_dst = dst;
  snap_rbuf = rbuf;
  snap_aux = aux;
  snap_ma.assign(static_cast<unsigned char *>(ma.address()), static_cast<unsigned char *>(ma.address()) + N);
}

QueuePair bad_input_world::fresh() { return need(QueuePair::create(pd, cq_s, cq_s), "fresh qp"); }

QueuePair bad_input_world::fresh_rts() {
  auto q = fresh();
  need(q.connect(need(q.local_endpoint(), "endpoint")), "connect to itself");
  return q;
}

std::error_code bad_input_world::on_victim(const std::function<void(SendBatch &)> &add) {
  auto b = vp.a.start_send();
  add(b);
  if (auto s = b.submit(); !s) return s.error();
  const ibv_wc wc = wait_wc(vp.cq_a, 1).front();
  vp.recover();
  return wc_error(wc);
}

std::error_code bad_input_world::refused_then_follow_up(QueuePair &q,
                                                        const std::function<std::error_code()> &post) {
  const std::error_code ec = post();
  if (need(q.state(), "state") == IBV_QPS_RESET) need(q.to_init(), "to_init");
  if (need(q.state(), "state") == IBV_QPS_INIT) need(q.to_rtr(need(q.local_endpoint(), "endpoint")), "to_rtr");
  need(q.to_rts(), "to_rts");
  {
    auto b = q.start_send();
    b.write({2, send_flag::signaled}, {mrr.iova() + 2048, mrr.rkey()}, ms.sge(0, 8));
    need(b.submit(), "submit the follow-up write");
  }
  const auto wcs = wait_wc(cq_s, 1);
  CHECK(wcs.front().wr_id == 2);
  expect_no_completion(cq_s, 200ms);
  std::memcpy(rbuf.data() + 2048, snap_rbuf.data() + 2048, 8); // undo the follow-up
  return ec;
}

std::error_code bad_input_world::write_md(QueuePair &q) {
  auto b = q.start_send();
  b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
  return err(b.submit());
}

void bad_input_world::finish() {
  // The checked destruction of a moved-from handle is a no-op that succeeds (not a bad input: it
  // mirrors the destructor), and it must not crash.
  CHECK(ctx_moved.destroy().has_value());
  CHECK(pd_moved.destroy().has_value());
  CHECK(mr_moved.destroy().has_value());
  CHECK(cq_moved.destroy().has_value());
  CHECK(qp_moved.destroy().has_value());
  CHECK(w_moved.destroy().has_value());
  CHECK(g_moved.destroy().has_value());
  CHECK(k_moved.destroy().has_value());

  // After the rows: nothing a rejected call pointed at changed...
  CHECK(tgt == snap_tgt);
  CHECK(tgt2 == snap_tgt2);
  CHECK(tgt_x == snap_tgt_x);
  CHECK(src == snap_src);
  CHECK(dst == snap_dst);
  CHECK(rbuf == snap_rbuf);
  CHECK(aux == snap_aux);
  CHECK(std::memcmp(ma.data(), snap_ma.data(), N) == 0);
  expect_no_completion(lb.cq_a, 100ms);
  expect_no_completion(lb.cq_b, 100ms);
  expect_no_completion(cq_s, 100ms);

  // ... and every object the rows used still works.
  for (QueuePair *q : {&lb.a, &lb.b, &p2.a, &p2.b, &vp.a, &vp.b})
    CHECK(need(q->state(), "state") == IBV_QPS_RTS);
  auto want = snap_dst;
  REQUIRE(lb.write(ms.sge(0, 512), {md.iova() + 100, md.rkey()}) == IBV_WC_SUCCESS);
  std::memcpy(want.data() + 100, src.data(), 512);
  CHECK(dst == want);
  REQUIRE(vp.write(ms.sge(512, 64), {md.iova() + 700, md.rkey()}) == IBV_WC_SUCCESS);
  std::memcpy(want.data() + 700, src.data() + 512, 64);
  CHECK(dst == want);
  // The other PD's pair: a write within its own region.
  REQUIRE(p2.write(mt2.sge(0, 64), {mt2.iova() + 1000, mt2.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(tgt2.data() + 1000, snap_tgt2.data(), 64) == 0);
  // The rereg subject: same keys, still valid, reachable through its rkey.
  CHECK(mrr.state() == mr_state::valid);
  CHECK(mrr.lkey() == mrr_lkey);
  CHECK(mrr.rkey() == mrr_rkey);
  CHECK(mrr.access() == remote_rw);
  REQUIRE(lb.write(ms.sge(1000, 256), {mrr.iova() + 8, mrr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(rbuf.data() + 8, src.data() + 1000, 256) == 0);
  // Windows: the ones refused above bind and carry traffic; the bound one still works.
  auto want_tgt = snap_tgt;
  const auto d2 = bind_wait(w2, lb.b, lb.cq_b, mt, {0, 256}, rw_rights, 200);
  REQUIRE(lb.write(ms.sge(2000, 200), d2.at(16)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 16, src.data() + 2000, 200);
  CHECK(tgt == want_tgt);
  need(w2.invalidate(lb.b, {201, send_flag::signaled}), "invalidate w2");
  CHECK(w2.complete(wait_one(lb.cq_b)));
  const auto d1 = bind_wait(w1, lb.b, lb.cq_b, mt, {256, 256}, rw_rights, 202);
  REQUIRE(lb.write(ms.sge(2500, 100), d1.at(0)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 256, src.data() + 2500, 100);
  CHECK(tgt == want_tgt);
  need(w1.unbind(lb.b, {203, send_flag::signaled}), "unbind w1");
  CHECK(w1.complete(wait_one(lb.cq_b)));
  REQUIRE(lb.write(ms.sge(3000, 64), d2b.at(8)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 1024 + 8, src.data() + 3000, 64);
  CHECK(tgt == want_tgt);
  // The strict grant refused above binds and carries traffic.
  const auto dg = need(g.grant(lb.b, access::remote_write, {204, send_flag::signaled}), "grant bind");
  CHECK(g.window().complete(wait_one(lb.cq_b)));
  REQUIRE(lb.write(ms.sge(3100, 512), dg.at(0)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 2048, src.data() + 3100, 512);
  CHECK(tgt == want_tgt);
  // The key refused above configures and carries traffic; the configured one still works.
  {
    auto b = lb.b.start_send();
    need(k.configure(b, lb.b, layout::list({{mt, 600, 30}, {mt, 700, 20}}), remote_rw,
                     {205, send_flag::signaled}),
         "configure k");
    need(b.submit(), "submit k");
    const ibv_wc wc = wait_one(lb.cq_b);
    CHECK(wc.wr_id == 205);
    CHECK(k.complete(wc));
    const auto dkk = need(k.descriptor(), "k descriptor");
    auto bw = lb.a.start_send();
    CHECK(need(write_indirect(bw, {206, send_flag::signaled}, dkk, 0, ms.sge(3700, 50)),
               "write_indirect k") == 2);
    need(bw.submit(), "submit write through k");
    CHECK(wait_one(lb.cq_a).wr_id == 206);
    std::memcpy(want_tgt.data() + 600, src.data() + 3700, 30);
    std::memcpy(want_tgt.data() + 700, src.data() + 3730, 20);
    CHECK(tgt == want_tgt);
    auto bc = lb.a.start_send();
    CHECK(need(write_indirect(bc, {207, send_flag::signaled}, dk, 95, ms.sge(3800, 10)),
               "write_indirect kc") == 2);
    need(bc.submit(), "submit write through kc");
    CHECK(wait_one(lb.cq_a).wr_id == 207);
    std::memcpy(want_tgt.data() + 3095, src.data() + 3800, 5);
    std::memcpy(want_tgt.data() + 100, src.data() + 3805, 5);
    CHECK(tgt == want_tgt);
    need(k.revoke(), "invalidate k");
  }
  CHECK(need(lb.a.state(), "state a") == IBV_QPS_RTS);
  CHECK(need(lb.b.state(), "state b") == IBV_QPS_RTS);

  // Everything is destroyable through the checked calls, children first.
  for (MemoryWindow *w : {&w1, &w2, &w1b, &w2b, &w2i, &w2x}) destroyed(w->destroy(), "window");
  destroyed(g.destroy(), "strict grant");
  for (IndirectKey *key : {&k, &kc, &kl, &k2, &kt}) destroyed(key->destroy(), "indirect key");
  for (MemoryRegion *m : {&mt, &mt2, &mt_x, &ms, &md, &mrr, &ma, &m_nobind, &m_nolw, &mu})
    destroyed(m->destroy(), "memory region");
  for (QueuePair *q : {&lb.a, &lb.b, &p2.a, &p2.b, &vp.a, &vp.b}) destroyed(q->destroy(), "queue pair");
  for (CompletionQueue *c :
       {&lb.cq_a, &lb.cq_b, &p2.cq_a, &p2.cq_b, &vp.cq_a, &vp.cq_b, &cq_ch, &cq_s, &cq_x})
    destroyed(c->destroy(), "completion queue");
  destroyed(ch.destroy(), "completion channel");
  destroyed(ch_x.destroy(), "completion channel of the other context");
  for (ProtectionDomain *p : {&pd, &pd2, &pd_x}) destroyed(p->destroy(), "protection domain");
  destroyed(ctx.destroy(), "context");
  destroyed(ctx_x.destroy(), "other context");
}

} // namespace rxe::bad_input

namespace {

// Every public type of include/rdmaxx/rdmaxx.hpp that has calls to refuse, with its tag (README,
// "Tests"); connection.hpp's are checked in test_bad_inputs_cm.cpp. A type without a case here
// fails the check below.
struct public_type {
  const char *name;
  const char *tag;
};
constexpr public_type public_types[] = {
    {"Context", "[context]"},
    {"ProtectionDomain", "[pd]"},
    {"access", "[access]"},
    {"MemoryRegion", "[mr]"},
    {"CompletionQueue", "[cq]"},
    {"QueuePair", "[qp]"},
    {"SendBatch", "[send-batch]"},
    {"MemoryWindow", "[window]"},
    {"StrictGrant", "[strict-grant]"},
    {"ExactGrant", "[exact-grant]"},
    {"GrantPool", "[grant-pool]"},
    {"remote_descriptor", "[remote-descriptor]"},
    {"ikey_descriptor", "[ikey-descriptor]"},
    {"grant_list", "[grant-list]"},
    {"layout / IndirectKey", "[indirect-key]"},
};

// The end of the run: how many rows ran, per type and in total.
struct bad_input_totals : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats &) override {
    const auto &ran = rows_run();
    if (ran.empty()) return;
    std::size_t n = 0;
    for (const auto &[h, count] : ran) n += count;
    std::cout << "bad inputs tried: " << n << " rows in " << ran.size() << " cases\n";
    for (const auto &[h, count] : ran) std::cout << "  " << h << ": " << count << "\n";
  }
};

} // namespace

CATCH_REGISTER_LISTENER(bad_input_totals)

namespace rxe::bad_input {
// Registered with Catch, per public type, under its name and tags: a type without a case (or a
// case renamed away from its type) would have no rows at all.
void check_cases_registered(std::span<const std::pair<const char *, const char *>> types) {
  std::map<std::string, std::set<std::string>> cases;
  for (const auto &tc : Catch::getRegistryHub().getTestCaseRegistry().getAllTests())
    cases[tc.name] = std::set<std::string>(tc.tags.begin(), tc.tags.end());
  for (const auto &[name, tag] : types) {
    const std::string want = case_prefix + name;
    INFO("public type " << name << ": its test case \"" << want << "\" [bad-input]" << tag);
    REQUIRE(cases.count(want) == 1);
    const std::string t(tag);
    CHECK(cases[want].count("bad-input") == 1);
    CHECK(cases[want].count(t.substr(1, t.size() - 2)) == 1);
  }
}
} // namespace rxe::bad_input

TEST_CASE("bad inputs: every public type has its case", "[bad-input]") {
  std::vector<std::pair<const char *, const char *>> types;
  for (const auto &p : public_types) types.emplace_back(p.name, p.tag);
  check_cases_registered(types);
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: Context", "[bad-input][context]") {
  table t("Context");
  t.add("Context::open(ibv_device *)", "null device", is(errc::no_device),
        [&] { return err(Context::open(static_cast<ibv_device *>(nullptr))); });
  t.add("Context::open(name)", "a name no device has", is(errc::no_device),
        [&] { return err(Context::open("rdmaxx-no-such-device")); });
  t.add("Context::open(name)", "empty name", is(errc::no_device),
        [&] { return err(Context::open(std::string_view{})); });
  t.add("Context::query_port", "port 0", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_port(0)); });
  t.add("Context::query_port", "port 2 (rxe has one)", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_port(2)); });
  t.add("Context::query_port", "port 255", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_port(255)); });
  t.add("Context::query_gid", "index -1", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_gid(1, -1)); });
  t.add("Context::query_gid", "index 1 << 20", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_gid(1, 1 << 20)); });
  t.add("Context::query_gid", "port 0", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_gid(0, 0)); });
  t.add("Context::query_port", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.query_port()); });
  t.add("Context::query_port", "default-constructed context", is(errc::null_handle),
        [&] { return err(Context{}.query_port()); });
  t.add("Context::query_gid", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.query_gid(1, 0)); });
  t.add("Context::query_capabilities", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.query_capabilities()); });
  t.add("Context::wait_async_event", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.wait_async_event(0)); });
  t.add("Context::wait_async_event", "zero timeout, no event", is(errc::timeout),
        [&] { return err(ctx.wait_async_event(0)); });
  t.add("Context::destroy", "children alive", is(errc::busy), [&] { return err(ctx.destroy()); });
  t.add("probe_window_bounds", "moved-from context", is(errc::null_handle), [&] {
    Capabilities c;
    c.mw_type2b = true;
    return err(probe_window_bounds(ctx_moved, c));
  });
  t.add("probe_window_bounds", "capabilities without window types", is(errc::unsupported), [&] {
    Capabilities c;
    return err(probe_window_bounds(ctx, c));
  });
  t.add("probe_window_bounds", "gid index 200", transition(__builtin_ctz(IBV_QP_AV)), [&] {
    auto c = need(ctx.query_capabilities({false, false}), "caps");
    return err(probe_window_bounds(ctx, c, 200));
  });
  t.add(
      "DeviceList::find", "moved-from list", is(errc::no_device),
      [&] {
        auto l = need(DeviceList::get(), "device list");
        DeviceList sink(std::move(l));
        // A moved-from list that still reports devices would dereference its null list.
        if (l.size() != 0 || !l.devices().empty()) return make_error_code(errc::wrong_state);
        return err(Context::open(l.find(dev_name)));
      });
  t.run();
  finish();
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: ProtectionDomain", "[bad-input][pd]") {
  table t("ProtectionDomain");
  t.add("ProtectionDomain::alloc", "moved-from context", is(errc::null_handle),
        [&] { return err(ProtectionDomain::alloc(ctx_moved)); });
  t.add("ProtectionDomain::alloc", "default-constructed context", is(errc::null_handle),
        [&] { return err(ProtectionDomain::alloc(Context{})); });
  t.add("ProtectionDomain::destroy", "MRs, windows and QPs alive", is(errc::busy),
        [&] { return err(pd.destroy()); });
  t.run();
  finish();
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: access", "[bad-input][access]") {
  table t("access");
  t.add("check_access", "unknown bit", is(errc::unknown_access_flag),
        [&] { return check_access(unknown_bit); });
  t.add("check_access", "remote write without local write", is(errc::remote_write_needs_local_write),
        [&] { return check_access(access::remote_write); });
  t.add("check_access", "remote atomic without local write", is(errc::remote_atomic_needs_local_write),
        [&] { return check_access(access::remote_atomic); });
  t.run();
  finish();
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: CompletionQueue", "[bad-input][cq]") {
  table t("CompletionQueue");
  t.add("CompletionChannel::create", "moved-from context", is(errc::null_handle),
        [&] { return err(CompletionChannel::create(ctx_moved)); });
  t.add("CompletionQueue::create", "moved-from context", is(errc::null_handle),
        [&] { return err(CompletionQueue::create(ctx_moved, 4)); });
  t.add("CompletionQueue::create", "cqe 0", is(errc::zero_length),
        [&] { return err(CompletionQueue::create(ctx, 0)); });
  t.add("CompletionQueue::create", "cqe -1", is(errc::zero_length),
        [&] { return err(CompletionQueue::create(ctx, -1)); });
  t.add("CompletionQueue::create", "cqe INT_MAX (above max_cqe)", sys_errno(std::errc::invalid_argument),
        [&] { return err(CompletionQueue::create(ctx, INT_MAX)); });
  t.add("CompletionQueue::create", "moved-from channel", is(errc::null_handle),
        [&] { return err(CompletionQueue::create(ctx, 4, &ch_moved)); });
  t.add(
      "CompletionQueue::create", "channel of another context", is(errc::context_mismatch),
      [&] { return err(CompletionQueue::create(ctx, 4, &ch_x)); });
  ibv_wc wcs[4];
  t.add("CompletionQueue::wait", "moved-from CQ", is(errc::null_handle),
        [&] { return err(cq_moved.wait(wcs, 0)); });
  t.add("CompletionQueue::wait", "CQ without a channel (busy poll), zero timeout, nothing completed", is(errc::timeout),
        [&] { return err(lb.cq_a.wait(wcs, 0)); });
  t.add("CompletionQueue::wait", "zero timeout, nothing completed", is(errc::timeout),
        [&] { return err(cq_ch.wait(wcs, 0)); });
  t.add("CompletionQueue::wait", "negative timeout", is(errc::timeout),
        [&] { return err(cq_ch.wait(wcs, -5)); });
  t.add(
      "CompletionQueue::wait", "empty output span", is(errc::zero_length),
      [&] { return err(cq_ch.wait(std::span<ibv_wc>{}, 30)); });
  t.add("CompletionQueue::destroy", "QPs use it", is(errc::busy), [&] { return err(lb.cq_a.destroy()); });
  t.add("CompletionChannel::destroy", "a CQ uses it", is(errc::busy), [&] { return err(ch.destroy()); });
  t.add("CompletionQueue::arm", "moved-from CQ", is(errc::null_handle), [&] { return err(cq_moved.arm()); });
  t.add("CompletionQueue::arm", "CQ without a channel", is(errc::wrong_state), [&] { return err(lb.cq_a.arm()); });
  t.add("CompletionQueue::poll_and_arm", "moved-from CQ", is(errc::null_handle),
        [&] { return err(cq_moved.poll_and_arm(wcs)); });
  t.add("CompletionQueue::poll_and_arm", "empty output span", is(errc::zero_length),
        [&] { return err(cq_ch.poll_and_arm(std::span<ibv_wc>{})); });
  t.add("CompletionQueue::poll_and_arm", "CQ without a channel", is(errc::wrong_state),
        [&] { return err(lb.cq_a.poll_and_arm(wcs)); });
  t.add("CompletionQueue::ack_events", "moved-from CQ", is(errc::null_handle),
        [&] { return err(cq_moved.ack_events(1)); });
  t.add("CompletionChannel::get_event", "moved-from channel", is(errc::null_handle),
        [&] { return err(ch_moved.get_event(0)); });
  t.add("CompletionChannel::get_event", "negative timeout", is(errc::invalid_argument),
        [&] { return err(ch.get_event(-1)); });
  t.add("CompletionChannel::get_event", "zero timeout, no event", is(errc::timeout),
        [&] { return err(ch.get_event(0)); });
  t.add("CompletionQueue::wait_for", "moved-from CQ", is(errc::null_handle),
        [&] { return err(cq_moved.wait_for(1, 0)); });
  t.add("CompletionQueue::wait_for", "nothing completes within 10 ms", is(errc::timeout),
        [&] { return err(lb.cq_a.wait_for(1, 10)); });
  t.add("CompletionQueue::wait_for", "another work request completes first", is(errc::unexpected_completion), [&] {
    {
      auto b = lb.a.start_send();
      b.write({41, send_flag::signaled}, {md.iova() + 3000, md.rkey()}, ms.sge(0, 8));
      need(b.submit(), "submit a write");
    }
    ibv_wc other{};
    const auto ec = err(lb.cq_a.wait_for(42, 10000, &other));
    CHECK(other.wr_id == 41); // handed back, not lost
    CHECK(other.status == IBV_WC_SUCCESS);
    std::memcpy(dst.data() + 3000, snap_dst.data() + 3000, 8); // undo the write
    return ec;
  });
  t.add("CompletionQueue::wait_for", "the work request completes in error", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    {
      auto b = vp.a.start_send();
      b.write({43, send_flag::signaled}, {mt.iova(), 0}, ms.sge(0, 8));
      need(b.submit(), "submit a write with rkey 0");
    }
    const auto ec = err(vp.cq_a.wait_for(43, 10000));
    vp.recover();
    return ec;
  });
  // poll() on a null CQ is a precondition violation (unchecked fast path, documented), not a row.
  t.run();
  finish();
}
