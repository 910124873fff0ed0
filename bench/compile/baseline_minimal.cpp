// Compile-cost probe, the strict baseline: only the parts of Outcome and verbs rdmaxx includes
// (std_result.hpp, not the whole <boost/outcome.hpp>).
#include <boost/outcome/std_result.hpp>
#include <infiniband/verbs.h>
#include <system_error>
BOOST_OUTCOME_V2_NAMESPACE::std_result<int> probe(ibv_cq *cq, ibv_wc *wc) {
  const int n = ibv_poll_cq(cq, 1, wc);
  if (n < 0) return std::error_code(-n, std::generic_category());
  return n;
}
