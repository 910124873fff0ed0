// [hostile] grants against a hostile peer on a real rxe device (issue 16). The peer posts with
// plain libibverbs (ibv_post_send on its QP's ibv_qp, no rdmaxx checks in the way): reads, writes
// and atomics just outside, across and inside every key rdmaxx hands out in the default
// configuration, send-with-invalidate naming it once and twice and naming its neighbours, and
// another peer's key over its own QP, in every state of the grant. The owner checks after every
// step that its memory outside live grants is byte-identical, that revoked keys are dead and that
// every denial is a remote-access or remote-invalid-request completion. A kernel panic ends the
// VM (tools/rxe-vm exits 125 and shows it); kernel warnings fail run-suite.
//
// [.canaryN] (hidden, run by test/rxe/run-canaries, type2_risk accepted, one VM boot each):
// the four panic sequences of issue 16 with the unsafe type-2 mode forced. Each passes only by
// panicking the guest kernel: they show that the default's guard is needed on this kernel.
#include "fixture.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <cinttypes>
#include <ctime>
#include <memory>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace rxe;

namespace {

constexpr access_flags all_rights = access::remote_read | access::remote_write | access::remote_atomic;

struct tally {
  int attempts = 0, denied = 0, breaches = 0;
  ~tally() {
    std::printf("[hostile] attempts %d, denied %d, breaches %d, panics 0 (a panic ends the VM)\n",
                attempts, denied, breaches);
  }
};
tally &totals() {
  static tally t;
  return t;
}


// Owner memory with a shadow copy: everything outside live grants must stay equal to it.
struct owner_mem {
  static constexpr std::size_t size = 16384;
  std::vector<unsigned char> mem = std::vector<unsigned char>(size), shadow;
  owner_mem() {
    fill(mem.data(), mem.size(), 61);
    shadow = mem;
  }
  void check(const char *after) {
    const bool same = std::memcmp(mem.data(), shadow.data(), size) == 0;
    if (!same) ++totals().breaches;
    INFO("owner memory after " << after);
    CHECK(same);
  }
};

// What a peer needs: its QP pair to the owner (a: the peer, b: the owner's end) and local buffers.
struct peer_side {
  qp_pair qp;
  std::vector<unsigned char> buf = std::vector<unsigned char>(8192, 0xA5);
  std::vector<unsigned char> rbuf = std::vector<unsigned char>(64, 0);
  MemoryRegion mr, owner_rmr;
  peer_side(const Context &ctx, const ProtectionDomain &pd)
      : qp(ctx, pd), mr(need(MemoryRegion::reg(pd, buf.data(), buf.size(), access::local_write), "peer mr")),
        owner_rmr(need(MemoryRegion::reg(pd, rbuf.data(), rbuf.size(), access::local_write), "recv mr")) {}
  ibv_sge sge(std::uint32_t len) { return mr.sge(0, len); }
};

// One hostile attempt: expected to be denied. Recovers both QPs after the denial.
void expect_denied(peer_side &p, owner_mem &o, ibv_wr_opcode op, std::uint64_t raddr, std::uint32_t len,
                   std::uint32_t rkey, const char *what) {
  ++totals().attempts;
  std::memset(p.buf.data(), 0xA5, p.buf.size());
  if (op == IBV_WR_SEND_WITH_INV) need(p.qp.b.post_recv(9, p.owner_rmr.sge()), "owner post_recv");
  ibv_wc_status s = peer_post(p.qp.a, p.qp.cq_a, op, p.sge(len), raddr, rkey);
  INFO(what << ": peer completion " << ibv_wc_status_str(s));
  if (op == IBV_WR_SEND_WITH_INV) {
    // The send itself is acknowledged (the peer sees success); the refusal is the owner's
    // receive completing with a remote-invalid-request error (and the owner's QP in ERR).
    const ibv_wc owner = wait_wc(p.qp.cq_b, 1).front();
    INFO("owner's receive: " << ibv_wc_status_str(owner.status));
    CHECK(owner.status == IBV_WC_REM_INV_REQ_ERR);
    s = owner.status;
  }
  if (s == IBV_WC_SUCCESS) ++totals().breaches;
  else if (is_denial(s)) ++totals().denied;
  CHECK(is_denial(s));
  // A denied read or atomic returned nothing.
  if (op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP)
    CHECK(all_equal(p.buf.data(), len, 0xA5));
  p.qp.recover();
  o.check(what);
}

// Every hostile access around a live grant [addr, addr + len) under `rkey`.
void attack_around(peer_side &p, owner_mem &o, std::uint64_t addr, std::uint64_t len, std::uint32_t rkey) {
  struct probe { ibv_wr_opcode op; std::int64_t off; std::uint32_t n; const char *what; };
  REQUIRE(len >= 16);
  const std::int64_t L = std::int64_t(len);
  const probe probes[] = {
      {IBV_WR_RDMA_WRITE, -1, 1, "write 1 byte just before"},
      {IBV_WR_RDMA_WRITE, L, 1, "write 1 byte just after"},
      {IBV_WR_RDMA_WRITE, -8, 16, "write across the start"},
      {IBV_WR_RDMA_WRITE, L - 8, 16, "write across the end"},
      {IBV_WR_RDMA_WRITE, 0, std::uint32_t(len + 1), "write one byte too long"},
      {IBV_WR_RDMA_WRITE, -4096, 64, "write a page before"},
      {IBV_WR_RDMA_READ, -1, 1, "read 1 byte just before"},
      {IBV_WR_RDMA_READ, L, 1, "read 1 byte just after"},
      {IBV_WR_RDMA_READ, -8, 16, "read across the start"},
      {IBV_WR_RDMA_READ, L - 8, 16, "read across the end"},
      {IBV_WR_RDMA_READ, L + 2048, 64, "read 2 KiB past the end"},
  };
  for (const auto &pr : probes)
    expect_denied(p, o, pr.op, std::uint64_t(std::int64_t(addr) + pr.off), pr.n, rkey, pr.what);
  // Atomics at 8-byte aligned addresses (a misaligned one is refused for its alignment).
  expect_denied(p, o, IBV_WR_ATOMIC_FETCH_AND_ADD, addr / 8 * 8 - 8, 8, rkey, "fetch-add just before");
  expect_denied(p, o, IBV_WR_ATOMIC_CMP_AND_SWP, (addr + len + 7) / 8 * 8, 8, rkey,
                "compare-swap just after");
}

// A write inside the grant must land (and only there); a read inside must return the owner's bytes.
void use_inside(peer_side &p, owner_mem &o, std::uint64_t addr, std::uint64_t len, std::uint32_t rkey,
                std::size_t owner_off, unsigned seed) {
  fill(p.buf.data(), len, seed);
  REQUIRE(peer_post(p.qp.a, p.qp.cq_a, IBV_WR_RDMA_WRITE, p.sge(std::uint32_t(len)), addr, rkey) ==
          IBV_WC_SUCCESS);
  std::memcpy(o.shadow.data() + owner_off, p.buf.data(), len);
  o.check("a write inside the grant");
  std::memset(p.buf.data(), 0, len);
  REQUIRE(peer_post(p.qp.a, p.qp.cq_a, IBV_WR_RDMA_READ, p.sge(std::uint32_t(len)), addr, rkey) ==
          IBV_WC_SUCCESS);
  CHECK(std::memcmp(p.buf.data(), o.mem.data() + owner_off, len) == 0);
}

// A dead key: every access through it, inside the old range included, is denied.
void expect_dead(peer_side &p, owner_mem &o, std::uint64_t addr, std::uint64_t len, std::uint32_t rkey,
                 const char *state) {
  INFO("state: " << state);
  expect_denied(p, o, IBV_WR_RDMA_WRITE, addr, std::uint32_t(len), rkey, "write inside a revoked grant");
  expect_denied(p, o, IBV_WR_RDMA_READ, addr, 64, rkey, "read inside a revoked grant");
  expect_denied(p, o, IBV_WR_ATOMIC_FETCH_AND_ADD, (addr + 7) / 8 * 8, 8, rkey,
                "fetch-add inside a revoked grant");
}

// Send-with-invalidate naming `rkey` (and its neighbours), each twice: no panic, each refused.
void invalidate_attacks(peer_side &p, owner_mem &o, std::uint32_t rkey) {
  for (std::uint32_t k : {rkey, rkey, ::ibv_inc_rkey(rkey), rkey - 1}) {
    expect_denied(p, o, IBV_WR_SEND_WITH_INV, 0, 8, k, "send-with-invalidate");
  }
}

remote_descriptor bind_wait(StrictGrant &g, QueuePair &qp, CompletionQueue &cq, access_flags rights,
                            std::uint64_t id = 500) {
  auto d = need(g.grant(qp, rights, {id, send_flag::signaled}), "grant bind");
  CHECK(g.window().complete(wait_one(cq)));
  return d;
}

enum class grant_state { granted, regranted, after_owner_qp_reset, unbound, revoked };
const char *name(grant_state s) {
  switch (s) {
  case grant_state::granted: return "granted";
  case grant_state::regranted: return "re-granted (bind, unbind, bind)";
  case grant_state::after_owner_qp_reset: return "granted, then the owner's QP reset and reconnected";
  case grant_state::unbound: return "revoked by unbind";
  case grant_state::revoked: return "revoked by revoke() (dealloc + dereg)";
  }
  return "?";
}

} // namespace

