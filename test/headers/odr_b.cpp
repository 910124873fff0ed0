#include <rdmaxx/rdmaxx.hpp>
const std::error_category *odr_b_category() { return &rdmaxx::error_category(); }
const void *odr_b_hook() { return &rdmaxx::detail::destroy_failure_hook(); }
