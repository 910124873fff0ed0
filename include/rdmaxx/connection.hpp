/// \file
/// rdmaxx/connection.hpp: connections by IP address over rdma_cm (librdmacm, rdma_cm(7)):
/// Connection (rdma_resolve_addr(3), rdma_resolve_route(3), rdma_connect(3), rdma_establish(3),
/// rdma_disconnect(3)), which owns its rdma_cm_id and an rdmaxx QueuePair. Including it gives the
/// whole rdma_cm part, each in its own header: cm_error.hpp (cm_category() and the cm codes),
/// cm_address.hpp (address, cm_private_data), event_channel.hpp (EventChannel,
/// rdma_create_event_channel(3)), connect_request.hpp (ConnectRequest:
/// RDMA_CM_EVENT_CONNECT_REQUEST, rdma_accept(3), rdma_reject(3)) and listener.hpp (Listener:
/// rdma_create_id(3), rdma_bind_addr(3), rdma_listen(3)). ConnectRequest and Listener are built
/// on Connection; their headers come in at the end of this one.
///
/// This header is the only one that needs librdmacm: link the `rdmaxx-cm` dependency (Meson:
/// dependency('rdmaxx-cm'); pkg-config: rdmaxx-cm; CMake: rdmaxx::cm). Programs that do not
/// include it do not link librdmacm.
///
/// Design decision: the QP is an ordinary rdmaxx QueuePair (ibv_create_qp_ex with rdmaxx's send
/// operations, on a PD of an rdmaxx Context), NOT rdma_create_qp_ex. rdmaxx moves it through
/// INIT, RTR and RTS itself with the attributes rdma_init_qp_attr(3) computes, passes its QP
/// number in rdma_conn_param, and completes the active side with rdma_establish(3). Why:
///   - rdma_create_qp_ex wants a PD of librdmacm's own device context (id->verbs); the user's
///     ProtectionDomain, MemoryRegions, windows and indirect keys live on an rdmaxx Context, and
///     a QP must share their PD. With our own QP any PD of the resolved DEVICE works.
///   - librdmacm changes the state of a QP attached to the id behind the handle's back (in
///     rdma_accept, rdma_get_cm_event, rdma_disconnect); rdmaxx's rules (never post before RTS,
///     SendBatch, windows as QP children, the rxe defect workarounds) need the QP to be a
///     QueuePair whose transitions rdmaxx makes. One QP type, one set of rules.
///   - Destruction stays in rdmaxx's hands: rdma_destroy_id never destroys our QP, and the
///     QueuePair's parent/child accounting (bound type-2 windows) is unchanged.
/// The cost: the active side sees RDMA_CM_EVENT_CONNECT_RESPONSE (not ESTABLISHED) and must call
/// rdma_establish; a Connection does that for you.
///
/// Resources: rdma_cm resolves an address to a device. A Connection either uses the user's
/// ProtectionDomain and CompletionQueue(s) (conn_options::pd, conn_options::send_cq,
/// conn_options::recv_cq; refused with errc::context_mismatch when they belong to another device
/// than the one resolved), or opens its
/// own Context on the resolved device, a PD and one CQ (optionally with a CompletionChannel),
/// reachable through context(), pd(), cq().
/// Those exist once the address is resolved, before the connect request goes out only with the
/// two-step connect: Connection::resolve() (stops with the QP in INIT, conn_state::resolved),
/// then connect_with(private_data): for private data made on the Connection's own PD, e.g. a
/// GrantPool's offer. The passive side's two steps are ConnectRequest::prepare() and
/// Connection::accept().
///
/// Events and file descriptors: by default every Listener and every Connection owns its own event
/// channel (an accepted connection's id is moved to a new channel by rdma_migrate_id(3) before
/// rdma_accept), whose fd is non-blocking and can be watched with poll(2)/epoll(7): one fd per
/// connection. With conn_options::channel (and listen_options::channel) they share one
/// EventChannel instead: one fd for all, EventChannel::dispatch() says which have events (their
/// cookies), each one's advance() takes its own (an accepted id is moved to the shared channel, or
/// stays when the listener's channel is that one). Each event is copied (type, status, private
/// data) and acknowledged at once (rdma_ack_cm_event), so that rdma_destroy_id never blocks on an
/// unacknowledged event.
///
/// Bounds: every step is bounded: address and route resolution by the timeout given to the
/// kernel; connect, accept and disconnect by the Connection's deadline (conn_options::timeout_ms
/// per step), enforced both by the blocking forms and by advance() (the non-blocking form):
/// a step past its deadline fails with a cm_category() "timeout" code naming the step.
///
/// Private data: at most 56 bytes on connect, 196 on accept, 148 on reject (RC over the TCP port
/// space on InfiniBand/RoCE), refused before any verb with errc::private_data_too_long. The
/// receiver sees the transport's whole private-data area: the bytes sent followed by zeros up to
/// the limit (rdma_cm does not transmit a length): carry your own length or a self-describing
/// format (remote_descriptor: descriptor_header::peek() gives the total size).
///
/// Lifetime: a Connection's QP borrows the user's PD and CQs when given (destroy the Connection
/// first). Destroying a Connection in any state is safe: the QP is destroyed, then the id
/// (rdma_destroy_id: the kernel sends a disconnect request or a reject to the peer), then the
/// channel, then the resources it owns. A peer that disconnects or dies gives DISCONNECTED: the
/// Connection then moves its QP to ERR so that outstanding work completes as flushed.
///
/// Threads: a handle is used by one thread at a time; different handles are independent, except
/// those sharing an EventChannel: they and the channel are used by one thread at a time.
///
/// Allocation: creation allocates (librdmacm, verbs, the children counters; on a shared channel
/// one node whose address is the id's context); advance(), fd() and the accessors do not
/// allocate except inside rdma_get_cm_event (malloc of one event).
#pragma once

