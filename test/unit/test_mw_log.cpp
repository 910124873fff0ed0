// detail::mw_log, the log of a memory window's unconfirmed operations, without a device: which
// completion confirms or undoes what, and that the MR and QP counts a binding holds move with it
// (back exactly on a rollback, released on a confirm). The parents are detail::handle objects
// with stand-in C objects and real children counters, as in test_handle_parents.cpp; the
// window's current binding lives in a handle's slots second (MR) and third (QP), as in
// MemoryWindow.
#include <rdmaxx/detail/mw_log.hpp>
#include <rdmaxx/memory_window.hpp> // detail::mw_binding, mw_state: the types MemoryWindow uses

#include <catch2/catch.hpp>

#include <vector>

using namespace rdmaxx;
using detail::mw_outcome;
using detail::parent_slot;

namespace {
struct obj {
  int id;
};
template <std::size_t N>
struct traits {
  using native = obj;
  static constexpr const char *object = "Stand-in";
  static constexpr const char *verb = "none";
  static constexpr std::size_t parents = N;
  static int destroy(native *) noexcept { return 0; }
};
std::vector<destroy_failure> reported;
void capture(const destroy_failure &f) noexcept { reported.push_back(f); }

using log4 = detail::mw_log<detail::mw_binding, MemoryWindow::max_pending>;
constexpr std::uint32_t qpn = 0x11, other_qpn = 0x12;

// A PD, two MRs and a QP with children counters, and a window (PD, MR, QP slots) whose current
// binding is `cur` and whose unconfirmed operations are `log`.
struct window {
  destroy_failure_handler old = set_destroy_failure_handler(&capture);
  obj objs[5] = {{0}, {1}, {2}, {3}, {4}};
  detail::handle<traits<1>> pd{&objs[0], nullptr, detail::new_parent_node()};
  detail::handle<traits<1>> mr_a{&objs[1], pd.node(), detail::new_parent_node()};
  detail::handle<traits<1>> mr_b{&objs[2], pd.node(), detail::new_parent_node()};
  detail::handle<traits<1>> qp{&objs[3], pd.node(), detail::new_parent_node()};
  detail::handle<traits<3>> h{&objs[4], pd.node(), nullptr};
  detail::mw_binding cur;
  log4 log;

  window() { reported.clear(); }
  ~window() {
    log.clear();
    cur = {};
    h.reset();
    qp.reset();
    mr_b.reset();
    mr_a.reset();
    pd.reset();
    CHECK(reported.empty()); // every count came back down before its parent went
    set_destroy_failure_handler(old);
  }
  // What MemoryWindow does for a posted operation: push, then apply the new binding.
  void bind(std::uint64_t wr_id, detail::handle<traits<1>> &mr, std::uint32_t key, bool type2 = true,
            std::uint32_t on_qp = qpn, bool signaled = true) {
    log.push(wr_id, on_qp, IBV_WC_BIND_MW, cur, h, signaled);
    cur.state = mw_state::bound;
    cur.rkey = key;
    cur.length = 64;
    h.set_parent<parent_slot::second>(mr.node());
    if (type2) {
      cur.qp_num = on_qp;
      h.set_parent<parent_slot::third>(qp.node());
    }
  }
  void unbind(std::uint64_t wr_id, std::uint32_t key, mw_state s = mw_state::unbound,
              ibv_wc_opcode op = IBV_WC_BIND_MW, bool signaled = true) {
    log.push(wr_id, qpn, op, cur, h, signaled);
    cur.state = s;
    cur.rkey = key;
    h.set_parent<parent_slot::second>(nullptr);
    h.set_parent<parent_slot::third>(nullptr);
  }
  [[nodiscard]] mw_outcome complete(const ibv_wc &wc, bool peer_invalidated = false) {
    return log.complete(wc, peer_invalidated, cur, h);
  }
  [[nodiscard]] std::uint32_t a() const { return mr_a.live_children(); }
  [[nodiscard]] std::uint32_t b() const { return mr_b.live_children(); }
  [[nodiscard]] std::uint32_t q() const { return qp.live_children(); }
  [[nodiscard]] std::vector<std::uint64_t> ids() const {
    std::vector<std::uint64_t> v;
    for (std::size_t i = 0; i < log.size(); ++i) v.push_back(log[i].wr_id);
    return v;
  }
};

ibv_wc wc_of(std::uint64_t id, ibv_wc_status st = IBV_WC_SUCCESS, ibv_wc_opcode op = IBV_WC_BIND_MW,
             std::uint32_t on_qp = qpn) {
  ibv_wc wc{};
  wc.wr_id = id;
  wc.qp_num = on_qp;
  wc.status = st;
  wc.opcode = op;
  return wc;
}

// The scenario most tests start from, a type-2 window with three unconfirmed operations:
//   before 1: unbound, key 0x100           (no links)
//   1: bind over mr_a, key 0x101  -> before 2: bound mr_a/qp  (links a, q)
//   2: invalidate, key 0x101      -> before 3: invalidated     (no links)
//   3: bind over mr_b, key 0x102  -> current:  bound mr_b/qp   (links b, q in the handle)
void three_ops(window &w) {
  w.cur.rkey = 0x100;
  w.bind(1, w.mr_a, 0x101);
  w.unbind(2, 0x101, mw_state::invalidated, IBV_WC_LOCAL_INV);
  w.bind(3, w.mr_b, 0x102);
}
} // namespace

