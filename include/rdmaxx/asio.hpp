/// \file
/// rdmaxx/asio.hpp: rdmaxx on a Boost.Asio io_context with C++20 coroutines (asio::awaitable).
/// Optional: usable where Boost.Asio is installed (Debian's libboost-dev ships it with Outcome)
/// and rdma_cm is (connection.hpp); built and tested by rdmaxx only then (meson: have_asio).
///
/// What it gives a service that runs one io_context thread, without ever blocking it:
///   - connect(), next_request(), accept(), advance(): rdma_cm steps awaited on the
///     Connection's / Listener's fd (Connection::advance, Listener::get_request(0)), each step
///     bounded by conn_options::timeout_ms as in the blocking forms; connect(to, o,
///     retry_options) retries, until a deadline, while nobody listens yet;
///   - CompletionRouter: one CompletionQueue and its CompletionChannel shared by many
///     connections. A wait polls the CQ first and suspends only if its completion is not there;
///     the CQ is armed (the drain-after-event rule: CompletionQueue::poll_and_arm) only while a
///     wait may suspend, so completions nobody waits for raise no event. On an event the router
///     takes it (ibv_get_cq_event), drains, acknowledges events in batches (ibv_ack_cq_events)
///     and routes every completion to the Waiter registered for its QP and wr_id, resuming the waiting
///     coroutines in the same handler; GrantPool completions go to their pool (attach()), which
///     wakes settled(). One Asio timer serves the deadlines of every suspended wait;
///   - Waiter: `co_await w.wait(deadline)` for the completion of one work request;
///   - settled(): `co_await` until a GrantLease's revocation is confirmed (lease_state::ready);
///   - watch(): fails every waiter of a connection with the connection's error once it
///     disconnects or fails; watch_stop ends it (stop()) and awaits its end (wait_idle());
///   - RDMAXX_CO_TRY / RDMAXX_CO_TRYV (co_try.hpp, included): RDMAXX_TRY for coroutines, which
///     co_return the error of a failed step;
///   - EventPump: one shared rdma_cm EventChannel for many Connections and Listeners, its fd
///     registered once; the steps above awaited through it.
///
/// Cancellation: Boost 1.74 (Debian 12) has no per-operation cancellation slots, so every wait
/// takes a deadline (the router's timer): when it passes the wait returns errc::timeout and the
/// caller revokes what it granted (GrantPool::revoke, then settled()). The request-grant
/// late-access rule holds: once settled() returns, the peer's access with the old key is refused.
///
/// Errors: every coroutine returns result<T>; Asio's error codes are converted in one place
/// (from_asio). Nothing here throws, except that Asio's own frame allocation at a co_await can
/// throw std::bad_alloc; an allocation that fails inside the router's noexcept handlers (the
/// Asio operation of its fd wait, its timer or its flush post) terminates instead.
///
/// Threads: one io_context thread for a router, its waiters, the pools attached to it and the
/// connections watched (like the CQ and QPs they use). One wait at a time on a Connection's or
/// Listener's fd (two would register the fd twice with the reactor). Connections and Listeners
/// on a shared EventChannel (conn_options::channel) have one fd between them: serve the channel
/// with an EventPump and use the overloads that take it (any number of steps wait at once).
/// An io_context that
/// only that thread touches can be made with BOOST_ASIO_CONCURRENCY_HINT_UNSAFE: its scheduler
/// and reactor then take no mutex per handler (a hint of 1 still does).
///
/// Lifetimes: a Waiter must not outlive its router's CQ (it keeps the router's core alive, not
/// the CQ); the router must be destroyed (or closed) before its CQ and channel, and before its
/// io_context (it holds a descriptor and a timer of that io_context). Destroying a router fails
/// its waiters with errc::null_handle.
///
/// What keeps io_context::run() running: a CompletionRouter holds an Asio operation (its wait for
/// the channel's fd, its one timer) only while a wait on it is suspended (Waiter::wait,
/// settled()); with none, it holds nothing, so run() returns once the program's own work is done
/// (every coroutine ended), whether the router is open or not, and close() is not needed for
/// that (it still is before the CQ and channel go). A completion that arrives while no wait is
/// suspended stays in the CQ until the next wait polls it (an attached GrantPool's too: settled()
/// polls first). An EventPump is different: it waits for its channel's fd from create() to
/// close(), so run() does not return while one is open: close it when the last step on its
/// channel is done (or stop the io_context). A watch() waits on its connection's fd until the
/// connection ends or its watch_stop is stopped; Listener steps (next_request) until they return.
///
/// Allocation: CompletionRouter::create allocates its core (the bucket array, the pool table);
/// per completion nothing is allocated beyond Asio's own coroutine frames (recycled per thread,
/// one block per kind): a suspended wait keeps its coroutine's handler in the Waiter, with no
/// timer or operation of its own.
///
/// The parts, each usable alone: asio/basics.hpp (task, deadlines, watch_stop), asio/cm_steps.hpp
/// (the rdma_cm steps), asio/router.hpp (CompletionRouter, Waiter, settled, watch), asio/pump.hpp
/// (EventPump, connect with retries), asio/task_group.hpp (TaskGroup, serve: spawning and
/// counting a service's coroutines), asio/node.hpp (Node: device, PD, CQ, channel and router in
/// one object).
#pragma once

#include "asio/basics.hpp"
#include "asio/cm_steps.hpp"
#include "asio/router.hpp"
#include "asio/pump.hpp"
#include "asio/task_group.hpp"
#include "asio/node.hpp"