#include "access.hpp"
#include "cm_address.hpp"
#include "cm_error.hpp"
#include "cm_options.hpp"
#include "completion_queue.hpp"
#include "detail/clock.hpp"
#include "detail/handle.hpp"
#include "device.hpp"
#include "error.hpp"
#include "event_channel.hpp"
#include "listener.hpp" // and connect_request.hpp: declared before Connection, defined after it
#include "protection_domain.hpp"
#include "queue_pair.hpp"

#include <rdma/rdma_cma.h>

#include <time.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>

namespace rdmaxx {


namespace detail {
struct conn_access; // after Connection

[[nodiscard]] inline bool same_device(ibv_context *a, ibv_context *b) noexcept {
  if (!a || !b) return false;
  if (a->device == b->device) return true;
  return ::ibv_get_device_guid(a->device) == ::ibv_get_device_guid(b->device) &&
         std::strcmp(::ibv_get_device_name(a->device), ::ibv_get_device_name(b->device)) == 0;
}
} // namespace detail

/// A connection by address (rdma_cm) with its own rdmaxx QueuePair. Move-only, null after move.
/// Destruction order of its parts: QP, CQ, PD, Context (those it owns), cm id, event channel (its
/// own; or its node on the shared channel, then its registration with it).
class Connection {
public:
  Connection() noexcept = default;
  /// Moves the connection; `o` is left null.
  Connection(Connection &&) noexcept = default;
  /// Destroys what this connection holds (in the order above), then takes `o`'s: the members are
  /// declared in that order, and the default assigns them in declaration order.
  Connection &operator=(Connection &&) noexcept = default;
  /// Destroys what this connection holds, in the order above (the implicit destructor would go
  /// in reverse declaration order: the old Context before its PD, the id after its channel).
  ~Connection() {
    qp_ = QueuePair();
    cq_ = CompletionQueue();
    cq_ch_ = CompletionChannel();
    pd_ = ProtectionDomain();
    ctx_ = Context();
    id_.reset();
    slot_.reset(); // its queued events go with it; the kernel has no more of the id's
    link_.drop();
    channel_.reset();
  }