TEST_CASE("mw_log: push moves the binding and its links into the log, up to capacity", "[unit][mw]") {
  window w;
  w.cur.rkey = 0x100;
  CHECK(log4::capacity == MemoryWindow::max_pending);
  CHECK(w.log.empty());
  w.bind(1, w.mr_a, 0x101);
  CHECK((w.a() == 1 && w.q() == 1));
  w.unbind(2, 0x101, mw_state::invalidated, IBV_WC_LOCAL_INV);
  // the binding's links moved into entry 2: still counted once, not twice, not zero
  CHECK((w.a() == 1 && w.q() == 1));
  CHECK(w.h.parent<parent_slot::second>() == nullptr);
  CHECK(w.h.parent<parent_slot::third>() == nullptr);
  REQUIRE(w.log.size() == 2);
  CHECK(w.log[1].before.mr_link.parent() == w.mr_a.node());
  CHECK(w.log[1].before.qp_link.parent() == w.qp.node());
  CHECK(w.log[1].before.state == mw_state::bound);
  CHECK(w.log[1].before.rkey == 0x101);
  CHECK(w.log[1].opcode == IBV_WC_LOCAL_INV);
  CHECK(w.log[0].before.state == mw_state::unbound);
  CHECK(w.log[0].before.rkey == 0x100);
  CHECK_FALSE(w.log[0].before.mr_link);
  CHECK(w.log[0].opcode == IBV_WC_BIND_MW);
  w.bind(3, w.mr_b, 0x102);
  CHECK_FALSE(w.log.full());
  w.unbind(4, 0x102, mw_state::invalidated, IBV_WC_LOCAL_INV);
  // the window's check before a fifth operation (errc::too_many_pending) reads this
  CHECK(w.log.full());
  CHECK(w.log.size() == 4);
  CHECK(w.ids() == std::vector<std::uint64_t>{1, 2, 3, 4});
  for (std::size_t i = 0; i < 4; ++i) CHECK(w.log[i].qp_num == qpn);
  CHECK((w.a() == 1 && w.b() == 1 && w.q() == 2)); // entries 2 and 4 hold the QP
  CHECK(w.cur.state == mw_state::invalidated);
}

