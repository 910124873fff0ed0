// layout.hpp: validation tables (naming the entry), list and repeat expansion, window splitting,
// and property checks over random layouts (fixed seed). No device: regions are raw values.
#include <rdmaxx/layout.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

using namespace rdmaxx;

namespace {
constexpr access_flags rw = access::local_write | access::remote_read | access::remote_write;
constexpr access_flags rwb = rw | access::mw_bind;
ibv_pd *const pd1 = reinterpret_cast<ibv_pd *>(0x1000);
ibv_pd *const pd2 = reinterpret_cast<ibv_pd *>(0x2000);

region_ref reg(std::uint64_t iova, std::uint64_t len, std::uint32_t key, access_flags acc = rw,
               ibv_pd *pd = pd1) {
  return region_ref::raw(iova, len, key, key + 1000, acc, pd);
}

// Reference: the device address of byte x of the layout, from the definition (no expansion).
struct loc {
  std::uint32_t lkey;
  std::uint64_t addr;
  bool operator==(const loc &) const = default;
};
loc ref_locate(const layout &l, std::uint64_t x) {
  for (std::uint32_t r = 0; r < l.repeat_count(); ++r)
    for (const auto &e : l.entries()) {
      if (x < e.length) return {e.source.lkey, e.source.iova + e.offset + r * (e.length + e.skip) + x};
      x -= e.length;
    }
  return {0, 0};
}
loc seg_locate(std::span<const key_segment> s, std::uint64_t x) {
  for (const auto &g : s) {
    if (x < g.length) return {g.lkey, g.addr + x};
    x -= g.length;
  }
  return {0, 0};
}
} // namespace

TEST_CASE("layout: validation table names the offending entry", "[unit][layout]") {
  const region_ref a = reg(0x10000, 1000, 1), b = reg(0x20000, 500, 2);
  region_ref ro = reg(0x30000, 100, 3, access::remote_read);
  region_ref other_pd = reg(0x40000, 100, 4, rw, pd2);
  region_ref unusable = a;
  unusable.problem = errc::unusable;
  region_ref empty;
  empty.problem = errc::null_handle;
  region_ref nobind = reg(0x50000, 100, 5, rw);
  region_ref bind = reg(0x60000, 100, 6, rwb);
  layout_limits lim; // software-like defaults
  layout_limits hw = lim;
  hw.interleave_16bit = true;
  layout_limits sw = lim;
  sw.remote_needs_mw_bind = true;
  layout_limits two = lim;
  two.max_entries = 2;

  struct row {
    const char *what;
    layout l;
    layout_limits lim;
    access_flags acc;
    errc expect;
    std::size_t entry;
  };
  const row rows[] = {
      {"valid list", layout::list({{a, 0, 1000}, {b, 499, 1}}), lim, rw, errc{}, no_entry},
      {"empty layout", layout::list({}), lim, rw, errc::zero_length, no_entry},
      {"zero length entry", layout::list({{a, 0, 10}, {b, 3, 0}}), lim, rw, errc::zero_length, 1},
      {"past the region", layout::list({{a, 0, 10}, {b, 400, 101}}), lim, rw, errc::out_of_range, 1},
      {"offset past end", layout::list({{a, 1001, 1}}), lim, rw, errc::out_of_range, 0},
      {"offset+length overflow", layout::list({{a, UINT64_MAX, 2}}), lim, rw, errc::out_of_range, 0},
      {"entry over 4 GiB", layout::list({{reg(0, 1ull << 33, 9), 0, 1ull << 32}}), lim, rw,
       errc::out_of_range, 0},
      {"missing right", layout::list({{a, 0, 1}, {b, 0, 1}, {ro, 0, 1}}), lim, rw,
       errc::missing_access, 2},
      {"read-only region, read key", layout::list({{ro, 0, 100}}), lim, access::remote_read, errc{},
       no_entry},
      {"pd mismatch", layout::list({{a, 0, 1}, {other_pd, 0, 1}}), lim, rw, errc::pd_mismatch, 1},
      {"unusable MR", layout::list({{a, 0, 1}, {unusable, 0, 1}}), lim, rw, errc::unusable, 1},
      {"null source", layout::list({{empty, 0, 1}}), lim, rw, errc::null_handle, 0},
      {"too many for limits", layout::list({{a, 0, 1}, {a, 1, 1}, {a, 2, 1}}), two, rw,
       errc::too_many_entries, 2},
      {"mw_bind needed", layout::list({{bind, 0, 1}, {nobind, 0, 1}}), sw, rw, errc::missing_access, 1},
      {"mw_bind not needed locally", layout::list({{nobind, 0, 1}}), sw, access::local_write, errc{},
       no_entry},
      {"right not grantable", layout::list({{a, 0, 1}}), lim, rw | access::mw_bind,
       errc::unknown_access_flag, no_entry},
      {"remote write without local", layout::list({{a, 0, 1}}), lim, access::remote_write,
       errc::remote_write_needs_local_write, no_entry},
      {"repeat valid", layout::repeat(3, {{a, 0, 10, 5}, {b, 0, 1, 0}}), hw, rw, errc{}, no_entry},
      {"repeat count 0", layout::repeat(0, {{a, 0, 10, 5}}), lim, rw, errc::zero_length, no_entry},
      // 66 strides of 15 + 10 = 1000 bytes from the offset
      {"repeat just fits", layout::repeat(67, {{a, 0, 10, 5}}), lim, rw, errc{}, no_entry},
      {"repeat past region", layout::repeat(67, {{b, 0, 1, 0}, {a, 1, 10, 5}}), lim, rw,
       errc::out_of_range, 1},
      {"16-bit bytes_count", layout::repeat(1, {{a, 0, 10, 0}, {reg(0, 1 << 17, 7), 0, 0x10000, 0}}),
       hw, rw, errc::out_of_range, 1},
      {"16-bit count+skip", layout::repeat(1, {{reg(0, 1 << 17, 7), 0, 0x8000, 0x8000}}), hw, rw,
       errc::out_of_range, 0},
      {"16-bit ok at 0xffff", layout::repeat(1, {{reg(0, 1 << 17, 7), 0, 0x8000, 0x7fff}}), hw, rw,
       errc{}, no_entry},
      {"no 16-bit limit in software", layout::repeat(1, {{reg(0, 1 << 17, 7), 0, 0x10000, 0}}), lim,
       rw, errc{}, no_entry},
  };
  for (const row &r : rows) {
    INFO(r.what);
    const std::error_code ec = r.l.validate(r.lim, r.acc, pd1);
    if (r.expect == errc{}) {
      INFO(ec.message());
      CHECK_FALSE(ec);
      continue;
    }
    INFO(ec.message());
    CHECK(layout_errc(ec) == r.expect);
    CHECK(layout_error_entry(ec) == r.entry);
    CHECK(ec.category() == layout_category());
  }
}