  /// Active side, non-blocking: rdma_create_id and rdma_resolve_addr towards `to`; then watch
  /// fd() and call advance() until it returns conn_state::established.
  /// \errors
  /// - errc::private_data_too_long: more than 56 bytes.
  /// - errc::invalid_argument: a timeout <= 0 (or cq_entries <= 0).
  /// - errc::null_handle: a PD without CQs.
  /// - cm_call_error(cm_call::rdma_resolve_addr, EDESTADDRREQ) (std::errc::
  ///   destination_address_required): `to` is a wildcard address (0.0.0.0, [::], "PORT"), which
  ///   names no peer; checked before any call.
  /// - cm_call_error() codes naming `to` for rdma_create_event_channel (EMFILE: the fd limit;
  ///   ENODEV: rdma_ucm not loaded), rdma_create_id / rdma_resolve_addr (EADDRNOTAVAIL, ENODEV: no
  ///   RDMA device reaches it, EINVAL).
  /// - errc::null_handle: o.channel is a null EventChannel.
  /// - ENOMEM: no memory for the node on the shared channel.
  /// \mallocs The event channel (or, on o.channel, one node) and the id, inside librdmacm.
  [[nodiscard]] static result<Connection> start_connect(const address &to, const conn_options &o = {}) noexcept;

  /// Active side, first half, blocking: resolve the address and the route and create the QP
  /// and its resources (on o.pd, or the Connection's own Context, PD and CQ on the resolved
  /// device, as connect() does), without sending the connect request. The Connection is then
  /// in conn_state::resolved: pd(), cq() and qp() (in INIT) exist, so that what the request
  /// carries can be made on them first, e.g. a GrantPool on pd() and its offer(). Then
  /// connect_with(private_data) and wait_established(). The mirror of ConnectRequest::prepare()
  /// + Connection::accept() on the passive side.
  /// \errors
  /// - errc::invalid_argument: o.private_data is not empty (give the bytes to connect_with()).
  /// - those of start_connect() and advance() (a cm timeout naming the address or route step).
  /// \mallocs As start_connect() and advance().
  [[nodiscard]] static result<Connection> resolve(const address &to, const conn_options &o = {}) noexcept;

  /// Second half of a connect (after resolve()): rdma_connect with `private_data` (at most 56
  /// bytes); the state becomes connecting: wait_established() or advance().
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: not resolved (not made by resolve(), or connect_with() called already).
  /// - errc::private_data_too_long: over 56 bytes; nothing is sent (call again with less).
  /// - cm_call_error(cm_call::rdma_connect, errno) naming the peer.
  /// \mallocs None.
  result<void> connect_with(std::span<const std::byte> private_data = {}) noexcept;

  /// Active side, blocking: start_connect(), then advance() until established or failed, each
  /// step within o.timeout_ms.
  /// \errors
  /// - those of start_connect() and advance().
  /// \mallocs As start_connect() and advance().
  [[nodiscard]] static result<Connection> connect(const address &to, const conn_options &o = {}) noexcept {
    RDMAXX_TRY(c, start_connect(to, o));
    RDMAXX_TRYV(c.run_until_established());
    return std::move(c);
  }

  /// Active side, blocking, retrying while the passive side is not up yet: connect(to, o), and
  /// after a failure whose retry_hint_of() is retry_hint::yes (reject reason 8: nobody listens on
  /// the port yet; the peer unreachable or its address not resolved in time, while its host comes
  /// up; a step past its bound) a pause (r.backoff_ms, doubled each time up to r.max_backoff_ms)
  /// and another attempt, until one succeeds or r.total_ms has passed (see retry_options: each
  /// attempt's steps are bounded by the time left). r.total_ms 0: one attempt. A failed
  /// attempt's Connection is destroyed before the pause (nothing of it is left).
  /// \errors
  /// - errc::invalid_argument: r.total_ms < 0, r.backoff_ms < 1, r.max_backoff_ms below it;
  ///   nothing was attempted.
  /// - an error that is not worth retrying, at once: those of connect() (e.g. REJECTED with
  ///   reason 28, the peer application refused; a wildcard address; private data too long).
  /// - at the deadline, the last attempt's error (e.g. REJECTED with reason 8: still nobody
  ///   listens); when the deadline cut the last attempt short and it timed out, the error of the
  ///   attempt before it.
  /// \mallocs As connect(), per attempt.
  [[nodiscard]] static result<Connection> connect(const address &to, const conn_options &o,
                                                  const retry_options &r) noexcept {
    if (auto ec = detail::retry_schedule::check(r)) return ec;
    detail::retry_schedule s(r);
    conn_options a = o;
    for (;;) {
      a.timeout_ms = s.begin_attempt(o.timeout_ms);
      auto c = connect(to, a);
      if (c) return c;
      const std::error_code ec = s.failed(c.error());
      const int pause = s.pause_after(c.error());
      if (pause < 0) return ec;
      detail::sleep_ms(pause);
      if (s.expired()) return ec;
    }
  }

