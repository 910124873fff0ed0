// endpoint::encode/decode: kind 3 under the common descriptor header; decode refuses truncated,
// padded, malformed, wrong-version and wrong-kind input.
#include <rdmaxx/queue_pair.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace rdmaxx;

namespace {
endpoint sample() {
  endpoint e;
  e.qpn = 0x123456;
  e.psn = 0xabcdef;
  for (int i = 0; i < 16; ++i) e.gid.raw[i] = std::uint8_t(0xf0 + i);
  e.lid = 0x0102;
  e.mtu = IBV_MTU_4096;
  return e;
}
} // namespace

TEST_CASE("endpoint: 36-byte big-endian encoding under the descriptor header", "[unit][endpoint]") {
  const auto w = sample().encode();
  REQUIRE(w.size() == endpoint::encoded_size);
  REQUIRE(endpoint::encoded_size == 36);
  auto h = descriptor_header::peek(w);
  REQUIRE(h);
  CHECK(h.value().kind == std::uint8_t(descriptor_kind::endpoint));
  CHECK(h.value().body_length == endpoint::body_size);
  CHECK(h.value().total_size() == w.size());
  CHECK(w[8] == std::byte{0x00});
  CHECK(w[9] == std::byte{0x12});
  CHECK(w[11] == std::byte{0x56});
  CHECK(w[13] == std::byte{0xab});
  CHECK(w[16] == std::byte{0xf0});
  CHECK(w[32] == std::byte{0x01});
  CHECK(w[33] == std::byte{0x02});
  CHECK(w[34] == std::byte{std::uint8_t(IBV_MTU_4096)});
  CHECK(w[35] == std::byte{0});
  auto d = endpoint::decode(w);
  REQUIRE(d);
  CHECK(d.value() == sample());
}

TEST_CASE("endpoint::decode refuses bad input", "[unit][endpoint]") {
  const auto good = sample().encode();
  auto with = [&](std::size_t at, std::uint8_t v) {
    auto b = good;
    b[at] = std::byte{v};
    return b;
  };
  struct row {
    const char *what;
    std::vector<std::byte> bytes;
    errc expect;
  };
  std::vector<row> rows;
  rows.push_back({"empty", {}, errc::malformed_input});
  rows.push_back({"header only", {good.begin(), good.begin() + 8}, errc::malformed_input});
  rows.push_back({"truncated body", {good.begin(), good.end() - 1}, errc::malformed_input});
  std::vector<std::byte> padded(good.begin(), good.end());
  padded.push_back(std::byte{0});
  rows.push_back({"trailing byte", padded, errc::malformed_input});
  auto mk = [](auto a) { return std::vector<std::byte>(a.begin(), a.end()); };
  rows.push_back({"wrong magic", mk(with(0, 0)), errc::malformed_input});
  rows.push_back({"wrong version", mk(with(4, 2)), errc::wrong_version});
  rows.push_back({"window kind", mk(with(5, 1)), errc::wrong_type});
  rows.push_back({"unknown kind", mk(with(5, 9)), errc::wrong_type});
  rows.push_back({"body length", mk(with(7, 27)), errc::malformed_input});
  auto qpn0 = good;
  for (int i = 8; i < 12; ++i) qpn0[i] = std::byte{0};
  rows.push_back({"qpn 0", mk(qpn0), errc::malformed_input});
  rows.push_back({"qpn above 24 bits", mk(with(8, 1)), errc::malformed_input});
  rows.push_back({"psn above 24 bits", mk(with(12, 1)), errc::malformed_input});
  rows.push_back({"mtu 0", mk(with(34, 0)), errc::malformed_input});
  rows.push_back({"mtu 6", mk(with(34, 6)), errc::malformed_input});
  rows.push_back({"reserved set", mk(with(35, 1)), errc::malformed_input});
  for (const auto &r : rows) {
    INFO(r.what);
    auto d = endpoint::decode(r.bytes);
    REQUIRE(!d);
    CHECK(descriptor_errc(d.error()) == r.expect);
  }
  // A window descriptor is not an endpoint, and an endpoint is not a window descriptor.
  remote_descriptor wd{4096, 64, 0x1234, access::remote_write, false};
  const auto wrong = endpoint::decode(wd.encode()).error();
  CHECK(descriptor_errc(wrong) == errc::wrong_type);
  CHECK(wrong.message() == "descriptor: a descriptor of kind 1 (window) where kind 3 (endpoint) was expected");
  CHECK(endpoint::decode(padded).error().message().find("descriptor_header::peek") != std::string::npos);
  CHECK(descriptor_errc(remote_descriptor::decode(good).error()) == errc::wrong_type);
}
