// [bad-input] The rows of QueuePair and SendBatch (bad_inputs.hpp).
#include "bad_inputs.hpp"

using namespace rxe;
using namespace rxe::bad_input;

TEST_CASE_METHOD(bad_input_world, "bad inputs: QueuePair", "[bad-input][qp]") {
  table t("QueuePair");
  t.add("QueuePair::create", "moved-from PD", is(errc::null_handle),
        [&] { return err(QueuePair::create(pd_moved, cq_s, cq_s)); });
  t.add("QueuePair::create", "moved-from send CQ", is(errc::null_handle),
        [&] { return err(QueuePair::create(pd, cq_moved, cq_s)); });
  t.add("QueuePair::create", "moved-from receive CQ", is(errc::null_handle),
        [&] { return err(QueuePair::create(pd, cq_s, cq_moved)); });
  t.add("QueuePair::create", "CQ of another context", is(errc::context_mismatch),
        [&] { return err(QueuePair::create(pd, cq_s, cq_x)); });
  t.add("QueuePair::create", "max_send_wr 1 << 30", sys_errno(std::errc::invalid_argument), [&] {
    qp_caps c;
    c.max_send_wr = 1u << 30;
    return err(QueuePair::create(pd, cq_s, cq_s, c));
  });
  t.add("QueuePair::create", "max_send_sge 100000", sys_errno(std::errc::invalid_argument), [&] {
    qp_caps c;
    c.max_send_sge = 100000;
    return err(QueuePair::create(pd, cq_s, cq_s, c));
  });
  t.add("QueuePair::create", "max_inline_data 1 MiB", sys_errno(std::errc::invalid_argument), [&] {
    qp_caps c;
    c.max_inline_data = 1u << 20;
    return err(QueuePair::create(pd, cq_s, cq_s, c));
  });
  t.add("QueuePair::create", "a send operation rxe lacks (TSO)", unsupported(), [&] {
    return err(QueuePair::create(pd, cq_s, cq_s, {}, send_ops(std::uint64_t(IBV_QP_EX_WITH_TSO))));
  });
  t.add("QueuePair::post_recv", "moved-from QP", is(errc::null_handle),
        [&] { return err(qp_moved.post_recv(1, ms.sge(0, 8))); });
  t.add("QueuePair::post_recv", "more SGEs than max_recv_sge", sys_errno(std::errc::invalid_argument), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    std::vector<ibv_sge> sg(q.caps().max_recv_sge + 1, ms.sge(0, 8));
    return err(q.post_recv(1, sg));
  });
  t.add("QueuePair::post_recv", "receive queue full", sys_errno(std::errc::not_enough_memory), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    // rxe's queue holds more than the max_recv_wr it reports: post until it refuses
    for (std::uint32_t i = 0; i <= 8 * q.caps().max_recv_wr + 64; ++i)
      if (auto r = q.post_recv(i, ms.sge(0, 8)); !r) return r.error();
    return std::error_code{};
  });
  t.add("QueuePair::local_endpoint", "port 0", sys_errno(std::errc::invalid_argument), [&] {
    connect_options o;
    o.port = 0;
    return err(lb.a.local_endpoint(o));
  });
  t.add("QueuePair::local_endpoint", "gid index 1 << 20", sys_errno(std::errc::invalid_argument), [&] {
    connect_options o;
    o.gid_index = 1 << 20;
    return err(lb.a.local_endpoint(o));
  });
  t.add("QueuePair::to_rts", "before to_rtr (INIT)", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    return err(q.to_rts());
  });
  t.add("QueuePair::to_rts", "in RESET", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(fresh().to_rts()); });
  t.add("QueuePair::to_rtr", "in RESET", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    return err(q.to_rtr(need(q.local_endpoint(), "endpoint")));
  });
  t.add("QueuePair::to_rts", "already in RTS", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(fresh_rts().to_rts()); });
  t.add("QueuePair::to_init", "port 0", transition(__builtin_ctz(IBV_QP_PORT)), [&] {
    connect_options o;
    o.port = 0;
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_init", "port 2 (rxe has one)", transition(__builtin_ctz(IBV_QP_PORT)), [&] {
    connect_options o;
    o.port = 2;
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_init", "unknown QP access bits", is(errc::unknown_access_flag), [&] {
    connect_options o;
    o.qp_access |= access_flags(1u << 28);
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_init", "MW_BIND as a QP access right", is(errc::unknown_access_flag), [&] {
    connect_options o;
    o.qp_access |= access::mw_bind;
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_rtr", "gid index 200", transition(__builtin_ctz(IBV_QP_AV)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    connect_options o;
    o.gid_index = 200;
    return err(q.to_rtr(need(q.local_endpoint(), "endpoint"), o));
  });
  t.add("QueuePair::to_rts", "max_rd_atomic 255", transition(__builtin_ctz(IBV_QP_MAX_QP_RD_ATOMIC)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    need(q.to_rtr(need(q.local_endpoint(), "endpoint")), "to_rtr");
    connect_options o;
    o.max_rd_atomic = 255;
    return err(q.to_rts(o));
  });
  t.add("QueuePair::to_rts", "in ERR", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init"); // RESET->ERR is not a legal transition
    need(q.to_error(), "to_error");
    return err(q.to_rts());
  });
  t.add("QueuePair::to_init", "in ERR", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    need(q.to_error(), "to_error");
    return err(q.to_init());
  });
  t.add("QueuePair::connect", "a connected QP, twice", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(lb.a.connect(need(lb.b.local_endpoint(), "endpoint b"))); });
  t.add("connect_loopback", "a connected pair, twice", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(connect_loopback(lb.a, lb.b)); });
  t.add("QueuePair::to_error", "in RESET (not a legal transition)", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(fresh().to_error()); });
  t.add("QueuePair::connect", "gid index 200 (an empty GID slot)", transition(__builtin_ctz(IBV_QP_AV)), [&] {
    auto q = fresh();
    connect_options o;
    o.gid_index = 200;
    return err(q.connect(need(q.local_endpoint(), "endpoint"), o));
  });
  t.add("QueuePair::connect", "port 0", transition(__builtin_ctz(IBV_QP_PORT)), [&] {
    auto q = fresh();
    connect_options o;
    o.port = 0;
    return err(q.connect(need(q.local_endpoint(), "endpoint"), o));
  });
  t.add("QueuePair::reset_and_reconnect", "never connected", is(errc::wrong_state),
        [&] { return err(fresh().reset_and_reconnect()); });
  t.add("QueuePair::destroy", "a type-2 window bound through it", is(errc::busy),
        [&] { return err(lb.b.destroy()); });
  t.add("connect_loopback", "moved-from QP", is(errc::null_handle),
        [&] { return err(connect_loopback(qp_moved, vp.b)); });
  {
    const endpoint ep{};
    t.add("QueuePair::local_endpoint", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.local_endpoint()); });
    t.add("QueuePair::to_init", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.to_init()); });
    t.add("QueuePair::to_rtr", "moved-from QP", is(errc::null_handle),
          [&, ep] { return err(qp_moved.to_rtr(ep)); });
    t.add("QueuePair::to_rts", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.to_rts()); });
    t.add("QueuePair::connect", "moved-from QP", is(errc::null_handle),
          [&, ep] { return err(qp_moved.connect(ep)); });
    t.add("QueuePair::reset_and_reconnect", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.reset_and_reconnect()); });
    t.add("QueuePair::to_reset", "moved-from QP", is(errc::null_handle), [&] { return err(qp_moved.to_reset()); });
    t.add("QueuePair::to_error", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.to_error()); });
    t.add("QueuePair::state", "moved-from QP", is(errc::null_handle), [&] { return err(qp_moved.state()); });
  }
