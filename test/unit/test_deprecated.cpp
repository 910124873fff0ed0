// The deprecated names of issue #44's one vocabulary still compile and do what the new name
// does: one case per alias, on null objects (no device). The only file that may call them (the
// build uses -Werror): delete it with the aliases.
#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

using namespace rdmaxx;

namespace {
// Both answered alike: both succeeded, or both failed with the same code.
bool same(const result<void> &a, const result<void> &b) {
  return a.has_value() == b.has_value() && (a.has_value() || a.error() == b.error());
}
} // namespace

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

TEST_CASE("deprecated: Context::close is destroy", "[unit][deprecated]") {
  Context ctx;
  CHECK(same(ctx.close(), ctx.destroy()));
  CHECK(ctx.close().has_value()); // a null Context: success, nothing is called
}

TEST_CASE("deprecated: ProtectionDomain::dealloc is destroy", "[unit][deprecated]") {
  ProtectionDomain pd;
  CHECK(same(pd.dealloc(), pd.destroy()));
  CHECK(pd.dealloc().has_value());
}

TEST_CASE("deprecated: MemoryRegion::dereg is destroy", "[unit][deprecated]") {
  MemoryRegion mr;
  CHECK(same(mr.dereg(), mr.destroy()));
  CHECK(mr.dereg().has_value());
}

TEST_CASE("deprecated: MemoryWindow::dealloc is destroy", "[unit][deprecated]") {
  MemoryWindow mw;
  CHECK(same(mw.dealloc(), mw.destroy()));
  CHECK(mw.dealloc().has_value());
}

TEST_CASE("deprecated: ExactGrant::revoke is destroy", "[unit][deprecated]") {
  ExactGrant g;
  CHECK(same(g.revoke(), g.destroy()));
  CHECK(g.revoke().has_value()); // an empty grant: success, nothing is called
}

TEST_CASE("deprecated: IndirectKey::invalidate is revoke", "[unit][deprecated]") {
  IndirectKey k;
  QueuePair qp;
  CHECK(same(k.invalidate(), k.revoke()));
  CHECK(same(k.invalidate(qp), k.revoke(qp)));
  auto batch = qp.start_send(); // a batch of a null QP: the key answers first
  CHECK(same(k.invalidate(batch), k.revoke(batch)));
  CHECK(k.invalidate().error() == errc::null_handle);
  CHECK(k.invalidate(qp).error() == errc::null_handle);
}

TEST_CASE("deprecated: IndirectKey::release_regions is destroy_kept_regions", "[unit][deprecated]") {
  IndirectKey k;
  CHECK(same(k.release_regions(), k.destroy_kept_regions()));
  CHECK(k.release_regions().error() == errc::null_handle);
}

TEST_CASE("deprecated: GrantPool::release(lease) is give_back", "[unit][deprecated]") {
  GrantPool p;
  GrantLease l;
  CHECK(same(p.release(l), p.give_back(l)));
  CHECK(p.release(l).error() == errc::null_handle);
}

#pragma GCC diagnostic pop
