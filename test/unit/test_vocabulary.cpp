// The small vocabulary types that stand in for standard ones to keep every user's TU cheap to
// compile: maybe<T> (for std::optional<T>) and detail::span_of (a std::span without its
// (iterator, count) constructor). Each must answer exactly what the standard type would.
#include <rdmaxx/access.hpp>
#include <rdmaxx/detail/span.hpp>
#include <rdmaxx/ikey_descriptor.hpp>
#include <rdmaxx/layout.hpp>
#include <rdmaxx/maybe.hpp>
#include <rdmaxx/memory_region.hpp>
#include <rdmaxx/memory_window.hpp>

#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

using namespace rdmaxx;

TEST_CASE("maybe<T>: empty by default, holds what it is given, compares as std::optional does", "[unit][maybe]") {
  STATIC_REQUIRE(std::is_trivially_copyable_v<maybe<std::uint32_t>>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<maybe<mr_range>>);
  maybe<std::uint32_t> none;
  CHECK_FALSE(none.has_value());
  CHECK_FALSE(bool(none));
  CHECK_FALSE(none == 0u); // empty equals no value, 0 included
  CHECK(none.value_or(7u) == 7u);

  maybe<std::uint32_t> k = 0x1234u;
  CHECK(k.has_value());
  CHECK(*k == 0x1234u);
  CHECK(k == 0x1234u);
  CHECK(0x1234u == k); // the reversed form, as with std::optional
  CHECK_FALSE(k == 0x1235u);
  CHECK(k != 0x1235u);
  CHECK(k.value_or(7u) == 0x1234u);
  *k = 5;
  CHECK(k == 5u);
  k.reset();
  CHECK_FALSE(k.has_value());
  CHECK_FALSE(k == 5u);

  int x = 0;
  maybe<mr_range> r = mr_range{&x, 4};
  REQUIRE(r);
  CHECK(r->addr == &x);
  CHECK(r->length == 4);
  maybe<mr_range> copy = r;
  CHECK(copy->addr == &x);
}

TEST_CASE("rereg_changes: the builders set exactly their field; | keeps the right-hand one", "[unit][maybe]") {
  int a = 0, b = 0;
  const rereg_changes t = change_translation(&a, 8);
  REQUIRE(t.translation.has_value());
  CHECK(t.translation->addr == &a);
  CHECK(t.translation->length == 8);
  CHECK_FALSE(t.access.has_value());
  CHECK(t.pd == nullptr);

  const rereg_changes both = t | change_access(access::local_write) | change_translation(&b, 16);
  REQUIRE(both.translation);
  CHECK(both.translation->addr == &b);
  CHECK(both.translation->length == 16);
  REQUIRE(both.access);
  CHECK(*both.access == access::local_write);
  CHECK_FALSE(rereg_changes{}.translation.has_value());
  CHECK_FALSE(rereg_changes{}.access.has_value());
}

namespace {
// The (pointer, size) a span answers, for every element type the headers build spans of.
template <class T>
void check_span_of(T *p, std::size_t n) {
  const std::span<T> s = detail::span_of(p, n);
  CHECK(s.data() == p);
  CHECK(s.size() == n);
  const std::span<T> direct(p, n); // the constructor span_of avoids: same answer
  CHECK(s.data() == direct.data());
  CHECK(s.size() == direct.size());
  if (n > 1) {
    const std::span<T> rest = detail::span_from(s, 1);
    CHECK(rest.data() == p + 1);
    CHECK(rest.size() == n - 1);
    CHECK(detail::span_from(s, n).empty());
  }
}
} // namespace

TEST_CASE("detail::span_of gives the span std::span's constructor gives", "[unit][span]") {
  ibv_wc wc[3]{};
  check_span_of(wc, 3);
  check_span_of(static_cast<const ibv_wc *>(wc), 2);
  std::byte bytes[40]{};
  check_span_of(bytes, 40);
  check_span_of(static_cast<const std::byte *>(bytes), 40);
  remote_segment segs[4]{};
  check_span_of(static_cast<const remote_segment *>(segs), 4);
  key_segment ks[5]{};
  check_span_of(ks, 5);
  check_span_of(static_cast<const key_segment *>(ks), 5);
  ibv_device *devs[2] = {nullptr, nullptr};
  check_span_of(static_cast<ibv_device *const *>(devs), 2);
  check_span_of<std::uint64_t>(nullptr, 0);
  // One element, the form the completion routing builds per completion.
  ibv_wc one{};
  one.wr_id = 42;
  const std::span<ibv_wc> s = detail::span_of(&one, 1);
  REQUIRE(s.size() == 1);
  CHECK(s[0].wr_id == 42);
  CHECK(&s.front() == &one);
}
