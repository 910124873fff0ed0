// Typed flags: values are the C constants; the access rule of ibv_reg_mr(3).
#include <rdmaxx/access.hpp>
#include <rdmaxx/queue_pair.hpp>

#include <catch2/catch.hpp>

using namespace rdmaxx;

static_assert(unsigned(access::local_write) == IBV_ACCESS_LOCAL_WRITE);
static_assert(unsigned(access::remote_write) == IBV_ACCESS_REMOTE_WRITE);
static_assert(unsigned(access::remote_read) == IBV_ACCESS_REMOTE_READ);
static_assert(unsigned(access::remote_atomic) == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(unsigned(access::mw_bind) == IBV_ACCESS_MW_BIND);
static_assert(unsigned(access::zero_based) == IBV_ACCESS_ZERO_BASED);
static_assert(unsigned(send_flag::signaled) == IBV_SEND_SIGNALED);
static_assert(unsigned(send_flag::inline_data) == IBV_SEND_INLINE);
static_assert((access::local_write | access::remote_read).native() ==
              (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
static_assert(sizeof(access_flags) == sizeof(unsigned));

TEST_CASE("flags algebra", "[unit][flags]") {
  access_flags a = access::local_write | access::remote_write;
  CHECK(a.has(access::local_write));
  CHECK(a.has(access::local_write | access::remote_write));
  CHECK_FALSE(a.has(access::remote_read));
  CHECK(a.any(access::remote_read | access::remote_write));
  CHECK((a & access::remote_write) == access_flags(access::remote_write));
  a &= ~access_flags(access::remote_write);
  CHECK(a == access_flags(access::local_write));
  CHECK(access_flags{}.empty());
  CHECK_FALSE(access_flags{}.has(access_flags{}));
  CHECK(access_flags(access::remote_read).subset_of(access::remote_read | access::local_write));
}

TEST_CASE("access combinations are checked before verbs", "[unit][flags]") {
  struct row { access_flags a; std::error_code expect; };
  const row rows[] = {
      {access_flags{}, {}},
      {access::local_write, {}},
      {access::remote_read, {}},
      {access::local_write | access::remote_write, {}},
      {access::local_write | access::remote_atomic, {}},
      {access::local_write | access::remote_write | access::remote_read | access::mw_bind, {}},
      {access::remote_write, errc::remote_write_needs_local_write},
      {access::remote_write | access::remote_read, errc::remote_write_needs_local_write},
      {access::remote_atomic, errc::remote_atomic_needs_local_write},
      {access::remote_atomic | access::remote_read | access::mw_bind, errc::remote_atomic_needs_local_write},
      {access_flags(1u << 30), errc::unknown_access_flag},
      {access_flags(1u << 30) | access::local_write, errc::unknown_access_flag},
  };
  for (const auto &r : rows) {
    INFO("access=" << r.a.native());
    CHECK(check_access(r.a) == r.expect);
  }
}