TEST_CASE("[hostile] the default grant on rxe is a type-1 window over an exact region", "[hostile]") {
  device_pd d;
  const auto caps = need(d.ctx.query_capabilities({false, false}), "caps");
  CHECK(caps.remote_inv_unbound_mw_panics == tristate::yes);
  CHECK(caps.grant == grant_mechanism::type1_exact_region);
  owner_mem o;
  auto mr = need(MemoryRegion::reg(d.pd, o.mem.data(), o.size, access::local_write), "owner mr");
  // No remote rights and no MW_BIND on the owner's region: the grant registers its own.
  auto g = need(StrictGrant::create(d.pd, mr, {1000, 3000}), "grant");
  CHECK(g.mechanism() == grant_mechanism::type1_exact_region);
  // The owner's MR has no key a peer could use (its rkey: 0 on Linux 6.1, its lkey on 6.12).
  peer_side p(d.ctx, d.pd);
  check_local_only_rkey(p.qp, mr, o.mem.data(), o.size, p.mr, p.buf.data(), p.buf.size());
  o.check("a peer's write and read with the owner MR's rkey");
  need(g.destroy(), "revoke");
}

TEST_CASE("[hostile] default grant: a hostile peer in every state: no breach, no panic", "[hostile]") {
  const grant_state st = GENERATE(grant_state::granted, grant_state::regranted,
                                  grant_state::after_owner_qp_reset, grant_state::unbound,
                                  grant_state::revoked);
  INFO("grant state: " << name(st));
  device_pd d;
  owner_mem o;
  auto mr = need(MemoryRegion::reg(d.pd, o.mem.data(), o.size, access::local_write), "owner mr");
  peer_side p(d.ctx, d.pd);
  constexpr std::size_t off = 4097, len = 3001; // unaligned on both ends
  auto g = need(StrictGrant::create(d.pd, mr, {off, len}), "grant");
  auto desc = bind_wait(g, p.qp.b, p.qp.cq_b, all_rights);
  if (st == grant_state::regranted) {
    need(g.revoke(p.qp.b, {501, send_flag::signaled}), "unbind");
    CHECK(g.window().complete(wait_one(p.qp.cq_b)));
    expect_dead(p, o, desc.addr, len, desc.rkey, "between grants");
    desc = bind_wait(g, p.qp.b, p.qp.cq_b, all_rights, 502);
  }
  if (st == grant_state::after_owner_qp_reset) p.qp.recover();
  const bool live = st != grant_state::unbound && st != grant_state::revoked;
  if (live) {
    use_inside(p, o, desc.addr, len, desc.rkey, off, 3);
    attack_around(p, o, desc.addr, len, desc.rkey);
    invalidate_attacks(p, o, desc.rkey);
    // The peer's invalidations did not end the grant (type 1 cannot be remotely invalidated).
    CHECK(g.window().state() == mw_state::bound);
    use_inside(p, o, desc.addr, len, desc.rkey, off, 4);
    // Revoke (unbind) after all that: the key is dead.
    need(g.revoke(p.qp.b, {503, send_flag::signaled}), "unbind after the attacks");
    CHECK(g.window().complete(wait_one(p.qp.cq_b)));
    expect_dead(p, o, desc.addr, len, desc.rkey, "unbound after the attacks");
  } else {
    if (st == grant_state::unbound) {
      need(g.revoke(p.qp.b, {504, send_flag::signaled}), "unbind");
      CHECK(g.window().complete(wait_one(p.qp.cq_b)));
    } else {
      need(g.destroy(), "revoke");
    }
    expect_dead(p, o, desc.addr, len, desc.rkey, name(st));
    invalidate_attacks(p, o, desc.rkey);
  }
  o.check("the whole case");
  if (g) need(g.destroy(), "revoke at the end");
}

