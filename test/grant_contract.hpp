// The grant contract (issue 20), stated once: what every public way of handing a peer a key
// promises. Two suites instantiate it, each case titled with one of the properties below and
// tagged [grant-contract]:
//   - test/rxe/test_grant_contract.cpp, on rxe against a plain-libibverbs peer: StrictGrant kept
//     per slot, a GrantPool lease, a software IndirectKey segment;
//   - test/unit/test_mlx5_contract.cpp, without a device ([mlx5]): the mlx5 IndirectKey against
//     a stand-in that behaves as rdma-core 44's mlx5 provider (what the device itself enforces
//     only hardware shows: not run on hardware).
// Each suite's adapters ("grant forms") model grant_form: the same grant / confirm / revoke
// steps, whatever the form's own API calls them.
#pragma once

#include <rdmaxx/queue_pair.hpp>
#include <rdmaxx/remote_descriptor.hpp>

#include <catch2/catch.hpp>

#include <concepts>
#include <cstdint>

// The properties, as the suites' test case titles (string literals, so that Catch2 can name a
// case with one, with a suffix for the form or the fault injected).
#define GRANT_CONTRACT_EXACT_BYTES "grant contract: the key reaches exactly the granted bytes"
#define GRANT_CONTRACT_OWN_COMPLETION "grant contract: only the operation's own completion confirms it"
#define GRANT_CONTRACT_ROLLBACK                                                                   \
  "grant contract: a dropped post and a failed or flushed one roll back; the key they named never works"
#define GRANT_CONTRACT_REUSE                                                                      \
  "grant contract: 300 reuse cycles hand out no key twice; grant #0's key stays dead"
#define GRANT_CONTRACT_QUERY_FAILS_CLOSED "grant contract: a failed device query fails closed"
#define GRANT_CONTRACT_TYPE2 "grant contract: type 2 on rxe only with the acknowledgement"

namespace grant_contract {

/// How many times the reuse property grants and revokes the same slot.
inline constexpr int reuse_cycles = 300;

/// A grant form as the contract drives it: grant into an open batch (the key it names, before
/// any confirmation), hand completions back, revoke; `confirmed()` once the form would hand the
/// key to a peer, `idle()` once the slot is free again.
template <class F>
concept grant_form = requires(F &f, const F &cf, rdmaxx::SendBatch &b, std::uint64_t id, const ibv_wc &wc) {
  { F::name } -> std::convertible_to<const char *>;
  { F::confirms_grant } -> std::convertible_to<bool>;   // the grant waits for its own completion
  { F::revoke_is_posted } -> std::convertible_to<bool>; // revoking is a work request of its own
  { f.grant(b, id) } -> std::same_as<rdmaxx::remote_descriptor>;
  { cf.confirmed() } -> std::same_as<bool>;
  { cf.idle() } -> std::same_as<bool>;
  f.complete(wc);
  f.post_revoke(id);
};

/// The own-completion property's core, for a form whose grant waits for its completion: `own`,
/// re-labelled as another work request of the same QP or as its wr_id on another QP, confirms
/// nothing. The caller then hands the real `own`.
template <grant_form F>
void foreign_completions_confirm_nothing(F &f, const ibv_wc &own) {
  CHECK_FALSE(f.confirmed());
  ibv_wc other = own;
  other.wr_id ^= 0x40; // another work request of the same QP
  f.complete(other);
  CHECK_FALSE(f.confirmed());
  other = own;
  other.qp_num ^= 1; // the same wr_id on another QP
  f.complete(other);
  CHECK_FALSE(f.confirmed());
}

} // namespace grant_contract
