// Compile-cost probe, the baseline issue #6 defines: the same work against <infiniband/verbs.h>
// and <boost/outcome.hpp> (the whole of Outcome, including its Boost flavour).
#include <boost/outcome.hpp>
#include <infiniband/verbs.h>
BOOST_OUTCOME_V2_NAMESPACE::std_result<int> probe(ibv_cq *cq, ibv_wc *wc) {
  const int n = ibv_poll_cq(cq, 1, wc);
  if (n < 0) return std::error_code(-n, std::generic_category());
  return n;
}
