/// \file
/// rdmaxx/impl/connection.ipp: the longer bodies of Connection, ConnectRequest and Listener.
/// Included once, by connection.hpp, after the three declarations (connection.hpp includes
/// listener.hpp, which includes connect_request.hpp, at its top: no header of the three includes
/// another one below it, so there is no include cycle). Never include it yourself.
#pragma once

namespace rdmaxx {

// ---- Connection: the longer bodies ----

inline result<Connection> Connection::start_connect(const address &to, const conn_options &o) noexcept {
  if (o.private_data.size() > cm_connect_private_data_max)
    return make_error_code(errc::private_data_too_long);
  RDMAXX_TRYV(check_options(o));
  if (detail::cm_is_wildcard(to.native()))
    return cm_at(cm_call_error(cm_call::rdma_resolve_addr, EDESTADDRREQ), cm_role::connect_to, to.native());
  Connection c;
  c.opts_ = o;
  c.opts_.channel = nullptr; // the node holds what is needed; the EventChannel may move
  c.peer_ = to;
  if (o.channel) RDMAXX_TRYV(c.join(*o.channel, o.cookie));
  else RDMAXX_TRYV(c.own_channel());
  rdma_cm_id *id = nullptr;
  if (::rdma_create_id(c.cm_channel(), &id, c.slot_.get(), RDMA_PS_TCP))
    return c.call_failed(cm_call::rdma_create_id);
  c.id_ = detail::handle<detail::cm_id_traits>(id, nullptr, nullptr);
  c.connect_data_len_ = std::uint8_t(o.private_data.size());
  if (!o.private_data.empty()) std::memcpy(c.connect_data_.data(), o.private_data.data(), o.private_data.size());
  c.state_ = conn_state::resolving_addr;
  c.deadline_ = detail::monotonic_ms() + o.timeout_ms;
  address dst = to;
  if (::rdma_resolve_addr(id, nullptr, dst.native(), o.timeout_ms))
    return c.call_failed(cm_call::rdma_resolve_addr);
  return c;
}

inline result<Connection> Connection::resolve(const address &to, const conn_options &o) noexcept {
  if (!o.private_data.empty()) return make_error_code(errc::invalid_argument);
  RDMAXX_TRY(c, start_connect(to, o));
  c.hold_connect_ = true; // no event was processed yet: ROUTE_RESOLVED stops at resolved
  for (;;) {
    RDMAXX_TRY(s, c.advance());
    if (s == conn_state::resolved) return std::move(c);
    RDMAXX_TRY(readable, detail::wait_readable(c.fd(), c.deadline_));
    (void)readable; // advance() reports the timeout
  }
}

inline result<void> Connection::connect_with(std::span<const std::byte> private_data) noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (state_ != conn_state::resolved) return make_error_code(errc::wrong_state);
  if (private_data.size() > cm_connect_private_data_max)
    return make_error_code(errc::private_data_too_long);
  connect_data_len_ = std::uint8_t(private_data.size());
  if (!private_data.empty()) std::memcpy(connect_data_.data(), private_data.data(), private_data.size());
  state_ = conn_state::connecting;
  deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
  rdma_conn_param p = conn_param();
  if (::rdma_connect(id_.get(), &p)) {
    state_ = conn_state::failed;
    return call_failed(cm_call::rdma_connect);
  }
  return success();
}

inline result<conn_state> Connection::advance() noexcept {
  auto r = advance_events();
  // On a shared channel, events left queued (after established is reported) keep the
  // connection on the channel's ready list; a failed connection's are dropped.
  if (detail::cm_slot *s = slot_.get(); s && s->count) {
    if (state_ == conn_state::failed) {
      detail::cm_unmark(*s);
      s->count = 0;
    } else {
      detail::cm_mark(*s);
    }
  }
  return r;
}

