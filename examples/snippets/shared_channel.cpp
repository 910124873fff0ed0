// docs/connecting.md, one cm fd for many connections: a server whose listener and
// accepted connections share one EventChannel (and one PD and CQ); dispatch() says which of
// them have rdma_cm events, so the loop never visits a connection with nothing to do.
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <poll.h>

#include <cstdint>
#include <span>
#include <vector>

rdmaxx::result<void> serve(rdmaxx::EventChannel &ch, const rdmaxx::ProtectionDomain &pd,
                           const rdmaxx::CompletionQueue &cq, std::vector<rdmaxx::Connection> &conns,
                           std::size_t clients) noexcept {
  using namespace rdmaxx;
  constexpr std::uint64_t listener = ~std::uint64_t(0); // cookies: the listener, else an index
  RDMAXX_TRY(at, address::parse("7473"));
  RDMAXX_TRY(l, Listener::listen(at, {.channel = &ch, .cookie = listener}));
  for (std::size_t up = 0; up < clients;) {
    pollfd p{ch.fd(), POLLIN, 0};                      // the one fd of every cm event
    if (!ch.has_ready() && ::poll(&p, 1, 20000) == 0) return make_error_code(errc::timeout);
    std::uint64_t ready[64];
    RDMAXX_TRY(n, ch.dispatch(ready));                 // who has events: O(events), not O(clients)
    for (const std::uint64_t k : std::span(ready, n)) {
      if (k == listener) {
        for (auto req = l.get_request(0); req; req = l.get_request(0)) { // each waiting request
          RDMAXX_TRY(c, req.value().start_accept({.pd = &pd, .send_cq = &cq, .recv_cq = &cq,
                                                  .channel = &ch, .cookie = conns.size()}));
          conns.push_back(std::move(c));             // a Connection may move: its events follow
        }
      } else {
        const conn_state was = conns[k].state();
        RDMAXX_TRY(s, conns[k].advance());           // this connection's own events
        if (s == conn_state::established && was != s) ++up;
      }
    }
  }
  return success(); // the listener goes; ch must outlive conns (destroying it first: errc::busy)
}
