// [bad-input] The rows of the wire formats: remote_descriptor, ikey_descriptor, grant_list
// (bad_inputs.hpp). No device objects: plain functions of bytes.
#include "bad_inputs.hpp"

using namespace rxe;
using namespace rxe::bad_input;

TEST_CASE("bad inputs: remote_descriptor", "[bad-input][remote-descriptor]") {
  table t("remote_descriptor");
  const remote_descriptor good{0x1000, 256, 0x1234, rw_rights, false};
  const auto wire = good.encode();
  using wire_t = std::array<std::byte, remote_descriptor::encoded_size>;
  auto decode_with = [wire](std::function<void(wire_t &)> f) {
    wire_t w = wire;
    f(w);
    return err(remote_descriptor::decode(w));
  };
  t.add("remote_descriptor::decode", "no bytes", is(errc::malformed_input),
        [&] { return err(remote_descriptor::decode({})); });
  t.add("remote_descriptor::decode", "7 bytes (a partial header)", is(errc::malformed_input),
        [&] { return err(remote_descriptor::decode(std::span(wire).first(7))); });
  t.add("remote_descriptor::decode", "31 bytes (truncated body)", is(errc::malformed_input),
        [&] { return err(remote_descriptor::decode(std::span(wire).first(31))); });
  t.add("remote_descriptor::decode", "33 bytes (a trailing byte)",
        descriptor_is(errc::malformed_input, "1 byte(s) after the descriptor"), [&] {
    std::array<std::byte, 33> w{};
    std::memcpy(w.data(), wire.data(), wire.size());
    return err(remote_descriptor::decode(w));
  });
  t.add("remote_descriptor::decode", "wrong magic", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[0] = std::byte{'X'}; }); });
  t.add("remote_descriptor::decode", "version 0", is(errc::wrong_version),
        [&] { return decode_with([](wire_t &w) { w[4] = std::byte{0}; }); });
  t.add("remote_descriptor::decode", "version 2", is(errc::wrong_version),
        [&] { return decode_with([](wire_t &w) { w[4] = std::byte{2}; }); });
  t.add("remote_descriptor::decode", "kind 2 (another descriptor kind)",
        descriptor_is(errc::wrong_type, "kind 2 (indirect key) where kind 1 (window) was expected"),
        [&] { return decode_with([](wire_t &w) { w[5] = std::byte{2}; }); });
  t.add("remote_descriptor::decode", "kind 0", descriptor_is(errc::wrong_type, "kind 0 (unknown)"),
        [&] { return decode_with([](wire_t &w) { w[5] = std::byte{0}; }); });
  t.add("remote_descriptor::decode", "body length 23", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[7] = std::byte{23}; }); });
  t.add("remote_descriptor::decode", "no rights", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[28] = std::byte{0}; }); });
  t.add("remote_descriptor::decode", "unknown rights bit", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[28] |= std::byte{8}; }); });
  t.add("remote_descriptor::decode", "unknown flag bit", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[29] = std::byte{2}; }); });
  t.add("remote_descriptor::decode", "reserved bytes set", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[31] = std::byte{1}; }); });
  t.add("remote_descriptor::decode", "length 0", is(errc::malformed_input), [&] {
    return decode_with([](wire_t &w) {
      for (int i = 16; i < 24; ++i) w[i] = std::byte{0};
    });
  });
  t.add("remote_descriptor::decode", "address + length wraps", is(errc::malformed_input), [&] {
    return decode_with([](wire_t &w) {
      for (int i = 8; i < 16; ++i) w[i] = std::byte{0xff};
    });
  });
  t.add("descriptor_header::peek", "no bytes", is(errc::malformed_input),
        [&] { return err(descriptor_header::peek({})); });
  t.add("descriptor_header::peek", "wrong magic", is(errc::malformed_input), [&] {
    wire_t w = wire;
    w[3] = std::byte{0};
    return err(descriptor_header::peek(w));
  });
  t.add("descriptor_header::peek", "version 9", is(errc::wrong_version), [&] {
    wire_t w = wire;
    w[4] = std::byte{9};
    return err(descriptor_header::peek(std::span(w).first(8)));
  });
  t.add("remote_descriptor::slice", "zero length", is(errc::zero_length),
        [&] { return err(good.slice(0, 0)); });
  t.add("remote_descriptor::slice", "past the end", is(errc::out_of_range),
        [&] { return err(good.slice(200, 57)); });
  t.add("remote_descriptor::slice", "offset + length wraps", is(errc::out_of_range),
        [&] { return err(good.slice(1, UINT64_MAX)); });
  t.add("remote_descriptor::encode_to", "31-byte buffer", is(errc::buffer_too_small), [&] {
    std::array<std::byte, 31> out{};
    const auto ec = err(good.encode_to(out));
    for (auto b : out) CHECK(b == std::byte{0}); // nothing written
    return ec;
  });
  t.add("remote_descriptor::encode_to", "empty buffer", is(errc::buffer_too_small),
        [&] { return err(good.encode_to({})); });
  t.run();
}