TEST_CASE("[hostile] per-peer isolation: a grant on peer A's PD is refused from peer B's QP",
          "[hostile]") {
  device_pd d; // the owner's memory is registered on this PD
  auto pd_a = need(ProtectionDomain::alloc(d.ctx), "pd a");
  auto pd_b = need(ProtectionDomain::alloc(d.ctx), "pd b");
  owner_mem o;
  auto mr = need(MemoryRegion::reg(d.pd, o.mem.data(), o.size, access::local_write), "owner mr");
  {
    peer_side a(d.ctx, pd_a), b(d.ctx, pd_b);
    auto ga = need(StrictGrant::create(pd_a, mr, {0, 4096}), "grant for a");
    auto gb = need(StrictGrant::create(pd_b, mr, {8192, 4096}), "grant for b");
    const auto da = bind_wait(ga, a.qp.b, a.qp.cq_b, all_rights);
    const auto db = bind_wait(gb, b.qp.b, b.qp.cq_b, all_rights);
    use_inside(a, o, da.addr, 4096, da.rkey, 0, 5);
    use_inside(b, o, db.addr, 4096, db.rkey, 8192, 6);
    // Each peer uses the other's key over its own QP: refused.
    expect_denied(b, o, IBV_WR_RDMA_WRITE, da.addr, 64, da.rkey, "b writes with a's key");
    expect_denied(b, o, IBV_WR_RDMA_READ, da.addr, 64, da.rkey, "b reads with a's key");
    expect_denied(a, o, IBV_WR_RDMA_WRITE, db.addr, 64, db.rkey, "a writes with b's key");
    expect_denied(b, o, IBV_WR_SEND_WITH_INV, 0, 8, da.rkey, "b invalidates a's key");
    // a's grant survived all of it.
    CHECK(ga.window().state() == mw_state::bound);
    use_inside(a, o, da.addr, 4096, da.rkey, 0, 7);
    // What the isolation rests on: on one PD a type-1 key works from every QP of that PD.
    peer_side a2(d.ctx, pd_a);
    use_inside(a2, o, da.addr, 4096, da.rkey, 0, 8);
    need(ga.destroy(), "revoke a");
    need(gb.destroy(), "revoke b");
    expect_dead(a, o, da.addr, 4096, da.rkey, "a revoked");
  }
  o.check("isolation");
}

