// [bad-input] The rows of MemoryRegion (bad_inputs.hpp).
#include "bad_inputs.hpp"

using namespace rxe;
using namespace rxe::bad_input;

TEST_CASE_METHOD(bad_input_world, "bad inputs: MemoryRegion", "[bad-input][mr]") {
  table t("MemoryRegion");
  t.add("MemoryRegion::reg", "null address", is(errc::null_address),
        [&] { return err(MemoryRegion::reg(pd, nullptr, 64, lw)); });
  t.add("MemoryRegion::reg", "zero length", is(errc::zero_length),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), 0, lw)); });
  t.add("MemoryRegion::reg", "length SIZE_MAX", is(errc::out_of_range),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), big, lw)); });
  t.add("MemoryRegion::reg", "address + length wraps", is(errc::out_of_range), [&] {
    const std::size_t wrap = SIZE_MAX - reinterpret_cast<std::uintptr_t>(aux.data()) + 2;
    return err(MemoryRegion::reg(pd, aux.data(), wrap, lw));
  });
  t.add("MemoryRegion::reg", "unknown access bit", is(errc::unknown_access_flag),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), N, unknown_bit)); });
  t.add("MemoryRegion::reg", "remote write without local write", is(errc::remote_write_needs_local_write),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), N, access::remote_write)); });
  t.add(
      "MemoryRegion::reg", "remote atomic without local write", is(errc::remote_atomic_needs_local_write),
      [&] { return err(MemoryRegion::reg(pd, aux.data(), N, access::remote_atomic | access::remote_read)); });
  t.add("MemoryRegion::reg", "on-demand paging (rxe has none)", unsupported(),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), N, access::local_write | access::on_demand)); });
  t.add("MemoryRegion::reg", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryRegion::reg(pd_moved, aux.data(), N, lw)); });
  const auto page_off = reinterpret_cast<std::uintptr_t>(aux.data()) & 4095;
  t.add("MemoryRegion::reg_iova", "IOVA with another page offset", is(errc::iova_page_offset_mismatch), [&] {
    return err(MemoryRegion::reg_iova(pd, aux.data(), N, 0x10000000 + ((page_off + 8) & 4095), lw));
  });
  t.add("MemoryRegion::reg_iova", "null address", is(errc::null_address),
        [&] { return err(MemoryRegion::reg_iova(pd, nullptr, N, 0x10000000, lw)); });
  t.add("MemoryRegion::reg_iova", "zero length", is(errc::zero_length),
        [&] { return err(MemoryRegion::reg_iova(pd, aux.data(), 0, 0x10000000 + page_off, lw)); });
  // More than a page from the last page's IOVA: it wraps whatever the buffer's page offset (with
  // N bytes at offset 0 the range would end exactly at 2^64, which does not wrap; TSan's allocator
  // gives such a buffer).
  static std::vector<unsigned char> wrap_buf(2 * N);
  const auto wrap_off = reinterpret_cast<std::uintptr_t>(wrap_buf.data()) & 4095;
  t.add("MemoryRegion::reg_iova", "IOVA + length wraps", is(errc::out_of_range), [&] {
    return err(MemoryRegion::reg_iova(pd, wrap_buf.data(), N + 1, (UINT64_MAX & ~std::uint64_t(4095)) + wrap_off, lw));
  });
  t.add("MemoryRegion::reg_iova", "remote write without local write",
        is(errc::remote_write_needs_local_write), [&] {
          return err(MemoryRegion::reg_iova(pd, aux.data(), N, 0x10000000 + page_off, access::remote_write));
        });
  t.add("MemoryRegion::reg_iova", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryRegion::reg_iova(pd_moved, aux.data(), N, 0x10000000 + page_off, lw)); });
  t.add("MemoryRegion::allocate", "zero length", is(errc::zero_length),
        [&] { return err(MemoryRegion::allocate(pd, 0, lw)); });
  t.add("MemoryRegion::allocate", "length SIZE_MAX", sys_errno(std::errc::not_enough_memory),
        [&] { return err(MemoryRegion::allocate(pd, big, lw)); });
  t.add("MemoryRegion::allocate", "1 PiB (more than the address space)",
        sys_errno(std::errc::not_enough_memory),
        [&] { return err(MemoryRegion::allocate(pd, std::size_t(1) << 50, lw)); });
  t.add("MemoryRegion::allocate", "unknown access bit", is(errc::unknown_access_flag),
        [&] { return err(MemoryRegion::allocate(pd, N, unknown_bit)); });
  t.add("MemoryRegion::allocate", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryRegion::allocate(pd_moved, N, lw)); });
  t.add("MemoryRegion::slice", "zero length", is(errc::zero_length), [&] { return err(md.slice(0, 0)); });
  t.add("MemoryRegion::slice", "offset past the end", is(errc::out_of_range),
        [&] { return err(md.slice(N + 1, 1)); });
  t.add("MemoryRegion::slice", "last byte + 1", is(errc::out_of_range),
        [&] { return err(md.slice(N - 1, 2)); });
  t.add("MemoryRegion::slice", "offset + length wraps", is(errc::out_of_range),
        [&] { return err(md.slice(1, big)); });
  t.add("MemoryRegion::slice", "moved-from MR", is(errc::null_handle),
        [&] { return err(mr_moved.slice(0, 1)); });
  t.add("MemoryRegion::slice", "unusable MR", is(errc::unusable), [&] { return err(mu.slice(0, 1)); });
  t.add("MemoryRegion::rereg", "no change", is(errc::nothing_to_change),
        [&] { return err(mrr.rereg(rereg_changes{})); });
  t.add("MemoryRegion::rereg", "the same access", is(errc::nothing_to_change),
        [&] { return err(mrr.rereg(change_access(remote_rw))); });
  t.add("MemoryRegion::rereg", "the same PD", is(errc::nothing_to_change),
        [&] { return err(mrr.rereg(change_pd(pd))); });
  t.add("MemoryRegion::rereg", "translation to a null address", is(errc::null_address),
        [&] { return err(mrr.rereg(change_translation(nullptr, N))); });
  t.add("MemoryRegion::rereg", "translation to zero length", is(errc::zero_length),
        [&] { return err(mrr.rereg(change_translation(aux.data(), 0))); });
  t.add("MemoryRegion::rereg", "translation whose address + length wraps", is(errc::out_of_range),
        [&] { return err(mrr.rereg(change_translation(aux.data(), big))); });
  t.add("MemoryRegion::rereg", "translation of an allocate()d MR", is(errc::wrong_type),
        [&] { return err(ma.rereg(change_translation(aux.data(), N))); });
  t.add("MemoryRegion::rereg", "unknown access bit", is(errc::unknown_access_flag),
        [&] { return err(mrr.rereg(change_access(unknown_bit))); });
  t.add("MemoryRegion::rereg", "on-demand paging (rxe has none)", is(errc::unsupported),
        [&] { return err(mrr.rereg(change_access(access::local_write | access::on_demand))); });
  t.add("MemoryRegion::rereg", "remote write without local write", is(errc::remote_write_needs_local_write),
        [&] { return err(mrr.rereg(change_access(access::remote_write))); });
  t.add("MemoryRegion::rereg", "moved-from PD", is(errc::null_handle),
        [&] { return err(mrr.rereg(change_pd(pd_moved))); });
  t.add("MemoryRegion::rereg", "PD of another context", is(errc::pd_mismatch),
        [&] { return err(mrr.rereg(change_pd(pd_x))); });
  t.add("MemoryRegion::rereg", "windows bound to the MR", is(errc::busy),
        [&] { return err(mt.rereg(change_access(access::local_write | access::mw_bind))); });
  t.add("MemoryRegion::rereg", "native_only where the device has none", is(errc::unsupported),
        [&] { return err(mrr.rereg(change_access(access::local_write), rereg_policy::native_only)); });
  t.add("MemoryRegion::rereg", "moved-from MR", is(errc::null_handle),
        [&] { return err(mr_moved.rereg(change_access(lw))); });
  t.add("MemoryRegion::rereg", "unusable MR", is(errc::unusable),
        [&] { return err(mu.rereg(change_access(remote_rw))); });
  t.add("MemoryRegion::rereg_native_unchecked", "unknown flag bit",
        rereg_old_valid(std::errc::invalid_argument),
        [&] { return err(mrr.rereg_native_unchecked(1 << 10, nullptr, nullptr, 0, 0)); });
  t.add("MemoryRegion::rereg_native_unchecked", "translation to a null address",
        rereg_old_valid(std::errc::invalid_argument), [&] {
          return err(mrr.rereg_native_unchecked(IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, N, 0));
        });
  t.add("MemoryRegion::rereg_native_unchecked", "moved-from MR", is(errc::null_handle), [&] {
    return err(mr_moved.rereg_native_unchecked(IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 1));
  });
  t.add("MemoryRegion::destroy", "windows bound to the MR", is(errc::busy), [&] { return err(mt.destroy()); });
  // A grant reaches the region's memory: moving it, changing its PD or deregistering it would
  // leave the grant's key on the old memory. Nothing changes; the grant keeps working (finish()).
  std::vector<unsigned char> under(2 * N, 0), elsewhere(2 * N, 0);
  MemoryRegion mg = need(MemoryRegion::reg(pd, under.data(), under.size(), lw), "granted region");
  StrictGrant sg_under = need(StrictGrant::create(pd, mg, {0, 64}), "strict grant under test");
  ExactGrant eg_under = need(ExactGrant::create(pd, mg, {64, 64}, access::remote_read), "exact grant");
  t.add("MemoryRegion::rereg", "translation change under a StrictGrant and an ExactGrant", is(errc::region_granted),
        [&] { return err(mg.rereg(change_translation(elsewhere.data(), elsewhere.size()))); });
  t.add("MemoryRegion::rereg", "PD change under a grant", is(errc::region_granted),
        [&] { return err(mg.rereg(change_pd(pd2))); });
  t.add("MemoryRegion::destroy", "a grant made from the MR", is(errc::region_granted), [&] { return err(mg.destroy()); });
  t.add("MemoryRegion::usable", "moved-from MR", is(errc::null_handle), [&] { return mr_moved.usable(); });
  t.add("MemoryRegion::usable", "unusable MR", is(errc::unusable), [&] { return mu.usable(); });
  t.run();
  CHECK(mg.address() == under.data());
  CHECK(mg.live_grants() == 2);
  CHECK(all_equal(elsewhere.data(), elsewhere.size(), 0));
  // The access change alone is allowed under these grants (their regions are their own).
  need(mg.rereg(change_access(lw | access::remote_read)), "access change under the grants");
  need(sg_under.destroy(), "destroy the strict grant");
  need(eg_under.destroy(), "revoke the exact grant");
  CHECK(mg.live_grants() == 0);
  need(mg.rereg(change_translation(elsewhere.data(), elsewhere.size())), "rereg once the grants are gone");
  need(mg.destroy(), "dereg");
  finish();
}
