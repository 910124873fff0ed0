// result<T> (result.hpp): what it holds, what each observer answers in each state, that values
// are constructed and destroyed exactly once through moves and copies, that a result of a trivial
// T stays trivially copyable (returned in registers or memory as the T would be, on the fast
// path), and that it still works with Boost.Outcome, which it replaced: BOOST_OUTCOME_TRY and
// Outcome's explicit conversion from a value-or-error type.
#include <rdmaxx/error.hpp>
#include <rdmaxx/result.hpp>

#include <boost/outcome/std_result.hpp>
#include <boost/outcome/try.hpp>
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

using namespace rdmaxx;

namespace {
namespace outcome = BOOST_OUTCOME_V2_NAMESPACE;
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
using outcome_int = outcome::std_result<int>;
#else
// Outcome's default policy needs boost::throw_exception without exceptions.
using outcome_int = outcome::std_result<int, std::error_code, outcome::policy::terminate>;
#endif
// Counts live objects, to find a value constructed or destroyed twice, or leaked.
struct counted {
  static inline int live = 0;
  int v = 0;
  explicit counted(int x) : v(x) { ++live; }
  counted(const counted &o) : v(o.v) { ++live; }
  counted(counted &&o) noexcept : v(std::exchange(o.v, -1)) { ++live; }
  counted &operator=(const counted &) = default;
  counted &operator=(counted &&o) noexcept {
    v = std::exchange(o.v, -1);
    return *this;
  }
  ~counted() { --live; }
};
struct move_only {
  int v = 0;
  explicit move_only(int x) : v(x) {}
  move_only(move_only &&) noexcept = default;
  move_only &operator=(move_only &&) noexcept = default;
};

result<int> half(int x) noexcept {
  if (x % 2 != 0) return errc::invalid_argument;
  return x / 2;
}
result<int> quarter(int x) noexcept {
  RDMAXX_TRY(h, half(x));
  return half(h);
}
result<void> check_even(int x) noexcept {
  RDMAXX_TRYV(half(x));
  return success();
}
outcome_int quarter_in_outcome(int x) noexcept {
  // BOOST_OUTCOME_TRYV: the one spelling Boost 1.74 and 1.76+ agree on (error.hpp).
  auto h = half(x);
  BOOST_OUTCOME_TRYV(h);
  auto q = half(h.value());
  BOOST_OUTCOME_TRYV(q);
  return q.value();
}
} // namespace

static_assert(std::is_trivially_copyable_v<result<std::size_t>>);
static_assert(std::is_trivially_copyable_v<result<void>>);
static_assert(std::is_trivially_copyable_v<result<ibv_wc *>>);
static_assert(!std::is_copy_constructible_v<result<move_only>>);
static_assert(std::is_nothrow_move_constructible_v<result<move_only>>);
static_assert(std::is_copy_constructible_v<result<std::string>>);
static_assert(!std::is_default_constructible_v<result<int>>);
static_assert(sizeof(result<std::size_t>) <= 24); // the code or the value, and a flag
// No implicit conversion that would make an error a value or a value an error.
static_assert(!std::is_convertible_v<result<int>, int>);
static_assert(!std::is_constructible_v<result<int>, result<long>>);

TEST_CASE("result: a value or an error code, and what each observer answers", "[unit][result]") {
  const result<int> ok = 7;
  CHECK(ok);
  CHECK(ok.has_value());
  CHECK_FALSE(ok.has_error());
  CHECK_FALSE(ok.has_failure());
  CHECK(ok.value() == 7);
  CHECK(ok.assume_value() == 7);
  CHECK_FALSE(ok.error()); // empty when it holds a value
  CHECK_FALSE(ok.as_failure());

  const result<int> bad = errc::busy;
  CHECK_FALSE(bad);
  CHECK(bad.has_error());
  CHECK(bad.error() == make_error_code(errc::busy));
  CHECK(bad.assume_error() == make_error_code(errc::busy));
  CHECK(bad.as_failure() == make_error_code(errc::busy));

  const result<int> from_std = std::errc::no_such_device;
  CHECK(from_std.error() == std::errc::no_such_device);
  const result<int> from_code = std::error_code(EIO, std::generic_category());
  CHECK(from_code.error().value() == EIO);

  const result<void> done = success();
  CHECK(done);
  CHECK_FALSE(done.error());
  const result<void> failed = errc::timeout;
  CHECK(failed.error() == make_error_code(errc::timeout));
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
  try {
    (void)bad.value();
    FAIL("value() of a failure did not throw");
  } catch (const std::system_error &e) {
    CHECK(e.code() == make_error_code(errc::busy));
  }
  CHECK_THROWS_AS(failed.value(), std::system_error);
  CHECK_NOTHROW(done.value());
#endif
}

TEST_CASE("result: values are constructed and destroyed once through moves, copies and "
          "assignments between states", "[unit][result]") {
  counted::live = 0;
  {
    result<counted> a = counted(1);
    CHECK(counted::live == 1);
    result<counted> b = std::move(a);
    CHECK(b.value().v == 1);
    CHECK(counted::live == 2); // a's moved-from value is still a value, as after std::move
    result<counted> c = b;     // copy
    CHECK(c.value().v == 1);
    result<counted> e = errc::busy;
    CHECK(counted::live == 3);
    e = c; // error -> value
    CHECK(e.value().v == 1);
    CHECK(counted::live == 4);
    c = result<counted>(errc::timeout); // value -> error: c's value destroyed
    CHECK(counted::live == 3);
    CHECK(c.error() == make_error_code(errc::timeout));
    e = std::move(b); // value -> value
    CHECK(e.value().v == 1);
    CHECK(counted::live == 3);
    const auto &same = c;
    c = same; // self-assignment of an error
    CHECK(c.error() == make_error_code(errc::timeout));
  }
  CHECK(counted::live == 0);

  result<move_only> m = move_only(5);
  result<move_only> n = std::move(m);
  CHECK(n.value().v == 5);
  move_only taken = std::move(n).value();
  CHECK(taken.v == 5);

  result<std::string> s = std::string(100, 'x'); // heap-allocated: ASan finds a double free
  result<std::string> t = s;
  s = errc::busy;
  t = s;
  CHECK(t.error() == make_error_code(errc::busy));
}

TEST_CASE("result: RDMAXX_TRY and RDMAXX_TRYV pass the first failure on", "[unit][result]") {
  CHECK(quarter(8).value() == 2);
  CHECK(quarter(6).error() == make_error_code(errc::invalid_argument));
  CHECK(quarter(5).error() == make_error_code(errc::invalid_argument));
  CHECK(check_even(4));
  CHECK(check_even(3).error() == make_error_code(errc::invalid_argument));
}

TEST_CASE("result: works with Boost.Outcome (BOOST_OUTCOME_TRY, explicit conversion)", "[unit][result]") {
  CHECK(quarter_in_outcome(8).value() == 2);
  CHECK(quarter_in_outcome(6).error() == make_error_code(errc::invalid_argument));
  const outcome_int ok{half(8)};
  CHECK(ok.value() == 4);
  const outcome_int bad{half(3)};
  CHECK(bad.error() == make_error_code(errc::invalid_argument));
}
