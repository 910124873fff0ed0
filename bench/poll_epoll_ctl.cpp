// MEASUREMENT SHIM (LD_PRELOAD), not a fault injection and not part of the library: it changes
// how example 06's poll(2) waits, to measure what each part of an Asio wait would cost the
// hand-written loop (bench/block_rpc_compare.sh; README, "On a Boost.Asio event loop"):
//   - always: one epoll_ctl(EPOLL_CTL_MOD) of the first fd before the poll, the call Asio's
//     reactor makes whenever a wait on a descriptor starts (SHIM=1: "06-ctl");
//   - RDMAXX_SHIM_WAIT=epoll: the wait itself is that epoll set's epoll_wait, as Asio's reactor
//     sleeps (one fd waited for POLLIN; anything else goes to the real poll) (SHIM_EPOLL=1:
//     "06-epoll");
//   - RDMAXX_SHIM_SPIN=N: after a wait that found its fd ready, N rounds of an empty loop (two
//     instructions each) before poll returns, on the request's path (SHIM_SPIN=N: "06-spin").
#include <dlfcn.h>
#include <poll.h>
#include <sys/epoll.h>

#include <cstdlib>
#include <cstring>

namespace {
using poll_fn = int (*)(pollfd *, nfds_t, int);
int ep = -1;

bool wait_by_epoll() {
  static const bool on = [] {
    const char *v = std::getenv("RDMAXX_SHIM_WAIT");
    return v && std::strcmp(v, "epoll") == 0;
  }();
  return on;
}
long spin_rounds() {
  static const long n = [] {
    const char *v = std::getenv("RDMAXX_SHIM_SPIN");
    return v ? std::strtol(v, nullptr, 10) : 0L;
  }();
  return n;
}
} // namespace

extern "C" int poll(pollfd *fds, nfds_t n, int timeout) {
  static const poll_fn real = reinterpret_cast<poll_fn>(::dlsym(RTLD_NEXT, "poll"));
  if (ep < 0) ep = ::epoll_create1(EPOLL_CLOEXEC);
  bool registered = false;
  if (n > 0 && ep >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET; // Asio's registration
    ev.data.fd = fds[0].fd;
    registered = ::epoll_ctl(ep, EPOLL_CTL_MOD, fds[0].fd, &ev) == 0 ||
                 ::epoll_ctl(ep, EPOLL_CTL_ADD, fds[0].fd, &ev) == 0;
  }
  int r;
  if (wait_by_epoll() && registered && n == 1 && fds[0].events == POLLIN) {
    epoll_event got{};
    r = ::epoll_wait(ep, &got, 1, timeout);
    if (r > 0) {
      fds[0].revents = static_cast<short>(got.events & (EPOLLIN | EPOLLERR | EPOLLHUP));
      if (!fds[0].revents) r = 0;
    } else {
      fds[0].revents = 0;
    }
  } else {
    r = real(fds, n, timeout);
  }
  if (r > 0)
    for (long i = spin_rounds(); i > 0; --i) asm volatile("" ::: "memory");
  return r;
}