TEST_CASE("[hostile] misuse sequences 3 and 4 through the public API: no panic, keys dead",
          "[hostile]") {
  device_pd d;
  owner_mem o;
  auto mr = need(MemoryRegion::reg(d.pd, o.mem.data(), o.size, access::local_write), "owner mr");
  peer_side a(d.ctx, d.pd), b(d.ctx, d.pd);
  auto ga = need(StrictGrant::create(d.pd, mr, {0, 2048}), "grant a");
  auto gb = need(StrictGrant::create(d.pd, mr, {4096, 2048}), "grant b");
  const auto da = bind_wait(ga, a.qp.b, a.qp.cq_b, all_rights);
  const auto db = bind_wait(gb, b.qp.b, b.qp.cq_b, all_rights);
  // 3: the peer's send-with-invalidate arrives; the owner polls that receive but does not hand it
  // to complete(); then it revokes with unbind.
  need(a.qp.b.post_recv(9, a.owner_rmr.sge()), "post_recv");
  (void)peer_post(a.qp.a, a.qp.cq_a, IBV_WR_SEND_WITH_INV, a.sge(8), 0, da.rkey);
  const ibv_wc owner_wc = wait_wc(a.qp.cq_b, 1).front(); // not handed to complete()
  CHECK(owner_wc.status == IBV_WC_REM_INV_REQ_ERR);
  a.qp.recover();
  need(ga.revoke(a.qp.b, {601, send_flag::signaled}), "unbind a");
  CHECK(ga.window().complete(wait_one(a.qp.cq_b)));
  expect_dead(a, o, da.addr, 2048, da.rkey, "sequence 3");
  // 4: peer a invalidates b's key over a's own connection; the owner hands a's completions to a's
  // grants only, then revokes b.
  need(a.qp.b.post_recv(9, a.owner_rmr.sge()), "post_recv");
  (void)peer_post(a.qp.a, a.qp.cq_a, IBV_WR_SEND_WITH_INV, a.sge(8), 0, db.rkey);
  for (const ibv_wc &wc : wait_wc(a.qp.cq_b, 1)) {
    CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR);
    CHECK_FALSE(ga.window().complete(wc));
  }
  a.qp.recover();
  use_inside(b, o, db.addr, 2048, db.rkey, 4096, 9); // b's grant still works
  need(gb.revoke(b.qp.b, {602, send_flag::signaled}), "unbind b");
  CHECK(gb.window().complete(wait_one(b.qp.cq_b)));
  expect_dead(b, o, db.addr, 2048, db.rkey, "sequence 4");
  need(ga.destroy(), "revoke a");
  need(gb.destroy(), "revoke b");
  o.check("sequences 3 and 4");
}

TEST_CASE("[hostile] a re-registered region's key: send-with-invalidate and out-of-bounds refused",
          "[hostile]") {
  device_pd d;
  owner_mem o;
  auto mr = need(MemoryRegion::reg(d.pd, o.mem.data() + 4096, 4096, access::local_write), "owner mr");
  need(mr.rereg(change_access(access::local_write | access::remote_write | access::remote_read)),
       "rereg: grant");
  peer_side p(d.ctx, d.pd);
  use_inside(p, o, mr.iova(), 4096, mr.rkey(), 4096, 10);
  attack_around(p, o, mr.iova(), 4096, mr.rkey());
  invalidate_attacks(p, o, mr.rkey());
  use_inside(p, o, mr.iova(), 4096, mr.rkey(), 4096, 11);
  const auto old_key = mr.rkey();
  need(mr.rereg(change_access(access::local_write)), "rereg: revoke");
  expect_dead(p, o, mr.iova(), 4096, old_key, "after the revoking rereg");
  invalidate_attacks(p, o, old_key);
}