  /// Process the pending events on this connection's channel without blocking and return the
  /// state reached (it stops right after reaching established, so that a connection that was
  /// established and then disconnected is seen as both, in two calls). On a shared channel: the
  /// events queued for this connection, after reading those the fd has (other users' are queued
  /// for them, see EventChannel::dispatch()). Also enforces the
  /// current step's deadline. An established connection that sees DISCONNECTED returns
  /// conn_state::disconnected (not an error): its QP is moved to ERR.
  /// \errors The state is then failed, or disconnected for DISCONNECTED:
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: the connection had already failed.
  /// - cm_category() codes: REJECTED with the reject reason, its private data copied to
  ///   conn_options::reject_data; UNREACHABLE; ADDR_ERROR; ROUTE_ERROR; CONNECT_ERROR;
  ///   DISCONNECTED before establishment; DEVICE_REMOVAL; a timeout naming the step.
  /// - errc::context_mismatch: the user's PD is of another device than the one resolved.
  /// - errc::too_many_entries: on a shared channel, an event found this connection's queue full
  ///   (4 events; rdma_cm's protocol never queues more than 3): reported, not lost silently.
  /// - the errno of the rdma_cm calls and QP transitions (qp_transition codes).
  /// - those of the resources created (Context::open, ProtectionDomain::alloc,
  ///   CompletionQueue::create, QueuePair::create).
  /// \mallocs One event per rdma_get_cm_event (malloc, inside librdmacm); once the route is
  /// resolved, the resources created (their nodes, besides what verbs allocates).
  [[nodiscard]] result<conn_state> advance() noexcept;

  /// Wait up to `timeout_ms` for the connection to end (DISCONNECTED), processing events.
  /// Returns true when disconnected, false when still established at the deadline.
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: not established or disconnected.
  /// - those of advance().
  /// \mallocs As advance().
  [[nodiscard]] result<bool> wait_disconnected(int timeout_ms) noexcept;

  /// Second half of an accept (after ConnectRequest::prepare()): rdma_accept with
  /// `private_data` (at most 196 bytes), or, when it is empty, with the conn_options::private_data
  /// given to prepare() (copied there); the state becomes accepting: advance() or
  /// wait_established().
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: not prepared.
  /// - errc::private_data_too_long: nothing is sent (accept again with less).
  /// - the errno of rdma_accept.
  /// \mallocs None.
  result<void> accept(std::span<const std::byte> private_data = {}) noexcept;

  /// Blocking: advance() until established, within the current step's bound (conn_options::
  /// timeout_ms).
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: prepared (accept() first) or resolved (connect_with() first).
  /// - those of advance(); DISCONNECTED when the peer went away first.
  /// \mallocs As advance().
  result<void> wait_established() noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    if (state_ == conn_state::prepared || state_ == conn_state::resolved)
      return make_error_code(errc::wrong_state);
    return run_until_established();
  }

  /// rdma_disconnect: move the QP to ERR (outstanding work completes as flushed) and send a
  /// disconnect request; the peer sees DISCONNECTED. Idempotent once disconnected.
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::wrong_state: never established.
  /// - the errno of rdma_disconnect.
  /// \mallocs None.
  result<void> disconnect() noexcept;

