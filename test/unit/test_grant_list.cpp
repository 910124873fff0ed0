// grant_list (kind 4) and grant_offer (kind 5): the request-grant wire formats of GrantPool, and
// what a null pool answers. Decoders refuse truncated, padded, malformed, wrong-version and
// wrong-kind input.
#include <rdmaxx/grant_list.hpp>
#include <rdmaxx/grant_pool.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

using namespace rdmaxx;

namespace {
grant_list sample() {
  grant_list l;
  REQUIRE(l.push({0x1122334455667788ull, 4096, 0xA1B2C3D4u, access::remote_read, false}));
  REQUIRE(l.push({16, 0xFFFFFFFFull, 7, access::remote_write | access::remote_atomic, true}));
  return l;
}
std::vector<std::byte> encoded(const grant_list &l) {
  std::vector<std::byte> v(grant_list::encoded_size(l.size()));
  auto n = l.encode_to(v);
  REQUIRE(n);
  REQUIRE(n.value() == v.size());
  return v;
}
} // namespace

TEST_CASE("grant_list: 18 bytes per grant under the descriptor header, round trip", "[unit][grant-list]") {
  const grant_list l = sample();
  const auto v = encoded(l);
  REQUIRE(v.size() == 46); // two grants fit rdma_cm's 56 bytes of connect private data
  auto h = descriptor_header::peek(v);
  REQUIRE(h);
  CHECK(h.value().kind == std::uint8_t(descriptor_kind::grant_list));
  CHECK(h.value().body_length == 38);
  CHECK(v[8] == std::byte{2});   // count
  CHECK(v[9] == std::byte{0});   // reserved
  CHECK(v[10] == std::byte{0x11}); // addr, big-endian
  CHECK(v[17] == std::byte{0x88});
  CHECK(v[18] == std::byte{0x00}); // length 4096
  CHECK(v[20] == std::byte{0x10});
  CHECK(v[22] == std::byte{0xA1}); // rkey
  CHECK(v[26] == std::byte{1});    // rights: read
  CHECK(v[27] == std::byte{0});    // flags
  CHECK(v[44] == std::byte{6});    // write | atomic
  CHECK(v[45] == std::byte{1});    // zero-based
  auto d = grant_list::decode(v);
  REQUIRE(d);
  CHECK(d.value() == l);
  CHECK(d.value()[1].length == 0xFFFFFFFFull);
  CHECK(d.value()[1].zero_based);
}

TEST_CASE("grant_list: push and encode refuse what the format cannot carry", "[unit][grant-list]") {
  grant_list l;
  std::array<std::byte, 64> out{};
  CHECK(l.encode_to(out).error() == errc::zero_length);
  CHECK(l.push({0, 0, 1, access::remote_read, false}).error() == errc::zero_length);
  CHECK(l.push({0, 1ull << 32, 1, access::remote_read, false}).error() == errc::out_of_range);
  CHECK(l.push({0, 8, 1, access_flags{}, false}).error() == errc::bad_grant_rights);
  CHECK(l.push({0, 8, 1, access::local_write, false}).error() == errc::bad_grant_rights);
  CHECK(make_error_code(errc::bad_grant_rights).message().find("local_write") != std::string::npos);
  for (std::size_t i = 0; i < grant_list::max_grants; ++i) REQUIRE(l.push({i, 8, 1, access::remote_read, false}));
  CHECK(l.push({0, 8, 1, access::remote_read, false}).error() == errc::too_many_entries);
  std::array<std::byte, 10> small{};
  CHECK(l.encode_to(small).error() == errc::buffer_too_small);
  for (std::byte b : small) CHECK(b == std::byte{0}); // nothing written
}

TEST_CASE("grant_list: the decoder refuses every malformed input", "[unit][grant-list]") {
  const auto good = encoded(sample());
  auto bad = [&](auto edit) {
    auto v = good;
    edit(v);
    return grant_list::decode(v);
  };
  CHECK(bad([](auto &v) { v.pop_back(); }).error() == errc::malformed_input);               // truncated
  const auto padded = bad([](auto &v) { v.resize(v.size() + 3); }).error();            // padded
  CHECK(descriptor_errc(padded) == errc::malformed_input);
  CHECK(padded == std::errc::bad_message);
  CHECK(padded.message() == "descriptor: 3 byte(s) after the descriptor: decode exactly "
                            "descriptor_header::peek(in).total_size() bytes (rdma_cm private data is "
                            "padded with zeros)");
  CHECK(bad([](auto &v) { v[0] = std::byte{0}; }).error() == errc::malformed_input);        // magic
  CHECK(bad([](auto &v) { v[4] = std::byte{2}; }).error() == errc::wrong_version);
  const auto window = bad([](auto &v) { v[5] = std::byte{1}; }).error();               // a window
  CHECK(descriptor_errc(window) == errc::wrong_type);
  CHECK(window.message() == "descriptor: a descriptor of kind 1 (window) where kind 4 (grant list) was expected");
  CHECK(bad([](auto &v) { v[8] = std::byte{1}; }).error() == errc::malformed_input);        // count vs length
  CHECK(bad([](auto &v) { v[8] = std::byte{0}; }).error() == errc::malformed_input);
  CHECK(bad([](auto &v) { v[9] = std::byte{1}; }).error() == errc::malformed_input);        // reserved
  CHECK(bad([](auto &v) { v[26] = std::byte{0}; }).error() == errc::malformed_input);       // no rights
  CHECK(bad([](auto &v) { v[26] = std::byte{8}; }).error() == errc::malformed_input);       // unknown right
  CHECK(bad([](auto &v) { v[27] = std::byte{2}; }).error() == errc::malformed_input);       // unknown flag
  CHECK(bad([](auto &v) { for (int i = 18; i < 22; ++i) v.at(std::size_t(i)) = std::byte{0}; }).error() ==
        errc::malformed_input);                                                             // zero length
  CHECK(bad([](auto &v) { for (int i = 10; i < 18; ++i) v.at(std::size_t(i)) = std::byte{0xFF}; }).error() ==
        errc::malformed_input);                                                             // wraps
  // Nine grants: the count and the body length agree, and still refused.
  std::vector<std::byte> nine(grant_list::encoded_size(9));
  detail::wire_writer w(nine);
  descriptor_header{descriptor_version, grant_list::kind, std::uint16_t(nine.size() - 8)}.write(w);
  w.u8(9);
  CHECK(grant_list::decode(nine).error() == errc::malformed_input);
  for (std::size_t n = 0; n < good.size(); ++n)
    CHECK_FALSE(grant_list::decode(std::span(good).first(n)));
}

