// [bad-input] The rows of GrantPool and GrantLease (bad_inputs.hpp): create, acquire, grant,
// revoke, release, revoke_all, destroy, GrantLease::buffer and grant_offer::decode. After the rows
// the pool's bytes are unchanged and the pool still grants: a write through a grant lands, the
// revoke is confirmed, the buffer is readable again.
#include "bad_inputs.hpp"

using namespace rxe;
using namespace rxe::bad_input;

TEST_CASE_METHOD(bad_input_world, "bad inputs: GrantPool", "[bad-input][grant-pool]") {
  constexpr std::size_t slot = 4096, slots = 4;
  auto pbuf = need(MemoryRegion::allocate(pd, slot * slots, access::local_write), "pool buffers");
  auto *pb = static_cast<unsigned char *>(pbuf.address());
  fill(pb, slot * slots, 9);
  auto obuf = need(MemoryRegion::allocate(pd, slot, access::local_write), "other pool's buffer");
  auto *ob = static_cast<unsigned char *>(obuf.address());
  fill(ob, slot, 10);
  std::vector<unsigned char> snap_pbuf(pb, pb + slot * slots);
  std::vector<unsigned char> snap_obuf(ob, ob + slot);
  auto pool = need(GrantPool::create(pd, pbuf, {.slot_size = slot}), "pool");
  REQUIRE(pool.size() == slots);
  auto other = need(GrantPool::create(pd, obuf, {.slot_size = slot}), "another pool");
  auto single = need(GrantPool::create(pd, obuf, {.slot_size = slot, .slots = 1}), "one-slot pool");
  GrantPool moved = need(GrantPool::create(pd, obuf, {.slot_size = slot, .slots = 1}), "pool to move");
  move_away(moved);
  auto caps = need(ctx.query_capabilities({false, false, false}), "capabilities");

  // Leases: ready, granted (its bind posted through lb.b), of the other pool, null, of the
  // exhausted one-slot pool.
  auto ready = need(pool.acquire(), "ready lease");
  auto granted = need(pool.acquire(), "lease to grant");
  {
    auto b = lb.b.start_send();
    need(pool.grant(b, lb.b, granted, access::remote_read), "grant");
    need(b.submit(), "submit the grant");
  }
  REQUIRE(granted.state() == lease_state::granted);
  auto foreign = need(other.acquire(), "lease of the other pool");
  GrantLease null_lease;
  auto only = need(single.acquire(), "the one-slot pool's lease");
  const std::size_t available = pool.available();

  // The grant form in a batch of `qp` that is then dropped (a wrongly accepted grant is undone).
  auto grant_in = [&](GrantPool &p, QueuePair &qp, GrantLease &l, access_flags rights) {
    auto b = qp.start_send();
    return err(p.grant(b, qp, l, rights));
  };

  table t("GrantPool");
  t.add("GrantPool::create", "moved-from PD", is(errc::null_handle),
        [&] { return err(GrantPool::create(pd_moved, pbuf, {.slot_size = slot})); });
  t.add("GrantPool::create", "moved-from MR", is(errc::null_handle),
        [&] { return err(GrantPool::create(pd, mr_moved, {.slot_size = slot})); });
  t.add("GrantPool::create", "unusable MR", is(errc::unusable),
        [&] { return err(GrantPool::create(pd, mu, {.slot_size = 1024})); });
  t.add("GrantPool::create", "PD of another context", is(errc::context_mismatch),
        [&] { return err(GrantPool::create(pd_x, pbuf, {.slot_size = slot})); });
  t.add("GrantPool::create", "slot size 0", is(errc::zero_length),
        [&] { return err(GrantPool::create(pd, pbuf, {.slot_size = 0})); });
  t.add("GrantPool::create", "slot size larger than the region (no slot fits)", is(errc::zero_length),
        [&] { return err(GrantPool::create(pd, pbuf, {.slot_size = slot * slots + 1})); });
  t.add("GrantPool::create", "slot size 2^32", is(errc::out_of_range),
        [&] { return err(GrantPool::create(pd, pbuf, {.slot_size = std::uint64_t(1) << 32})); });
  t.add("GrantPool::create", "slot size UINT64_MAX", is(errc::out_of_range),
        [&] { return err(GrantPool::create(pd, pbuf, {.slot_size = UINT64_MAX})); });
  t.add("GrantPool::create", "5 slots where 4 fit", is(errc::out_of_range),
        [&] { return err(GrantPool::create(pd, pbuf, {.slot_size = slot, .slots = slots + 1})); });
  t.add("GrantPool::create", "SIZE_MAX slots", is(errc::out_of_range),
        [&] { return err(GrantPool::create(pd, pbuf, {.slot_size = 1, .slots = big})); });
  t.add("GrantPool::create", "capabilities of another device", is(errc::context_mismatch), [&] {
    Capabilities c = caps;
    std::strcpy(c.name, "rdmaxx-other");
    return err(GrantPool::create(pd, pbuf, {.slot_size = slot, .grant = {.caps = &c}}));
  });
  t.add("GrantPool::create", "capabilities without memory windows", is(errc::unsupported), [&] {
    Capabilities c = caps;
    c.max_mw = 0;
    return err(GrantPool::create(pd, pbuf, {.slot_size = slot, .grant = {.caps = &c}}));
  });
  t.add("GrantPool::create", "only type-2 windows, on a device where a peer can panic the kernel",
        is(errc::unsafe_grant), [&] {
          Capabilities c = caps;
          c.mw_type1 = false;
          c.mw_type2b = true;
          c.remote_inv_unbound_mw_panics = tristate::yes;
          return err(GrantPool::create(pd, pbuf, {.slot_size = slot, .grant = {.trusted_peers = true, .caps = &c}}));
        });
  t.add("GrantPool::acquire", "moved-from pool", is(errc::null_handle), [&] { return err(moved.acquire()); });
  t.add("GrantPool::acquire", "every slot leased", is(errc::pool_exhausted), [&] { return err(single.acquire()); });
  t.add("GrantPool::grant", "rights local write + remote read", is(errc::bad_grant_rights),
        [&] { return grant_in(pool, lb.b, ready, access::local_write | access::remote_read); });
  t.add("GrantPool::grant", "no rights", is(errc::bad_grant_rights),
        [&] { return grant_in(pool, lb.b, ready, access_flags{}); });
  t.add("GrantPool::grant", "MW_BIND as a right", is(errc::bad_grant_rights),
        [&] { return grant_in(pool, lb.b, ready, access::mw_bind | access::remote_read); });
  t.add("GrantPool::grant", "a lease of another pool", is(errc::pool_mismatch),
        [&] { return grant_in(pool, lb.b, foreign, access::remote_read); });
  t.add("GrantPool::grant", "a null lease", is(errc::null_handle),
        [&] { return grant_in(pool, lb.b, null_lease, access::remote_read); });
  t.add("GrantPool::grant", "a granted lease, again (not ready)", is(errc::grant_outstanding),
        [&] { return grant_in(pool, lb.b, granted, access::remote_read); });
  t.add("GrantPool::grant", "moved-from pool", is(errc::null_handle),
        [&] { return grant_in(moved, lb.b, ready, access::remote_read); });
  t.add("GrantPool::grant", "QP of another PD", is(errc::pd_mismatch),
        [&] { return grant_in(pool, p2.b, ready, access::remote_read); });
  t.add("GrantPool::grant", "moved-from QP", is(errc::null_handle), [&] {
    auto b = lb.b.start_send();
    return err(pool.grant(b, qp_moved, ready, access::remote_read));
  });
  t.add("GrantPool::grant", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(pool.grant(b, lb.b, ready, access::remote_read));
  });
  t.add("GrantPool::grant", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(pool.grant(b, lb.b, ready, access::remote_read));
  });
  t.add("GrantPool::revoke", "a lease of another pool", is(errc::pool_mismatch),
        [&] { return err(pool.revoke(lb.b, foreign)); });
  t.add("GrantPool::revoke", "a null lease", is(errc::null_handle),
        [&] { return err(pool.revoke(lb.b, null_lease)); });
  t.add("GrantPool::revoke", "moved-from pool", is(errc::null_handle),
        [&] { return err(moved.revoke(lb.b, ready)); });
  t.add("GrantPool::revoke (batch)", "a lease of another pool", is(errc::pool_mismatch), [&] {
    auto b = lb.b.start_send();
    return err(pool.revoke(b, lb.b, foreign));
  });
  t.add("GrantPool::revoke (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(pool.revoke(b, lb.b, granted));
  });
  // On a pool of its own: revoke_all() (the way out after a QP went to ERR) revokes every grant
  // of its pool.
  t.add("GrantPool::revoke", "on a QP in ERR (it would be flushed and rolled back)", is(errc::wrong_state), [&] {
    auto vpool = need(GrantPool::create(pd, obuf, {.slot_size = slot, .slots = 1}), "the victim's pool");
    auto l = need(vpool.acquire(), "lease for the victim QP");
    {
      auto b = vp.b.start_send();
      need(vpool.grant(b, vp.b, l, access::remote_write), "grant through the victim");
      need(b.submit(), "submit");
    }
    need(vp.b.to_error(), "victim QP to ERR (as a disconnect does)");
    const auto ec = err(vpool.revoke(vp.b, l));
    CHECK(l.state() == lease_state::granted); // nothing was posted to be flushed
    {
      auto b = vp.b.start_send();
      CHECK(err(vpool.revoke(b, vp.b, l)) == errc::wrong_state);
    }
    ibv_wc wc[8];
    while (vp.cq_b.poll(wc).value() > 0) {}
    need(vpool.revoke_all(), "revoke_all");
    CHECK(l.state() == lease_state::ready);
    need(vpool.give_back(l), "release");
    need(vpool.destroy(), "destroy the victim's pool");
    vp.recover();
    return ec;
  });
  t.add("GrantPool::give_back", "a granted lease", is(errc::grant_outstanding), [&] {
    const auto ec = err(pool.give_back(granted));
    CHECK(bool(granted)); // unchanged
    return ec;
  });
  t.add("GrantPool::give_back", "a lease of another pool", is(errc::pool_mismatch), [&] {
    const auto ec = err(pool.give_back(foreign));
    CHECK(bool(foreign));
    return ec;
  });
  t.add("GrantPool::give_back", "a null lease", is(errc::null_handle), [&] { return err(pool.give_back(null_lease)); });
  t.add("GrantPool::give_back", "moved-from pool", is(errc::null_handle), [&] { return err(moved.give_back(ready)); });
  t.add("GrantPool::revoke_all", "moved-from pool", is(errc::null_handle), [&] { return err(moved.revoke_all()); });
  t.add("GrantPool::destroy", "moved-from pool", is(errc::null_handle), [&] { return err(moved.destroy()); });
  t.add("GrantLease::buffer", "a granted lease", is(errc::grant_outstanding), [&] { return err(granted.buffer()); });
  t.add("GrantLease::buffer", "a null lease", is(errc::null_handle), [&] { return err(null_lease.buffer()); });
  t.add("GrantLease::buffer", "a lease whose pool was destroyed", is(errc::null_handle), [&] {
    auto p = need(GrantPool::create(pd, obuf, {.slot_size = slot, .slots = 1}), "short-lived pool");
    auto l = need(p.acquire(), "lease");
    need(p.destroy(), "destroy the pool");
    CHECK(l.state() == lease_state::ready);
    return err(l.buffer());
  });
  // The offer the owner sends at connection setup (kind 5, 12 bytes).
  const auto offer = grant_offer{true}.encode();
  using offer_t = std::remove_const_t<decltype(offer)>;
  auto decode_offer = [offer](std::function<void(offer_t &)> f) {
    offer_t w = offer;
    f(w);
    return err(grant_offer::decode(w));
  };
  t.add("grant_offer::decode", "no bytes", is(errc::malformed_input), [&] { return err(grant_offer::decode({})); });
  t.add("grant_offer::decode", "11 bytes (truncated body)", is(errc::malformed_input),
        [&] { return err(grant_offer::decode(std::span(offer).first(11))); });
  t.add("grant_offer::decode", "wrong magic", is(errc::malformed_input),
        [&] { return decode_offer([](offer_t &w) { w[0] = std::byte{'X'}; }); });
  t.add("grant_offer::decode", "version 2", is(errc::wrong_version),
        [&] { return decode_offer([](offer_t &w) { w[4] = std::byte{2}; }); });
  t.add("grant_offer::decode", "kind 1 (a window descriptor's header)",
        descriptor_is(errc::wrong_type, "kind 1 (window)"),
        [&] { return decode_offer([](offer_t &w) { w[5] = std::byte{1}; }); });
  t.add("grant_offer::decode", "body length 5", is(errc::malformed_input),
        [&] { return decode_offer([](offer_t &w) { w[7] = std::byte{5}; }); });
  t.add("grant_offer::decode", "unknown flag bit", is(errc::malformed_input),
        [&] { return decode_offer([](offer_t &w) { w[8] |= std::byte{2}; }); });
  t.add("grant_offer::decode", "reserved byte set", is(errc::malformed_input),
        [&] { return decode_offer([](offer_t &w) { w[11] = std::byte{1}; }); });
  t.run();

  // Nothing a refused call reached changed: the bytes, the leases, the free slots.
  CHECK(std::memcmp(pb, snap_pbuf.data(), slot * slots) == 0);
  CHECK(std::memcmp(ob, snap_obuf.data(), slot) == 0);
  CHECK(ready.state() == lease_state::ready);
  CHECK(granted.state() == lease_state::granted);
  CHECK(pool.available() == available);
  CHECK(need(lb.b.state(), "state b") == IBV_QPS_RTS);
  CHECK(need(vp.b.state(), "state of the victim") == IBV_QPS_RTS);
  expect_no_completion(lb.cq_b, 100ms);

  // The pool still works: the refused lease grants, a write through it lands in its slot only,
  // the revoke is confirmed, and the bytes are the caller's again.
  {
    auto b = lb.b.start_send();
    const auto d = need(pool.grant(b, lb.b, ready, access::remote_write), "grant the ready lease");
    need(b.submit(), "submit");
    REQUIRE(lb.write(ms.sge(0, 256), d.at(100)) == IBV_WC_SUCCESS);
    need(pool.revoke(lb.b, ready), "revoke");
    auto wcs = wait_wc(lb.cq_b, 1);
    CHECK(pool.complete(wcs).empty());
    REQUIRE(ready.state() == lease_state::ready);
    const auto bytes = need(ready.buffer(), "buffer");
    auto want = snap_pbuf;
    std::memcpy(want.data() + std::size_t(ready.slot()) * slot + 100, src.data(), 256);
    CHECK(std::memcmp(pb, want.data(), slot * slots) == 0);
    CHECK(bytes.size() == slot);
    need(pool.revoke(lb.b, granted), "revoke the granted lease");
    auto wcs2 = wait_wc(lb.cq_b, 1);
    CHECK(pool.complete(wcs2).empty());
    CHECK(granted.state() == lease_state::ready);
    need(pool.give_back(ready), "release");
    need(pool.give_back(granted), "release");
  }
  destroyed(pool.destroy(), "pool");
  destroyed(other.destroy(), "other pool");
  destroyed(single.destroy(), "one-slot pool");
  destroyed(pbuf.destroy(), "pool buffers");
  destroyed(obuf.destroy(), "other pool's buffer");
  finish();
}