  /// The QueuePair (in RTS once established): SendBatch, windows and keys work on it as on any.
  [[nodiscard]] QueuePair &qp() noexcept { return qp_; }
  /// The QueuePair, read-only.
  [[nodiscard]] const QueuePair &qp() const noexcept { return qp_; }
  /// The Context the Connection opened (null when the user gave a PD).
  [[nodiscard]] const Context &context() const noexcept { return ctx_; }
  /// The PD of the QP: the user's or the Connection's own (null before the address resolved).
  [[nodiscard]] const ProtectionDomain &pd() const noexcept { return user_pd_ ? *user_pd_ : pd_; }
  /// The CQ the Connection created (null when the user gave CQs).
  [[nodiscard]] CompletionQueue &cq() noexcept { return cq_; }
  /// The CompletionChannel of the created CQ (with conn_options::cq_channel), else null.
  [[nodiscard]] const CompletionChannel &completion_channel() const noexcept { return cq_ch_; }
  /// The current state.
  [[nodiscard]] conn_state state() const noexcept { return state_; }
  /// The private data the peer sent: the accept's on the active side, the connect request's
  /// on the passive side (see the top of this header: padded to the transport's limit).
  [[nodiscard]] std::span<const std::byte> peer_private_data() const noexcept { return peer_data_.span(); }
  /// The fd of the connection's event channel (non-blocking; readable: call advance()); on a
  /// shared channel, the channel's fd. -1 when null.
  [[nodiscard]] int fd() const noexcept {
    if (slot_) return slot_.get()->hub->ch->fd;
    return channel_ ? channel_.get()->fd : -1;
  }
  /// True when the connection uses a shared EventChannel (conn_options::channel).
  [[nodiscard]] bool shares_channel() const noexcept { return bool(slot_); }
  /// The rdma_cm_id (owned), or nullptr.
  [[nodiscard]] rdma_cm_id *native_handle() const noexcept { return id_.get(); }
  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return bool(id_); }
  /// Destroy now, checked, in the destructor's order: the QP, the CQ and its completion channel,
  /// the PD and the Context where the connection owns them, the cm id (rdma_destroy_id), the
  /// event channel (or its node on the shared one). No disconnect is sent first (disconnect()
  /// ends a connection gracefully; a destroyed established connection looks to the peer like a
  /// vanished one). Stops at the first
  /// failure: what was destroyed stays destroyed, the rest stays with the connection (state
  /// failed), and its destructor finishes it. Null afterwards on success.
  /// \errors
  /// - those of QueuePair::destroy (errc::busy: a type-2 window still bound through it),
  ///   CompletionQueue::destroy, ProtectionDomain::dealloc (errc::busy: the caller's regions,
  ///   windows or grants on the connection's PD: destroy them first) and Context::close.
  /// - the errno of rdma_destroy_id.
  /// \mallocs None.
  result<void> destroy() noexcept;
  /// The peer's address (rdma_get_peer_addr).
  /// \errors
  /// - errc::null_handle: the connection is null.
  /// - errc::bad_address: not resolved yet.
  /// \mallocs None.
  [[nodiscard]] result<address> peer_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_peer_addr(id_.get()));
  }
  /// Our address (rdma_get_local_addr).
  /// \errors
  /// - those of peer_address().
  /// \mallocs None.
  [[nodiscard]] result<address> local_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_local_addr(id_.get()));
  }