TEST_CASE("layout: builder errors are remembered and reported", "[unit][layout]") {
  const region_ref a = reg(0, 100, 1);
  layout l;
  for (std::size_t i = 0; i < layout::capacity; ++i) l.add(layout_entry{a, i, 1});
  CHECK_FALSE(l.validate({.max_entries = 64}, rw));
  l.add(layout_entry{a, 0, 1});
  const auto ec = l.validate({.max_entries = 64}, rw);
  CHECK(layout_errc(ec) == errc::too_many_entries);
  CHECK(layout_error_entry(ec) == layout::capacity);
  layout m;
  m.add(repeat_entry{a, 0, 1, 0});
  CHECK(layout_errc(m.validate({}, rw)) == errc::wrong_type);
  CHECK(layout_error_entry(m.validate({}, rw)) == 0);
}

TEST_CASE("layout: error codes carry message, entry and portable condition", "[unit][layout]") {
  const auto ec = layout_error(errc::out_of_range, 3);
  CHECK(ec.message() == "layout entry 3: " + make_error_code(errc::out_of_range).message());
  CHECK(ec == std::errc::result_out_of_range);
  CHECK(layout_error_entry(ec) == 3);
  CHECK(layout_error(errc::zero_length, no_entry).message().rfind("layout: ", 0) == 0);
  CHECK(layout_error_entry(make_error_code(errc::out_of_range)) == no_entry);
  CHECK(layout_errc(make_error_code(errc::busy)) == errc::busy);
  CHECK(layout_errc(std::make_error_code(std::errc::io_error)) == errc{});
  CHECK(layout_error(errc::missing_access, 0) == std::errc::permission_denied);
}

