// Catch2's main. With CATCH_CONFIG_DISABLE_EXCEPTIONS (the -fno-exceptions build) Catch2 supplies
// its own Catch::throw_exception, which aborts.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
