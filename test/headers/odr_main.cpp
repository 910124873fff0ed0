#include <cstdio>
#include <system_error>
const std::error_category *odr_a_category();
const std::error_category *odr_b_category();
const void *odr_a_hook();
const void *odr_b_hook();
// Inline singletons must be one object across translation units, or error codes from one TU
// would not compare equal to those of another.
int main() {
  if (odr_a_category() != odr_b_category() || odr_a_hook() != odr_b_hook()) {
    std::puts("ODR failure: two instances of an inline singleton");
    return 1;
  }
  return 0;
}
