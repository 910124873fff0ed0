#include <rdmaxx/rdmaxx.hpp>
const std::error_category *odr_a_category() { return &rdmaxx::error_category(); }
const void *odr_a_hook() { return &rdmaxx::detail::destroy_failure_hook(); }
