// The grant core on rxe (issue 20): a reused grant slot never hands out a key again, type-2 windows
// are refused on this device through every public path unless the risk is accepted, and a
// deferred destruction keeps what the live children need. The peer is plain libibverbs
// (peer_post): what a buggy or hostile program can send.
#include "fixture.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

using namespace rxe;

namespace {
// Hand the owner's CQ completions to the window until the operation posted with `id` is seen.
void confirm(loopback &lb, MemoryWindow &w) {
  auto wc = wait_wc(lb.cq_b, 1);
  REQUIRE(wc.front().status == IBV_WC_SUCCESS);
  REQUIRE(w.complete(wc.front()));
  REQUIRE(w.pending() == 0);
}
bool mapped(const void *p, std::size_t n) {
  return ::msync(const_cast<void *>(p), n, MS_ASYNC) == 0 || errno != ENOMEM;
}
} // namespace

TEST_CASE("a StrictGrant reused 300 times never hands a key out again; grant #0's key stays dead",
          "[grant-core]") {
  loopback lb;
  constexpr std::size_t N = 65536, off = 8192, len = 4096;
  std::vector<unsigned char> mem(N, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), N, access::local_write), "owner mr");
  auto g = need(StrictGrant::create(lb.pd, mr, {off, len}), "grant");
  REQUIRE(g.mechanism() == grant_mechanism::type1_exact_region); // rxe's default
  REQUIRE(g.grants_per_window() == 127);
  std::vector<unsigned char> src(len, 0x5A);
  auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), len, access::local_write), "src");
  std::set<std::uint32_t> keys;
  remote_descriptor first{};
  int refused_old = 0, stale_attempts = 0;
  for (int i = 0; i < 300; ++i) {
    auto d = need(g.grant(lb.b, access::remote_write), "bind");
    confirm(lb, g.window());
    INFO("grant #" << i << " key " << std::hex << d.rkey);
    REQUIRE(keys.insert(d.rkey).second); // never a key handed out before
    if (i == 0) first = d;
    if (i == 128 || i == 256 || i == 299) {
      // The hostile peer writes with grant #0's key during a later grant: refused, bytes untouched.
      ++stale_attempts;
      const auto st = peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), first.addr,
                                first.rkey);
      if (is_denial(st)) ++refused_old;
      CHECK(all_equal(mem.data() + off, len, 0));
      lb.recover();
      // The current grant still works after the reconnect.
      REQUIRE(lb.write(src_mr.sge(0, 64), d.at(0)) == IBV_WC_SUCCESS);
      CHECK(mem[off] == 0x5A);
      std::memset(mem.data() + off, 0, 64);
    }
    need(g.revoke(lb.b), "unbind");
    confirm(lb, g.window());
  }
  CHECK(keys.size() == 300);
  CHECK(refused_old == stale_attempts);
  // Keys are renewed while the grant is unbound and confirmed: a bound grant whose keys are used
  // up is not silently rebound.
  need(g.destroy(), "revoke");
}

TEST_CASE("a GrantPool slot reused 300 times never hands a key out again", "[grant-core]") {
  loopback lb;
  auto buf = need(MemoryRegion::allocate(lb.pd, 4096, access::local_write), "buffers");
  auto pool = need(GrantPool::create(lb.pd, buf, {.slot_size = 4096, .slots = 1}), "pool");
  REQUIRE(pool.mechanism() == grant_mechanism::type1_exact_region);
  std::set<std::uint32_t> keys;
  for (int i = 0; i < 300; ++i) {
    auto l = need(pool.acquire(), "acquire");
    auto b = lb.b.start_send();
    auto d = need(pool.grant(b, lb.b, l, access::remote_write), "grant");
    need(b.submit(), "submit");
    REQUIRE(keys.insert(d.rkey).second);
    need(pool.revoke(lb.b, l), "revoke");
    auto wc = wait_wc(lb.cq_b, 1);
    REQUIRE(wc.front().status == IBV_WC_SUCCESS);
    (void)pool.complete(std::span<ibv_wc>(wc));
    REQUIRE(l.state() == lease_state::ready);
  }
  CHECK(keys.size() == 300);
  CHECK(pool.stats().windows_renewed == 2);
}

