// rdmaxx/rdmaxx.hpp: the umbrella header.
#pragma once

#include "error.hpp"
#include "access.hpp"
#include "device.hpp"
#include "protection_domain.hpp"
#include "memory_region.hpp"
#include "completion_queue.hpp"
#include "queue_pair.hpp"
#if __has_include("memory_window.hpp")
#include "memory_window.hpp"
#endif
#if __has_include("indirect_key.hpp")
#include "indirect_key.hpp"
#endif
