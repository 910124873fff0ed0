// [grant-contract] One contract, every public grant form (issue 20): StrictGrant kept per slot, a
// GrantPool lease, a software IndirectKey segment. Each case is one template instantiated per
// form through a small adapter that uses only the form's public API; the peer is plain
// libibverbs (peer_post): what a buggy or hostile program can send. The promise checked:
//   - the key reaches exactly the granted bytes (one byte before or past: refused, untouched);
//   - confirmation comes only from the operation's own completion (another work request's
//     completion changes nothing);
//   - a dropped post and a flushed (failed) bind roll back: the key it named never works, and
//     the form grants again;
//   - a revoked key is refused, also after 300 reuse cycles of the same slot, and no key is
//     handed out twice;
//   - a failed device query fails closed (FAULT INJECTION: rxe's query cannot fail);
//   - type 2 is refused on rxe without the acknowledgement (trusted peers are not enough).
// The properties and the adapter concept are shared with the mlx5 key's device-free suite
// (test/grant_contract.hpp, test/unit/test_mlx5_contract.cpp).
#include "../grant_contract.hpp"
#include "fixture.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

using namespace rxe;

namespace {

constexpr access_flags rights = access::remote_write;

// The owner's memory: a region over `n` zeroed bytes; the grant covers [off, off + len). A pool
// takes its buffers from a region of their own: `slot` registers exactly the granted bytes.
struct owner_memory {
  static constexpr std::size_t n = 65536, off = 8192, len = 4096;
  MemoryRegion mr;
  MemoryRegion slot;
  explicit owner_memory(loopback &lb)
      : mr(need(MemoryRegion::allocate(lb.pd, n, access::local_write), "owner region")),
        slot(need(MemoryRegion::reg(lb.pd, data() + off, len, access::local_write), "slot region")) {}
  [[nodiscard]] unsigned char *data() const { return static_cast<unsigned char *>(mr.address()); }
  [[nodiscard]] bool untouched() const { return all_equal(data(), n, 0); }
};

// --- the adapters: what "grant", "confirmed", "revoke" are for each form ---

// StrictGrant, one kept per buffer slot (what its documentation recommends).
struct strict_form {
  static constexpr const char *name = "StrictGrant";
  static constexpr bool confirms_grant = true;  // window().pending() until the bind's completion
  static constexpr bool revoke_is_posted = true; // an unbind, confirmed by its completion
  loopback &lb;
  StrictGrant g;
  strict_form(loopback &l, owner_memory &m) : lb(l), g(need(make(l, m, {}), "StrictGrant")) {}
  static result<StrictGrant> make(loopback &l, owner_memory &m, grant_options o) {
    return StrictGrant::create(l.pd, m.mr, {owner_memory::off, owner_memory::len}, o);
  }
  static result<grant_mechanism> mechanism_with(loopback &l, owner_memory &m, grant_options o) {
    RDMAXX_TRY(g, make(l, m, o));
    return g.mechanism();
  }
  remote_descriptor grant(SendBatch &b, std::uint64_t id) {
    return need(g.grant(b, lb.b, rights, {id, send_flag::signaled}), "grant");
  }
  [[nodiscard]] bool confirmed() const { return g.window().pending() == 0 && g.window().state() == mw_state::bound; }
  [[nodiscard]] bool idle() const { return g.window().pending() == 0 && g.window().state() != mw_state::bound; }
  void complete(const ibv_wc &wc) { (void)g.window().complete(wc); }
  void post_revoke(std::uint64_t id) { need(g.revoke(lb.b, {id, send_flag::signaled}), "revoke"); }
};

// A GrantPool of one slot: the lease's grant is unsignaled (its descriptor travels in the same
// batch, after the bind, on the same QP); its revoke is signaled and the buffer is ready again
// only once that completion was handed to the pool.
struct lease_form {
  static constexpr const char *name = "GrantPool lease";
  static constexpr bool confirms_grant = false; // the pool's binds are unsignaled by design
  static constexpr bool revoke_is_posted = true;
  loopback &lb;
  GrantPool pool;
  GrantLease l;
  lease_form(loopback &lo, owner_memory &m)
      : lb(lo), pool(need(make(lo, m, {}), "GrantPool")), l(need(pool.acquire(), "acquire")) {}
  static result<GrantPool> make(loopback &lo, owner_memory &m, grant_options o) {
    // One slot over exactly the granted bytes.
    return GrantPool::create(lo.pd, m.slot, {.slot_size = owner_memory::len, .slots = 1, .grant = o});
  }
  static result<grant_mechanism> mechanism_with(loopback &lo, owner_memory &m, grant_options o) {
    RDMAXX_TRY(p, make(lo, m, o));
    return p.mechanism();
  }
  remote_descriptor grant(SendBatch &b, std::uint64_t id) {
    (void)id; // the pool names its own work requests
    return need(pool.grant(b, lb.b, l, rights), "grant");
  }
  [[nodiscard]] bool confirmed() const { return l.state() == lease_state::granted; }
  [[nodiscard]] bool idle() const { return l.state() == lease_state::ready; }
  void complete(const ibv_wc &wc) {
    ibv_wc copy = wc;
    (void)pool.complete(std::span<ibv_wc>(&copy, 1));
  }
  void post_revoke(std::uint64_t) { need(pool.revoke(lb.b, l), "revoke"); }
};

// A software IndirectKey of one segment: descriptor() only once the bind's own completion was
// handed to complete(); revoke() deallocates the window (no work request).
struct ikey_form {
  static constexpr const char *name = "software IndirectKey segment";
  static constexpr bool confirms_grant = true;
  static constexpr bool revoke_is_posted = false;
  loopback &lb;
  owner_memory &m;
  IndirectKey k;
  ikey_form(loopback &lo, owner_memory &mem) : lb(lo), m(mem), k(need(make(lo, mem, {}), "IndirectKey")) {}
  static result<IndirectKey> make(loopback &lo, owner_memory &, grant_options o) {
    return IndirectKey::create(lo.pd, 4,
                               {.backend = umr_backend::software, .grant = o});
  }
  static result<grant_mechanism> mechanism_with(loopback &lo, owner_memory &mem, grant_options o) {
    RDMAXX_TRY(k, make(lo, mem, o));
    return k.mechanism();
  }
  remote_descriptor grant(SendBatch &b, std::uint64_t id) {
    const layout l = layout::list({{m.mr, owner_memory::off, owner_memory::len}});
    need(k.configure(b, lb.b, l, access::local_write | rights, {id, send_flag::signaled}), "configure");
    const key_segment &s = k.segments()[0];
    return {s.addr, s.length, s.rkey, rights, false};
  }
  [[nodiscard]] bool confirmed() const { return k.configured() && k.descriptor().has_value(); }
  [[nodiscard]] bool idle() const { return !k.configured(); }
  void complete(const ibv_wc &wc) { (void)k.complete(wc); }
  void post_revoke(std::uint64_t) { need(k.revoke(), "invalidate"); }
};

// Grant through a submitted batch and confirm with the operation's own completion (the pool's
// bind is unsignaled: its descriptor is sent behind it on the same QP, and the pool needs no
// completion for it).
template <class F>
remote_descriptor grant_confirmed(F &f, loopback &lb, std::uint64_t id) {
  auto b = lb.b.start_send();
  const remote_descriptor d = f.grant(b, id);
  need(b.submit(), "submit grant");
  if (F::confirms_grant) f.complete(wait_one(lb.cq_b));
  REQUIRE(f.confirmed());
  return d;
}
template <class F>
void revoke_confirmed(F &f, loopback &lb, std::uint64_t id) {
  f.post_revoke(id);
  if (F::revoke_is_posted) f.complete(wait_one(lb.cq_b));
  REQUIRE(f.idle());
}

// The peer writes 64 bytes at `addr` with `rkey`; the status of its completion.
ibv_wc_status peer_write(loopback &lb, const MemoryRegion &src, std::uint64_t addr, std::uint32_t rkey,
                         std::uint32_t len = 64) {
  return peer_post(lb.a, lb.cq_a, IBV_WR_RDMA_WRITE, src.sge(0, len), addr, rkey);
}

struct fixture {
  loopback lb;
  owner_memory mem{lb};
  std::vector<unsigned char> src = std::vector<unsigned char>(64, 0x5A);
  MemoryRegion src_mr = need(MemoryRegion::reg(lb.pd, src.data(), src.size(), access::local_write), "src");
  // The peer writes `len` bytes at `addr` with `rkey`: true when refused with no byte of the
  // owner's memory changed; both QPs are reconnected afterwards (a denial moves them to ERR).
  bool refused(std::uint64_t addr, std::uint32_t rkey, std::uint32_t len = 64) {
    const bool denied = is_denial(peer_write(lb, src_mr, addr, rkey, len));
    const bool untouched = mem.untouched();
    lb.recover();
    return denied && untouched;
  }
};

int fail_query(ibv_context *, const ibv_query_device_ex_input *, ibv_device_attr_ex *) {
  errno = EIO;
  return EIO;
}
} // namespace