TEST_CASE("type-2 windows on rxe: refused through every public path unless the risk is accepted",
          "[grant-core]") {
  loopback lb;
  auto caps = need(lb.ctx.query_capabilities(), "caps");
  REQUIRE(caps.remote_inv_unbound_mw_panics == tristate::yes);
  std::vector<unsigned char> mem(8192);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), access::local_write | access::mw_bind),
                 "mr");
  // MemoryWindow::alloc
  auto w = MemoryWindow::alloc(lb.pd, mw_type::type2);
  REQUIRE_FALSE(w);
  CHECK(w.error() == errc::unsafe_grant);
  CHECK(w.error().message().find("any peer") != std::string::npos);
  CHECK(MemoryWindow::alloc(lb.pd, mw_type::type1)); // type 1 is fine
  CHECK(MemoryWindow::alloc(lb.pd, mw_type::type2, accept_risk));
  // StrictGrant, explicit type
  auto s2 = StrictGrant::create(lb.pd, mr, {0, 4096}, mw_type::type2);
  REQUIRE_FALSE(s2);
  CHECK(s2.error() == errc::unsafe_grant);
  CHECK(StrictGrant::create(lb.pd, mr, {0, 4096}, mw_type::type2, accept_risk));
  // StrictGrant, trusted peers: not enough on rxe (the exposure is device-wide)
  auto st = need(StrictGrant::create(lb.pd, mr, {0, 4096}, grant_options{.trusted_peers = true}), "st");
  CHECK(st.mechanism() == grant_mechanism::type1_exact_region);
  auto sa = need(StrictGrant::create(lb.pd, mr, {0, 4096}, grant_options{.type2 = accept_risk}), "sa");
  CHECK(sa.mechanism() == grant_mechanism::type2_window);
  // GrantPool
  auto pt = need(GrantPool::create(lb.pd, mr, {.slot_size = 4096, .grant = {.trusted_peers = true}}), "pt");
  CHECK(pt.mechanism() == grant_mechanism::type1_exact_region);
  auto pa = need(GrantPool::create(lb.pd, mr, {.slot_size = 4096, .grant = {.type2 = accept_risk}}), "pa");
  CHECK(pa.mechanism() == grant_mechanism::type2_window);
  // The software IndirectKey: trusted peers get type-1 exact regions; with remote rights a key
  // configures and a peer reaches exactly the layout through it.
  auto k = need(IndirectKey::create(lb.pd, 4, {.backend = umr_backend::software, .grant = {.trusted_peers = true}}),
                "key");
  const layout l = layout::list({{mr, 0, 64}});
  auto b = lb.b.start_send();
  need(k.configure(b, lb.b, l, access::remote_read, {9, send_flag::signaled}), "configure");
  need(b.submit(), "submit");
  for (auto &wc : wait_wc(lb.cq_b, 1)) (void)k.complete(wc);
  // RDMAXX_GRANT=type2 in the environment cannot expose this device either.
  ::setenv("RDMAXX_GRANT", "type2", 1);
  auto env = need(StrictGrant::create(lb.pd, mr, {0, 4096}), "env grant");
  ::unsetenv("RDMAXX_GRANT");
  CHECK(env.mechanism() == grant_mechanism::type1_exact_region);
  // probe_window_bounds probes with type 1 here and still reports rxe's bounds.
  CHECK(need(probe_window_bounds(lb.ctx, caps), "probe") == tristate::no);
}

TEST_CASE("an allocate()d region destroyed under a bound window keeps its pages until it goes",
          "[grant-core]") {
  loopback lb;
  auto mr = std::make_unique<MemoryRegion>(
      need(MemoryRegion::allocate(lb.pd, 8192, access::local_write | access::mw_bind), "allocate"));
  auto *p = static_cast<unsigned char *>(mr->address());
  fill(p, 8192, 3);
  auto w = need(MemoryWindow::alloc(lb.pd, mw_type::type1), "window");
  auto d = need(w.bind(lb.b, *mr, {0, 4096}, access::remote_read), "bind");
  confirm(lb, w);
  mr.reset(); // deferred: the window is bound to it (reported through the hook)
  CHECK(mapped(p, 8192));
  // The peer still reads the bytes the region had, through the live window.
  std::vector<unsigned char> got(64, 0);
  auto got_mr = need(MemoryRegion::reg(lb.pd, got.data(), got.size(), access::local_write), "got");
  REQUIRE(lb.read(got_mr.sge(0, 64), d.at(0)) == IBV_WC_SUCCESS);
  std::vector<unsigned char> want(64);
  fill(want.data(), 64, 3);
  CHECK(got == want);
  need(w.destroy(), "dealloc"); // the last child: the region is deregistered, then unmapped
  CHECK_FALSE(mapped(p, 8192));
}