inline result<conn_state> Connection::advance_events() noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  for (;;) {
    if (state_ == conn_state::failed) return make_error_code(errc::wrong_state);
    RDMAXX_TRY(ev, next_event());
    if (!ev) break;
    const conn_state was = state_;
    if (auto ec = on_event(*ev)) {
      if (state_ != conn_state::disconnected) state_ = conn_state::failed;
      return named(ec);
    }
    // Reaching established is reported on its own: later events (a DISCONNECTED that is
    // already queued) are left for the next call.
    if (state_ == conn_state::established && was != conn_state::established) return state_;
  }
  if (state_ != conn_state::established && state_ != conn_state::disconnected &&
      state_ != conn_state::prepared && state_ != conn_state::resolved &&
      detail::monotonic_ms() >= deadline_) {
    const cm_step s = step();
    state_ = conn_state::failed;
    return named(cm_timeout(s));
  }
  return state_;
}

inline result<bool> Connection::wait_disconnected(int timeout_ms) noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (state_ != conn_state::established && state_ != conn_state::disconnected)
    return make_error_code(errc::wrong_state);
  const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
  for (;;) {
    RDMAXX_TRY(s, advance());
    if (s == conn_state::disconnected) return true;
    RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline));
    if (!readable) return false;
  }
}

inline result<void> Connection::accept(std::span<const std::byte> private_data) noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (state_ != conn_state::prepared) return make_error_code(errc::wrong_state);
  if (private_data.size() > cm_accept_private_data_max)
    return make_error_code(errc::private_data_too_long);
  if (!private_data.empty()) {
    connect_data_len_ = std::uint8_t(private_data.size());
    std::memcpy(connect_data_.data(), private_data.data(), private_data.size());
  }
  rdma_conn_param p = conn_param();
  p.responder_resources = opts_.responder_resources < resp_res_ ? opts_.responder_resources : resp_res_;
  p.initiator_depth = opts_.initiator_depth < init_depth_ ? opts_.initiator_depth : init_depth_;
  state_ = conn_state::accepting;
  deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
  if (::rdma_accept(id_.get(), &p)) {
    state_ = conn_state::failed;
    return call_failed(cm_call::rdma_accept);
  }
  return success();
}

inline result<void> Connection::disconnect() noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (state_ == conn_state::disconnected) return success();
  if (state_ != conn_state::established) return make_error_code(errc::wrong_state);
  (void)qp_.to_error();
  state_ = conn_state::disconnected;
  if (::rdma_disconnect(id_.get())) return call_failed(cm_call::rdma_disconnect);
  return success();
}

inline result<void> Connection::destroy() noexcept {
  if (!id_ && !qp_) return success();
  state_ = conn_state::failed;
  RDMAXX_TRYV(qp_.destroy());
  RDMAXX_TRYV(cq_.destroy());
  RDMAXX_TRYV(cq_ch_.destroy());
  RDMAXX_TRYV(pd_.destroy());
  RDMAXX_TRYV(ctx_.destroy());
  RDMAXX_TRYV(id_.destroy());
  slot_.reset(); // its queued events go with it; the kernel has no more of the id's
  link_.drop();
  return channel_.destroy();
}

