// detail/wire.hpp: network byte order, and a reader that never passes its input.
#include <rdmaxx/detail/wire.hpp>

#include <catch2/catch.hpp>

#include <array>

using namespace rdmaxx::detail;

TEST_CASE("wire: big-endian round trip and exact bytes", "[unit][wire]") {
  std::array<std::byte, 15> buf{};
  wire_writer w(buf);
  w.u8(0xAB);
  w.u16(0x0102);
  w.u32(0x03040506);
  w.u64(0x0708090A0B0C0D0Eull);
  REQUIRE_FALSE(w.overflow());
  REQUIRE(w.size() == 15);
  const unsigned char expect[] = {0xAB, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  for (std::size_t i = 0; i < 15; ++i) CHECK(std::to_integer<unsigned>(buf[i]) == expect[i]);
  wire_reader r(buf);
  CHECK(r.u8() == 0xAB);
  CHECK(r.u16() == 0x0102);
  CHECK(r.u32() == 0x03040506u);
  CHECK(r.u64() == 0x0708090A0B0C0D0Eull);
  CHECK_FALSE(r.failed());
  CHECK(r.remaining() == 0);
}

TEST_CASE("wire: overflow and truncation are reported, never overrun", "[unit][wire]") {
  std::array<std::byte, 5> small{};
  wire_writer w(small);
  w.u32(1);
  w.u16(2); // does not fit
  CHECK(w.overflow());
  CHECK(w.size() == 4);
  wire_reader r(std::span<const std::byte>(small).first(3));
  CHECK(r.u32() == 0);
  CHECK(r.failed());
  CHECK(r.u8() == 0); // stays failed
  CHECK(r.position() == 0);
}

TEST_CASE("wire: a reader after more bytes than there are reads nothing", "[unit][wire]") {
  const std::array<std::byte, 6> in{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}, std::byte{5}, std::byte{6}};
  auto r = wire_reader::after(in, 2);
  CHECK(r.remaining() == 4);
  CHECK(r.u32() == 0x03040506u);
  CHECK(!r.failed());
  auto at_end = wire_reader::after(in, 6);
  CHECK(at_end.remaining() == 0);
  CHECK(at_end.u8() == 0);
  CHECK(at_end.failed());
  auto past = wire_reader::after(in, 7); // before: subspan(7) of 6 bytes, a precondition violation
  CHECK(past.remaining() == 0);
  CHECK(past.u8() == 0);
  CHECK(past.failed());
  wire_writer w(nullptr, 0);
  w.u8(1);
  CHECK(w.overflow());
}