TEST_CASE("[hostile] indirect-key segment keys: each reaches exactly its segment, no panic",
          "[hostile][ikey]") {
  device_pd d;
  owner_mem o;
  // Two segments of one MR (the 3000-byte segment and its neighbour) and one of another.
  auto m1 = need(MemoryRegion::reg(d.pd, o.mem.data(), 8192,
                                   access::local_write | access::remote_write | access::remote_read |
                                       access::mw_bind),
                 "owner mr 1");
  auto m2 = need(MemoryRegion::reg(d.pd, o.mem.data() + 8192, 8192,
                                   access::local_write | access::remote_write | access::remote_read |
                                       access::mw_bind),
                 "owner mr 2");
  peer_side p(d.ctx, d.pd);
  auto key = need(IndirectKey::create(d.pd, 4), "ikey");
  REQUIRE(key.backend() == umr_backend::software);
  const layout l = layout::list({{m1, 1000, 3000}, {m1, 5000, 2000}, {m2, 100, 1500}});
  const std::size_t owner_off[] = {1000, 5000, 8192 + 100};
  {
    auto b = p.qp.b.start_send();
    need(key.configure(b, p.qp.b, l, access::local_write | access::remote_write | access::remote_read,
                       {800, send_flag::signaled}),
         "configure");
    need(b.submit(), "submit");
  }
  {
    const ibv_wc wc = wait_one(p.qp.cq_b);
    CHECK(wc.wr_id == 800);
    CHECK(key.complete(wc));
  }
  const auto desc = need(key.descriptor(), "descriptor");
  REQUIRE(desc.segments().size() == 3);
  // The underlying regions are counted: they cannot be deregistered under the key.
  CHECK(m1.destroy().error() == errc::region_granted);
  for (std::size_t i = 0; i < 3; ++i) {
    const remote_segment sg = desc.segments()[i];
    INFO("segment " << i);
    use_inside(p, o, sg.addr, sg.length, sg.rkey, owner_off[i], unsigned(20 + i));
    attack_around(p, o, sg.addr, sg.length, sg.rkey);
    // The cases: a 4096-byte write through the 3000-byte segment, a read 2 KiB past it.
    expect_denied(p, o, IBV_WR_RDMA_WRITE, sg.addr, 4096, sg.rkey, "4096-byte write through the segment");
    // One segment's key aimed at another segment of the same MR.
    const remote_segment other = desc.segments()[(i + 1) % 3];
    expect_denied(p, o, IBV_WR_RDMA_WRITE, other.addr, 64, sg.rkey, "a segment's key on another segment");
    invalidate_attacks(p, o, sg.rkey);
    use_inside(p, o, sg.addr, sg.length, sg.rkey, owner_off[i], unsigned(30 + i)); // still granted
  }
  // The underlying MRs' own rkeys are not handed out; revoke and check every segment key dead.
  need(key.revoke(), "invalidate");
  for (const remote_segment &sg : desc.segments()) {
    expect_dead(p, o, sg.addr, sg.length, sg.rkey, "after invalidate");
    invalidate_attacks(p, o, sg.rkey);
  }
  // The key keeps its exact regions for the next configure, so m1 is still counted; giving
  // them back frees it.
  CHECK(m1.destroy().error() == errc::region_granted);
  need(key.destroy_kept_regions(), "release the kept exact regions");
  need(m1.destroy(), "dereg m1 after the key is invalidated");
  need(key.destroy(), "destroy key");
  o.check("indirect key");
}

// ---- the seeded hostile-peer fuzzer ----
// Two peers, each on its own PD (the per-peer isolation of the default), each with two grant slots
// (StrictGrant on its PD over a seeded range of the owner's 64 KiB). Every step the owner may
// grant, end (unbind) or revoke-and-recreate a slot on its own seeded schedule; then one peer
// issues a seeded operation (read, write, fetch-add, compare-swap, send-with-invalidate) with a
// current, revoked, neighbouring or other peer's key at an address inside, at the edges of, across
// or around a grant. The expectation is computed from the live grants; after every step the owner
// checks all its memory against the shadow (only allowed writes/atomics change it) and every key
// it revoked is re-tried dead. RDMAXX_HOSTILE_SEED replays a run; RDMAXX_HOSTILE_SECONDS bounds it
// (default 60).
namespace {
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};
struct slot {
  int peer = 0;
  StrictGrant g;
  std::uint64_t off = 0, len = 0;
  bool bound = false;
  remote_descriptor d{};
  access_flags rights;
};
struct dead_key {
  std::uint64_t addr, len;
  std::uint32_t rkey;
};
std::uint64_t env_u64(const char *name, std::uint64_t dflt) {
  const char *v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 0) : dflt;
}
} // namespace

