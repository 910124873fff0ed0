// indirect_key.hpp without a device: the remote descriptor (exact bytes, every malformed input
// refused), the null IndirectKey, and the options.
#include <rdmaxx/indirect_key.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <random>
#include <string_view>
#include <string>
#include <vector>

using namespace rdmaxx;

namespace {
std::vector<std::byte> bytes(std::initializer_list<unsigned> v) {
  std::vector<std::byte> out;
  for (unsigned b : v) out.push_back(std::byte(b));
  return out;
}
} // namespace

TEST_CASE("ikey descriptor: exact encoding, round trip", "[unit][ikey][descriptor]") {
  const remote_segment segs[] = {{0x0102030405060708ull, 0x11, 0xAABBCCDD}, {0x10, 0x100, 0x7}};
  auto d = ikey_descriptor::make(segs, access::remote_write | access::remote_read);
  REQUIRE(d.has_value());
  CHECK(d.value().length() == 0x111);
  std::array<std::byte, ikey_descriptor::encoded_size(2)> buf{};
  REQUIRE(d.value().encode(buf).value() == 56);
  // the common descriptor header (kind 2, body 48 bytes), then rights, count, total, segments
  const auto expect = bytes({'R', 'D', 'X', 'D', 1, 2, 0, 48,
                             3, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x11,
                             1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0x11, 0xAA, 0xBB, 0xCC, 0xDD,
                             0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1, 0, 0, 0, 0, 7});
  REQUIRE(expect.size() == buf.size());
  for (std::size_t i = 0; i < buf.size(); ++i) {
    INFO("byte " << i);
    CHECK(buf[i] == expect[i]);
  }
  auto back = ikey_descriptor::decode(buf);
  REQUIRE(back.has_value());
  CHECK(back.value() == d.value());
  CHECK(back.value().rights() == (access::remote_write | access::remote_read));
  CHECK(back.value().segments()[0].rkey == 0xAABBCCDD);
  // too small an output buffer
  std::array<std::byte, 55> small{};
  CHECK(d.value().encode(small).error() == errc::buffer_too_small);
}

TEST_CASE("ikey descriptor: make() refuses bad input", "[unit][ikey][descriptor]") {
  const remote_segment ok{0, 1, 1}, empty{0, 0, 1};
  std::vector<remote_segment> many(ikey_descriptor::max_segments + 1, ok);
  std::vector<remote_segment> full(ikey_descriptor::max_segments, remote_segment{0, UINT32_MAX, 1});
  CHECK(ikey_descriptor::make({}, access::remote_read).error() == errc::zero_length);
  CHECK(ikey_descriptor::make(std::span(&empty, 1), access::remote_read).error() == errc::zero_length);
  CHECK(ikey_descriptor::make(many, access::remote_read).error() == errc::too_many_entries);
  CHECK(ikey_descriptor::make(std::span(&ok, 1), access::local_write).error() == errc::unknown_access_flag);
  CHECK(ikey_descriptor::make(std::span(&ok, 1), access_flags{}).error() == errc::missing_access);
  auto big = ikey_descriptor::make(full, access::remote_read);
  REQUIRE(big.has_value());
  CHECK(big.value().length() == std::uint64_t(UINT32_MAX) * ikey_descriptor::max_segments);
  std::array<std::byte, 64> out{};
  CHECK(ikey_descriptor().encode(out).error() == errc::zero_length);
}

