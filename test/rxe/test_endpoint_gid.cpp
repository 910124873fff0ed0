// [endpoint]: GID selection by type on rxe (which has an IPv6 link-local GID and an IPv4-mapped
// one), and two QPs connected with DEFAULT options through encoded endpoints.
#include "fixture.hpp"

TEST_CASE("default GID selection picks the RoCE v2 IPv4-mapped GID; encoded endpoints connect", "[endpoint]") {
  using namespace rxe;
  device_pd d;
  auto idx = need(detail::select_gid_index(d.ctx.native_handle(), 1), "select_gid_index");
  ibv_gid_entry e{};
  REQUIRE(::ibv_query_gid_ex(d.ctx.native_handle(), 1, std::uint32_t(idx), &e, 0) == 0);
  CHECK(e.gid_type == IBV_GID_TYPE_ROCE_V2);
  CHECK(detail::gid_is_v4_mapped(e.gid));
  // Index 0 on rxe is the IPv6 link-local GID (fe80::): not the default.
  auto g0 = need(d.ctx.query_gid(1, 0), "gid 0");
  CHECK(g0.raw[0] == 0xfe);
  CHECK(idx != 0);

  CompletionQueue cq_a = need(CompletionQueue::create(d.ctx, 16), "cq a");
  CompletionQueue cq_b = need(CompletionQueue::create(d.ctx, 16), "cq b");
  QueuePair a = need(QueuePair::create(d.pd, cq_a, cq_a), "qp a");
  QueuePair b = need(QueuePair::create(d.pd, cq_b, cq_b), "qp b");
  // Each side sends the other its encoded endpoint; the defaults choose the GID.
  const auto wa = need(a.local_endpoint(), "endpoint a").encode();
  const auto wb = need(b.local_endpoint(), "endpoint b").encode();
  auto ea = need(endpoint::decode(wa), "decode a");
  auto eb = need(endpoint::decode(wb), "decode b");
  CHECK(std::memcmp(ea.gid.raw, e.gid.raw, 16) == 0);
  need(a.connect(eb), "connect a");
  need(b.connect(ea), "connect b");
  alignas(64) static unsigned char src[256], dst[256];
  fill(src, sizeof src, 4);
  std::memset(dst, 0, sizeof dst);
  auto smr = need(MemoryRegion::reg(d.pd, src, sizeof src, access::local_write), "src");
  auto dmr = need(MemoryRegion::reg(d.pd, dst, sizeof dst, remote_rw), "dst");
  CHECK(write_one(a, cq_a, smr.sge(), {dmr.iova(), dmr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(src, dst, sizeof src) == 0);

  // gid_index is still settable: the explicit index gives the same GID.
  connect_options o;
  o.gid_index = idx;
  CHECK(need(a.local_endpoint(o), "explicit").gid.raw[15] == e.gid.raw[15]);
}
