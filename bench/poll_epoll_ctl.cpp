// MEASUREMENT SHIM (LD_PRELOAD), not a fault injection and not part of the library: poll(2) with
// one epoll_ctl(EPOLL_CTL_MOD) of its first fd before it, the call Asio's reactor makes whenever
// a wait on a descriptor starts. bench/block_rpc_compare.sh SHIM=1 runs example 06 under it, to
// measure what that one system call per wait costs a request of the hand-written loop (README,
// "On a Boost.Asio event loop").
#include <dlfcn.h>
#include <poll.h>
#include <sys/epoll.h>

namespace {
using poll_fn = int (*)(pollfd *, nfds_t, int);
int ep = -1;
} // namespace

extern "C" int poll(pollfd *fds, nfds_t n, int timeout) {
  static const poll_fn real = reinterpret_cast<poll_fn>(::dlsym(RTLD_NEXT, "poll"));
  if (ep < 0) ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (n > 0 && ep >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET; // Asio's registration
    if (::epoll_ctl(ep, EPOLL_CTL_MOD, fds[0].fd, &ev) != 0) (void)::epoll_ctl(ep, EPOLL_CTL_ADD, fds[0].fd, &ev);
  }
  return real(fds, n, timeout);
}