TEST_CASE("grant_offer: 12 bytes, decoded from padded private data", "[unit][grant-list]") {
  for (bool inv : {false, true}) {
    const auto v = grant_offer{inv}.encode();
    REQUIRE(v.size() == 12);
    CHECK(v[5] == std::byte{std::uint8_t(descriptor_kind::grant_offer)});
    std::vector<std::byte> padded(v.begin(), v.end());
    padded.resize(56); // what rdma_cm delivers
    auto d = grant_offer::decode(padded);
    REQUIRE(d);
    CHECK(d.value().remote_invalidate == inv);
  }
  auto v = grant_offer{true}.encode();
  v[8] = std::byte{3};
  CHECK(grant_offer::decode(v).error() == errc::malformed_input);
  v = grant_offer{}.encode();
  v[11] = std::byte{1};
  CHECK(grant_offer::decode(v).error() == errc::malformed_input);
  v = grant_offer{}.encode();
  CHECK(grant_offer::decode(std::span(v).first(11)).error() == errc::malformed_input);
  const auto wrong = grant_offer::decode(remote_descriptor{0, 8, 1, access::remote_read, false}.encode()).error();
  CHECK(descriptor_errc(wrong) == errc::wrong_type);
  CHECK(wrong.message() == "descriptor: a descriptor of kind 1 (window) where kind 5 (grant offer) was expected");
}

TEST_CASE("GrantPool: a null pool and a null lease answer null_handle and hold nothing", "[unit][grant-list]") {
  GrantPool p;
  CHECK_FALSE(p);
  CHECK(p.size() == 0);
  CHECK(p.available() == 0);
  CHECK(p.mechanism() == grant_mechanism::none);
  CHECK(p.acquire().error() == errc::null_handle);
  CHECK(p.revoke_all().error() == errc::null_handle);
  GrantLease l;
  CHECK(p.give_back(l).error() == errc::null_handle);
  CHECK(l.state() == lease_state::ready);
  CHECK(l.buffer().error() == errc::null_handle); // never an empty span to write through
  ibv_wc wc[2]{};
  wc[0].wr_id = grant_pool_wr_tag | 1;
  CHECK(p.complete(wc).size() == 2); // nothing is taken by a null pool
  CHECK_FALSE(p.owns(wc[0]));
  GrantPool q(std::move(p));
  CHECK_FALSE(q);
}

// The pool's key index (detail::fixed_vector of key_entry sorted by our own heapsort and searched
// by our own lower_bound, not <algorithm>'s): against std::sort and std::lower_bound on the same
// data, and key_entry's order against std::pair's.
TEST_CASE("GrantPool's key index: sort, lower_bound, insert and erase agree with the standard ones",
          "[unit][grant-pool]") {
  using entry = detail::key_entry;
  for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 64u, 1000u}) {
    detail::fixed_vector<entry> v;
    REQUIRE(v.allocate(n + 1, false));
    std::vector<entry> ref;
    std::uint32_t x = 12345;
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 1103515245u + 12345u;
      const entry e{(x >> 8) % 97, std::uint32_t(i)}; // repeated keys, distinct slots
      v.push_back(e);
      ref.push_back(e);
    }
    for (std::size_t i = 0; i + 1 < ref.size(); ++i) // the order std::pair gave
      CHECK((ref[i] < ref[i + 1]) == (std::pair{ref[i].key, ref[i].slot} < std::pair{ref[i + 1].key, ref[i + 1].slot}));
    v.sort();
    std::sort(ref.begin(), ref.end());
    REQUIRE(std::equal(v.begin(), v.end(), ref.begin(), ref.end()));
    for (std::uint32_t k = 0; k < 100; ++k) {
      const entry probe{k, 0};
      CHECK(v.lower_bound(probe) - v.begin() == std::lower_bound(ref.begin(), ref.end(), probe) - ref.begin());
    }
    const entry e{50, 7777};
    v.insert(v.lower_bound(e), e);
    ref.insert(std::lower_bound(ref.begin(), ref.end(), e), e);
    REQUIRE(std::equal(v.begin(), v.end(), ref.begin(), ref.end()));
    v.erase(v.begin());
    ref.erase(ref.begin());
    REQUIRE(std::equal(v.begin(), v.end(), ref.begin(), ref.end()));
    if (!ref.empty()) {
      v.erase(v.end() - 1);
      ref.pop_back();
      REQUIRE(std::equal(v.begin(), v.end(), ref.begin(), ref.end()));
    }
  }
}