TEST_CASE("mw_log: successes confirm in order, and a match confirms the unsignaled ones before it", "[unit][mw]") {
  SECTION("in order") {
    window w;
    three_ops(w);
    REQUIRE((w.a() == 1 && w.b() == 1 && w.q() == 2));
    CHECK(w.complete(wc_of(1)) == mw_outcome::confirmed);
    CHECK(w.ids() == std::vector<std::uint64_t>{2, 3});
    CHECK((w.a() == 1 && w.q() == 2)); // entry 2 still holds the binding over mr_a
    CHECK(w.complete(wc_of(2, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV)) == mw_outcome::confirmed);
    CHECK(w.ids() == std::vector<std::uint64_t>{3});
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1)); // the binding over mr_a is gone for good
    CHECK(w.complete(wc_of(3)) == mw_outcome::confirmed);
    CHECK(w.log.empty());
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1)); // the current binding's, in the handle
    CHECK(w.cur.state == mw_state::bound);
    CHECK(w.cur.rkey == 0x102);
    CHECK(w.complete(wc_of(3)) == mw_outcome::ignored); // nothing left
  }
  SECTION("out of order: the last operation's completion (earlier ones unsignaled)") {
    window w;
    three_ops(w);
    CHECK(w.complete(wc_of(3)) == mw_outcome::confirmed);
    CHECK(w.log.empty());
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1));
    CHECK(w.cur.rkey == 0x102);
    CHECK(w.h.parent<parent_slot::second>() == w.mr_b.node());
  }
  SECTION("one wr_id for every operation (window_wr_id), only the last signaled: its success confirms all") {
    window w;
    w.cur.rkey = 0x100;
    w.bind(window_wr_id, w.mr_a, 0x101, true, qpn, false);
    w.unbind(window_wr_id, 0x101, mw_state::invalidated, IBV_WC_LOCAL_INV, false);
    w.bind(window_wr_id, w.mr_b, 0x102);
    CHECK(w.complete(wc_of(window_wr_id)) == mw_outcome::confirmed);
    CHECK(w.log.empty());
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1));
  }
  SECTION("one wr_id, every operation signaled: each success confirms the oldest, not a later one") {
    // A bind's success once confirmed the (type 1) unbind after it too, before that had run: a
    // flush of the unbind was then ignored and the window read unbound with its key live.
    window w;
    w.cur.rkey = 0x100;
    w.bind(window_wr_id, w.mr_a, 0x101, false);
    w.unbind(window_wr_id, 0x102); // a type-1 unbind completes as IBV_WC_BIND_MW too
    CHECK(w.complete(wc_of(window_wr_id)) == mw_outcome::confirmed);
    REQUIRE(w.log.size() == 1);
    CHECK(w.cur.state == mw_state::unbound);
    CHECK(w.complete(wc_of(window_wr_id, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
    CHECK(w.log.empty());
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101)); // live: the unbind never ran
    CHECK(w.a() == 1);
  }
  SECTION("same wr_id, different opcodes: the newest entry of the completion's opcode") {
    window w;
    w.cur.rkey = 0x100;
    w.bind(7, w.mr_a, 0x101);
    w.unbind(7, 0x101, mw_state::invalidated, IBV_WC_LOCAL_INV);
    // a bind's completion cannot be the invalidate's: only the bind is confirmed
    CHECK(w.complete(wc_of(7)) == mw_outcome::confirmed);
    REQUIRE(w.log.size() == 1);
    CHECK(w.log[0].opcode == IBV_WC_LOCAL_INV);
    CHECK((w.a() == 1 && w.q() == 1));
  }
}