TEST_CASE("a software IndirectKey hands out its descriptor only once its binds' own completion "
          "confirmed them", "[grant-core][ikey]") {
  loopback lb;
  std::vector<unsigned char> mem(8192, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), access::local_write), "mr");
  auto key = need(IndirectKey::create(lb.pd, 4, {.backend = umr_backend::software}), "key");
  const layout l = layout::list({{mr, 100, 50}, {mr, 4000, 30}});
  // Posted without the signaled flag: the library signals the last bind itself.
  auto b = lb.b.start_send();
  need(key.configure(b, lb.b, l, access::local_write | access::remote_write, {41, {}}), "configure");
  need(b.submit(), "submit");
  CHECK(key.pending());
  CHECK(key.descriptor().error() == errc::operation_unconfirmed); // not confirmed yet
  const ibv_wc wc = wait_one(lb.cq_b);
  REQUIRE(wc.wr_id == 41);
  ibv_wc other = wc;
  other.wr_id = 40; // another work request's completion confirms nothing
  CHECK_FALSE(key.complete(other));
  CHECK(key.descriptor().error() == errc::operation_unconfirmed);
  CHECK(key.complete(wc));
  CHECK_FALSE(key.pending());
  const auto d = need(key.descriptor(), "descriptor");
  REQUIRE(d.segments().size() == 2);
  need(key.revoke(), "invalidate");

  // An error completion of the configure (a failed or flushed bind) undoes it: no key, and the
  // keys it would have handed out are dead.
  auto b2 = lb.b.start_send();
  need(key.configure(b2, lb.b, l, access::local_write | access::remote_write, {42, {}}), "configure 2");
  need(b2.submit(), "submit 2");
  ibv_wc real = wait_one(lb.cq_b);
  const std::uint32_t rkey = key.segments()[0].rkey;
  const std::uint64_t raddr = key.segments()[0].addr;
  ibv_wc failed = real;
  failed.status = IBV_WC_WR_FLUSH_ERR;
  CHECK(key.complete(failed));
  CHECK_FALSE(key.configured());
  CHECK(key.descriptor().error() == errc::wrong_state);
  CHECK_FALSE(key.complete(real)); // the late success is ignored
  std::vector<unsigned char> src(16, 0x77);
  auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 16), raddr, rkey)));
  CHECK(all_equal(mem.data(), mem.size(), 0));
  lb.recover();
}

namespace {
// Two zeroed 4 KiB slots in a pool on the loopback's PD; slot `l` granted for remote writes
// (descriptor `d`), the grant posted.
struct granted_pool {
  loopback lb;
  MemoryRegion buf = need(MemoryRegion::allocate(lb.pd, 8192, access::local_write), "buffers");
  GrantPool pool = [this] {
    std::memset(buf.address(), 0, 8192);
    return need(GrantPool::create(lb.pd, buf, {.slot_size = 4096}), "pool");
  }();
  GrantLease l = need(pool.acquire(), "acquire");
  remote_descriptor d = [this] {
    auto b = lb.b.start_send();
    auto r = need(pool.grant(b, lb.b, l, access::remote_write), "grant");
    need(b.submit(), "submit");
    return r;
  }();
};
} // namespace

TEST_CASE("GrantPool::revoke on a QP in ERR is refused (it would be flushed and rolled back); "
          "revoke_all kills the key", "[grant-core][grants]") {
  granted_pool g;
  auto &[lb, buf, pool, l, d] = g;
  need(lb.b.to_error(), "owner QP to ERR (as a disconnect does)");
  auto r = pool.revoke(lb.b, l);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::wrong_state);
  {
    auto b2 = lb.b.start_send();
    CHECK(pool.revoke(b2, lb.b, l).error() == errc::wrong_state);
  } // dropped: nothing was added
  ibv_wc wc[8];
  while (lb.cq_b.poll(wc).value() > 0) {}
  need(pool.revoke_all(), "revoke_all");
  lb.recover();
  std::vector<unsigned char> src(64, 0x31);
  auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), d.addr, d.rkey)));
  CHECK(all_equal(buf.address(), 8192, 0));
  lb.recover();
}

