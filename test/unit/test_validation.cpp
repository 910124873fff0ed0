// Argument checks that must refuse before any verb is called (no device needed).
#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

using namespace rdmaxx;

TEST_CASE("MemoryRegion::reg refuses malformed arguments before verbs", "[unit][validation]") {
  ProtectionDomain none; // no device here: any call that reached verbs would need a real PD
  char buf[64];
  struct row { void *addr; std::size_t len; access_flags acc; std::error_code expect; };
  const row rows[] = {
      {nullptr, 64, access::local_write, errc::null_address},
      {buf, 0, access::local_write, errc::zero_length},
      {buf, 64, access::remote_write, errc::remote_write_needs_local_write},
      {buf, 64, access::remote_atomic | access::remote_read, errc::remote_atomic_needs_local_write},
      {buf, 64, access_flags(1u << 29), errc::unknown_access_flag},
      {buf, 64, access::local_write | access::remote_write, errc::null_handle},
  };
  for (const auto &r : rows) {
    auto mr = MemoryRegion::reg(none, r.addr, r.len, r.acc);
    REQUIRE_FALSE(mr);
    CHECK(mr.error() == r.expect);
    const std::uint64_t iova = 0x100000 + (reinterpret_cast<std::uintptr_t>(r.addr) & 4095);
    auto mi = MemoryRegion::reg_iova(none, r.addr, r.len, iova, r.acc);
    REQUIRE_FALSE(mi);
    CHECK(mi.error() == r.expect);
  }
  // The kernel's rule for IOVAs: same offset within the page as the address.
  auto odd = MemoryRegion::reg_iova(none, buf, 64, (reinterpret_cast<std::uintptr_t>(buf) + 1) & 4095,
                                    access::local_write);
  CHECK(odd.error() == errc::iova_page_offset_mismatch);
  auto al = MemoryRegion::allocate(none, 0, access::local_write);
  REQUIRE_FALSE(al);
  CHECK(al.error() == errc::zero_length);
  auto al2 = MemoryRegion::allocate(none, 4096, access::remote_write);
  REQUIRE_FALSE(al2);
  CHECK(al2.error() == errc::remote_write_needs_local_write);
}

TEST_CASE("creating from empty parents is refused", "[unit][validation]") {
  Context ctx;
  ProtectionDomain pd;
  CompletionQueue cq;
  CHECK(ProtectionDomain::alloc(ctx).error() == errc::null_handle);
  CHECK(CompletionQueue::create(ctx, 16).error() == errc::null_handle);
  CHECK(CompletionChannel::create(ctx).error() == errc::null_handle);
  CHECK(QueuePair::create(pd, cq, cq).error() == errc::null_handle);
  CHECK(ctx.query_port(1).error() == errc::null_handle);
  CHECK(ctx.query_capabilities().error() == errc::null_handle);
  QueuePair qp;
  CHECK(qp.to_init().error() == errc::null_handle);
  CHECK(qp.reset_and_reconnect().error() == errc::null_handle);
  CHECK(qp.local_endpoint().error() == errc::null_handle);
  MemoryRegion mr;
  CHECK(mr.slice(0, 1).error() == errc::null_handle);
  CHECK(mr.usable() == errc::null_handle);
}

TEST_CASE("opening a device that does not exist", "[unit][validation]") {
  auto c = Context::open("rdmaxx-no-such-device");
  REQUIRE_FALSE(c);
  // No device of that name: errc::no_device; on a kernel without uverbs the listing itself may
  // fail with the errno of ibv_get_device_list.
  const bool expected = c.error() == errc::no_device || c.error().category() == std::generic_category();
  CHECK(expected);
  CHECK(Context::open(static_cast<ibv_device *>(nullptr)).error() == errc::no_device);
}