TEST_CASE("mw_log: a failure of the middle entry rolls back to the state before it", "[unit][mw]") {
  window w;
  w.cur.rkey = 0x100;
  const std::uint32_t a0 = w.a(), b0 = w.b(), q0 = w.q();
  three_ops(w);
  // the invalidate failed: the window is bound over mr_a again, entry 3 (after it) is dropped
  CHECK(w.complete(wc_of(2, IBV_WC_MW_BIND_ERR, IBV_WC_LOCAL_INV)) == mw_outcome::rolled_back);
  CHECK(w.ids() == std::vector<std::uint64_t>{1});
  CHECK(w.cur.state == mw_state::bound);
  CHECK(w.cur.rkey == 0x101);
  CHECK(w.cur.qp_num == qpn);
  CHECK(w.h.parent<parent_slot::second>() == w.mr_a.node());
  CHECK(w.h.parent<parent_slot::third>() == w.qp.node());
  CHECK_FALSE(w.cur.mr_link); // the links went back to the handle, not stayed in the binding
  CHECK((w.a() == 1 && w.b() == 0 && w.q() == 1));
  // later completions of the dropped operation are ignored
  CHECK(w.complete(wc_of(3, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::ignored);
  CHECK(w.complete(wc_of(3)) == mw_outcome::ignored);
  CHECK(w.log.size() == 1);
  // and the first failing too: every count exactly as before the three operations
  CHECK(w.complete(wc_of(1, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
  CHECK(w.log.empty());
  CHECK(w.cur.state == mw_state::unbound);
  CHECK(w.cur.rkey == 0x100);
  CHECK(w.h.parent<parent_slot::second>() == nullptr);
  CHECK(w.h.parent<parent_slot::third>() == nullptr);
  CHECK((w.a() == a0 && w.b() == b0 && w.q() == q0));
}

TEST_CASE("mw_log: flushed completions of unsignaled operations", "[unit][mw]") {
  SECTION("the oldest flushed operation undoes everything after it; the rest are ignored") {
    window w;
    three_ops(w);
    // the QP went to error: every outstanding work request, unsignaled ones included, flushes
    CHECK(w.complete(wc_of(1, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND)) == mw_outcome::rolled_back);
    CHECK(w.complete(wc_of(2, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND)) == mw_outcome::ignored);
    CHECK(w.complete(wc_of(3, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND)) == mw_outcome::ignored);
    CHECK(w.log.empty());
    CHECK((w.cur.state == mw_state::unbound && w.cur.rkey == 0x100));
    CHECK((w.a() == 0 && w.b() == 0 && w.q() == 0));
  }
  SECTION("one wr_id for all: each flush undoes the newest; exact once every flush is handed over") {
    window w;
    w.cur.rkey = 0x100;
    w.bind(window_wr_id, w.mr_a, 0x101);
    w.unbind(window_wr_id, 0x101, mw_state::invalidated, IBV_WC_LOCAL_INV);
    w.bind(window_wr_id, w.mr_b, 0x102);
    CHECK(w.complete(wc_of(window_wr_id, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
    CHECK((w.cur.state == mw_state::invalidated && w.log.size() == 2));
    CHECK(w.complete(wc_of(window_wr_id, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101 && w.log.size() == 1));
    CHECK(w.complete(wc_of(window_wr_id, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
    CHECK(w.log.empty());
    CHECK((w.cur.state == mw_state::unbound && w.cur.rkey == 0x100));
    CHECK((w.a() == 0 && w.b() == 0 && w.q() == 0));
  }
  SECTION("one wr_id, an unsignaled bind that ran, then its unbind flushed: the bind stays live") {
    window w;
    w.cur.rkey = 0x100;
    w.bind(window_wr_id, w.mr_a, 0x101, false, qpn, false);
    w.unbind(window_wr_id, 0x102);
    CHECK(w.complete(wc_of(window_wr_id, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
    REQUIRE(w.log.size() == 1); // the bind: unconfirmed, its binding current
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101));
    CHECK(w.a() == 1);
  }
  SECTION("an operation that executed silently stays unconfirmed when a later one flushes") {
    window w;
    three_ops(w);
    CHECK(w.complete(wc_of(2, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::rolled_back);
    CHECK(w.ids() == std::vector<std::uint64_t>{1});
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101));
    CHECK((w.a() == 1 && w.b() == 0 && w.q() == 1));
  }
}

TEST_CASE("mw_log: completions of another QP, opcode or work request are ignored", "[unit][mw]") {
  window w;
  three_ops(w);
  auto unchanged = [&] {
    CHECK(w.ids() == std::vector<std::uint64_t>{1, 2, 3});
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x102));
    CHECK((w.a() == 1 && w.b() == 1 && w.q() == 2));
  };
  CHECK(w.complete(wc_of(3, IBV_WC_SUCCESS, IBV_WC_BIND_MW, other_qpn)) == mw_outcome::ignored);
  CHECK(w.complete(wc_of(1, IBV_WC_REM_ACCESS_ERR, IBV_WC_BIND_MW, other_qpn)) == mw_outcome::ignored);
  unchanged();
  // a success must report the operation's own opcode (a bind's wr_id on a write: not the bind)
  CHECK(w.complete(wc_of(3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)) == mw_outcome::ignored);
  CHECK(w.complete(wc_of(3, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV)) == mw_outcome::ignored);
  CHECK(w.complete(wc_of(2, IBV_WC_SUCCESS, IBV_WC_BIND_MW)) == mw_outcome::ignored);
  unchanged();
  CHECK(w.complete(wc_of(99)) == mw_outcome::ignored);
  CHECK(w.complete(wc_of(99, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::ignored);
  unchanged();
  // a failure's opcode is not reliable: it matches on wr_id and QP alone
  CHECK(w.complete(wc_of(3, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_WRITE)) == mw_outcome::rolled_back);
  CHECK(w.ids() == std::vector<std::uint64_t>{1, 2});
  CHECK((w.cur.state == mw_state::invalidated && w.cur.rkey == 0x101));
  CHECK((w.a() == 1 && w.b() == 0 && w.q() == 1));
}

TEST_CASE("mw_log: a peer's invalidation drops every entry and leaves the binding to its owner",
          "[unit][mw]") {
  SECTION("with operations unconfirmed") {
    window w;
    three_ops(w);
    ibv_wc recv = wc_of(0x500, IBV_WC_SUCCESS, IBV_WC_RECV);
    // the owner's verdict (MemoryWindow: type 2, bound, invalidated_rkey() is the current key)
    CHECK(w.complete(recv, false) == mw_outcome::ignored); // an ordinary receive
    CHECK(w.log.size() == 3);
    CHECK(w.complete(recv, true) == mw_outcome::invalidated);
    CHECK(w.log.empty());
    // the entries' bindings are released; the current one (mr_b) is the owner's to end
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1));
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x102));
    // as MemoryWindow then does (set_unbound): every count is gone
    w.h.set_parent<parent_slot::second>(nullptr);
    w.h.set_parent<parent_slot::third>(nullptr);
    CHECK((w.a() == 0 && w.b() == 0 && w.q() == 0));
    // completions of the dropped operations are ignored
    CHECK(w.complete(wc_of(3, IBV_WC_WR_FLUSH_ERR)) == mw_outcome::ignored);
  }
  SECTION("with nothing unconfirmed") {
    window w;
    w.bind(1, w.mr_a, 0x101);
    CHECK(w.complete(wc_of(1)) == mw_outcome::confirmed);
    CHECK(w.complete(wc_of(0, IBV_WC_SUCCESS, IBV_WC_RECV), true) == mw_outcome::invalidated);
    CHECK(w.log.empty());
    CHECK((w.a() == 1 && w.q() == 1));
  }
}

TEST_CASE("mw_log: cancel undoes every entry (a dropped batch), clear releases them", "[unit][mw]") {
  SECTION("cancel") {
    window w;
    w.cur.rkey = 0x100;
    CHECK_FALSE(w.log.cancel(w.cur, w.h)); // nothing to undo
    CHECK(w.cur.rkey == 0x100);
    w.bind(1, w.mr_a, 0x101);
    CHECK(w.complete(wc_of(1)) == mw_outcome::confirmed);
    // a bound window; a batch with an invalidate and a rebind over mr_b is dropped
    w.unbind(2, 0x101, mw_state::invalidated, IBV_WC_LOCAL_INV);
    w.bind(3, w.mr_b, 0x102);
    CHECK((w.a() == 1 && w.b() == 1 && w.q() == 2));
    CHECK(w.log.cancel(w.cur, w.h));
    CHECK(w.log.empty());
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101 && w.cur.qp_num == qpn));
    CHECK(w.h.parent<parent_slot::second>() == w.mr_a.node());
    CHECK((w.a() == 1 && w.b() == 0 && w.q() == 1));
    CHECK_FALSE(w.log.cancel(w.cur, w.h));
    CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101));
  }
  SECTION("clear (dealloc, move): the entries' counts go, the handle's stay") {
    window w;
    three_ops(w);
    w.log.clear();
    CHECK(w.log.empty());
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1));
  }
  SECTION("a moved log takes its entries and their counts along") {
    window w;
    three_ops(w);
    log4 other = std::move(w.log);
    w.log.clear(); // as MemoryWindow's move does to the moved-from window: releases nothing twice
    CHECK((w.a() == 1 && w.b() == 1 && w.q() == 2));
    REQUIRE(other.size() == 3);
    CHECK(other[1].before.mr_link.parent() == w.mr_a.node());
    CHECK(other.complete(wc_of(3), false, w.cur, w.h) == mw_outcome::confirmed);
    CHECK((w.a() == 0 && w.b() == 1 && w.q() == 1));
  }
}

TEST_CASE("mw_log: a type-1 binding holds no QP; rollback restores exactly that", "[unit][mw]") {
  window w;
  w.cur.rkey = 0x100;
  w.bind(1, w.mr_a, 0x101, false);
  CHECK(w.complete(wc_of(1)) == mw_outcome::confirmed);
  CHECK((w.a() == 1 && w.q() == 0));
  w.unbind(2, 0x102);
  w.bind(3, w.mr_b, 0x103, false);
  CHECK((w.a() == 1 && w.b() == 1 && w.q() == 0));
  CHECK(w.complete(wc_of(2, IBV_WC_REM_ACCESS_ERR)) == mw_outcome::rolled_back);
  CHECK((w.cur.state == mw_state::bound && w.cur.rkey == 0x101 && w.cur.qp_num == 0));
  CHECK(w.h.parent<parent_slot::third>() == nullptr);
  CHECK((w.a() == 1 && w.b() == 0 && w.q() == 0));
}
