// The small vocabulary types that stand in for standard ones to keep every user's TU cheap to
// compile: detail::span_of (a std::span without its (iterator, count) constructor). Each must
// answer exactly what the standard type would.
#include <rdmaxx/detail/span.hpp>
#include <rdmaxx/ikey_descriptor.hpp>
#include <rdmaxx/layout.hpp>

#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

using namespace rdmaxx;

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