inline result<Connection> Connection::prepare_passive(detail::handle<detail::cm_id_traits> &id,
                                                    const cm_private_data &data, std::uint8_t resp_res,
                                                    std::uint8_t init_depth, const conn_options &o) noexcept {
  RDMAXX_TRYV(check_options(o));
  Connection c;
  c.opts_ = o;
  c.opts_.private_data = {}; // copied: the caller's bytes need not outlive this call
  c.connect_data_len_ = std::uint8_t(o.private_data.size());
  if (!o.private_data.empty())
    std::memcpy(c.connect_data_.data(), o.private_data.data(), o.private_data.size());
  c.peer_data_ = data;
  c.resp_res_ = resp_res;
  c.init_depth_ = init_depth;
  c.opts_.channel = nullptr;
  c.id_ = std::move(id);
  c.passive_ = true;
  if (auto a = address::from(::rdma_get_peer_addr(c.id_.get()))) c.peer_ = a.value();
  if (o.channel) RDMAXX_TRYV(c.join(*o.channel, o.cookie));
  else RDMAXX_TRYV(c.own_channel());
  // The id's events go to this connection's node (shared) or to nobody else (own channel); it
  // moves to the channel unless it is on it already (a listener on the same shared channel).
  c.id_.get()->context = c.slot_.get();
  if (c.id_.get()->channel != c.cm_channel() && ::rdma_migrate_id(c.id_.get(), c.cm_channel()))
    return c.call_failed(cm_call::rdma_migrate_id);
  // On the connection's channel now: the request's registration with the listener's ends (the
  // connection's own, on a shared channel, is link_).
  c.id_.set_parent(nullptr);
  RDMAXX_TRYV(c.make_qp(c.id_.get()->verbs));
  RDMAXX_TRYV(c.move_qp(IBV_QPS_INIT));
  RDMAXX_TRYV(c.move_qp(IBV_QPS_RTR));
  // RTS now, as librdmacm does for its own QPs: once the client's DREQ may have arrived
  // (a client that writes and disconnects at once), rdma_init_qp_attr refuses RTS (EINVAL).
  RDMAXX_TRYV(c.move_qp(IBV_QPS_RTS));
  c.state_ = conn_state::prepared;
  c.deadline_ = detail::monotonic_ms() + o.timeout_ms;
  return c;
}

inline result<void> Connection::check_options(const conn_options &o) noexcept {
  if (o.timeout_ms <= 0 || o.cq_entries <= 0) return make_error_code(errc::invalid_argument);
  if (o.channel && !*o.channel) return make_error_code(errc::null_handle);
  if (o.pd && (!*o.pd || !o.send_cq || !o.recv_cq || !*o.send_cq || !*o.recv_cq))
    return make_error_code(errc::null_handle);
  if (!o.pd && (o.send_cq || o.recv_cq)) return make_error_code(errc::invalid_argument);
  if (!o.qp_access.subset_of(access::local_write | access::remote_write | access::remote_read |
                             access::remote_atomic))
    return make_error_code(errc::unknown_access_flag);
  return success();
}

inline cm_step Connection::step() const noexcept {
  switch (state_) {
  case conn_state::resolving_addr: return cm_step::resolve_addr;
  case conn_state::resolving_route: return cm_step::resolve_route;
  case conn_state::connecting: return cm_step::connect;
  default: return cm_step::accept;
  }
}

inline result<void> Connection::run_until_established() noexcept {
  for (;;) {
    RDMAXX_TRY(s, advance());
    if (s == conn_state::established) return success();
    if (s == conn_state::disconnected) return named(cm_error(RDMA_CM_EVENT_DISCONNECTED, 0));
    RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline_));
    (void)readable; // advance() reports the timeout
  }
}

inline result<void> Connection::make_qp(ibv_context *resolved) noexcept {
  if (!resolved) return make_error_code(errc::no_device);
  const ProtectionDomain *pd = opts_.pd;
  const CompletionQueue *scq = opts_.send_cq, *rcq = opts_.recv_cq;
  if (pd) {
    if (!detail::same_device(pd->context(), resolved) ||
        !detail::same_device(scq->native_handle()->context, resolved) ||
        !detail::same_device(rcq->native_handle()->context, resolved))
      return make_error_code(errc::context_mismatch);
    user_pd_ = pd;
  } else {
    RDMAXX_TRY(ctx, Context::open(resolved->device));
    ctx_ = std::move(ctx);
    RDMAXX_TRY(p, ProtectionDomain::alloc(ctx_));
    pd_ = std::move(p);
    if (opts_.cq_channel) {
      RDMAXX_TRY(ch, CompletionChannel::create(ctx_));
      cq_ch_ = std::move(ch);
    }
    RDMAXX_TRY(cq, CompletionQueue::create(ctx_, opts_.cq_entries, cq_ch_ ? &cq_ch_ : nullptr));
    cq_ = std::move(cq);
    pd = &pd_;
    scq = rcq = &cq_;
  }
  RDMAXX_TRY(qp, QueuePair::create(*pd, *scq, *rcq, opts_.caps, opts_.ops));
  qp_ = std::move(qp);
  return success();
}

