// remote_descriptor: exact bytes, round trip, and refusal of malformed, truncated and
// wrong-version input (no device needed).
#include <rdmaxx/remote_descriptor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <span>
#include <vector>

using namespace rdmaxx;

namespace {
remote_descriptor sample() {
  return {0x0102030405060708ull, 0x1000, 0xA1B2C3D4u, access::remote_read | access::remote_write, false};
}
std::vector<std::byte> bytes_of(const remote_descriptor &d) {
  const auto a = d.encode();
  return {a.begin(), a.end()};
}
} // namespace

TEST_CASE("descriptor: the encoding is 32 big-endian bytes with a versioned header", "[unit][descriptor]") {
  const auto b = bytes_of(sample());
  REQUIRE(b.size() == remote_descriptor::encoded_size);
  REQUIRE(b.size() == 32);
  const unsigned char expect[32] = {
      0x52, 0x44, 0x58, 0x44, // magic "RDXD"
      1,    1,    0,    24,   // version 1, kind window, body length 24
      1,    2,    3,    4,    5, 6, 7, 8,       // addr
      0,    0,    0,    0,    0, 0, 0x10, 0,    // length
      0xA1, 0xB2, 0xC3, 0xD4,                   // rkey
      3,    0,    0,    0,                      // rights read|write, flags, reserved
  };
  for (std::size_t i = 0; i < 32; ++i) {
    INFO("byte " << i);
    CHECK(std::to_integer<unsigned>(b[i]) == expect[i]);
  }
}

TEST_CASE("descriptor: round trip of every rights combination and zero-based", "[unit][descriptor]") {
  const access_flags rights[] = {access::remote_read, access::remote_write, access::remote_atomic,
                                 access::remote_read | access::remote_write,
                                 access::remote_read | access::remote_write | access::remote_atomic};
  for (const auto r : rights)
    for (const bool zb : {false, true}) {
      const remote_descriptor d{zb ? 0 : 0x7fff'0000'1000ull, 4096, 0x00123456u, r, zb};
      const auto b = d.encode();
      auto back = remote_descriptor::decode(b);
      REQUIRE(back.has_value());
      CHECK(back.value() == d);
      std::array<std::byte, 40> big{};
      auto n = d.encode_to(big);
      REQUIRE(n.has_value());
      CHECK(n.value() == 32);
      CHECK(remote_descriptor::decode(std::span<const std::byte>(big).first(32)).value() == d);
    }
  std::array<std::byte, 31> small{};
  CHECK(sample().encode_to(small).error() == errc::buffer_too_small);
}

TEST_CASE("descriptor: the header can be peeked to learn the total size", "[unit][descriptor]") {
  const auto b = bytes_of(sample());
  auto h = descriptor_header::peek(std::span<const std::byte>(b).first(8));
  REQUIRE(h.has_value());
  CHECK(h.value().kind == std::uint8_t(descriptor_kind::window));
  CHECK(h.value().total_size() == 32);
  CHECK(descriptor_header::peek(std::span<const std::byte>(b).first(7)).error() == errc::malformed_input);
}

TEST_CASE("descriptor: every truncation and any trailing byte is refused", "[unit][descriptor]") {
  auto b = bytes_of(sample());
  for (std::size_t n = 0; n < b.size(); ++n) {
    INFO("first " << n << " bytes");
    auto r = remote_descriptor::decode(std::span<const std::byte>(b).first(n));
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::malformed_input);
  }
  b.push_back(std::byte{0});
  const auto trailing = remote_descriptor::decode(b).error();
  CHECK(trailing.category() == descriptor_category());
  CHECK(descriptor_errc(trailing) == errc::malformed_input);
  CHECK(trailing.message().find("1 byte(s) after the descriptor") != std::string::npos);
  CHECK(trailing.message().find("descriptor_header::peek") != std::string::npos);
}