TEST_CASE("[hostile-fuzz] seeded hostile peers against a granting, re-granting, revoking owner",
          "[hostile-fuzz]") {
  const std::uint64_t seed = env_u64("RDMAXX_HOSTILE_SEED", std::uint64_t(std::time(nullptr)));
  const std::uint64_t seconds = env_u64("RDMAXX_HOSTILE_SECONDS", 60);
  std::printf("[hostile-fuzz] seed %llu (RDMAXX_HOSTILE_SEED=%llu replays), %llu s\n",
              (unsigned long long)seed, (unsigned long long)seed, (unsigned long long)seconds);
  std::fflush(stdout);
  rng r{seed * 2654435761u + 1};
  device_pd d;
  ProtectionDomain pds[2] = {need(ProtectionDomain::alloc(d.ctx), "pd 0"),
                             need(ProtectionDomain::alloc(d.ctx), "pd 1")};
  constexpr std::size_t M = 65536;
  std::vector<unsigned char> mem(M), shadow;
  fill(mem.data(), M, 99);
  shadow = mem;
  auto mr = need(MemoryRegion::reg(d.pd, mem.data(), M, access::local_write), "owner mr");
  std::vector<std::unique_ptr<peer_side>> peers;
  peers.push_back(std::make_unique<peer_side>(d.ctx, pds[0]));
  peers.push_back(std::make_unique<peer_side>(d.ctx, pds[1]));
  std::vector<slot> slots(4);
  std::vector<dead_key> dead;
  auto make_slot = [&](slot &sl, int peer) {
    sl.peer = peer;
    sl.len = 16 + r.below(4000);
    sl.off = 64 + r.below(M - sl.len - 128);
    sl.g = need(StrictGrant::create(pds[peer], mr, {sl.off, sl.len}), "fuzz grant");
    sl.bound = false;
  };
  for (int i = 0; i < 4; ++i) make_slot(slots[std::size_t(i)], i / 2);
  long ops = 0, attempts = 0, denied = 0, breaches = 0, unexpected = 0, grants = 0, revokes = 0;
  auto drain_owner = [&](peer_side &p) {
    ibv_wc wc[8];
    while (p.qp.cq_b.poll(wc).value() > 0) {}
  };
  auto owner_wait = [&](slot &sl) {
    peer_side &p = *peers[std::size_t(sl.peer)];
    ibv_wc wc = wait_wc(p.qp.cq_b, 1).front();
    CHECK(sl.g.window().complete(wc));
    REQUIRE(wc.status == IBV_WC_SUCCESS);
  };
  auto check_mem = [&](const char *what) {
    if (mem != shadow) {
      ++breaches;
      FAIL_CHECK("owner memory changed outside the live grants after " << what << " (seed " << seed << ")");
      shadow = mem;
    }
  };
  // One peer operation; returns whether it was denied.
  auto attack = [&](int pi, ibv_wr_opcode op, std::uint64_t addr, std::uint32_t len, std::uint32_t key,
                    std::uint64_t add) {
    peer_side &p = *peers[std::size_t(pi)];
    ++attempts;
    // Expectation from the live grants (by key value, so a neighbour that is another live key counts).
    bool allowed = false;
    const slot *hit = nullptr;
    for (const slot &sl : slots)
      if (sl.bound && sl.d.rkey == key) hit = &sl;
    if (hit && op != IBV_WR_SEND_WITH_INV && hit->peer == pi && addr >= hit->d.addr &&
        len <= hit->d.length && addr - hit->d.addr <= hit->d.length - len) {
      const access_flags need_r = op == IBV_WR_RDMA_WRITE  ? access_flags(access::remote_write)
                                  : op == IBV_WR_RDMA_READ ? access_flags(access::remote_read)
                                                           : access_flags(access::remote_atomic);
      allowed = hit->rights.has(need_r) && (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_READ || addr % 8 == 0);
    }
    for (std::size_t k = 0; k < 4096; ++k) p.buf[k] = static_cast<unsigned char>(r.next());
    const std::vector<unsigned char> sent(p.buf.begin(), p.buf.begin() + 4096);
    if (op == IBV_WR_SEND_WITH_INV) need(p.qp.b.post_recv(9, p.owner_rmr.sge()), "post_recv");
    ibv_send_wr w{};
    ibv_sge sge = p.sge(len);
    w.wr_id = 1;
    w.opcode = op;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = &sge;
    w.num_sge = 1;
    if (op == IBV_WR_SEND_WITH_INV) {
      w.invalidate_rkey = key;
    } else if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      w.wr.atomic.remote_addr = addr;
      w.wr.atomic.rkey = key;
      w.wr.atomic.compare_add = op == IBV_WR_ATOMIC_FETCH_AND_ADD ? add : 0;
      w.wr.atomic.swap = add;
    } else {
      w.wr.rdma.remote_addr = addr;
      w.wr.rdma.rkey = key;
    }
    ibv_send_wr *bad = nullptr;
    REQUIRE(::ibv_post_send(p.qp.a.native_handle(), &w, &bad) == 0);
    ibv_wc_status st = wait_wc(p.qp.cq_a, 1, 20s).front().status;
    if (op == IBV_WR_SEND_WITH_INV) st = wait_wc(p.qp.cq_b, 1, 20s).front().status; // the owner's receive
    const bool is_denied = is_denial(st);
    if (allowed && st == IBV_WC_SUCCESS) {
      const std::size_t o = std::size_t(addr - std::uint64_t(reinterpret_cast<std::uintptr_t>(mem.data())));
      if (op == IBV_WR_RDMA_WRITE) std::memcpy(shadow.data() + o, sent.data(), len);
      if (op == IBV_WR_RDMA_READ && std::memcmp(p.buf.data(), mem.data() + o, len) != 0) ++unexpected;
      if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
        std::uint64_t v;
        std::memcpy(&v, shadow.data() + o, 8);
        v = op == IBV_WR_ATOMIC_FETCH_AND_ADD ? v + add : (v == 0 ? add : v);
        std::memcpy(shadow.data() + o, &v, 8);
      }
    } else if (!allowed && st == IBV_WC_SUCCESS) {
      ++breaches;
      FAIL_CHECK("breach: op " << int(op) << " key 0x" << std::hex << key << std::dec << " at " << addr
                               << " len " << len << " succeeded (seed " << seed << ", op " << ops << ")");
    } else if (!is_denied || allowed) {
      ++unexpected;
      FAIL_CHECK("unexpected " << ibv_wc_status_str(st) << " (op " << int(op) << ", len " << len
                               << ", allowed " << allowed << ", seed " << seed
                               << ", op " << ops << ")");
    }
    if (is_denied) {
      ++denied;
      if (op != IBV_WR_RDMA_WRITE && op != IBV_WR_SEND_WITH_INV)
        CHECK(std::memcmp(p.buf.data(), sent.data(), len) == 0); // nothing returned
    }
    if (st != IBV_WC_SUCCESS) p.qp.recover(); // reconnect on ERR
    check_mem("a peer operation");
  };
  const auto t_end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < t_end) {
    ++ops;
    // The owner's schedule.
    slot &sl = slots[r.below(4)];
    const auto act = r.below(10);
    peer_side &op_ = *peers[std::size_t(sl.peer)];
    if (act < 3 && !sl.bound) {
      const access_flags choices[] = {access::remote_read, access::remote_write,
                                      access::remote_read | access::remote_write, all_rights};
      sl.rights = choices[r.below(4)];
      drain_owner(op_);
      sl.d = need(sl.g.grant(op_.qp.b, sl.rights, {500, send_flag::signaled}), "fuzz bind");
      owner_wait(sl);
      sl.bound = true;
      ++grants;
    } else if (act < 5 && sl.bound) {
      need(sl.g.revoke(op_.qp.b, {501, send_flag::signaled}), "fuzz unbind");
      owner_wait(sl);
      sl.bound = false;
      dead.push_back({sl.d.addr, sl.d.length, sl.d.rkey});
      ++revokes;
    } else if (act == 5) {
      if (sl.bound) dead.push_back({sl.d.addr, sl.d.length, sl.d.rkey});
      need(sl.g.destroy(), "fuzz revoke");
      ++revokes;
      make_slot(sl, sl.peer);
    }
    if (dead.size() > 64) dead.erase(dead.begin());
    // Every revoked key is dead: re-try the latest one.
    if (!dead.empty() && (act == 4 || act == 5 || act == 3)) {
      const dead_key &k = dead.back();
      bool live_again = false;
      for (const slot &s2 : slots) live_again = live_again || (s2.bound && s2.d.rkey == k.rkey);
      if (!live_again) attack(int(r.below(2)), IBV_WR_RDMA_WRITE, k.addr, 8, k.rkey, 0);
    }
    // A hostile operation.
    const int pi = int(r.below(2));
    const slot &t = slots[r.below(4)];
    std::uint32_t key = t.g ? t.g.window().rkey() : 1;
    std::uint64_t base = t.d.addr ? t.d.addr : std::uint64_t(reinterpret_cast<std::uintptr_t>(mem.data())) + t.off;
    std::uint64_t glen = t.d.length ? t.d.length : t.len;
    switch (r.below(6)) {
    case 0: if (!dead.empty()) { const dead_key &k = dead[r.below(dead.size())]; key = k.rkey; base = k.addr; glen = k.len; } break;
    case 1: key = ::ibv_inc_rkey(key); break;
    case 2: key = key - 1; break;
    default: break;
    }
    const ibv_wr_opcode opcodes[] = {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                                     IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_SEND_WITH_INV, IBV_WR_RDMA_WRITE};
    const ibv_wr_opcode op = opcodes[r.below(6)];
    const bool atomic = op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP;
    std::uint32_t len = atomic || op == IBV_WR_SEND_WITH_INV // the owner's receive holds 64 bytes
                            ? 8
                            : std::uint32_t(1 + r.below(glen < 512 ? glen + 8 : 520));
    std::int64_t off;
    switch (r.below(6)) {
    case 0: off = 0; break;
    case 1: off = -std::int64_t(1 + r.below(16)); break;                      // before / across the start
    case 2: off = std::int64_t(glen) - std::int64_t(r.below(len + 1)); break;  // at / across the end
    case 3: off = std::int64_t(glen) + std::int64_t(r.below(64)); break;       // just past
    case 4: off = std::int64_t(r.below(glen)); break;                          // inside
    default: off = std::int64_t(r.below(16384)) - 8192; break;                 // around
    }
    std::uint64_t addr = std::uint64_t(std::int64_t(base) + off);
    if (atomic) addr &= ~7ull; // rxe's own post_send refuses a misaligned atomic (EINVAL)
    // Keep the peer's accesses within the owner's buffer's pages plus the MR-less surroundings:
    // anything outside mem is outside every grant and must be denied anyway.
    attack(pi, op, addr, len, key, r.next() & 0xff);
  }
  for (slot &sl : slots)
    if (sl.g) need(sl.g.destroy(), "final revoke");
  std::printf("[hostile-fuzz] seed %llu: %ld steps, %ld attempts, %ld denied, %ld grants, %ld revokes, "
              "%ld breaches, %ld unexpected, 0 panics\n",
              (unsigned long long)seed, ops, attempts, denied, grants, revokes, breaches, unexpected);
  CHECK(breaches == 0);
  CHECK(unexpected == 0);
}