#define GRANT_FORMS strict_form, lease_form, ikey_form
static_assert(grant_contract::grant_form<strict_form> && grant_contract::grant_form<lease_form> &&
              grant_contract::grant_form<ikey_form>);

TEMPLATE_TEST_CASE(GRANT_CONTRACT_EXACT_BYTES, "[grant-contract]",
                   GRANT_FORMS) {
  fixture x;
  TestType f(x.lb, x.mem);
  INFO(TestType::name);
  const remote_descriptor d = grant_confirmed(f, x.lb, 11);
  REQUIRE(d.addr != 0);
  REQUIRE(d.length == owner_memory::len);
  // The last 64 bytes of the grant: written.
  REQUIRE(peer_write(x.lb, x.src_mr, d.addr + d.length - 64, d.rkey) == IBV_WC_SUCCESS);
  CHECK(all_equal(x.mem.data() + owner_memory::off + owner_memory::len - 64, 64, 0x5A));
  std::memset(x.mem.data() + owner_memory::off + owner_memory::len - 64, 0, 64);
  // One byte past the grant: refused, nothing written anywhere.
  CHECK(x.refused(d.addr + d.length - 63, d.rkey));
  // One byte before it: refused.
  CHECK(x.refused(d.addr - 1, d.rkey, 1));
  revoke_confirmed(f, x.lb, 12);
}