TEST_CASE("descriptor: rdma_cm's padded private data is refused with a pointer to peek()", "[unit][descriptor]") {
  auto b = bytes_of(sample());
  b.resize(196); // what an accept's private data looks like on the active side
  const auto r = remote_descriptor::decode(b);
  REQUIRE_FALSE(r);
  CHECK(descriptor_errc(r.error()) == errc::malformed_input);
  CHECK(r.error().message().find("164 byte(s) after the descriptor") != std::string::npos);
  // What the message says to do works.
  auto h = descriptor_header::peek(b);
  REQUIRE(h.has_value());
  CHECK(remote_descriptor::decode(std::span<const std::byte>(b).first(h.value().total_size())).value() == sample());
}

TEST_CASE("descriptor: another kind is refused naming the kind expected and the kind found", "[unit][descriptor]") {
  auto b = bytes_of(sample());
  b[5] = std::byte{3}; // an endpoint's header
  const auto r = remote_descriptor::decode(b);
  REQUIRE_FALSE(r);
  CHECK(r.error().category() == descriptor_category());
  CHECK(descriptor_errc(r.error()) == errc::wrong_type);
  CHECK(r.error().message() == "descriptor: a descriptor of kind 3 (endpoint) where kind 1 (window) was expected");
  CHECK(r.error().default_error_condition() == make_error_code(errc::wrong_type).default_error_condition());
  b[5] = std::byte{9};
  CHECK(remote_descriptor::decode(b).error().message().find("kind 9 (unknown)") != std::string::npos);
}

TEST_CASE("descriptor: malformed and wrong-version input is refused with the right code", "[unit][descriptor]") {
  struct row { std::size_t at; unsigned char value; std::error_code expect; const char *what; };
  const row rows[] = {
      {0, 0x00, errc::malformed_input, "magic"},
      {3, 0x45, errc::malformed_input, "magic last byte"},
      {4, 0, errc::wrong_version, "version 0"},
      {4, 2, errc::wrong_version, "version 2"},
      {4, 0xff, errc::wrong_version, "version 255"},
      {5, 0, errc::wrong_type, "kind 0"},
      {5, 2, errc::wrong_type, "kind 2 (another descriptor kind)"},
      {7, 23, errc::malformed_input, "body length 23"},
      {7, 25, errc::malformed_input, "body length 25"},
      {6, 1, errc::malformed_input, "body length 280"},
      {28, 0, errc::malformed_input, "no rights"},
      {28, 8, errc::malformed_input, "unknown rights bit"},
      {28, 0x83, errc::malformed_input, "high rights bit"},
      {29, 2, errc::malformed_input, "unknown flag bit"},
      {30, 1, errc::malformed_input, "reserved"},
      {31, 0x80, errc::malformed_input, "reserved low byte"},
  };
  for (const auto &r : rows) {
    auto b = bytes_of(sample());
    b[r.at] = std::byte{r.value};
    INFO(r.what);
    auto d = remote_descriptor::decode(b);
    REQUIRE_FALSE(d);
    CHECK(make_error_code(descriptor_errc(d.error())) == r.expect);
  }
  // Zero length, and a range that wraps the address space.
  auto zero = sample();
  zero.length = 0;
  CHECK(remote_descriptor::decode(zero.encode()).error() == errc::malformed_input);
  auto wrap = sample();
  wrap.addr = ~0ull - 10;
  wrap.length = 11;
  CHECK(remote_descriptor::decode(wrap.encode()).error() == errc::malformed_input);
  wrap.length = 10; // ends exactly at the top: fine
  CHECK(remote_descriptor::decode(wrap.encode()).has_value());
}

TEST_CASE("descriptor: checked slices stay inside the grant", "[unit][descriptor]") {
  const auto d = sample();
  CHECK(d.at(16).addr == d.addr + 16);
  CHECK(d.at(16).rkey == d.rkey);
  CHECK(d.slice(0, 0x1000).has_value());
  CHECK(d.slice(0x1000 - 8, 8).value().addr == d.addr + 0x1000 - 8);
  CHECK(d.slice(0x1000 - 8, 9).error() == errc::out_of_range);
  CHECK(d.slice(0x1001, 1).error() == errc::out_of_range);
  CHECK(d.slice(0, 0).error() == errc::zero_length);
}