// ---- canaries: the unsafe type-2 mode accepted (type2_risk); each must panic the kernel ----
namespace {
struct canary {
  device_pd d;
  owner_mem o;
  MemoryRegion mr = need(MemoryRegion::reg(d.pd, o.mem.data(), o.size, access::local_write), "owner mr");
  peer_side a{d.ctx, d.pd};
  // The unsafe mode, accepted explicitly: the only way to get type-2 grants on rxe.
  StrictGrant g = need(StrictGrant::create(d.pd, mr, {0, 4096}, grant_options{.type2 = accept_risk}),
                       "grant");
  canary() { REQUIRE(g.mechanism() == grant_mechanism::type2_window); }
  ~canary() {
    // Reached only when the kernel did not panic: the canary fails.
    std::printf("canary: no panic\n");
  }
  void wait_for_panic() {
    std::this_thread::sleep_for(3s);
    FAIL("the kernel did not panic: the guard may no longer be needed on this kernel");
  }
};
} // namespace

TEST_CASE("canary 1: local invalidate, then the peer's send-with-invalidate of the old key", "[.canary1]") {
  canary c;
  const auto d = bind_wait(c.g, c.a.qp.b, c.a.qp.cq_b, access::remote_write);
  need(c.g.window().invalidate(c.a.qp.b, {700, send_flag::signaled}), "invalidate");
  CHECK(c.g.window().complete(wait_one(c.a.qp.cq_b)));
  need(c.a.qp.b.post_recv(9, c.a.owner_rmr.sge()), "post_recv");
  std::printf("canary 1: peer sends send-with-invalidate of 0x%x\n", d.rkey);
  std::fflush(stdout);
  (void)peer_post(c.a.qp.a, c.a.qp.cq_a, IBV_WR_SEND_WITH_INV, c.a.sge(8), 0, d.rkey);
  c.wait_for_panic();
}

