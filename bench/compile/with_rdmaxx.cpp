// Compile-cost probe: a translation unit that uses rdmaxx.
#include <rdmaxx/rdmaxx.hpp>
int probe(rdmaxx::CompletionQueue &cq, ibv_wc *wc) {
  auto r = cq.poll({wc, 1});
  return r ? int(r.value()) : -1;
}