inline result<void> Connection::move_qp(ibv_qp_state to) noexcept {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = to;
  if (::rdma_init_qp_attr(id_.get(), &a, &mask)) return call_failed(cm_call::rdma_init_qp_attr);
  // Only attributes userspace verbs knows (librdmacm masks the same legacy kernel bits).
  mask &= (IBV_QP_DEST_QPN << 1) - 1;
  if (to == IBV_QPS_INIT) a.qp_access_flags = opts_.qp_access.native();
  const ibv_qp_state from = to == IBV_QPS_INIT ? IBV_QPS_RESET
                            : to == IBV_QPS_RTR ? IBV_QPS_INIT
                                                : IBV_QPS_RTR;
  if (const int rc = ::ibv_modify_qp(qp_.native_handle(), &a, mask))
    return qp_transition_error(from, to, -1, rc);
  detail::qp_access::note_state(qp_, to); // what its batches may post
  return success();
}

inline rdma_conn_param Connection::conn_param() const noexcept {
  rdma_conn_param p{};
  p.private_data = connect_data_len_ ? connect_data_.data() : nullptr;
  p.private_data_len = connect_data_len_;
  p.responder_resources = opts_.responder_resources;
  p.initiator_depth = opts_.initiator_depth;
  p.retry_count = 7;
  p.rnr_retry_count = opts_.rnr_retry_count;
  p.qp_num = qp_.qp_num();
  return p;
}

inline std::error_code Connection::on_event(const detail::cm_event_copy &ev) noexcept {
  const auto fail = [&] { return cm_error(ev.type, ev.status); };
  switch (ev.type) {
  case RDMA_CM_EVENT_ADDR_RESOLVED:
    if (state_ != conn_state::resolving_addr) return make_error_code(errc::wrong_state);
    if (ev.status) return fail();
    if (auto r = make_qp(id_.get()->verbs); !r) return r.error();
    if (::rdma_resolve_route(id_.get(), opts_.timeout_ms)) return call_failed(cm_call::rdma_resolve_route);
    state_ = conn_state::resolving_route;
    deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
    return {};
  case RDMA_CM_EVENT_ROUTE_RESOLVED: {
    if (state_ != conn_state::resolving_route) return make_error_code(errc::wrong_state);
    if (ev.status) return fail();
    if (auto r = move_qp(IBV_QPS_INIT); !r) return r.error();
    if (hold_connect_) { // resolve(): connect_with() sends the request
      state_ = conn_state::resolved;
      return {};
    }
    rdma_conn_param p = conn_param();
    if (::rdma_connect(id_.get(), &p)) return call_failed(cm_call::rdma_connect);
    state_ = conn_state::connecting;
    deadline_ = detail::monotonic_ms() + opts_.timeout_ms;
    return {};
  }
  case RDMA_CM_EVENT_CONNECT_RESPONSE:
    if (state_ != conn_state::connecting) return make_error_code(errc::wrong_state);
    if (ev.status) return fail();
    peer_data_ = ev.data;
    if (auto r = move_qp(IBV_QPS_RTR); !r) return r.error();
    if (auto r = move_qp(IBV_QPS_RTS); !r) return r.error();
    if (::rdma_establish(id_.get())) return call_failed(cm_call::rdma_establish);
    state_ = conn_state::established;
    return {};
  case RDMA_CM_EVENT_ESTABLISHED:
    if (state_ == conn_state::established) return {};
    if (state_ != conn_state::accepting) return make_error_code(errc::wrong_state);
    if (ev.status) return fail();
    state_ = conn_state::established; // the QP reached RTS before rdma_accept
    return {};
  case RDMA_CM_EVENT_DISCONNECTED:
    if (qp_) (void)qp_.to_error();
    if (state_ == conn_state::established || state_ == conn_state::disconnected) {
      state_ = conn_state::disconnected;
      return {};
    }
    state_ = conn_state::disconnected;
    return fail();
  case RDMA_CM_EVENT_REJECTED:
    if (opts_.reject_data) *opts_.reject_data = ev.data;
    return fail();
  case RDMA_CM_EVENT_TIMEWAIT_EXIT:
  case RDMA_CM_EVENT_ADDR_CHANGE: return {};
  case RDMA_CM_EVENT_DEVICE_REMOVAL:
    if (qp_) (void)qp_.to_error();
    return fail();
  default: // ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR, UNREACHABLE, ...
    return fail();
  }
}

