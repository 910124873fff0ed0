/// \file
/// rdmaxx/listener.hpp: Listener, a listening rdma_cm id bound to an address (rdma_create_id(3),
/// rdma_bind_addr(3), rdma_listen(3)) with its own event channel or on a shared EventChannel
/// (listen_options::channel); get_request() hands out each ConnectRequest. Part of the rdma_cm
/// support (connection.hpp; needs librdmacm).
///
/// Allocation: listen() allocates inside librdmacm (on a shared channel also one node and its
/// queue of requests); get_request() mallocs one event per rdma_get_cm_event.
///
/// This header declares Listener; its longer bodies are in impl/connection.ipp, which connection.hpp
/// includes after the declarations of the three rdma_cm classes. Include connection.hpp (it
/// includes this header): no header of the three includes one that includes it back.
#pragma once

#include "cm_address.hpp"
#include "cm_error.hpp"
#include "connect_request.hpp"
#include "detail/clock.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "event_channel.hpp"

#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>

namespace rdmaxx {

/// How a Listener listens (Listener::listen).
struct listen_options {
  /// rdma_listen's backlog (> 0); on a shared channel also the requests queued for the listener
  /// at most (up to 4,096): a request beyond them is refused, as by the kernel's backlog.
  int backlog = 64;
  /// The rdma_cm event channel to share (EventChannel::create(); it must outlive the listener
  /// and the requests it hands out: destroying it first is refused with errc::busy); nullptr:
  /// a channel of the listener's own (one fd). A null EventChannel: errc::null_handle.
  EventChannel *channel = nullptr;
  /// What EventChannel::dispatch() hands out when requests wait for this listener.
  std::uint64_t cookie = 0;
};

/// A listening rdma_cm id bound to an address (rdma_bind_addr(3), rdma_listen(3)), with its own
/// event channel or on a shared one. Move-only, null after move.
class Listener {
public:
  Listener() noexcept = default;
  /// Moves the listener; `o` is left null.
  Listener(Listener &&) noexcept = default;
  /// Destroys what this listener holds (in the destructor's order), then takes `o`'s.
  Listener &operator=(Listener &&) noexcept = default;
  /// Destroys the listening id, then lets go of its channel: its own channel stays, without a
  /// report, until the last request taken from it is accepted or destroyed; on a shared one, the
  /// requests queued for it and not taken are refused, then its registration there ends.
  ~Listener() {
    id_.reset();
    slot_.reset();
    link_.drop();
    channel_.reset();
  }

  /// rdma_create_id (RDMA_PS_TCP), rdma_bind_addr to `at` (port 0: the kernel chooses, read it
  /// with port()), rdma_listen with `backlog`.
  /// \errors
  /// - errc::invalid_argument: `backlog` <= 0.
  /// - cm_call_error() codes naming `at` for rdma_create_event_channel (ENODEV: rdma_ucm not
  ///   loaded; EMFILE: the fd limit), rdma_create_id, rdma_bind_addr (EADDRINUSE, "port in use";
  ///   EADDRNOTAVAIL: no local interface has that address; ENODEV: the address's interface has
  ///   no RDMA device) and rdma_listen. The kernel's rdma_cm answers a port in use with
  ///   EADDRNOTAVAIL, as for an address of no interface: when the address is a wildcard or one
  ///   a UDP socket can bind, the port is what is taken, and the code says EADDRINUSE.
  /// \mallocs The event channel and the id, inside librdmacm.
  [[nodiscard]] static result<Listener> listen(const address &at, int backlog = 64) noexcept {
    return listen(at, listen_options{.backlog = backlog});
  }
  /// As listen(at, backlog), with the options: on o.channel, a shared EventChannel, the
  /// listening id is created on it and its CONNECT_REQUESTs are queued for this listener
  /// (EventChannel::dispatch() hands out o.cookie; get_request() takes them).
  /// \errors
  /// - those of listen(at, backlog) (rdma_create_event_channel only without o.channel).
  /// - errc::null_handle: o.channel is a null EventChannel.
  /// - ENOMEM: no memory for the node and queue on the shared channel.
  /// \mallocs As listen(at, backlog); with o.channel one node and a queue of min(backlog, 4096)
  /// requests instead of a channel.
  [[nodiscard]] static result<Listener> listen(const address &at, const listen_options &o) noexcept;