TEST_CASE("ExactGrant, the one-shot grant: exactly the bytes, live on return, dead after revoke, "
          "a stray send-with-invalidate refused", "[grant-core]") {
  loopback lb;
  constexpr std::size_t N = 16384, off = 4097, len = 3001;
  std::vector<unsigned char> mem(N, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), N, access::local_write), "owner mr");
  std::vector<unsigned char> src(64, 0x6B);
  auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  // Refusals before any verb.
  CHECK(ExactGrant::create(lb.pd, mr, {off, 0}, access::remote_write).error() == errc::zero_length);
  CHECK(ExactGrant::create(lb.pd, mr, {N - 8, 64}, access::remote_write).error() == errc::out_of_range);
  CHECK(ExactGrant::create(lb.pd, mr, {off, len}, access::local_write).error() == errc::bad_grant_rights);
  auto ro = need(MemoryRegion::reg(lb.pd, mem.data(), N, {}), "read-only region");
  CHECK(ExactGrant::create(lb.pd, ro, {off, len}, access::remote_write).error() == errc::missing_access);

  auto g = need(ExactGrant::create(lb.pd, mr, {off, len}, access::remote_write), "grant");
  const auto d = g.descriptor();
  REQUIRE(d.length == len);
  // Live on return: the last 64 bytes of the grant.
  REQUIRE(lb.write(src_mr.sge(0, 64), d.at(len - 64)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data() + off + len - 64, 64, 0x6B));
  std::memset(mem.data() + off + len - 64, 0, 64);
  // One byte past the grant: refused, nothing written (also not inside the grant).
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), d.addr + len - 63,
                            d.rkey)));
  CHECK(all_equal(mem.data(), N, 0));
  lb.recover();
  // One byte before it: refused.
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 1), d.addr - 1, d.rkey)));
  CHECK(all_equal(mem.data(), N, 0));
  lb.recover();
  // A hostile peer's send-with-invalidate naming the key, twice: refused, no panic, and the
  // grant still works afterwards.
  std::vector<unsigned char> rx(64);
  auto rx_mr = need(MemoryRegion::reg(lb.pd, rx.data(), rx.size(), access::local_write), "rx");
  for (int i = 0; i < 2; ++i) {
    need(lb.b.post_recv(500u + unsigned(i), rx_mr.sge()), "post_recv");
    // On rxe the peer's send completes; the refusal is the owner's receive completing with
    // REM_INV_REQ_ERR (REFERENCE.md 4b), and the owner's QP goes to ERR.
    (void)peer_post(lb.a, lb.cq_a, IBV_WR_SEND_WITH_INV, src_mr.sge(0, 8), 0, d.rkey);
    const ibv_wc owner = wait_wc(lb.cq_b, 1).front();
    CHECK(owner.wr_id == 500u + unsigned(i));
    CHECK(owner.status == IBV_WC_REM_INV_REQ_ERR);
    lb.recover();
  }
  REQUIRE(lb.write(src_mr.sge(0, 8), d.at(0)) == IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data() + off, 8, 0x6B));
  std::memset(mem.data() + off, 0, 8);
  // Dead after revoke.
  need(g.destroy(), "revoke");
  CHECK_FALSE(g);
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 8), d.addr, d.rkey)));
  CHECK(all_equal(mem.data(), N, 0));
  lb.recover();
}