TEST_CASE("descriptor: decode_private_data takes rdma_cm's zero padding and nothing else", "[unit][descriptor]") {
  const auto exact = bytes_of(sample());
  struct row {
    const char *what;
    std::vector<std::byte> in;
    std::error_code expect; // empty: decodes to sample()
  };
  std::vector<row> rows;
  rows.push_back({"exactly 32 bytes", exact, {}});
  for (const std::size_t n : {std::size_t(33), std::size_t(56), std::size_t(196), std::size_t(4096)}) {
    auto b = exact;
    b.resize(n); // zeros: an accept's (196) or connect's (56) private data as received
    rows.push_back({"padded with zeros", b, {}});
  }
  for (const std::size_t at : {std::size_t(32), std::size_t(100), std::size_t(195)}) {
    auto b = exact;
    b.resize(196);
    b[at] = std::byte{1}; // something else sent after the descriptor
    rows.push_back({"a non-zero byte in the padding", b, errc::malformed_input});
  }
  for (const std::size_t n : {std::size_t(0), std::size_t(7), std::size_t(8), std::size_t(31)})
    rows.push_back({"short", std::vector<std::byte>(exact.begin(), exact.begin() + long(n)), errc::malformed_input});
  {
    auto b = exact;
    b.resize(196);
    b[4] = std::byte{2};
    rows.push_back({"padded, another version", b, errc::wrong_version});
    b[4] = std::byte{1};
    b[5] = std::byte{3};
    b[100] = std::byte{7}; // another kind wins over the tail: it says more
    rows.push_back({"padded, another kind, non-zero tail", b, errc::wrong_type});
    b[5] = std::byte{1};
    b[100] = std::byte{0};
    b[28] = std::byte{0};
    rows.push_back({"padded, no rights", b, errc::malformed_input});
  }
  std::vector<std::byte> zeros(196);
  rows.push_back({"196 zero bytes (nothing sent)", zeros, errc::malformed_input});
  for (const auto &r : rows) {
    INFO(r.what << ", " << r.in.size() << " bytes");
    const auto d = remote_descriptor::decode_private_data(r.in);
    if (!r.expect) {
      REQUIRE(d.has_value());
      CHECK(d.value() == sample());
    } else {
      REQUIRE_FALSE(d);
      CHECK(make_error_code(descriptor_errc(d.error())) == r.expect);
    }
  }
  // decode() itself still refuses the padding (one input, one meaning).
  auto padded = exact;
  padded.resize(56);
  CHECK(descriptor_errc(remote_descriptor::decode(padded).error()) == errc::malformed_input);
}

// The pointer forms (what decode_private_data uses for its prefix) answer exactly as the span
// forms, on every prefix of a valid descriptor, on the whole, and on a corrupted copy; a null
// pointer with no bytes is truncated input, not a crash.
TEST_CASE("descriptor: decode and peek by pointer and size answer as the span forms", "[unit][descriptor]") {
  const auto good = bytes_of(sample());
  auto bad = good;
  bad[4] = std::byte{9}; // version
  const std::vector<std::byte> *inputs[] = {&good, &bad};
  for (const auto *v : inputs) {
    for (std::size_t n = 0; n <= v->size(); ++n) {
      const std::span<const std::byte> s(v->data(), n);
      const auto a = remote_descriptor::decode(s);
      const auto b = remote_descriptor::decode(v->data(), n);
      REQUIRE(a.has_value() == b.has_value());
      if (a) CHECK(a.value() == b.value());
      else CHECK(a.error() == b.error());
      const auto h1 = descriptor_header::peek(s);
      const auto h2 = descriptor_header::peek(v->data(), n);
      REQUIRE(h1.has_value() == h2.has_value());
      if (h1) CHECK(h1.value().total_size() == h2.value().total_size());
      else CHECK(h1.error() == h2.error());
    }
  }
  CHECK(remote_descriptor::decode(good.data(), good.size()).value() == sample());
  CHECK(remote_descriptor::decode(nullptr, 0).error() == errc::malformed_input);
  CHECK(descriptor_header::peek(nullptr, 0).error() == errc::malformed_input);
}