namespace detail {
/// What the types built on Connection (ConnectRequest, connect_request.hpp) reach of it, instead
/// of being its friends: the passive side's construction and the blocking wait of an accept.
struct conn_access {
  /// The passive side of a request's `id` (see ConnectRequest::prepare()).
  [[nodiscard]] static result<Connection> prepare(handle<cm_id_traits> &id, const cm_private_data &data,
                                                  std::uint8_t resp_res, std::uint8_t init_depth,
                                                  const conn_options &o) noexcept {
    return Connection::prepare_passive(id, data, resp_res, init_depth, o);
  }
  /// advance() until established, within the step's deadline.
  static result<void> run_until_established(Connection &c) noexcept { return c.run_until_established(); }
};
} // namespace detail

// ---- ConnectRequest ----

inline result<Connection> ConnectRequest::prepare(const conn_options &o) noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (o.private_data.size() > cm_accept_private_data_max)
    return make_error_code(errc::private_data_too_long);
  // The id is the connection's now (or destroyed with it), with its registration on the
  // listener's channel until it has moved to the connection's.
  return detail::conn_access::prepare(id_, data_, resp_res_, init_depth_, o);
}

inline result<Connection> ConnectRequest::start_accept(const conn_options &o) noexcept {
  RDMAXX_TRY(c, prepare(o)); // checks and copies o.private_data first
  RDMAXX_TRYV(c.accept());
  return std::move(c);
}

inline result<Connection> ConnectRequest::accept(const conn_options &o) noexcept {
  RDMAXX_TRY(c, start_accept(o));
  RDMAXX_TRYV(detail::conn_access::run_until_established(c));
  return std::move(c);
}

inline result<void> ConnectRequest::reject(std::span<const std::byte> data) noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (data.size() > cm_reject_private_data_max) return make_error_code(errc::private_data_too_long);
  const int rc = ::rdma_reject(id_.get(), data.empty() ? nullptr : data.data(), std::uint8_t(data.size()));
  const auto ec = rc ? cm_at(cm_call_error(cm_call::rdma_reject, errno), cm_role::accept_from,
                             ::rdma_get_peer_addr(id_.get()))
                     : std::error_code{};
  id_.reset();
  if (ec) return ec;
  return success();
}

namespace detail {
/// What the types built on ConnectRequest (Listener, listener.hpp) reach of it, instead of being
/// its friends: a request made from its RDMA_CM_EVENT_CONNECT_REQUEST.
struct request_access {
  /// The request of `ev` (a CONNECT_REQUEST): owns the event's new id, a child of `channel`
  /// (the shared channel's node the id is on; null: the listener's own channel).
  [[nodiscard]] static ConnectRequest from_event(const cm_event_copy &ev, parent_node *channel = nullptr) noexcept {
    ConnectRequest r;
    r.id_ = handle<cm_id_traits>(ev.id, channel, nullptr);
    r.data_ = ev.data;
    r.resp_res_ = ev.responder_resources;
    r.init_depth_ = ev.initiator_depth;
    return r;
  }
};
} // namespace detail

// ---- Listener ----