namespace {
// Memory regions of this process's device as `rdma resource show mr` counts them.
std::size_t mr_count() {
  std::size_t n = 0;
  if (FILE *f = ::popen("rdma resource show mr 2>/dev/null", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (std::strstr(line, "mrn")) ++n;
    ::pclose(f);
  }
  return n;
}
void configure_confirmed(loopback &lb, IndirectKey &k, const layout &l, std::uint64_t id) {
  auto b = lb.b.start_send();
  need(k.configure(b, lb.b, l, access::local_write | access::remote_write, {id, send_flag::signaled}),
       "configure");
  need(b.submit(), "submit");
  REQUIRE(k.complete(wait_one(lb.cq_b)));
}
} // namespace

TEST_CASE("a software IndirectKey reuses the exact regions of unchanged segments across "
          "configures and gives them back", "[grant-core][ikey]") {
  loopback lb;
  std::vector<unsigned char> mem(16384, 0);
  auto mr = need(MemoryRegion::reg(lb.pd, mem.data(), mem.size(), access::local_write), "mr");
  std::vector<unsigned char> src(64, 0x3C);
  auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  auto key = need(IndirectKey::create(lb.pd, 4, {.backend = umr_backend::software}), "key");
  const layout l = layout::list({{mr, 100, 300}, {mr, 5000, 200}});
  const std::size_t base = mr_count();
  configure_confirmed(lb, key, l, 61);
  CHECK(key.kept_regions() == 2);
  CHECK(mr_count() == base + 2);
  const auto first = need(key.descriptor(), "descriptor 1");
  need(key.revoke(), "invalidate");
  CHECK(key.kept_regions() == 2); // kept for the next configure
  // The old keys are dead at once although the regions stay (they carry no remote rights).
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 16), first.segments()[0].addr,
                            first.segments()[0].rkey)));
  CHECK(all_equal(mem.data(), mem.size(), 0));
  lb.recover();
  // The underlying region is counted while its exact regions are kept.
  CHECK(mr.destroy().error() == errc::region_granted);

  // The same layout again: nothing registered, new keys, the old ones still dead.
  configure_confirmed(lb, key, l, 62);
  CHECK(mr_count() == base + 2);
  const auto second = need(key.descriptor(), "descriptor 2");
  for (std::size_t i = 0; i < 2; ++i) CHECK(second.segments()[i].rkey != first.segments()[i].rkey);
  REQUIRE(lb.write(src_mr.sge(0, 16), {second.segments()[1].addr + 184, second.segments()[1].rkey}) ==
          IBV_WC_SUCCESS);
  CHECK(all_equal(mem.data() + 5184, 16, 0x3C));
  std::memset(mem.data() + 5184, 0, 16);
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 16), first.segments()[1].addr,
                            first.segments()[1].rkey)));
  CHECK(all_equal(mem.data(), mem.size(), 0));
  lb.recover();
  need(key.revoke(), "invalidate 2");

  // One segment changed: its region is replaced, the other kept; a shorter layout gives back the
  // regions it does not use.
  configure_confirmed(lb, key, layout::list({{mr, 100, 300}, {mr, 6000, 200}}), 63);
  CHECK(key.kept_regions() == 2);
  CHECK(mr_count() == base + 2);
  need(key.revoke(), "invalidate 3");
  configure_confirmed(lb, key, layout::list({{mr, 100, 300}}), 64);
  CHECK(key.kept_regions() == 1);
  CHECK(mr_count() == base + 1);
  CHECK(key.destroy_kept_regions().error() == errc::already_bound); // its layout uses them
  need(key.revoke(), "invalidate 4");
  need(key.destroy_kept_regions(), "destroy_kept_regions");
  CHECK(key.kept_regions() == 0);
  CHECK(mr_count() == base);
  need(mr.destroy(), "dereg: nothing counts on it any more");
}

TEST_CASE("GrantPool::destroy, the checked destruction: every key dead when it returns, the pool "
          "null, its leases inert", "[grant-core][grants]") {
  granted_pool g;
  auto &[lb, buf, pool, l, d] = g;
  std::vector<unsigned char> src(64, 0x21);
  auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  REQUIRE(lb.write(src_mr.sge(0, 64), d.at(0)) == IBV_WC_SUCCESS); // live while granted
  std::memset(buf.address(), 0, 64);
  need(pool.destroy(), "destroy");
  CHECK_FALSE(pool);
  CHECK(pool.destroy().error() == errc::null_handle);
  CHECK(l.state() == lease_state::ready);
  CHECK(l.buffer().error() == errc::null_handle); // the pool is gone
  CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), d.addr, d.rkey)));
  CHECK(all_equal(buf.address(), 8192, 0));
  lb.recover();
  need(buf.destroy(), "the buffers' region: nothing counts on it any more");
}

