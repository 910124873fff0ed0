/// \file
/// rdmaxx/asio/node.hpp: Node, this host's side of an Asio service in one object: a device
/// opened, a protection domain, one CompletionQueue with its CompletionChannel, and the
/// CompletionRouter serving them, created together and destroyed in the right order.
///
/// Why: every service on one io_context thread needs exactly these five, and the order rules
/// between them (the router closed before its CQ and channel, the CQ before the context) are
/// easy to get wrong by hand. Connections made with connection_options() share the node's PD and
/// CQ, so one router serves them all.
#pragma once

#include "basics.hpp"
#include "router.hpp"
#include "../cm_address.hpp"
#include "../completion_queue.hpp"
#include "../connection.hpp"
#include "../device.hpp"
#include "../protection_domain.hpp"

#include <memory>
#include <cstdint>
#include <new>
#include <string_view>

namespace rdmaxx::asio {

/// What Node::open needs.
struct node_options {
  /// The device to open by name (Context::open(name)); empty: the first (Context::open_first).
  std::string_view device{};
  /// Entries of the node's CQ: at least the work requests of every connection that may be
  /// outstanding at once (send and receive).
  int cq_entries = 1024;
  /// The router's sizes (waiter buckets, attachable pools and objects, event acknowledgement).
  router_options router{};
  /// conn_options::timeout_ms of connection_options(): the bound of each rdma_cm step.
  int timeout_ms = 5000;
};

/// A device, its PD, one CQ with its channel, and the CompletionRouter over them, owned together
/// (at one address: moving the Node moves a pointer). Destruction, close() or move-assignment
/// closes the router, then destroys the CQ, the channel, the PD and the context, in that order.
/// Connections, regions and grants made on it must be destroyed before it, as for the handles it
/// holds. Move-only, null after move. One io_context thread, as its router.
class Node {
public:
  /// A null node.
  Node() noexcept = default;
  /// Takes over `o`'s parts (one pointer); `o` is left null.
  Node(Node &&) noexcept = default;
  /// Closes this node, then takes over `o`'s parts.
  Node &operator=(Node &&o) noexcept {
    if (this != &o) {
      close();
      p_ = std::move(o.p_);
    }
    return *this;
  }
  /// close().
  ~Node() { close(); }

  /// Open the device (o.device, or the first), allocate a PD, create a channel and a CQ of
  /// o.cq_entries on it, and serve them with a CompletionRouter on `ex`.
  /// \errors Those of Context::open / open_first, ProtectionDomain::alloc,
  /// CompletionChannel::create, CompletionQueue::create and CompletionRouter::create, from the
  /// first that failed (what was created before it is destroyed); ENOMEM when the node's block
  /// cannot be allocated.
  /// \mallocs The node's block (new(nothrow)), and what each of those creations allocates.
  [[nodiscard]] static result<Node> open(const net::any_io_executor &ex, const node_options &o = {}) noexcept;

  /// True unless null.
  [[nodiscard]] explicit operator bool() const noexcept { return p_ != nullptr; }
  /// The device's context (the node must not be null: as for every accessor here).
  [[nodiscard]] Context &context() const noexcept { return p_->ctx; }
  /// The protection domain of everything made on the node.
  [[nodiscard]] ProtectionDomain &pd() const noexcept { return p_->pd; }
  /// The CQ of every connection made with connection_options().
  [[nodiscard]] CompletionQueue &cq() const noexcept { return p_->cq; }
  /// The channel the CQ raises its events on.
  [[nodiscard]] CompletionChannel &channel() const noexcept { return p_->ch; }
  /// The router serving the CQ: Waiters, settled(), route().
  [[nodiscard]] CompletionRouter &router() const noexcept { return p_->router; }
  /// Options for Connection::start_connect / connect() / ConnectRequest::prepare() that put the
  /// connection's QP on the node's PD and CQ (send and receive), its steps bounded by
  /// node_options::timeout_ms; change the other fields on the copy returned.
  [[nodiscard]] conn_options connection_options() const noexcept {
    conn_options c;
    c.pd = &p_->pd;
    c.send_cq = &p_->cq;
    c.recv_cq = &p_->cq;
    c.timeout_ms = p_->timeout_ms;
    return c;
  }

  /// The address peers reach this node's device at (address::of_device of its first port), with
  /// TCP port `port`: what a server on this node listens on, and what a client in the same
  /// process connects to.
  /// \errors Those of address::of_device (no IP address on the device's netdev: errc::no_device).
  [[nodiscard]] result<address> local_address(std::uint16_t port) const noexcept {
    RDMAXX_TRY(a, address::of_device(p_->ctx));
    return a.with_port(port);
  }

  /// Close the router (its waiters fail with errc::null_handle), then destroy the CQ, the
  /// channel, the PD and the context. Idempotent.
  void close() noexcept { p_.reset(); }

private:
  // Declared in the order of creation: destroyed router first, context last.
  struct parts {
    Context ctx;
    ProtectionDomain pd;
    CompletionChannel ch;
    CompletionQueue cq;
    CompletionRouter router;
    int timeout_ms = 5000;
  };
  std::unique_ptr<parts> p_;
};

inline result<Node> Node::open(const net::any_io_executor &ex, const node_options &o) noexcept {
  Node n;
  n.p_.reset(new (std::nothrow) parts);
  if (!n.p_) return std::make_error_code(std::errc::not_enough_memory);
  parts &p = *n.p_;
  p.timeout_ms = o.timeout_ms;
  RDMAXX_TRY(ctx, o.device.empty() ? Context::open_first() : Context::open(o.device));
  p.ctx = std::move(ctx);
  RDMAXX_TRY(pd, ProtectionDomain::alloc(p.ctx));
  p.pd = std::move(pd);
  RDMAXX_TRY(ch, CompletionChannel::create(p.ctx));
  p.ch = std::move(ch);
  RDMAXX_TRY(cq, CompletionQueue::create(p.ctx, o.cq_entries, &p.ch));
  p.cq = std::move(cq);
  RDMAXX_TRY(router, CompletionRouter::create(ex, p.cq, p.ch, o.router));
  p.router = std::move(router);
  return n;
}


} // namespace rdmaxx::asio