TEST_CASE("layout: list expansion keeps order and merges only true neighbours", "[unit][layout]") {
  const region_ref a = reg(0x1000, 1000, 1), b = reg(0x9000, 1000, 2);
  const layout l = layout::list({{a, 3, 17}, {a, 20, 5}, {b, 0, 10}, {a, 25, 1}, {b, 11, 4}});
  REQUIRE_FALSE(l.validate({}, rw));
  CHECK(l.total_length() == 37);
  key_segment out[8];
  const std::size_t n = l.expand(out).value();
  REQUIRE(n == 4); // {a,3,17}+{a,20,5} merge; {b,0,10} and {b,11,4} are not contiguous
  CHECK(out[0].addr == 0x1003);
  CHECK(out[0].length == 22);
  CHECK(out[0].lkey == 1);
  CHECK(out[0].rkey == 1001);
  CHECK(out[1].addr == 0x9000);
  CHECK(out[1].length == 10);
  CHECK(out[2].addr == 0x1000 + 25);
  CHECK(out[3].addr == 0x9000 + 11);
  key_segment small[2];
  const auto r = l.expand(small);
  REQUIRE_FALSE(r.has_value());
  CHECK(layout_errc(r.error()) == errc::too_many_entries);
  CHECK(layout_error_entry(r.error()) == 2);
}

TEST_CASE("layout: repeat expansion follows the strides", "[unit][layout]") {
  const region_ref a = reg(0x1000, 1000, 1), b = reg(0x9000, 1000, 2);
  const layout l = layout::repeat(3, {{a, 2, 4, 6}, {b, 100, 2, 0}});
  REQUIRE_FALSE(l.validate({}, rw));
  CHECK(l.total_length() == 18);
  key_segment out[16];
  const std::size_t n = l.expand(out).value();
  REQUIRE(n == 6);
  for (std::uint32_t r = 0; r < 3; ++r) {
    CHECK(out[2 * r].addr == 0x1000 + 2 + r * 10);
    CHECK(out[2 * r].length == 4);
    CHECK(out[2 * r + 1].addr == 0x9000 + 100 + r * 2);
    CHECK(out[2 * r + 1].length == 2);
  }
  // a single entry with skip 0 is one contiguous run: one segment. The output must still hold
  // every piece before merging (the bound is on pieces, so expansion time stays bounded).
  const layout c = layout::repeat(50, {{a, 0, 20, 0}});
  REQUIRE_FALSE(c.validate({}, rw));
  CHECK(layout_errc(c.expand(out).error()) == errc::too_many_entries);
  key_segment big[50];
  REQUIRE(c.expand(big).value() == 1);
  CHECK(big[0].length == 1000);
}

TEST_CASE("layout: nested sources are resolved through their segments", "[unit][layout]") {
  const region_ref a = reg(0x1000, 1000, 1), b = reg(0x9000, 1000, 2);
  key_segment inner[4];
  const layout li = layout::list({{a, 0, 10}, {b, 500, 20}, {a, 900, 5}});
  const std::size_t ni = li.expand(inner).value();
  REQUIRE(ni == 3);
  region_ref nested;
  nested.indirect = true;
  nested.pd = pd1;
  nested.length = 35;
  nested.access = rw;
  nested.segments = inner;
  nested.nsegments = std::uint32_t(ni);
  const layout lo = layout::list({{nested, 8, 25}, {a, 500, 1}});
  REQUIRE_FALSE(lo.validate({}, rw, pd1));
  key_segment out[8];
  const std::size_t n = lo.expand(out).value();
  REQUIRE(n == 4);
  CHECK(out[0].addr == 0x1008);
  CHECK(out[0].length == 2);
  CHECK(out[1].addr == 0x9000 + 500);
  CHECK(out[1].length == 20);
  CHECK(out[2].addr == 0x1000 + 900);
  CHECK(out[2].length == 3);
  CHECK(out[3].addr == 0x1000 + 500);
  // beyond the nested key's length
  CHECK(layout_errc(layout::list({{nested, 30, 6}}).validate({}, rw)) == errc::out_of_range);
  // a backend that only nests hardware keys refuses it
  CHECK(layout_errc(lo.validate({.nested_hardware_only = true}, rw)) == errc::wrong_type);
}