TEST_CASE("bad inputs: ikey_descriptor", "[bad-input][ikey-descriptor]") {
  table t("ikey_descriptor");
  const std::array<remote_segment, 2> segs{{{0x1000, 100, 0x11}, {0x9000, 28, 0x22}}};
  const ikey_descriptor ikd = need(ikey_descriptor::make(segs, rw_rights), "make");
  std::array<std::byte, ikey_descriptor::encoded_size(2)> ikwire{};
  REQUIRE(need(ikd.encode(ikwire), "encode") == ikwire.size());
  using ikwire_t = decltype(ikwire);
  auto ikdecode_with = [ikwire](std::function<void(ikwire_t &)> f) {
    ikwire_t w = ikwire;
    f(w);
    return err(ikey_descriptor::decode(w));
  };
  t.add("ikey_descriptor::make", "no segments", is(errc::zero_length),
        [&] { return err(ikey_descriptor::make({}, rw_rights)); });
  t.add("ikey_descriptor::make", "an empty segment", is(errc::zero_length), [&] {
    const std::array<remote_segment, 2> s{{{0x1000, 100, 1}, {0x2000, 0, 2}}};
    return err(ikey_descriptor::make(s, rw_rights));
  });
  t.add("ikey_descriptor::make", "257 segments", is(errc::too_many_entries), [&] {
    std::vector<remote_segment> s(ikey_descriptor::max_segments + 1, remote_segment{0x1000, 1, 1});
    return err(ikey_descriptor::make(s, rw_rights));
  });
  t.add("ikey_descriptor::make", "local write as a right", is(errc::unknown_access_flag),
        [&] { return err(ikey_descriptor::make(segs, access::local_write | access::remote_read)); });
  t.add("ikey_descriptor::make", "MW_BIND as a right", is(errc::unknown_access_flag),
        [&] { return err(ikey_descriptor::make(segs, access::mw_bind)); });
  t.add("ikey_descriptor::make", "no rights", is(errc::missing_access),
        [&] { return err(ikey_descriptor::make(segs, access_flags{})); });
  t.add("ikey_descriptor::encode", "an empty descriptor", is(errc::zero_length), [&] {
    std::array<std::byte, 64> out{};
    return err(ikey_descriptor{}.encode(out));
  });
  t.add("ikey_descriptor::encode", "a buffer one byte short", is(errc::buffer_too_small), [&] {
    std::array<std::byte, ikey_descriptor::encoded_size(2) - 1> out{};
    const auto ec = err(ikd.encode(out));
    for (auto b : out) CHECK(b == std::byte{0}); // nothing written
    return ec;
  });
  t.add("ikey_descriptor::encode", "empty buffer", is(errc::buffer_too_small),
        [&] { return err(ikd.encode({})); });
  t.add("ikey_descriptor::decode", "no bytes", is(errc::malformed_input),
        [&] { return err(ikey_descriptor::decode({})); });
  t.add("ikey_descriptor::decode", "15 bytes (a partial body header)", is(errc::malformed_input),
        [&] { return err(ikey_descriptor::decode(std::span(ikwire).first(15))); });
  t.add("ikey_descriptor::decode", "wrong magic", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[1] = std::byte{0}; }); });
  t.add("ikey_descriptor::decode", "version 2", is(errc::wrong_version),
        [&] { return ikdecode_with([](ikwire_t &w) { w[4] = std::byte{2}; }); });
  t.add("ikey_descriptor::decode", "unknown rights bit", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[8] |= std::byte{0x10}; }); });
  t.add("ikey_descriptor::decode", "no rights", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[8] = std::byte{0}; }); });
  t.add("ikey_descriptor::decode", "kind 1 (a window descriptor's header)",
        descriptor_is(errc::wrong_type, "kind 1 (window) where kind 2 (indirect key) was expected"),
        [&] { return ikdecode_with([](ikwire_t &w) { w[5] = std::byte{1}; }); });
  t.add("ikey_descriptor::decode", "body length that disagrees with the count", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[7] ^= std::byte{1}; }); });
  t.add("ikey_descriptor::decode", "reserved byte set", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[9] = std::byte{1}; }); });
  t.add("ikey_descriptor::decode", "count 0", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[10] = w[11] = std::byte{0}; }); });
  t.add("ikey_descriptor::decode", "count 300", is(errc::too_many_entries), [&] {
    return ikdecode_with([](ikwire_t &w) {
      w[10] = std::byte{1};
      w[11] = std::byte{44};
    });
  });
  t.add("ikey_descriptor::decode", "count 3 with 2 segments' bytes", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[11] = std::byte{3}; }); });
  t.add("ikey_descriptor::decode", "truncated last segment", is(errc::malformed_input),
        [&] { return err(ikey_descriptor::decode(std::span(ikwire).first(ikwire.size() - 1))); });
  t.add("ikey_descriptor::decode", "a trailing byte",
        descriptor_is(errc::malformed_input, "1 byte(s) after the descriptor"), [&] {
    std::array<std::byte, ikey_descriptor::encoded_size(2) + 1> w{};
    std::memcpy(w.data(), ikwire.data(), ikwire.size());
    return err(ikey_descriptor::decode(w));
  });
  t.add("ikey_descriptor::decode", "an empty segment", is(errc::malformed_input), [&] {
    return ikdecode_with([](ikwire_t &w) {
      for (int i = 32; i < 36; ++i) w[i] = std::byte{0};
    });
  });
  t.add("ikey_descriptor::decode", "total length that does not add up", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[23] = std::byte{1}; }); });
  t.run();
}

