/// \file
/// rdmaxx/connect_request.hpp: ConnectRequest, a connection request a Listener received
/// (RDMA_CM_EVENT_CONNECT_REQUEST): accepted into a Connection (rdma_migrate_id(3),
/// rdma_accept(3)) or rejected (rdma_reject(3)). Part of the rdma_cm support (connection.hpp;
/// needs librdmacm).
///
/// Allocation: prepare() and the accepts create the Connection's resources; reject() and
/// destroy() allocate nothing.
///
/// This header declares ConnectRequest; its longer bodies are in impl/connection.ipp, which connection.hpp
/// includes after the declarations of the three rdma_cm classes. Include connection.hpp (it
/// includes this header): no header of the three includes one that includes it back.
#pragma once

#include "cm_address.hpp"
#include "cm_error.hpp"
#include "cm_options.hpp"
#include "detail/handle.hpp"
#include "error.hpp"
#include "event_channel.hpp"

#include <rdma/rdma_cma.h>

#include <cstdint>
#include <new>
#include <span>

namespace rdmaxx {

class Connection; // connection.hpp, which includes this header

namespace detail {
struct request_access; // impl/connection.ipp
} // namespace detail

/// A connection request received by a Listener (RDMA_CM_EVENT_CONNECT_REQUEST): accept() it or
/// reject() it. Move-only, null after move; dropped without either, its id is destroyed
/// (rdma_destroy_id), which rejects the request. From a Listener on a shared EventChannel, the
/// request's id is on that channel: the request counts as one of its children until it is
/// accepted, rejected or destroyed.
class ConnectRequest {
public:
  ConnectRequest() noexcept = default;
  /// Moves the request; `o` is left null.
  ConnectRequest(ConnectRequest &&) noexcept = default;
  /// Destroys the old id (then it lets go of its channel: the id holds it), then takes `o`'s.
  ConnectRequest &operator=(ConnectRequest &&) noexcept = default;

  /// The private data the client sent (56 bytes: the sent bytes, then zeros).
  [[nodiscard]] std::span<const std::byte> private_data() const noexcept { return data_.span(); }
  /// The device the request arrived on (rdma_cm's context; compare with your PD's).
  [[nodiscard]] ibv_context *device_context() const noexcept { return id_ ? id_.get()->verbs : nullptr; }
  /// The client's address (rdma_get_peer_addr).
  /// \errors
  /// - errc::null_handle: the request is null.
  /// \mallocs None.
  [[nodiscard]] result<address> peer_address() const noexcept {
    if (!id_) return make_error_code(errc::null_handle);
    return address::from(::rdma_get_peer_addr(id_.get()));
  }
  /// The new rdma_cm_id (owned), or nullptr.
  [[nodiscard]] rdma_cm_id *native_handle() const noexcept { return id_.get(); }
  /// True unless null (moved from, accepted or rejected).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(id_); }
  /// Destroy now, checked (rdma_destroy_id: the kernel rejects the request, without private
  /// data; reject() sends some). Null afterwards on success; nothing to do when null.
  /// \errors
  /// - the errno of rdma_destroy_id (the request stays).
  /// \mallocs None.
  result<void> destroy() noexcept { return id_.destroy(); }

  /// First half of an accept: create the QP (conn_options as for connect), move the id to a
  /// new event channel of the connection's own, or to o.channel, a shared one (rdma_migrate_id;
  /// not when the listener's channel is that one), and bring the QP to INIT, RTR and RTS
  /// (rdma_init_qp_attr), without answering the client yet. The returned Connection is in
  /// conn_state::prepared: post local work now (e.g. bind the memory window whose descriptor
  /// goes into the accept's private data), then call Connection::accept(). Nothing may be sent
  /// to the peer before it is established. o.private_data is copied now and sent by accept()
  /// unless accept() is given data of its own. The request becomes null, whatever the outcome
  /// (except for the first two errors).
  /// \errors
  /// - errc::null_handle: the request is null.
  /// - errc::private_data_too_long: o.private_data over 196 bytes (the request stays usable).
  /// - errc::invalid_argument / errc::unknown_access_flag: the options; errc::null_handle:
  ///   o.channel is a null EventChannel (these three leave the request usable).
  /// - ENOMEM: no memory for the node on the shared channel.
  /// - errc::context_mismatch: a PD of another device.
  /// - cm_call_error() codes for rdma_create_event_channel (EMFILE: the fd limit), rdma_migrate_id
  ///   and rdma_init_qp_attr.
  /// - qp_transition codes.
  /// - the errors of the resources created.
  /// \mallocs A new event channel (librdmacm; with o.channel one node instead) and the
  /// resources created (their nodes, besides what verbs allocates).
  [[nodiscard]] result<Connection> prepare(const conn_options &o = {}) noexcept;

  /// Non-blocking accept: prepare(o), then Connection::accept(o.private_data); the returned
  /// Connection is in conn_state::accepting: advance() it until established (the client's
  /// RTU).
  /// \errors
  /// - errc::private_data_too_long: over 196 bytes (checked first: nothing is sent and the
  ///   request stays usable: reject it or accept again).
  /// - those of prepare() and Connection::accept().
  /// \mallocs As prepare().
  [[nodiscard]] result<Connection> start_accept(const conn_options &o = {}) noexcept;
  /// Blocking accept: start_accept(), then advance() until established within o.timeout_ms.
  /// \errors
  /// - those of start_accept() and Connection::advance() (a cm timeout naming the accept step).
  /// \mallocs As start_accept() and Connection::advance().
  [[nodiscard]] result<Connection> accept(const conn_options &o = {}) noexcept;
  /// rdma_reject with private data (at most 148 bytes): the client's connect fails with a
  /// REJECTED code (reject reason 28, consumer defined) carrying these bytes.
  /// \errors
  /// - errc::null_handle: the request is null.
  /// - errc::private_data_too_long: nothing is sent; the request stays usable.
  /// - the errno of rdma_reject (the request is null afterwards either way).
  /// \mallocs None.
  result<void> reject(std::span<const std::byte> data = {}) noexcept;

private:
  friend struct detail::request_access; // Listener (listener.hpp) makes requests
  // The id, a child of the channel it is on (its parent: the listener's own channel's node, or
  // the shared one's), released after the id is destroyed.
  detail::handle<detail::cm_id_traits> id_;
  cm_private_data data_{};
  std::uint8_t resp_res_ = 0;
  std::uint8_t init_depth_ = 0;
};

} // namespace rdmaxx
