// [bad-input] The rows of MemoryWindow, StrictGrant and ExactGrant (bad_inputs.hpp).
#include "bad_inputs.hpp"

using namespace rxe;
using namespace rxe::bad_input;

TEST_CASE_METHOD(bad_input_world, "bad inputs: MemoryWindow", "[bad-input][window]") {
  table t("MemoryWindow");
  auto bind_now = [&](MemoryWindow &w, QueuePair &qp, const MemoryRegion &m, window_range r,
                      access_flags rights) { return err(w.bind(qp, m, r, rights)); };
  // The batch form; a batch that got a bind is dropped, so the window's pending bind is cancelled.
  auto bind_batched = [&](MemoryWindow &w, QueuePair &qp, const MemoryRegion &m, window_range r,
                          access_flags rights) {
    auto b = qp.start_send();
    auto res = w.bind(b, qp, m, r, rights);
    if (res) w.cancel_pending();
    return err(res);
  };
  t.add("MemoryWindow::alloc", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryWindow::alloc(pd_moved, mw_type::type2, accept_risk)); });
  t.add("MemoryWindow::alloc", "a type that does not exist (7)", sys_errno(std::errc::invalid_argument),
        [&] { return err(MemoryWindow::alloc(pd, static_cast<mw_type>(7))); });
  for (MemoryWindow *w : {&w2, &w1}) {
    const char *call = w == &w2 ? "MemoryWindow::bind (type 2)" : "MemoryWindow::bind (type 1)";
    t.add(call, "zero length", is(errc::zero_length), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 0}, rw_rights);
    });
    t.add(call, "range past the end of the MR", is(errc::out_of_range), [&, w] {
      return bind_now(*w, lb.b, mt, {N - 8, 64}, rw_rights);
    });
    t.add(call, "offset + length wraps", is(errc::out_of_range), [&, w] {
      return bind_now(*w, lb.b, mt, {1, UINT64_MAX}, rw_rights);
    });
    t.add(call, "no rights", is(errc::bad_grant_rights), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 64}, access_flags{});
    });
    t.add(call, "local write as a window right", is(errc::bad_grant_rights), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 64}, access::local_write | access::remote_read);
    });
    t.add(call, "unknown access bit", is(errc::unknown_access_flag), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 64}, unknown_bit | access::remote_read);
    });
    t.add(call, "MR without MW_BIND", is(errc::missing_access), [&, w] {
      return bind_now(*w, lb.b, m_nobind, {0, 64}, access::remote_read);
    });
    t.add(call, "remote write over an MR without LOCAL_WRITE", is(errc::missing_access), [&, w] {
      return bind_now(*w, lb.b, m_nolw, {0, 64}, access::remote_write);
    });
    t.add(call, "MR of another PD", is(errc::pd_mismatch), [&, w] {
      return bind_now(*w, lb.b, mt2, {0, 64}, access::remote_read);
    });
    t.add(call, "QP of another PD", is(errc::pd_mismatch), [&, w] {
      return bind_now(*w, p2.b, mt, {0, 64}, access::remote_read);
    });
    t.add(call, "moved-from MR", is(errc::null_handle), [&, w] {
      return bind_now(*w, lb.b, mr_moved, {0, 64}, access::remote_read);
    });
    t.add(call, "unusable MR", is(errc::unusable), [&, w] {
      return bind_now(*w, lb.b, mu, {0, 64}, access::remote_read);
    });
    t.add(call, "moved-from QP", is(errc::null_handle), [&, w] {
      return bind_now(*w, qp_moved, mt, {0, 64}, access::remote_read);
    });
  }
  t.add("MemoryWindow::bind (type 2)", "remote atomic over an MR without LOCAL_WRITE",
        is(errc::missing_access), [&] {
          return bind_now(w2, lb.b, m_nolw, {0, 64}, access::remote_atomic);
        });
  t.add("MemoryWindow::bind (type 2)", "MR of another context", is(errc::pd_mismatch), [&] {
    return bind_now(w2, lb.b, mt_x, {0, 64}, access::remote_read);
  });
  t.add("MemoryWindow::bind (type 2)", "a window of another PD, through that PD's QP", is(errc::pd_mismatch),
        [&] {
          return bind_now(w2x, p2.b, mt, {0, 64}, access::remote_read);
        });
  t.add("MemoryWindow::bind (type 2)", "a bound window, again", is(errc::already_bound), [&] {
    return bind_now(w2b, lb.b, mt, {0, 64}, access::remote_read);
  });
  t.add("MemoryWindow::bind (type 2)", "moved-from window", is(errc::null_handle), [&] {
    return bind_now(w_moved, lb.b, mt, {0, 64}, access::remote_read);
  });
  t.add("MemoryWindow::bind (type 1)", "through a QP in RESET", is(errc::wrong_state), [&] {
    auto q = fresh();
    const auto ec = refused_then_follow_up(q, [&] {
      return bind_now(w1, q, mt, {0, 64}, access::remote_read);
    });
    CHECK(w1.state() == mw_state::unbound);
    CHECK(w1.pending() == 0);
    return ec;
  });
  t.add("MemoryWindow::bind (type 2)", "through a QP in INIT", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    const std::uint32_t key = w2.rkey();
    const auto ec = refused_then_follow_up(q, [&] {
      return bind_now(w2, q, mt, {0, 64}, access::remote_read);
    });
    CHECK(w2.state() == mw_state::unbound);
    CHECK(w2.rkey() == key);
    CHECK(w2.native_handle()->rkey == key);
    CHECK(q.live_children() == 0);
    return ec;
  });
  t.add("MemoryWindow::unbind", "through a QP in INIT", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    const auto ec = refused_then_follow_up(q, [&] { return err(w1b.unbind(q)); });
    CHECK(w1b.state() == mw_state::bound);
    return ec;
  });
  t.add("MemoryWindow::bind (type 1)", "zero-based", is(errc::wrong_type), [&] {
    return bind_now(w1, lb.b, mt, {0, 64}, access::remote_read | access::zero_based);
  });
  t.add("MemoryWindow::bind (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(w2.bind(b, lb.b, mt, {0, 64}, access::remote_read));
  });
  t.add("MemoryWindow::bind (batch)", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(w2.bind(b, lb.b, mt, {0, 64}, access::remote_read));
  });
  t.add("MemoryWindow::bind (batch)", "moved-from batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    move_away(b);
    return err(w1.bind(b, lb.b, mt, {0, 64}, access::remote_read));
  });
  t.add("MemoryWindow::bind (batch)", "zero length", is(errc::zero_length), [&] {
    return bind_batched(w2, lb.b, mt, {0, 0}, rw_rights);
  });
  t.add("MemoryWindow::bind (batch)", "QP of another PD", is(errc::pd_mismatch), [&] {
    return bind_batched(w2, p2.b, mt, {0, 64}, rw_rights);
  });
  t.add("MemoryWindow::bind (batch)", "a bound type-2 window", is(errc::already_bound), [&] {
    return bind_batched(w2b, lb.b, mt, {0, 64}, rw_rights);
  });
  t.add("MemoryWindow::bind (batch)", "type 1, zero-based", is(errc::wrong_type), [&] {
    return bind_batched(w1, lb.b, mt, {0, 64}, access::remote_read | access::zero_based);
  });
  t.add("MemoryWindow::bind (batch)", "a 5th unconfirmed operation", is(errc::too_many_pending), [&] {
    auto b = lb.b.start_send();
    std::error_code ec;
    for (std::size_t i = 0; i <= MemoryWindow::max_pending && !ec; ++i)
      ec = err(w1.bind(b, lb.b, mt, {64 * i, 64}, access::remote_read, {100 + i}));
    CHECK(w1.pending() == MemoryWindow::max_pending);
    w1.cancel_pending(); // the batch is dropped: nothing of it was posted
    return ec;
  });
  t.add("MemoryWindow::bind (batch)", "while an operation is unconfirmed on another QP",
        is(errc::wrong_state), [&] {
          auto bb = lb.b.start_send();
          need(w1.bind(bb, lb.b, mt, {0, 64}, access::remote_read, {110}), "first bind");
          auto ba = lb.a.start_send();
          const auto ec = err(w1.bind(ba, lb.a, mt, {0, 64}, access::remote_read, {111}));
          w1.cancel_pending();
          return ec;
        });
  t.add("MemoryWindow::unbind", "type 2", is(errc::wrong_type), [&] { return err(w2b.unbind(lb.b)); });
  t.add("MemoryWindow::unbind", "unbound type 1", is(errc::not_bound), [&] { return err(w1.unbind(lb.b)); });
  t.add("MemoryWindow::unbind", "moved-from window", is(errc::null_handle),
        [&] { return err(w_moved.unbind(lb.b)); });
  t.add("MemoryWindow::unbind", "moved-from QP", is(errc::null_handle),
        [&] { return err(w1b.unbind(qp_moved)); });
  t.add("MemoryWindow::unbind (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(w1b.unbind(b, lb.b));
  });
  t.add("MemoryWindow::unbind (batch)", "type 2", is(errc::wrong_type), [&] {
    auto b = lb.b.start_send();
    return err(w2b.unbind(b, lb.b));
  });
  t.add("MemoryWindow::invalidate", "type 1", is(errc::wrong_type),
        [&] { return err(w1b.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "never bound", is(errc::not_bound),
        [&] { return err(w2.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "already invalidated", is(errc::not_bound),
        [&] { return err(w2i.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "through another QP than the bind's", is(errc::qp_mismatch),
        [&] { return err(w2b.invalidate(lb.a)); });
  t.add("MemoryWindow::invalidate", "moved-from window", is(errc::null_handle),
        [&] { return err(w_moved.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "moved-from QP", is(errc::null_handle),
        [&] { return err(w2b.invalidate(qp_moved)); });
  t.add("MemoryWindow::invalidate (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(w2b.invalidate(b, lb.b));
  });
  t.add("MemoryWindow::invalidate (batch)", "never bound", is(errc::not_bound), [&] {
    auto b = lb.b.start_send();
    return err(w2.invalidate(b, lb.b));
  });
  t.add("MemoryWindow::invalidate (batch)", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(w2b.invalidate(b, lb.b));
  });
  t.run();
  finish();
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: StrictGrant", "[bad-input][strict-grant]") {
  table t("StrictGrant");
  t.add("StrictGrant::create", "moved-from PD", is(errc::null_handle), [&] {
    return err(StrictGrant::create(pd_moved, mt, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "moved-from MR", is(errc::null_handle), [&] {
    return err(StrictGrant::create(pd, mr_moved, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "unusable MR", is(errc::unusable), [&] {
    return err(StrictGrant::create(pd, mu, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "PD of another context", is(errc::context_mismatch), [&] {
    return err(StrictGrant::create(pd_x, mt, {0, 64}, mw_type::type2, accept_risk));
  });
  // Another PD of the MR's device: accepted by both forms (one PD rule; the exact region is
  // registered on it).
  CHECK(StrictGrant::create(pd2, mt, {0, 64}, mw_type::type2, accept_risk));
  CHECK(StrictGrant::create(pd2, mt, {0, 64}));
  t.add("StrictGrant::create", "zero length", is(errc::zero_length), [&] {
    return err(StrictGrant::create(pd, mt, {0, 0}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "range past the end of the MR", is(errc::out_of_range), [&] {
    return err(StrictGrant::create(pd, mt, {N - 8, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "offset + length wraps", is(errc::out_of_range), [&] {
    return err(StrictGrant::create(pd, mt, {8, UINT64_MAX - 4}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "a window type that does not exist (7)",
        sys_errno(std::errc::invalid_argument), [&] {
          return err(StrictGrant::create(pd, mt, {0, 64}, static_cast<mw_type>(7)));
        });
  t.add("StrictGrant::grant", "no rights", is(errc::bad_grant_rights),
        [&] { return err(g.grant(lb.b, access_flags{})); });
  t.add("StrictGrant::grant", "QP of another PD", is(errc::pd_mismatch),
        [&] { return err(g.grant(p2.b, access::remote_read)); });
  t.add("StrictGrant::grant", "moved-from QP", is(errc::null_handle),
        [&] { return err(g.grant(qp_moved, access::remote_read)); });
  t.add("StrictGrant::grant", "moved-from grant", is(errc::null_handle),
        [&] { return err(g_moved.grant(lb.b, access::remote_read)); });
  t.add("StrictGrant::grant", "type 1, zero-based", is(errc::wrong_type), [&] {
    auto g1 = need(StrictGrant::create(pd, mt, {0, 64}, mw_type::type1), "type-1 grant");
    return err(g1.grant(lb.b, access::remote_read | access::zero_based));
  });
  t.add("StrictGrant::grant", "remote write over an MR without LOCAL_WRITE", is(errc::missing_access), [&] {
    auto gr = need(StrictGrant::create(pd, m_nolw, {0, 64}, mw_type::type2, accept_risk), "grant over m_nolw");
    return err(gr.grant(lb.b, access::remote_write));
  });
  t.add("StrictGrant::grant", "a bound type-2 grant, again", is(errc::already_bound), [&] {
    auto gb = need(StrictGrant::create(pd, mt, {128, 64}, mw_type::type2, accept_risk), "grant");
    need(gb.grant(lb.b, access::remote_read, {120, send_flag::signaled}), "first bind");
    CHECK(gb.window().complete(wait_one(lb.cq_b)));
    const auto ec = err(gb.grant(lb.b, access::remote_read));
    need(gb.destroy(), "revoke");
    return ec;
  });
  t.add("StrictGrant::grant (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(g.grant(b, lb.b, access::remote_read));
  });
  // Another live object's own work request id: its completion would be that object's.
  t.add("StrictGrant::grant", "another window's own wr_id", is(errc::foreign_wr_id),
        [&] { return err(g.grant(lb.b, access::remote_read, {w1.wr_id(), send_flag::signaled})); });
  t.add("StrictGrant::revoke", "an IndirectKey's own wr_id", is(errc::foreign_wr_id), [&] {
    auto gb = need(StrictGrant::create(pd, mt, {256, 64}), "grant");
    need(gb.grant(lb.b, access::remote_read), "grant");
    CHECK(gb.window().complete(wait_one(lb.cq_b)));
    const auto ec = err(gb.revoke(lb.b, {k.wr_id(), send_flag::signaled}));
    CHECK(gb.window().state() == mw_state::bound); // unchanged, nothing posted
    CHECK(gb.window().pending() == 0);
    need(gb.revoke(lb.b), "revoke with the grant's own id");
    CHECK(gb.window().complete(wait_one(lb.cq_b)));
    return ec;
  });
  t.add("StrictGrant::grant (batch)", "a GrantPool-like id of the object tag, not its own", is(errc::foreign_wr_id), [&] {
    auto b = lb.b.start_send();
    return err(g.grant(b, lb.b, access::remote_read, {object_wr_tag | 1u}));
  });
  t.run();
  finish();
}

TEST_CASE_METHOD(bad_input_world, "bad inputs: ExactGrant", "[bad-input][exact-grant]") {
  table t("ExactGrant");
  t.add("ExactGrant::create", "moved-from PD", is(errc::null_handle),
        [&] { return err(ExactGrant::create(pd_moved, mt, {0, 64}, access::remote_read)); });
  t.add("ExactGrant::create", "moved-from MR", is(errc::null_handle),
        [&] { return err(ExactGrant::create(pd, mr_moved, {0, 64}, access::remote_read)); });
  t.add("ExactGrant::create", "unusable MR", is(errc::unusable),
        [&] { return err(ExactGrant::create(pd, mu, {0, 64}, access::remote_read)); });
  t.add("ExactGrant::create", "PD of another context", is(errc::context_mismatch),
        [&] { return err(ExactGrant::create(pd_x, mt, {0, 64}, access::remote_read)); });
  t.add("ExactGrant::create", "zero length", is(errc::zero_length),
        [&] { return err(ExactGrant::create(pd, mt, {0, 0}, access::remote_read)); });
  t.add("ExactGrant::create", "range past the end of the MR", is(errc::out_of_range),
        [&] { return err(ExactGrant::create(pd, mt, {N - 8, 64}, access::remote_read)); });
  t.add("ExactGrant::create", "offset past the end of the MR", is(errc::out_of_range),
        [&] { return err(ExactGrant::create(pd, mt, {N + 1, 1}, access::remote_read)); });
  t.add("ExactGrant::create", "offset + length wraps", is(errc::out_of_range),
        [&] { return err(ExactGrant::create(pd, mt, {8, UINT64_MAX - 4}, access::remote_read)); });
  t.add("ExactGrant::create", "no rights", is(errc::bad_grant_rights),
        [&] { return err(ExactGrant::create(pd, mt, {0, 64}, access_flags{})); });
  t.add("ExactGrant::create", "local write as a right", is(errc::bad_grant_rights),
        [&] { return err(ExactGrant::create(pd, mt, {0, 64}, access::local_write | access::remote_read)); });
  t.add("ExactGrant::create", "MW_BIND as a right", is(errc::bad_grant_rights),
        [&] { return err(ExactGrant::create(pd, mt, {0, 64}, access::mw_bind | access::remote_read)); });
  t.add("ExactGrant::create", "unknown access bit", is(errc::bad_grant_rights),
        [&] { return err(ExactGrant::create(pd, mt, {0, 64}, unknown_bit | access::remote_read)); });
  t.add("ExactGrant::create", "remote write over an MR without LOCAL_WRITE", is(errc::missing_access),
        [&] { return err(ExactGrant::create(pd, m_nolw, {0, 64}, access::remote_write)); });
  t.add("ExactGrant::create", "remote atomic over an MR without LOCAL_WRITE", is(errc::missing_access),
        [&] { return err(ExactGrant::create(pd, m_nolw, {0, 64}, access::remote_atomic)); });
  t.run();

  // A grant the rows refused works: a write through it lands exactly there (undone after, so
  // that finish() finds the target as it was).
  auto eg = need(ExactGrant::create(pd, mt, {512, 128}, access::remote_write), "exact grant");
  REQUIRE(lb.write(ms.sge(0, 128), eg.descriptor().at(0)) == IBV_WC_SUCCESS);
  auto want = snap_tgt;
  std::memcpy(want.data() + 512, src.data(), 128);
  CHECK(tgt == want);
  std::memcpy(tgt.data() + 512, snap_tgt.data() + 512, 128);
  destroyed(eg.destroy(), "exact grant");
  CHECK(!eg);
  finish();
}