TEST_CASE("canary 2: the peer's send-with-invalidate twice", "[.canary2]") {
  canary c;
  const auto d = bind_wait(c.g, c.a.qp.b, c.a.qp.cq_b, access::remote_write);
  need(c.a.qp.b.post_recv(9, c.a.owner_rmr.sge()), "post_recv");
  need(c.a.qp.b.post_recv(10, c.a.owner_rmr.sge()), "post_recv");
  std::printf("canary 2: peer sends send-with-invalidate of 0x%x twice\n", d.rkey);
  std::fflush(stdout);
  (void)peer_post(c.a.qp.a, c.a.qp.cq_a, IBV_WR_SEND_WITH_INV, c.a.sge(8), 0, d.rkey, 1);
  (void)peer_post(c.a.qp.a, c.a.qp.cq_a, IBV_WR_SEND_WITH_INV, c.a.sge(8), 0, d.rkey, 2);
  c.wait_for_panic();
}

TEST_CASE("canary 3: the invalidating receive is not handed to complete(), then invalidate()",
          "[.canary3]") {
  canary c;
  const auto d = bind_wait(c.g, c.a.qp.b, c.a.qp.cq_b, access::remote_write);
  need(c.a.qp.b.post_recv(9, c.a.owner_rmr.sge()), "post_recv");
  REQUIRE(peer_post(c.a.qp.a, c.a.qp.cq_a, IBV_WR_SEND_WITH_INV, c.a.sge(8), 0, d.rkey) == IBV_WC_SUCCESS);
  (void)wait_wc(c.a.qp.cq_b, 1); // polled, not handed to complete()
  std::printf("canary 3: owner invalidates 0x%x, which the peer already invalidated\n", d.rkey);
  std::fflush(stdout);
  need(c.g.window().invalidate(c.a.qp.b, {701, send_flag::signaled}), "invalidate");
  (void)wait_wc(c.a.qp.cq_b, 1);
  c.wait_for_panic();
}

TEST_CASE("canary 4: peer B invalidates A's window over B's connection, the owner revokes A",
          "[.canary4]") {
  canary c;
  peer_side b(c.d.ctx, c.d.pd);
  const auto d = bind_wait(c.g, c.a.qp.b, c.a.qp.cq_b, access::remote_write);
  need(b.qp.b.post_recv(9, b.owner_rmr.sge()), "post_recv");
  REQUIRE(peer_post(b.qp.a, b.qp.cq_a, IBV_WR_SEND_WITH_INV, b.sge(8), 0, d.rkey) == IBV_WC_SUCCESS);
  (void)wait_wc(b.qp.cq_b, 1); // B's completions go to B's windows (none): A's window never sees it
  std::printf("canary 4: owner invalidates A's 0x%x, invalidated by B\n", d.rkey);
  std::fflush(stdout);
  need(c.g.window().invalidate(c.a.qp.b, {702, send_flag::signaled}), "invalidate");
  (void)wait_wc(c.a.qp.cq_b, 1);
  c.wait_for_panic();
}
