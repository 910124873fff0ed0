// Compile-cost probe, the baseline of rdmaxx/asio.hpp: Boost.Asio, the strict baseline
// (verbs.h + Outcome's std_result.hpp + <system_error>) and rdma_cma.h.
#include <utility> // Boost 1.74's awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <boost/outcome/std_result.hpp>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <system_error>
BOOST_OUTCOME_V2_NAMESPACE::std_result<int> probe(ibv_cq *cq, ibv_wc *wc) {
  const int n = ibv_poll_cq(cq, 1, wc);
  if (n < 0) return std::error_code(-n, std::generic_category());
  return n;
}