// Issue 24, "How cost grows": a large pool of which a connection uses few slots costs only what it
// uses. A slot's first lease registers its exact region and allocates its window; a first lease
// that fails (here: rxe cannot pin the slot's pages, made inaccessible) leaves nothing allocated
// and the slot free, and the next acquire() makes it.
TEST_CASE("a GrantPool with lazy slots makes each slot at its first lease; a failed one leaves "
          "nothing allocated", "[grant-core][grants]") {
  loopback lb;
  constexpr std::size_t slot = 4096, n = 64;
  auto buf = need(MemoryRegion::allocate(lb.pd, slot * n, access::local_write), "buffers");
  auto *bytes = static_cast<unsigned char *>(buf.address());
  std::memset(bytes, 0, slot * n);
  const std::size_t mrs0 = mr_count();
  const std::string before = kernel_resources();
  {
    auto pool = need(GrantPool::create(lb.pd, buf, {.slot_size = slot, .lazy_slots = true}), "pool");
    CHECK(pool.size() == n);
    CHECK(pool.available() == n);
    CHECK(pool.stats().slots_made == 0);
    CHECK(mr_count() == mrs0); // no exact region yet

    // Slot 0 is the first out: its pages inaccessible, the registration fails.
    REQUIRE(::mprotect(bytes, slot, PROT_NONE) == 0);
    auto bad = pool.acquire();
    REQUIRE(::mprotect(bytes, slot, PROT_READ | PROT_WRITE) == 0);
    REQUIRE_FALSE(bad);
    INFO(bad.error().message());
    CHECK(bad.error().value() == EFAULT);
    CHECK(pool.available() == n);
    CHECK(pool.stats().slots_made == 0);
    CHECK(kernel_resources() == before); // nothing left allocated

    auto l = need(pool.acquire(), "acquire once the pages are back");
    CHECK(l.slot() == 0);
    CHECK(pool.stats().slots_made == 1);
    CHECK(mr_count() == mrs0 + 1);
    std::vector<unsigned char> src(slot + 1, 0x5A), sink(8, 0);
    auto src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
    auto sink_mr = need(MemoryRegion::reg(lb.pd, sink.data(), sink.size(), remote_rw), "sink");
    auto b = lb.b.start_send();
    const remote_descriptor d = need(pool.grant(b, lb.b, l, access::remote_write), "grant");
    // The grant's bind is unsignaled and works once executed: a fenced, signaled write after it in
    // the batch tells when (grant()'s contract: the request follows with a fence). On Linux 6.1 rxe
    // executed it within submit(); on 6.12 a workqueue does, and the peer's write below could
    // otherwise reach the window before it was bound.
    b.write({99, send_flag::fence | send_flag::signaled}, {sink_mr.iova(), sink_mr.rkey()}, src_mr.sge(0, 8));
    need(b.submit(), "submit");
    REQUIRE(wait_wc(lb.cq_b, 1).front().status == IBV_WC_SUCCESS);
    CHECK(d.addr == reinterpret_cast<std::uintptr_t>(bytes));
    CHECK(d.length == slot);
    // One byte past the slot is refused (its exact region), the slot itself lands.
    CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, std::uint32_t(slot + 1)),
                              d.addr, d.rkey)));
    CHECK(all_equal(bytes, slot * n, 0));
    lb.recover();
    CHECK(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, std::uint32_t(slot)), d.addr, d.rkey) ==
          IBV_WC_SUCCESS);
    CHECK(all_equal(bytes, slot, 0x5A));
    CHECK(all_equal(bytes + slot, slot * (n - 1), 0));
    need(pool.revoke(lb.b, l), "revoke");
    auto wc = wait_wc(lb.cq_b, 1);
    REQUIRE(wc.front().status == IBV_WC_SUCCESS);
    (void)pool.complete(std::span<ibv_wc>(wc));
    REQUIRE(l.state() == lease_state::ready);
    CHECK(is_denial(peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src_mr.sge(0, 64), d.addr, d.rkey)));
    lb.recover();
    need(pool.give_back(l), "release");
    // The next lease reuses the made slot: nothing new registered.
    auto l2 = need(pool.acquire(), "acquire again");
    CHECK(l2.slot() == 0);
    CHECK(pool.stats().slots_made == 1);
    auto l3 = need(pool.acquire(), "a second slot");
    CHECK(l3.slot() == 1);
    CHECK(pool.stats().slots_made == 2);
    CHECK(mr_count() == mrs0 + 4); // two slots' exact regions, src and sink
    need(pool.give_back(l2), "release");
    need(pool.give_back(l3), "release");
    need(pool.destroy(), "destroy");
  }
  CHECK(kernel_resources() == before);
}