  /// The port bound (rdma_get_src_port), host order; 0 when null.
  [[nodiscard]] std::uint16_t port() const noexcept {
    return id_ ? ntohs(::rdma_get_src_port(id_.get())) : 0;
  }
  /// The bound address (rdma_get_local_addr), with the chosen port.
  /// \errors
  /// - errc::null_handle: the listener is null.
  /// \mallocs None.
  [[nodiscard]] result<address> local_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_local_addr(id_.get()));
  }
  /// The device the listener is bound to (null when bound to a wildcard address).
  [[nodiscard]] ibv_context *device_context() const noexcept { return id_ ? id_.get()->verbs : nullptr; }
  /// The non-blocking fd of the listener's channel (readable: call get_request(0)); on a shared
  /// channel, the channel's fd. -1 when null.
  [[nodiscard]] int fd() const noexcept {
    if (slot_) return slot_.get()->hub->ch->fd;
    return channel_ ? channel_.get()->fd : -1;
  }
  /// True when the listener uses a shared EventChannel (listen_options::channel).
  [[nodiscard]] bool shares_channel() const noexcept { return bool(slot_); }
  /// The listening rdma_cm_id (owned), or nullptr.
  [[nodiscard]] rdma_cm_id *native_handle() const noexcept { return id_.get(); }
  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return bool(id_); }
  /// Stop listening and destroy now, checked: rdma_destroy_id of the listening id (requests
  /// already taken with get_request() stay valid), then its event channel (its own: at once, or,
  /// while requests taken from it live, when the last of them is accepted or destroyed, since a
  /// request's id is on it until then; shared: the requests queued for it and not taken are
  /// refused, rdma_destroy_id, and it lets go of the channel).
  /// On failure the listener keeps both (its destructor tries again). Null afterwards on success.
  /// \errors
  /// - the errno of rdma_destroy_id.
  /// \mallocs None.
  result<void> destroy() noexcept {
    RDMAXX_TRYV(id_.destroy());
    slot_.reset();
    link_.drop();
    channel_.reset();
    return success();
  }

  /// Wait up to `timeout_ms` (0: do not wait) for the next connection request. Other events on
  /// the channel (of requests that went away before being accepted) are acknowledged and
  /// skipped; on a shared channel other users' events are queued for them
  /// (EventChannel::dispatch()).
  /// \errors
  /// - errc::null_handle: the listener is null.
  /// - errc::invalid_argument: negative timeout.
  /// - a cm timeout (cm_step::request): none arrived.
  /// - the errno of rdma_get_cm_event.
  /// \mallocs One event per rdma_get_cm_event (malloc, inside librdmacm).
  [[nodiscard]] result<ConnectRequest> get_request(int timeout_ms) noexcept;

private:
  // True when `at` is a wildcard or an address of this host (a UDP socket binds to it, port 0).
  [[nodiscard]] static bool address_is_local(const address &at) noexcept;

  // In the order of their destruction (the destructor's, and so the default move assignment's,
  // which assigns them in this order): the id, then its node on the shared channel (queued
  // requests refused) and its registration there, or its own channel. That channel goes at once,
  // or with the last request taken from it (those are its children by design, so its traits
  // defer quietly, in the move assignment too).
  detail::handle<detail::cm_id_traits> id_;
  detail::cm_slot_ptr slot_;
  detail::child_link link_;
  detail::handle<detail::cm_listen_channel_traits> channel_;
};

} // namespace rdmaxx
