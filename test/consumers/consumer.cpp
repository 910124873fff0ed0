// test/consumers/consumer.cpp: the program every consumer project builds (run.sh copies it into
// the project as main.cpp). It needs no RDMA device: it lists the devices (none is fine), and
// checks what works without one (error codes, access-flag validation, null handles), so that a
// consumer build with the wrong flags fails here rather than in a user's project.
#include <rdmaxx/rdmaxx.hpp>

#include <cerrno>
#include <cstdio>
#include <system_error>

#ifndef RDMAXX_HAVE_MLX5
#error "RDMAXX_HAVE_MLX5 is not defined: the build system did not pass rdmaxx's compile definitions"
#endif
#ifndef RDMAXX_CONSUMER_KIND
#define RDMAXX_CONSUMER_KIND "unnamed"
#endif

namespace {
int failures = 0;
void check(bool ok, const char *what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what);
  }
}
} // namespace

int main() {
  using namespace rdmaxx;

  // Devices: none is fine (a host kernel without RDMA); a failed list is reported, not fatal.
  auto list = DeviceList::get();
  if (list) {
    std::printf("%zu RDMA device(s)", list.value().size());
    for (ibv_device *d : list.value().devices()) std::printf(" %s", ::ibv_get_device_name(d));
    std::printf("\n");
    if (list.value().empty()) {
      auto ctx = Context::open_first();
      check(!ctx && ctx.error() == errc::no_device, "open_first without devices gives no_device");
    }
  } else {
    std::printf("no device list: %s\n", list.error().message().c_str());
  }

  // Access flags: the ibv_reg_mr(3) rule, checked before verbs.
  check(check_access(access::remote_write) == errc::remote_write_needs_local_write,
        "remote_write alone is refused");
  check(check_access(access::remote_write) == std::errc::invalid_argument,
        "the refusal maps to std::errc::invalid_argument");
  check(!check_access(access::local_write | access::remote_write), "local|remote write is valid");
  check((access::local_write | access::remote_read).native() ==
            unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
        "flag values are the IBV_ACCESS_* constants");

  // Error codes.
  check(is_unsupported(errno_code(EOPNOTSUPP)), "EOPNOTSUPP is 'unsupported'");
  check(wc_error(IBV_WC_REM_ACCESS_ERR) == std::errc::permission_denied,
        "IBV_WC_REM_ACCESS_ERR is permission_denied");
  check(!wc_error(IBV_WC_SUCCESS), "IBV_WC_SUCCESS is no error");

  // Handles: null by default; creation from a null parent fails without calling verbs.
  ProtectionDomain pd;
  check(!pd && pd.native_handle() == nullptr, "a default ProtectionDomain is null");
  auto pd2 = ProtectionDomain::alloc(Context{});
  check(!pd2 && pd2.error() == errc::null_handle, "alloc on a null Context gives null_handle");

  std::printf("rdmaxx consumer (%s): %s\n", RDMAXX_CONSUMER_KIND, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
