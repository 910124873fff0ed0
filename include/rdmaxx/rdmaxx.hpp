/// \file rdmaxx/rdmaxx.hpp
/// The umbrella header: every public rdmaxx header (the mlx5 backend comes in through
/// indirect_key.hpp when built with the mlx5 option).
#pragma once

#include "error.hpp"
#include "access.hpp"
#include "device.hpp"
#include "protection_domain.hpp"
#include "memory_region.hpp"
#include "completion_queue.hpp"
#include "endpoint.hpp"
#include "send_batch.hpp"
#include "queue_pair.hpp"
#include "work_request.hpp"
#include "remote_descriptor.hpp"
#include "ikey_descriptor.hpp"
#include "memory_window.hpp"
#include "strict_grant.hpp"
#include "exact_grant.hpp"
#include "probe.hpp"
#include "layout.hpp"
#include "indirect_key.hpp"
#include "indirect_access.hpp"
#include "grant_list.hpp"
#include "grant_pool.hpp"
#include "completion_dispatcher.hpp"
#include "route.hpp"