TEMPLATE_TEST_CASE(GRANT_CONTRACT_OWN_COMPLETION, "[grant-contract]", GRANT_FORMS) {
  fixture x;
  TestType f(x.lb, x.mem);
  INFO(TestType::name);
  auto b = x.lb.b.start_send();
  const remote_descriptor d = f.grant(b, 21);
  need(b.submit(), "submit grant");
  if constexpr (TestType::confirms_grant) {
    const ibv_wc own = wait_one(x.lb.cq_b);
    grant_contract::foreign_completions_confirm_nothing(f, own);
    f.complete(own);
  }
  REQUIRE(f.confirmed());
  REQUIRE(peer_write(x.lb, x.src_mr, d.addr, d.rkey) == IBV_WC_SUCCESS);
  std::memset(x.mem.data() + owner_memory::off, 0, 64);
  if constexpr (TestType::revoke_is_posted) {
    f.post_revoke(22);
    const ibv_wc own = wait_one(x.lb.cq_b);
    ibv_wc other = own;
    other.wr_id ^= 0x40;
    f.complete(other);
    CHECK_FALSE(f.idle()); // not revoked as far as the form knows: the buffer is not handed back
    f.complete(own);
    CHECK(f.idle());
  } else {
    f.post_revoke(22); // synchronous (the window is deallocated)
    CHECK(f.idle());
  }
  CHECK(x.refused(d.addr, d.rkey));
}

TEMPLATE_TEST_CASE(GRANT_CONTRACT_ROLLBACK, "[grant-contract]", GRANT_FORMS) {
  fixture x;
  TestType f(x.lb, x.mem);
  INFO(TestType::name);
  remote_descriptor dropped{};
  {
    auto b = x.lb.b.start_send();
    dropped = f.grant(b, 31);
  } // dropped: nothing was posted, the batch rolls the grant back
  CHECK(f.idle());
  CHECK(x.refused(dropped.addr, dropped.rkey));

  // A bind that fails: the owner's QP is in ERR, so the bind is flushed.
  need(x.lb.b.to_error(), "owner QP to ERR");
  auto b = x.lb.b.start_send();
  const remote_descriptor flushed = f.grant(b, 32);
  need(b.submit(), "submit into ERR");
  // The flush comes back for the bind (signaled or not: a QP in ERR flushes every work request).
  const ibv_wc wc = wait_wc(x.lb.cq_b, 1).front();
  CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
  f.complete(wc);
  CHECK(f.idle());
  CHECK_FALSE(f.confirmed());
  x.lb.recover();
  CHECK(x.refused(flushed.addr, flushed.rkey));

  // The form grants again, and the new key works.
  const remote_descriptor d = grant_confirmed(f, x.lb, 33);
  REQUIRE(peer_write(x.lb, x.src_mr, d.addr, d.rkey) == IBV_WC_SUCCESS);
  CHECK(all_equal(x.mem.data() + owner_memory::off, 64, 0x5A));
  revoke_confirmed(f, x.lb, 34);
}