TEST_CASE("ikey descriptor: the decoder refuses malformed input", "[unit][ikey][descriptor]") {
  const remote_segment segs[] = {{0x1000, 10, 5}, {0x2000, 20, 6}, {0x3000, 30, 7}};
  const auto d = ikey_descriptor::make(segs, access::remote_write).value();
  std::array<std::byte, ikey_descriptor::encoded_size(3)> good{};
  REQUIRE(d.encode(good).value() == good.size());
  auto decode = [](std::vector<std::byte> v) {
    return ikey_descriptor::decode(std::span<const std::byte>(v.data(), v.size()));
  };
  const std::vector<std::byte> base(good.begin(), good.end());
  REQUIRE(decode(base).has_value());

  // every truncation, including empty input
  for (std::size_t n = 0; n < base.size(); ++n) {
    INFO("truncated to " << n);
    auto r = decode(std::vector<std::byte>(base.begin(), base.begin() + std::ptrdiff_t(n)));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::malformed_input);
  }
  struct row {
    const char *what;
    std::size_t at;
    unsigned value;
    errc expect;
  };
  const row rows[] = {
      {"magic", 0, 'X', errc::malformed_input},
      {"version 2", 4, 2, errc::wrong_version},
      {"version 0", 4, 0, errc::wrong_version},
      {"kind window", 5, 1, errc::wrong_type},
      {"body length short", 7, 63, errc::malformed_input},
      {"body length long", 7, 65, errc::malformed_input},
      {"unknown rights bit", 8, 0x0a, errc::malformed_input},
      {"no rights", 8, 0, errc::malformed_input},
      {"reserved byte", 9, 1, errc::malformed_input},
      {"count 0", 11, 0, errc::malformed_input},
      {"count says 4", 11, 4, errc::malformed_input},
      {"count says 2", 11, 2, errc::malformed_input},
      {"reserved word", 15, 1, errc::malformed_input},
      {"total too big", 23, 61, errc::malformed_input},
      {"total too small", 23, 59, errc::malformed_input},
      {"empty segment", 35, 0, errc::malformed_input},
  };
  for (const row &r : rows) {
    INFO(r.what);
    auto v = base;
    v[r.at] = std::byte(r.value);
    auto res = decode(v);
    REQUIRE_FALSE(res.has_value());
    CHECK(descriptor_errc(res.error()) == r.expect);
  }
  // more segments than the bound: refused before reading them
  auto v = base;
  v[10] = std::byte(0x01);
  v[11] = std::byte(0x01); // 257
  CHECK(decode(v).error() == errc::too_many_entries);
  // trailing bytes
  v = base;
  v.push_back(std::byte(0));
  const auto trailing = decode(v).error();
  CHECK(descriptor_errc(trailing) == errc::malformed_input);
  CHECK(trailing.message().find("1 byte(s) after the descriptor") != std::string::npos);
  CHECK(trailing.message().find("descriptor_header::peek") != std::string::npos);
  // segment lengths whose sum overflows 64 bits cannot occur (32-bit lengths, <= 256 of them),
  // but a total that disagrees must be refused: covered above. Random garbage never decodes
  // into something that re-encodes differently.
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    auto g = base;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) g[rng() % g.size()] = std::byte(rng() & 0xff);
    auto r = decode(g);
    if (!r) continue;
    std::array<std::byte, ikey_descriptor::max_encoded_size> re{};
    const std::size_t n = r.value().encode(re).value();
    REQUIRE(n == g.size());
    REQUIRE(std::equal(g.begin(), g.end(), re.begin()));
  }
}

TEST_CASE("ikey: a null IndirectKey refuses everything cleanly", "[unit][ikey]") {
  IndirectKey k;
  CHECK_FALSE(k);
  CHECK(k.backend() == umr_backend::none);
  CHECK_FALSE(k.configured());
  CHECK(k.length() == 0);
  CHECK(k.lkey() == 0);
  CHECK(k.rkey() == 0);
  CHECK(k.native_handle() == nullptr);
  CHECK(k.segments().empty());
  ibv_sge sg[2];
  CHECK(k.sges(0, 1, sg).error() == errc::null_handle);
  CHECK(k.descriptor().error() == errc::null_handle);
  CHECK(k.revoke().error() == errc::null_handle);
  CHECK(k.destroy().has_value());
  const region_ref r = k;
  CHECK(r.problem == errc::null_handle);
  CHECK(layout_errc(layout::list({{k, 0, 1}}).validate({}, access::local_write)) == errc::null_handle);
  ProtectionDomain pd;
  CHECK(IndirectKey::create(pd, 4).error() == errc::null_handle);
  IndirectKey moved = std::move(k);
  CHECK_FALSE(moved);
  static_assert(!std::is_copy_constructible_v<IndirectKey>);
  static_assert(std::is_nothrow_move_constructible_v<IndirectKey>);
  static_assert(std::is_nothrow_move_assignable_v<IndirectKey>);
}