TEST_CASE("layout: for_each_piece splits windows exactly", "[unit][layout]") {
  const std::uint64_t lens[] = {5, 1, 10, 3};
  auto len_of = [&](std::size_t i) { return lens[i]; };
  std::vector<window_piece> got;
  auto collect = [&](const window_piece &p) { got.push_back(p); };
  REQUIRE(for_each_piece(4, len_of, 4, 3, collect));
  REQUIRE(got.size() == 3);
  CHECK((got[0].segment == 0 && got[0].segment_offset == 4 && got[0].length == 1 && got[0].done == 0));
  CHECK((got[1].segment == 1 && got[1].segment_offset == 0 && got[1].length == 1 && got[1].done == 1));
  CHECK((got[2].segment == 2 && got[2].segment_offset == 0 && got[2].length == 1 && got[2].done == 2));
  got.clear();
  CHECK(for_each_piece(4, len_of, 18, 1, collect));
  REQUIRE(got.size() == 1);
  CHECK((got[0].segment == 3 && got[0].segment_offset == 2));
  got.clear();
  CHECK_FALSE(for_each_piece(4, len_of, 18, 2, collect)); // one past the end
  CHECK_FALSE(for_each_piece(4, len_of, 0, 0, collect));  // empty
  CHECK_FALSE(for_each_piece(4, len_of, UINT64_MAX, 2, collect));
  CHECK(got.empty());
}

TEST_CASE("layout: property checks over random layouts (fixed seed)", "[unit][layout][property]") {
  std::mt19937_64 rng(20261129);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  const region_ref regs[] = {reg(0x10000, 4096, 1), reg(0x30000, 333, 2), reg(0x50000, 65536, 3),
                             reg(0x90000, 17, 4)};
  std::vector<key_segment> out(4096);
  for (int iter = 0; iter < 2000; ++iter) {
    layout l;
    if (pick(0, 1) == 0) {
      const std::size_t n = pick(1, layout::capacity);
      for (std::size_t i = 0; i < n; ++i) {
        const region_ref &s = regs[pick(0, 3)];
        const std::uint64_t off = pick(0, s.length - 1);
        l.add(layout_entry{s, off, pick(1, s.length - off)});
      }
    } else {
      const std::uint32_t reps = std::uint32_t(pick(1, 20));
      l = layout::repeat(reps, std::span<const repeat_entry>{});
      const std::size_t n = pick(1, 6);
      for (std::size_t i = 0; i < n; ++i) {
        const region_ref &s = regs[pick(0, 3)];
        const std::uint32_t bc = std::uint32_t(pick(1, 8));
        const std::uint32_t skip = std::uint32_t(pick(0, 8));
        const std::uint64_t span = std::uint64_t(reps - 1) * (bc + skip) + bc;
        if (span > s.length) continue;
        l.add(repeat_entry{s, pick(0, s.length - span), bc, skip});
      }
      if (l.size() == 0) continue;
    }
    INFO("iteration " << iter);
    REQUIRE_FALSE(l.validate({.max_segments = 4096}, rw));
    const std::size_t n = l.expand(out).value();
    const std::span<const key_segment> segs(out.data(), n);
    // total length preserved; no empty segment; no mergeable neighbours left
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(segs[i].length > 0);
      sum += segs[i].length;
      if (i > 0)
        CHECK_FALSE((segs[i - 1].lkey == segs[i].lkey && segs[i - 1].addr + segs[i - 1].length == segs[i].addr));
    }
    REQUIRE(sum == l.total_length());
    // every byte maps where the definition says (sampled, plus both ends)
    for (int k = 0; k < 40; ++k) {
      const std::uint64_t x = k == 0 ? 0 : k == 1 ? sum - 1 : pick(0, sum - 1);
      REQUIRE(seg_locate(segs, x) == ref_locate(l, x));
    }
    // any window splits into pieces that are contiguous, in order, and map correctly
    for (int k = 0; k < 10; ++k) {
      const std::uint64_t off = pick(0, sum - 1), len = pick(1, sum - off);
      std::uint64_t expect_done = 0;
      std::size_t last = 0;
      bool first = true;
      const bool ok = for_each_piece(
          n, [&](std::size_t i) { return std::uint64_t(segs[i].length); }, off, len,
          [&](const window_piece &p) {
            CHECK(p.done == expect_done);
            CHECK((first || p.segment == last + 1));
            CHECK(seg_locate(segs, off + p.done) == loc{segs[p.segment].lkey, segs[p.segment].addr + p.segment_offset});
            CHECK(seg_locate(segs, off + p.done + p.length - 1) ==
                  loc{segs[p.segment].lkey, segs[p.segment].addr + p.segment_offset + p.length - 1});
            expect_done += p.length;
            last = p.segment;
            first = false;
          });
      REQUIRE(ok);
      REQUIRE(expect_done == len);
    }
  }
}