#if RDMAXX_HAVE_MLX5
  t.add("mlx5::create_umr_qp", "not an mlx5 device", is(errc::unsupported),
        [&] { return err(mlx5::create_umr_qp(pd, cq_s, cq_s)); });
  t.add("mlx5::create_umr_qp", "moved-from PD", is(errc::null_handle),
        [&] { return err(mlx5::create_umr_qp(pd_moved, cq_s, cq_s)); });
  t.add("mlx5::create_umr_qp", "moved-from CQ", is(errc::null_handle),
        [&] { return err(mlx5::create_umr_qp(pd, cq_moved, cq_s)); });
#endif
  t.run();
  finish();
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: SendBatch", "[bad-input][send-batch]") {
  table t("SendBatch");
  t.add("SendBatch::submit", "twice", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    need(b.submit(), "first submit (empty batch)");
    return err(b.submit());
  });
  t.add("QueuePair::start_send + submit", "moved-from QP", is(errc::null_handle), [&] {
    auto b = qp_moved.start_send();
    b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    return err(b.submit());
  });
  t.add("SendBatch::submit", "moved-from batch", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    move_away(b);
    return err(b.submit());
  });
  t.add("SendBatch::write + submit", "a write added after submit", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    need(b.submit(), "submit (empty batch)");
    b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    return err(b.submit());
  });
  t.add("SendBatch::read/send/... + submit", "every operation on a moved-from batch", is(errc::wrong_state),
        [&] {
          auto b = lb.a.start_send();
          move_away(b);
          const std::byte bytes[4]{};
          const ibv_sge s = ms.sge(0, 8);
          b.read({1}, {md.iova(), md.rkey()}, s)
              .write_inline({2}, {md.iova(), md.rkey()}, bytes)
              .write_imm({3}, {md.iova(), md.rkey()}, 7, s)
              .send({4}, s)
              .send_inline({5}, bytes)
              .send_imm({6}, 7, s)
              .send_inv({7}, 1, std::span<const ibv_sge>(&s, 1))
              .local_inv({8}, 1)
              .atomic_cmp_swp({9}, {md.iova(), md.rkey()}, 0, 1, s)
              .atomic_fetch_add({10}, {md.iova(), md.rkey()}, 1, s);
          return err(b.submit());
        });
  t.add("SendBatch::write + submit", "on a QP in RESET", is(errc::wrong_state), [&] {
    auto q = fresh();
    return refused_then_follow_up(q, [&] { return write_md(q); });
  });
  t.add("SendBatch::write + submit", "on a QP in INIT", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    return refused_then_follow_up(q, [&] { return write_md(q); });
  });
  t.add("SendBatch::write + submit", "on a QP in RTR", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    need(q.to_rtr(need(q.local_endpoint(), "endpoint")), "to_rtr");
    return refused_then_follow_up(q, [&] { return write_md(q); });
  });
  // rxe's provider answers ENOSPC for work requests that do not fit the QP.
  t.add("SendBatch::write(span) + submit", "more SGEs than max_send_sge",
        sys_errno(std::errc::no_space_on_device), [&] {
          std::vector<ibv_sge> sg(vp.a.caps().max_send_sge + 1, ms.sge(0, 8));
          auto b = vp.a.start_send();
          b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, sg);
          return err(b.submit());
        });
  t.add("SendBatch::write_inline + submit", "more than max_inline_data",
        sys_errno(std::errc::no_space_on_device), [&] {
          std::vector<std::byte> data(vp.a.caps().max_inline_data + 1);
          auto b = vp.a.start_send();
          b.write_inline({1, send_flag::signaled}, {md.iova(), md.rkey()}, data);
          return err(b.submit());
        });
  t.add("SendBatch::write + submit", "more work requests than the send queue holds",
        sys_errno(std::errc::no_space_on_device), [&] {
          // rxe's queue holds more than the max_send_wr it reports: add until it cannot hold them
          auto b = vp.a.start_send();
          for (std::uint32_t i = 0; i <= 8 * vp.a.caps().max_send_wr + 64; ++i)
            b.write({i}, {md.iova(), md.rkey()}, ms.sge(0, 8));
          return err(b.submit());
        });
  // rxe's requester fails to copy the payload. On Linux 6.1 the completer reports that work request
  // with the requester's status (local protection or QP operation error), then moves the QP to
  // ERR; on 6.12 the requester moves the QP to ERR itself (rxe_qp_error) and the completer, finding
  // it there, flushes the send queue, this request included: "Work Request Flushed Error". What
  // matters on every kernel: an error completion, the QP in ERR, nothing sent (finish() checks md).
  const kernel_version &kv = running_kernel();
  const expectation bad_lkey = kv.is(6, 1)    ? completion(IBV_WC_LOC_PROT_ERR, IBV_WC_LOC_QP_OP_ERR)
                               : kv.is(6, 12) ? completion(IBV_WC_WR_FLUSH_ERR)
                                              : expectation{"completion: a local error or a flush (kernel " +
                                                                kv.release + " not measured)",
                                                            [](const std::error_code &ec) {
                                                              return ec == wc_error(IBV_WC_LOC_PROT_ERR) ||
                                                                     ec == wc_error(IBV_WC_LOC_QP_OP_ERR) ||
                                                                     ec == wc_error(IBV_WC_WR_FLUSH_ERR);
                                                            }};
  t.add("SendBatch::write", "a local SGE with an lkey that does not exist", bad_lkey, [&] {
    auto b = vp.a.start_send();
    b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, {ms.iova(), 64, ms.lkey() ^ 0x5a5a00});
    if (auto s = b.submit(); !s) return s.error();
    const ibv_wc wc = wait_wc(vp.cq_a, 1).front();
    // 6.1 reports the completion before it moves the QP to ERR: allow it a moment.
    ibv_qp_state st = IBV_QPS_RTS;
    for (int i = 0; i < 100 && (st = need(vp.a.state(), "state")) != IBV_QPS_ERR; ++i)
      std::this_thread::sleep_for(10ms);
    INFO("QP state after the bad lkey's completion: " << int(st));
    CHECK(st == IBV_QPS_ERR);
    vp.recover();
    return wc_error(wc);
  });
  t.add("SendBatch::write", "a remote range past the end of the MR", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    return on_victim([&](SendBatch &b) {
      b.write({1, send_flag::signaled}, {mt.iova() + N - 8, mt.rkey()}, ms.sge(0, 64));
    });
  });
  t.add("SendBatch::write", "rkey 0", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    return on_victim([&](SendBatch &b) { b.write({1, send_flag::signaled}, {mt.iova(), 0}, ms.sge(0, 64)); });
  });
  t.add("SendBatch::write", "through a read-only type-1 window", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    return on_victim([&](SendBatch &b) {
      b.write({1, send_flag::signaled}, w1b.descriptor().at(0), ms.sge(0, 64));
    });
  });
  t.add("SendBatch::read", "into a local SGE past the end of its MR", completion(IBV_WC_LOC_PROT_ERR), [&] {
    return on_victim([&](SendBatch &b) {
      b.read({1, send_flag::signaled}, {mt.iova(), mt.rkey()}, {ms.iova() + N - 8, 64, ms.lkey()});
    });
  });
  t.add("SendBatch::write", "on a QP in ERR", completion(IBV_WC_WR_FLUSH_ERR), [&] {
    need(vp.a.to_error(), "to_error");
    return on_victim([&](SendBatch &b) {
      b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    });
  });
  t.run();
  finish();
}
