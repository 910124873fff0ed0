// RDMAXX_CO_TRY / RDMAXX_CO_TRYV (co_try.hpp): in coroutines returning a result<T> or a
// std::error_code, a failure co_returns its error and nothing after it runs; a success binds the
// value (also a move-only one) and goes on. Plain and co_await'ed expressions. No device, no Asio:
// a minimal coroutine type of its own.
#include <rdmaxx/co_try.hpp>

#include <catch2/catch.hpp>

#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

using namespace rdmaxx;

namespace {

// A coroutine that runs to its end when called and keeps what it co_returned.
template <class R>
struct eager {
  struct promise_type {
    std::optional<R> v;
    eager get_return_object() noexcept { return eager{std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    template <class U>
    void return_value(U &&u) {
      v.emplace(std::forward<U>(u));
    }
    void unhandled_exception() noexcept { std::terminate(); }
  };
  explicit eager(std::coroutine_handle<promise_type> x) noexcept : h(x) {}
  eager(eager &&o) noexcept : h(std::exchange(o.h, {})) {}
  eager(const eager &) = delete;
  eager &operator=(const eager &) = delete;
  ~eager() {
    if (h) h.destroy();
  }
  R get() { return std::move(*h.promise().v); }
  std::coroutine_handle<promise_type> h;
};

// An awaitable already holding its result (what co_await of an asio.hpp step gives back). Not an
// aggregate: GCC 12 destroys the members of a braced aggregate awaitable twice.
template <class R>
struct ready {
  explicit ready(R x) noexcept : r(std::move(x)) {}
  R r;
  bool await_ready() const noexcept { return true; }
  void await_suspend(std::coroutine_handle<>) const noexcept {}
  R await_resume() { return std::move(r); }
};

result<int> ok_int(int v) noexcept { return v; }
result<int> failed_int() noexcept { return make_error_code(errc::timeout); }
result<void> failed_void() noexcept { return make_error_code(errc::busy); }
result<std::unique_ptr<int>> owned(int v) noexcept { return std::make_unique<int>(v); }

eager<result<int>> add_one(result<int> in, bool awaited, int &reached) {
  reached = 0;
  int v = 0;
  if (awaited) {
    RDMAXX_CO_TRY(x, co_await ready<result<int>>(std::move(in)));
    v = x;
  } else {
    RDMAXX_CO_TRY(x, std::move(in));
    v = x;
  }
  reached = 1;
  RDMAXX_CO_TRYV(ok_int(v)); // a plain call
  reached = 2;
  co_return v + 1;
}

eager<result<int>> void_step(result<void> in, int &reached) {
  reached = 0;
  RDMAXX_CO_TRYV(co_await ready<result<void>>(std::move(in)));
  reached = 1;
  co_return 7;
}

eager<std::error_code> error_code_coroutine(std::error_code step, bool fail_result, int &reached) {
  reached = 0;
  RDMAXX_CO_TRYV(step); // a std::error_code: fails when non-empty
  reached = 1;
  if (fail_result) RDMAXX_CO_TRYV(failed_void());
  reached = 2;
  RDMAXX_CO_TRY(p, owned(3));
  co_return *p == 3 ? std::error_code{} : make_error_code(errc::invalid_argument);
}

eager<result<std::unique_ptr<int>>> move_only(bool awaited) {
  if (awaited) {
    RDMAXX_CO_TRY(p, co_await ready<result<std::unique_ptr<int>>>(owned(41)));
    ++*p;
    co_return std::move(p); // the value bound was moved out of the expression's result
  }
  RDMAXX_CO_TRY(p, owned(41));
  ++*p;
  co_return std::move(p);
}

} // namespace

TEST_CASE("RDMAXX_CO_TRY: a success binds the value and goes on; a failure co_returns its error at once",
          "[unit][co_try]") {
  for (const bool awaited : {false, true}) {
    INFO((awaited ? "co_await'ed" : "plain"));
    int reached = -1;
    auto good = add_one(ok_int(41), awaited, reached);
    const auto g = good.get();
    REQUIRE(g.has_value());
    CHECK(g.value() == 42);
    CHECK(reached == 2);
    auto bad = add_one(failed_int(), awaited, reached);
    const auto b = bad.get();
    REQUIRE_FALSE(b);
    CHECK(b.error() == errc::timeout);
    CHECK(reached == 0); // nothing after the failed step ran
    auto m = move_only(awaited);
    const auto mv = m.get();
    REQUIRE(mv.has_value());
    REQUIRE(mv.value() != nullptr);
    CHECK(*mv.value() == 42);
  }
}

TEST_CASE("RDMAXX_CO_TRYV: result<void> and std::error_code; coroutines returning either", "[unit][co_try]") {
  int reached = -1;
  auto ok = void_step(success(), reached);
  CHECK(ok.get().value() == 7);
  CHECK(reached == 1);
  auto bad = void_step(make_error_code(errc::busy), reached);
  CHECK(bad.get().error() == errc::busy);
  CHECK(reached == 0);

  auto e0 = error_code_coroutine({}, false, reached);
  CHECK(!e0.get()); // every step succeeded: the empty code
  CHECK(reached == 2);
  auto e1 = error_code_coroutine(make_error_code(errc::wrong_state), false, reached);
  CHECK(e1.get() == errc::wrong_state); // a non-empty error_code fails
  CHECK(reached == 0);
  auto e2 = error_code_coroutine({}, true, reached);
  CHECK(e2.get() == errc::busy); // a failed result, co_returned as the coroutine's error_code
  CHECK(reached == 1);
}
