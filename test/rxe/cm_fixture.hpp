// Shared setup of the rdma_cm device tests (on top of fixture.hpp).
#pragma once

#include "fixture.hpp"

#include <rdmaxx/connection.hpp>

#include <string>

namespace rxe {

/// kernel_resources() once librdmacm has opened the device context it keeps for the life of the
/// process (on its first use): a baseline taken before that would count the context as a leak.
inline std::string cm_resources_baseline() {
  { auto l = Listener::listen(address::parse("192.0.2.1:0").value()); }
  return kernel_resources();
}

} // namespace rxe
