/// \file
/// rdmaxx/impl/cm_error.ipp: the longer bodies of cm_error.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of cm_error.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

inline std::string detail::cm_category_impl::message(int v) const {
  const int ev = (v & 0xff);
  const int st = (v >> 8) & 0xff;
  const int role = (v >> 16) & 0xf;
  std::string m = "rdma_cm: ";
  if (role != 0) {
    static const char *const roles[] = {"", "connect to ", "connection from ", "listen on "};
    m += role <= 3 ? roles[role] : "";
    m += cm_address_text((v >> 24) & 0x7f);
    m += ": ";
  }
  if (ev == cm_timeout_tag) {
    m += "timed out waiting for ";
    m += ::rdma_event_str(static_cast<rdma_cm_event_type>(st));
    return m;
  }
  if (ev == cm_call_tag) {
    const int call = (v >> 20) & 0xf;
    if (st == EDESTADDRREQ && call == int(cm_call::rdma_resolve_addr))
      return m + "a wildcard address names no peer (\"PORT\" alone, 0.0.0.0 and [::] are for "
                 "Listener::listen): connect to the peer's ADDR:PORT";
    if (st == EADDRINUSE && call == int(cm_call::rdma_bind_addr))
      return m + "port in use (rdma_bind_addr: another listener has it; choose another port, or "
                 "port 0 for one the kernel picks)";
    m += cm_call_name(call);
    m += " failed: ";
    m += std::generic_category().message(st);
    if (st == EMFILE)
      m += " (each Connection and Listener holds an rdma_cm event channel fd, and a Connection "
           "without a PD also a device context and its CQ's channel: raise the fd limit, ulimit -n, "
           "or share a PD and CQ, and an EventChannel, through conn_options)";
    return m;
  }
  m += cm_event_step(ev - 1);
  m += ::rdma_event_str(static_cast<rdma_cm_event_type>(ev - 1));
  if (ev - 1 == RDMA_CM_EVENT_REJECTED) {
    char n[16];
    std::snprintf(n, sizeof n, "%d", st);
    m += " (reject reason ";
    m += n;
    m += ": ";
    m += cm_reject_reason_name(st);
    m += ")";
  } else if (st != 0) {
    m += " (";
    m += std::generic_category().message(st);
    m += ")";
  }
  return m;
}

inline std::error_condition detail::cm_category_impl::default_error_condition(int v) const noexcept {
  const int ev = (v & 0xff);
  const int st = (v >> 8) & 0xff;
  if (ev == cm_timeout_tag) return std::errc::timed_out;
  if (ev == cm_call_tag) return {st, std::generic_category()};
  switch (static_cast<rdma_cm_event_type>(ev - 1)) {
  case RDMA_CM_EVENT_REJECTED: return std::errc::connection_refused;
  case RDMA_CM_EVENT_UNREACHABLE:
    return st == ETIMEDOUT ? std::errc::timed_out : std::errc::host_unreachable;
  case RDMA_CM_EVENT_ADDR_ERROR:
  case RDMA_CM_EVENT_ROUTE_ERROR:
    switch (st) {
    case ETIMEDOUT: return std::errc::timed_out;
    case ENETUNREACH: return std::errc::network_unreachable;
    case ENODEV: return std::errc::no_such_device;
    case EADDRNOTAVAIL: return std::errc::address_not_available;
    default: return std::errc::host_unreachable;
    }
  case RDMA_CM_EVENT_CONNECT_ERROR: return std::errc::connection_aborted;
  case RDMA_CM_EVENT_DISCONNECTED: return std::errc::connection_reset;
  case RDMA_CM_EVENT_DEVICE_REMOVAL: return std::errc::no_such_device;
  default: return std::errc::protocol_error;
  }
}

} // namespace rdmaxx
