/// \file
/// rdmaxx/work_request.hpp: the small value types of a work request (its flags, its identity, the
/// remote address it targets), shared by the send batch, the descriptors and the indirect-key
/// initiator without pulling in QueuePair.
///
/// Allocation: none (value types).
#pragma once

#include "detail/flags.hpp"

#include <infiniband/verbs.h>

#include <cstdint>

namespace rdmaxx {

/// Work-request flags (enum ibv_send_flags).
enum class send_flag : unsigned {
  fence = IBV_SEND_FENCE,
  signaled = IBV_SEND_SIGNALED,
  solicited = IBV_SEND_SOLICITED,
  inline_data = IBV_SEND_INLINE,
};
RDMAXX_FLAGS_OPERATORS(send_flag)
/// A set of work-request flags; native() is the IBV_SEND_* mask.
using send_flags = flags<send_flag>;

/// An address in a peer's registered memory: where to read or write and the key that allows it.
struct remote_addr {
  /// Remote address (an offset for zero-based keys).
  std::uint64_t addr = 0;
  /// Remote key of the region, window or indirect key covering addr.
  std::uint32_t rkey = 0;
};

/// Identity and flags of one work request.
struct wr {
  /// wr_id, returned in the completion.
  std::uint64_t id = 0;
  /// IBV_SEND_* flags (signaled, fence, solicited, inline).
  send_flags flags{};
};

} // namespace rdmaxx