TEST_CASE("bad inputs: grant_list", "[bad-input][grant-list]") {
  const remote_descriptor one{0x1000, 256, 0x1234, rw_rights, false};
  grant_list gl;
  REQUIRE(gl.push(one));
  REQUIRE(gl.push({0x9000, 64, 0x77, access::remote_read, false}));
  std::array<std::byte, grant_list::encoded_size(2)> wire{};
  REQUIRE(need(gl.encode_to(wire), "encode") == wire.size());
  using wire_t = decltype(wire);
  auto decode_with = [wire](std::function<void(wire_t &)> f) {
    wire_t w = wire;
    f(w);
    return err(grant_list::decode(w));
  };
  grant_list full;
  for (std::size_t i = 0; i < grant_list::max_grants; ++i) REQUIRE(full.push(one));

  table t("grant_list");
  // push: each refused push leaves the list as it was (checked after the rows).
  t.add("grant_list::push", "length 0", is(errc::zero_length),
        [&] { return err(gl.push({0x1000, 0, 1, rw_rights, false})); });
  t.add("grant_list::push", "length 2^32 (does not fit the wire's 32 bits)", is(errc::out_of_range),
        [&] { return err(gl.push({0x1000, std::uint64_t(1) << 32, 1, rw_rights, false})); });
  t.add("grant_list::push", "no rights", is(errc::bad_grant_rights),
        [&] { return err(gl.push({0x1000, 8, 1, access_flags{}, false})); });
  t.add("grant_list::push", "local write as a right", is(errc::bad_grant_rights),
        [&] { return err(gl.push({0x1000, 8, 1, access::local_write | access::remote_read, false})); });
  t.add("grant_list::push", "MW_BIND as a right", is(errc::bad_grant_rights),
        [&] { return err(gl.push({0x1000, 8, 1, access::mw_bind, false})); });
  t.add("grant_list::push", "a 9th grant (max_grants 8)", is(errc::too_many_entries),
        [&] { return err(full.push(one)); });
  t.add("grant_list::encode_to", "an empty list", is(errc::zero_length), [&] {
    std::array<std::byte, 64> out{};
    return err(grant_list{}.encode_to(out));
  });
  t.add("grant_list::encode_to", "a buffer one byte short", is(errc::buffer_too_small), [&] {
    std::array<std::byte, grant_list::encoded_size(2) - 1> out{};
    const auto ec = err(gl.encode_to(out));
    for (auto b : out) CHECK(b == std::byte{0}); // nothing written
    return ec;
  });
  t.add("grant_list::encode_to", "empty buffer", is(errc::buffer_too_small), [&] { return err(gl.encode_to({})); });
  t.add("grant_list::decode", "no bytes", is(errc::malformed_input), [&] { return err(grant_list::decode({})); });
  t.add("grant_list::decode", "9 bytes (a partial body)", is(errc::malformed_input),
        [&] { return err(grant_list::decode(std::span(wire).first(9))); });
  t.add("grant_list::decode", "truncated last grant", is(errc::malformed_input),
        [&] { return err(grant_list::decode(std::span(wire).first(wire.size() - 1))); });
  t.add("grant_list::decode", "a trailing byte", descriptor_is(errc::malformed_input, "1 byte(s) after the descriptor"),
        [&] {
          std::array<std::byte, grant_list::encoded_size(2) + 1> w{};
          std::memcpy(w.data(), wire.data(), wire.size());
          return err(grant_list::decode(w));
        });
  t.add("grant_list::decode", "wrong magic", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[2] = std::byte{0}; }); });
  t.add("grant_list::decode", "version 2", is(errc::wrong_version),
        [&] { return decode_with([](wire_t &w) { w[4] = std::byte{2}; }); });
  t.add("grant_list::decode", "kind 1 (a window descriptor's header)",
        descriptor_is(errc::wrong_type, "kind 1 (window)"),
        [&] { return decode_with([](wire_t &w) { w[5] = std::byte{1}; }); });
  t.add("grant_list::decode", "count 0", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[8] = std::byte{0}; }); });
  t.add("grant_list::decode", "count 3 with 2 grants' bytes", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[8] = std::byte{3}; }); });
  t.add("grant_list::decode", "reserved byte set", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[9] = std::byte{1}; }); });
  // The first grant's fields: address 10..17, length 18..21, rkey 22..25, rights 26, flags 27.
  t.add("grant_list::decode", "length 0", is(errc::malformed_input), [&] {
    return decode_with([](wire_t &w) {
      for (int i = 18; i < 22; ++i) w[i] = std::byte{0};
    });
  });
  t.add("grant_list::decode", "address + length wraps", is(errc::malformed_input), [&] {
    return decode_with([](wire_t &w) {
      for (int i = 10; i < 18; ++i) w[i] = std::byte{0xff};
    });
  });
  t.add("grant_list::decode", "no rights", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[26] = std::byte{0}; }); });
  t.add("grant_list::decode", "unknown rights bit", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[26] |= std::byte{0x80}; }); });
  t.add("grant_list::decode", "unknown flag bit", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[27] = std::byte{2}; }); });
  t.run();
  CHECK(gl.size() == 2);
  CHECK(gl[0] == one);
  CHECK(full.size() == grant_list::max_grants);
  CHECK(need(grant_list::decode(wire), "decode the untouched bytes") == gl);
}