TEST_CASE("ikey: RDMAXX_UMR=software is recognised", "[unit][ikey]") {
  ::setenv("RDMAXX_UMR", "software", 1);
  CHECK(detail::umr_forced_software());
  ::setenv("RDMAXX_UMR", "mlx5", 1);
  CHECK_FALSE(detail::umr_forced_software());
  ::unsetenv("RDMAXX_UMR");
  CHECK_FALSE(detail::umr_forced_software());
}

TEST_CASE("ikey descriptor: one header and one rights byte with window descriptors", "[unit][ikey][descriptor]") {
  const remote_segment segs[] = {{0x1000, 10, 5}};
  const auto d = ikey_descriptor::make(segs, access::remote_read | access::remote_atomic).value();
  std::array<std::byte, ikey_descriptor::encoded_size(1)> ik{};
  REQUIRE(d.encode(ik).has_value());
  auto h = descriptor_header::peek(ik);
  REQUIRE(h.has_value());
  CHECK(h.value().kind == std::uint8_t(descriptor_kind::indirect_key));
  CHECK(h.value().total_size() == ik.size());
  // each decoder refuses the other kind as such, not as garbage
  CHECK(descriptor_errc(remote_descriptor::decode(ik).error()) == errc::wrong_type);
  const remote_descriptor w{0x2000, 64, 9, access::remote_read | access::remote_atomic, false};
  const auto wb = w.encode();
  const auto wrong = ikey_descriptor::decode(wb).error();
  CHECK(descriptor_errc(wrong) == errc::wrong_type);
  CHECK(wrong.message() ==
        "descriptor: a descriptor of kind 1 (window) where kind 2 (indirect key) was expected");
  // the same rights byte in both kinds
  CHECK(wb[28] == ik[8]);
  CHECK(std::to_integer<unsigned>(ik[8]) == detail::rights_to_wire(d.rights()));
}

TEST_CASE("Capabilities::umr_why: why the mlx5 backend is or is not chosen", "[unit][ikey]") {
  using detail::umr_reason_of;
  // the build decides first, then the device, then RDMAXX_UMR, then the live probe
  CHECK(umr_reason_of(false, true, false, umr_reason::chosen) == umr_reason::no_mlx5_build);
  CHECK(umr_reason_of(true, false, false, umr_reason::chosen) == umr_reason::not_mlx5_device);
  CHECK(umr_reason_of(true, false, true, umr_reason::chosen) == umr_reason::not_mlx5_device);
  CHECK(umr_reason_of(true, true, true, umr_reason::chosen) == umr_reason::forced_software);
  CHECK(umr_reason_of(true, true, true, umr_reason::umr_modify_atomic_disabled) == umr_reason::forced_software);
  for (umr_reason probed : {umr_reason::chosen, umr_reason::umr_modify_atomic_disabled,
                            umr_reason::mkey_creation_failed, umr_reason::no_devx, umr_reason::hca_query_failed})
    CHECK(umr_reason_of(true, true, false, probed) == probed);
  // every reason has its own sentence
  const umr_reason all[] = {umr_reason::chosen,          umr_reason::no_mlx5_build,
                            umr_reason::not_mlx5_device, umr_reason::forced_software,
                            umr_reason::umr_modify_atomic_disabled, umr_reason::mkey_creation_failed,
                            umr_reason::no_devx,         umr_reason::hca_query_failed,
                            umr_reason::umr_indirect_mkey_disabled};
  for (umr_reason a : all)
    for (umr_reason b : all)
      CHECK((a == b) == (std::string_view(umr_reason_text(a)) == umr_reason_text(b)));
  CHECK(std::string_view(umr_reason_text(umr_reason::not_mlx5_device)) == "not an mlx5 device");
  CHECK(std::string_view(umr_reason_text(umr_reason::umr_modify_atomic_disabled)).find("umr_modify_atomic_disabled") !=
        std::string_view::npos);
  Capabilities c; // a default says nothing was found
  CHECK(c.umr == umr_backend::none);
  CHECK(c.umr_errno == 0);
}