// A revoke posted after a peer's bad access moved the owner's QP to ERR on the device (verbs
// still records RTS, so the revoke is posted) is flushed. The grant before it executed (the
// pool's bind silently: unsignaled), so its key still works: the form must not report its
// memory reusable. It once did for the pool lease (bind and revoke shared a wr_id, and the flush
// undid both). Revoked on the reconnected QP, the key is refused.
TEMPLATE_TEST_CASE("grant contract: a revoke flushed after its grant executed leaves the grant live", "[grant-contract]",
                   GRANT_FORMS) {
  fixture x;
  TestType f(x.lb, x.mem);
  INFO(TestType::name);
  if constexpr (TestType::revoke_is_posted) {
    const remote_descriptor d = grant_confirmed(f, x.lb, 41);
    REQUIRE(peer_write(x.lb, x.src_mr, d.addr, d.rkey) == IBV_WC_SUCCESS);
    std::memset(x.mem.data() + owner_memory::off, 0, 64);
    // The peer's access one byte past the grant: refused, both QPs to ERR on the device.
    REQUIRE(is_denial(peer_write(x.lb, x.src_mr, d.addr + d.length - 63, d.rkey)));
    REQUIRE(x.lb.b.native_handle()->state == IBV_QPS_RTS); // what verbs still records
    f.post_revoke(42);
    const ibv_wc wc = wait_wc(x.lb.cq_b, 1).front();
    CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
    f.complete(wc);
    CHECK_FALSE(f.idle()); // the grant is live: not reusable
    x.lb.recover();
    // Live indeed: the key still writes (through the reconnected QP of the same PD).
    CHECK(peer_write(x.lb, x.src_mr, d.addr, d.rkey) == IBV_WC_SUCCESS);
    std::memset(x.mem.data() + owner_memory::off, 0, 64);
    revoke_confirmed(f, x.lb, 43);
    CHECK(x.refused(d.addr, d.rkey));
  }
}

TEMPLATE_TEST_CASE(GRANT_CONTRACT_REUSE, "[grant-contract]", GRANT_FORMS) {
  fixture x;
  TestType f(x.lb, x.mem);
  INFO(TestType::name);
  std::set<std::uint32_t> keys;
  remote_descriptor first{}, last{};
  int refused = 0, attempts = 0;
  for (int i = 0; i < grant_contract::reuse_cycles; ++i) {
    const remote_descriptor d = grant_confirmed(f, x.lb, 1000u + unsigned(i));
    last = d;
    INFO("grant #" << i << " key " << std::hex << d.rkey);
    REQUIRE(keys.insert(d.rkey).second);
    if (i == 0) first = d;
    if (i == 128 || i == 256 || i == grant_contract::reuse_cycles - 1) {
      ++attempts;
      if (x.refused(first.addr, first.rkey)) ++refused;
      REQUIRE(peer_write(x.lb, x.src_mr, d.addr, d.rkey) == IBV_WC_SUCCESS); // the current one works
      std::memset(x.mem.data() + owner_memory::off, 0, 64);
    }
    revoke_confirmed(f, x.lb, 5000u + unsigned(i));
  }
  CHECK(keys.size() == std::size_t(grant_contract::reuse_cycles));
  CHECK(refused == attempts);
  // And the last key, revoked: refused.
  CHECK(x.refused(last.addr, last.rkey));
}

TEMPLATE_TEST_CASE(GRANT_CONTRACT_QUERY_FAILS_CLOSED " (FAULT INJECTION: ibv_query_device_ex)",
                   "[grant-contract]", GRANT_FORMS) {
  fixture x;
  INFO(TestType::name);
  const auto previous = fault_injection::set_query_device(&fail_query);
  auto r = TestType::make(x.lb, x.mem, {});
  fault_injection::set_query_device(previous);
  REQUIRE_FALSE(r);
  CHECK(r.error() == std::errc::io_error);
  // With the caller's Capabilities no query is made: the injected failure does not matter.
  const auto caps = need(x.lb.ctx.query_capabilities(), "caps");
  fault_injection::set_query_device(&fail_query);
  auto with_caps = TestType::mechanism_with(x.lb, x.mem, {.caps = &caps});
  fault_injection::set_query_device(previous);
  REQUIRE(with_caps);
  CHECK(with_caps.value() == grant_mechanism::type1_exact_region);
}

TEMPLATE_TEST_CASE(GRANT_CONTRACT_TYPE2, "[grant-contract]", GRANT_FORMS) {
  fixture x;
  INFO(TestType::name);
  REQUIRE(need(x.lb.ctx.query_capabilities(), "caps").remote_inv_unbound_mw_panics == tristate::yes);
  CHECK(need(TestType::mechanism_with(x.lb, x.mem, {}), "default") == grant_mechanism::type1_exact_region);
  CHECK(need(TestType::mechanism_with(x.lb, x.mem, {.trusted_peers = true}), "trusted") ==
        grant_mechanism::type1_exact_region);
  CHECK(need(TestType::mechanism_with(x.lb, x.mem, {.trusted_peers = true, .type2 = accept_risk}),
             "accepted") == grant_mechanism::type2_window);
}