inline result<Listener> Listener::listen(const address &at, const listen_options &o) noexcept {
  const int backlog = o.backlog;
  if (backlog <= 0) return make_error_code(errc::invalid_argument);
  if (o.channel && !*o.channel) return make_error_code(errc::null_handle);
  Listener l;
  const auto failed = [&](cm_call c, int err) {
    return cm_at(cm_call_error(c, err), cm_role::listen_on, at.native());
  };
  rdma_event_channel *on = nullptr;
  if (o.channel) {
    const std::uint32_t q = std::uint32_t(backlog) < detail::cm_slot::max_listener_queue
                                ? std::uint32_t(backlog) : detail::cm_slot::max_listener_queue;
    l.slot_ = detail::cm_slot_ptr::make(*detail::channel_access::hub(*o.channel), o.cookie, q);
    if (!l.slot_) return std::make_error_code(std::errc::not_enough_memory);
    l.link_ = detail::child_link(detail::handle_access::node(*o.channel));
    on = l.slot_.get()->hub->ch;
  } else {
    auto ch = detail::create_cm_channel();
    if (!ch && ch.error().category() == std::generic_category())
      return failed(cm_call::rdma_create_event_channel, ch.error().value());
    if (!ch) return ch.error();
    // With a node: the requests taken from this channel count as its children, so that it stays
    // until the last of them is accepted (moved to the connection's channel) or destroyed, even
    // after the listener is gone (rdma_destroy_id of a request reads its channel's fd).
    detail::parent_node *node = detail::new_parent_node();
    if (!node) return std::make_error_code(std::errc::not_enough_memory);
    l.channel_ = detail::handle<detail::cm_listen_channel_traits>(ch.value().release(), nullptr, node);
    on = l.channel_.get();
  }
  rdma_cm_id *id = nullptr;
  if (::rdma_create_id(on, &id, l.slot_.get(), RDMA_PS_TCP))
    return failed(cm_call::rdma_create_id, errno);
  l.id_ = detail::handle<detail::cm_id_traits>(id, nullptr, nullptr);
  address a = at;
  if (::rdma_bind_addr(id, a.native())) {
    int err = errno;
    if (err == EADDRNOTAVAIL && address_is_local(at)) err = EADDRINUSE;
    return failed(cm_call::rdma_bind_addr, err);
  }
  if (::rdma_listen(id, backlog)) return failed(cm_call::rdma_listen, errno);
  return l;
}

inline result<ConnectRequest> Listener::get_request(int timeout_ms) noexcept {
  if (!id_) return make_error_code(errc::null_handle);
  if (timeout_ms < 0) return make_error_code(errc::invalid_argument);
  const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
  for (;;) {
    if (detail::cm_slot *s = slot_.get()) {
      // Shared: only CONNECT_REQUESTs are queued for a listener.
      RDMAXX_TRY(ev, detail::cm_next(*s));
      if (ev) {
        if (s->count) detail::cm_mark(*s); // more requests wait: dispatch() says so again
        return detail::request_access::from_event(*ev, link_.parent());
      }
      RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline));
      if (!readable) return cm_at(cm_timeout(cm_step::request), cm_role::listen_on, ::rdma_get_local_addr(id_.get()));
      continue;
    }
    RDMAXX_TRY(ev, detail::next_cm_event(channel_.get()));
    if (ev && ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      return detail::request_access::from_event(*ev, channel_.node());
    }
    if (ev) continue; // an event of a request that went away: skipped
    RDMAXX_TRY(readable, detail::wait_readable(fd(), deadline));
    if (!readable) return cm_at(cm_timeout(cm_step::request), cm_role::listen_on, ::rdma_get_local_addr(id_.get()));
  }
}

inline bool Listener::address_is_local(const address &at) noexcept {
  if (detail::cm_is_wildcard(at.native())) return true;
  const int fd = ::socket(at.is_v6() ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  address probe = at.with_port(0);
  const socklen_t len = at.is_v6() ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  const bool ok = ::bind(fd, probe.native(), len) == 0;
  ::close(fd);
  return ok;
}

} // namespace rdmaxx
