// bench/credit_cost.cpp (by hand, not built by Meson): what the send-queue credit
// (detail/sq_credit.hpp, on mlx5 UMR QPs) would add per work request on any QP, counted with callgrind
// on a stand-in ibv_qp_ex whose entries do nothing (no device): one batch of one signaled write,
// submitted, and (counted QP) its completion handed back to QueuePair::retire.
//   g++ -std=c++20 -O3 -Iinclude -DRDMAXX_HAVE_MLX5=1 bench/credit_cost.cpp -o /tmp/cc -libverbs -lmlx5
//   valgrind --tool=callgrind --toggle-collect="count_*" /tmp/cc 1000; callgrind_annotate --inclusive=yes
// count_credit - count_plain, divided by the rounds, is the credit per work request.
#include <rdmaxx/queue_pair.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rdmaxx::detail {
struct test_access {
  static QueuePair qp(ibv_qp_ex &q) {
    QueuePair r;
    r.h_ = decltype(r.h_)(&q.qp_base, nullptr, nullptr);
    r.qpx_.reset(&q);
    return r;
  }
  static void disown(QueuePair &q) { q.h_.replace(nullptr); q.qpx_.release(); }
};
} // namespace rdmaxx::detail
using namespace rdmaxx;

static ibv_qp_ex make() {
  ibv_qp_ex x{};
  x.qp_base.state = IBV_QPS_RTS;
  x.qp_base.qp_num = 7;
  x.wr_rdma_write = [](ibv_qp_ex *, std::uint32_t, std::uint64_t) {};
  x.wr_set_sge = [](ibv_qp_ex *, std::uint32_t, std::uint64_t, std::uint32_t) {};
  x.wr_start = [](ibv_qp_ex *) {};
  x.wr_complete = [](ibv_qp_ex *) { return 0; };
  x.wr_abort = [](ibv_qp_ex *) {};
  return x;
}

__attribute__((noinline)) int count_plain(QueuePair &qp, int rounds) {
  int bad = 0;
  const ibv_sge s{0x1000, 64, 5};
  for (int i = 0; i < rounds; ++i) {
    auto b = qp.start_send();
    b.write({std::uint64_t(i), send_flag::signaled}, {0x2000, 9}, s);
    bad += b.submit() ? 0 : 1;
  }
  return bad;
}
__attribute__((noinline)) int count_credit(QueuePair &qp, int rounds) {
  int bad = 0;
  const ibv_sge s{0x1000, 64, 5};
  ibv_wc wc{};
  wc.qp_num = 7;
  wc.status = IBV_WC_SUCCESS;
  wc.opcode = IBV_WC_RDMA_WRITE;
  for (int i = 0; i < rounds; ++i) {
    auto b = qp.start_send();
    b.write({std::uint64_t(i), send_flag::signaled}, {0x2000, 9}, s);
    bad += b.submit() ? 0 : 1;
    wc.wr_id = std::uint64_t(i);
    bad += qp.retire(wc) ? 0 : 1;
  }
  return bad;
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 1000;
  ibv_qp_ex a = make(), b = make();
  QueuePair plain = detail::test_access::qp(a);
  QueuePair counted = detail::test_access::qp(b);
  if (!detail::sq_credit::install(&b, 64, nullptr)) return 1;
  const int bad = count_plain(plain, rounds) + count_credit(counted, rounds);
  std::printf("bad %d room %u\n", bad, counted.send_queue_room());
  detail::sq_credit::free(b.qp_base.qp_context);
  detail::test_access::disown(plain);
  detail::test_access::disown(counted);
  return bad != 0;
}