private:
  friend struct detail::conn_access; // ConnectRequest (connect_request.hpp) makes the passive side

  // ConnectRequest::prepare() past its own checks: the passive side of `id` (taken over, also
  // on failure), with the request's private data and offer.
  [[nodiscard]] static result<Connection> prepare_passive(detail::handle<detail::cm_id_traits> &id,
                                                          const cm_private_data &data, std::uint8_t resp_res,
                                                          std::uint8_t init_depth, const conn_options &o) noexcept;

  [[nodiscard]] static result<void> check_options(const conn_options &o) noexcept;

  [[nodiscard]] cm_step step() const noexcept;

  result<void> run_until_established() noexcept;

  // The QP and its resources on the device the id resolved to.
  result<void> make_qp(ibv_context *resolved) noexcept;

  // ibv_modify_qp to `to` with the attributes rdma_init_qp_attr computes.
  result<void> move_qp(ibv_qp_state to) noexcept;

  rdma_conn_param conn_param() const noexcept;

  // A cm code naming this connection's side and peer (other codes unchanged).
  [[nodiscard]] std::error_code named(std::error_code ec) const noexcept {
    return cm_at(ec, passive_ ? cm_role::accept_from : cm_role::connect_to, peer_.native());
  }
  // The errno of a failed librdmacm call, naming it, the side and the peer.
  [[nodiscard]] std::error_code call_failed(cm_call c) const noexcept {
    return named(cm_call_error(c, errno));
  }
  // A channel of its own, its errno named as rdma_create_event_channel's (EMFILE says which fd).
  [[nodiscard]] result<void> own_channel() noexcept {
    auto ch = detail::create_cm_channel();
    if (!ch && ch.error().category() == std::generic_category())
      return named(cm_call_error(cm_call::rdma_create_event_channel, ch.error().value()));
    if (!ch) return ch.error();
    channel_ = std::move(ch).value();
    return success();
  }
  // Join the shared channel `ch`: a node (the id's context) and a registration as its child.
  [[nodiscard]] result<void> join(const EventChannel &ch, std::uint64_t cookie) noexcept {
    slot_ = detail::cm_slot_ptr::make(*detail::channel_access::hub(ch), cookie);
    if (!slot_) return std::make_error_code(std::errc::not_enough_memory);
    link_ = detail::child_link(detail::handle_access::node(ch));
    return success();
  }
  // The channel new ids are created on: the shared one, else this connection's own.
  [[nodiscard]] rdma_event_channel *cm_channel() const noexcept {
    return slot_ ? slot_.get()->hub->ch : channel_.get();
  }

  // The next event of this connection (its own channel, or its queue on the shared one).
  [[nodiscard]] result<maybe<detail::cm_event_copy>> next_event() noexcept {
    if (!slot_) return detail::next_cm_event(channel_.get());
    if (slot_.get()->overflow) {
      state_ = conn_state::failed;
      return named(make_error_code(errc::too_many_entries));
    }
    return detail::cm_next(*slot_.get());
  }
  // advance() without the shared channel's bookkeeping.
  [[nodiscard]] result<conn_state> advance_events() noexcept;

  // One event of this connection's id.
  std::error_code on_event(const detail::cm_event_copy &ev) noexcept;

  // The parts, in the order of their destruction (the destructor's, destroy()'s and so the
  // default move assignment's): QP, CQ, completion channel, PD, Context, id, then its node on the
  // shared channel and its registration there, or the connection's own channel.
  QueuePair qp_;
  CompletionQueue cq_;
  CompletionChannel cq_ch_;
  ProtectionDomain pd_;
  Context ctx_;
  detail::handle<detail::cm_id_traits> id_;
  detail::cm_slot_ptr slot_;  // shared channel: the id's context, the queue of its events
  detail::child_link link_;   // shared channel: this connection counts as its child
  detail::handle<detail::cm_channel_traits> channel_; // a channel of its own
  // Values.
  const ProtectionDomain *user_pd_ = nullptr;
  conn_options opts_{};
  conn_state state_ = conn_state::failed;
  std::int64_t deadline_ = 0;
  std::array<std::byte, cm_accept_private_data_max> connect_data_{}; // what we send
  std::uint8_t connect_data_len_ = 0;
  cm_private_data peer_data_{};
  std::uint8_t resp_res_ = 0;   // the client's offer (CONNECT_REQUEST), passive side
  std::uint8_t init_depth_ = 0;
  address peer_{};              // what error codes name
  bool passive_ = false;
  bool hold_connect_ = false;   // resolve(): stop at conn_state::resolved
};

} // namespace rdmaxx

// The bodies of the three classes, after all three declarations.
#include "impl/connection.ipp"
