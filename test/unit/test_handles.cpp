// Handle machinery: move-only, null after move, one deleter, parent/child diagnostics.
// The fake traits below exercise detail::handle itself (no device behaviour is simulated).
#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

using namespace rdmaxx;

template <class H>
constexpr bool move_only_v = !std::is_copy_constructible_v<H> && !std::is_copy_assignable_v<H> &&
                             std::is_nothrow_move_constructible_v<H> &&
                             std::is_nothrow_move_assignable_v<H> &&
                             std::is_nothrow_default_constructible_v<H>;
static_assert(move_only_v<DeviceList>);
static_assert(move_only_v<Context>);
static_assert(move_only_v<ProtectionDomain>);
static_assert(move_only_v<MemoryRegion>);
static_assert(move_only_v<CompletionChannel>);
static_assert(move_only_v<CompletionQueue>);
static_assert(move_only_v<QueuePair>);
static_assert(!std::is_copy_constructible_v<SendBatch> && std::is_nothrow_move_constructible_v<SendBatch>);

namespace {
int destroyed = 0;
int destroy_rc = 0;
struct fake { int id; };
struct fake_traits {
  using native = fake;
  static constexpr const char *object = "Fake";
  static constexpr const char *verb = "fake_destroy";
  static int destroy(native *) noexcept {
    ++destroyed;
    return destroy_rc;
  }
};
using fake_handle = detail::handle<fake_traits>;

std::vector<destroy_failure> failures;
void capture(const destroy_failure &f) noexcept { failures.push_back(f); }

struct hook_guard {
  destroy_failure_handler old = set_destroy_failure_handler(&capture);
  hook_guard() { failures.clear(); destroyed = 0; destroy_rc = 0; }
  ~hook_guard() { set_destroy_failure_handler(old); }
};
} // namespace

TEST_CASE("a handle destroys its object exactly once and is null after move", "[unit][handles]") {
  hook_guard g;
  fake f{1};
  {
    fake_handle a(&f, nullptr, nullptr);
    CHECK(a);
    fake_handle b(std::move(a));
    CHECK_FALSE(a);
    CHECK(a.get() == nullptr);
    CHECK(b.get() == &f);
    fake_handle c;
    c = std::move(b);
    CHECK_FALSE(b);
    CHECK(c.get() == &f);
  }
  CHECK(destroyed == 1);
  CHECK(failures.empty());
}

TEST_CASE("move assignment releases the object it overwrites", "[unit][handles]") {
  hook_guard g;
  fake f1{1}, f2{2};
  fake_handle a(&f1, nullptr, nullptr);
  fake_handle b(&f2, nullptr, nullptr);
  a = std::move(b);
  CHECK(destroyed == 1); // f1 released by the assignment
  CHECK(a.get() == &f2);
  a.reset();
  CHECK(destroyed == 2);
  CHECK_FALSE(a);
}

TEST_CASE("a parent destroyed before its children is reported and destroyed by its last child", "[unit][handles]") {
  hook_guard g;
  fake gf{0}, pf{1}, cf{2}, cf2{3};
  fake_handle grand(&gf, nullptr, detail::new_parent_node());
  fake_handle parent(&pf, grand.node(), detail::new_parent_node());
  fake_handle child(&cf, parent.node(), nullptr);
  fake_handle child2(&cf2, parent.node(), nullptr);
  CHECK(parent.live_children() == 2);
  CHECK(grand.live_children() == 1);
  // The checked destroy refuses and leaves everything valid.
  auto r = parent.destroy();
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::busy);
  CHECK(parent);
  CHECK(destroyed == 0);
  // The destructor path: reported through the hook with the child count; destroy deferred.
  parent.reset();
  CHECK_FALSE(parent);
  REQUIRE(failures.size() == 1);
  CHECK(std::string(failures[0].object) == "Fake");
  CHECK(std::string(failures[0].verb) == "fake_destroy");
  CHECK(failures[0].live_children == 2);
  CHECK(failures[0].error == errc::busy);
  CHECK(destroyed == 0);
  CHECK(grand.live_children() == 1); // the orphan still counts as the grandparent's child
  child.reset();
  CHECK(destroyed == 1); // only the child so far
  child2.reset();
  CHECK(destroyed == 3); // the last child, then the orphaned parent
  CHECK(grand.live_children() == 0);
  CHECK(failures.size() == 1);
  CHECK(grand.destroy().has_value());
  CHECK(destroyed == 4);
}

namespace {
template <const char *Name>
struct named_traits {
  using native = fake;
  static constexpr const char *object = Name;
  static constexpr const char *verb = "named_destroy";
  static int destroy(native *) noexcept {
    ++destroyed;
    return 0;
  }
};
constexpr char pd_name[] = "ProtectionDomain";
constexpr char mr_name[] = "MemoryRegion";
constexpr char mw_name[] = "MemoryWindow";
} // namespace

TEST_CASE("a parent destroyed before its children names their kinds", "[unit][handles]") {
  hook_guard g;
  using pd_h = detail::handle<named_traits<pd_name>>;
  using mr_h = detail::handle<named_traits<mr_name>>;
  using mw_h = detail::handle<named_traits<mw_name>>;
  static_assert(pd_h::kind == child_kind::protection_domain && mr_h::kind == child_kind::memory_region &&
                mw_h::kind == child_kind::memory_window && fake_handle::kind == child_kind::other);
  fake objs[12]{};
  pd_h pd(&objs[0], nullptr, detail::new_parent_node());
  std::vector<mr_h> mrs;
  std::vector<mw_h> mws;
  for (int i = 0; i < 3; ++i) mrs.emplace_back(&objs[1 + i], pd.node(), nullptr);
  for (int i = 0; i < 7; ++i) mws.emplace_back(&objs[4 + i], pd.node(), nullptr);
  detail::child_link pool(pd.node(), child_kind::grant_pool);
  mws.pop_back(); // a child gone before the parent: no longer counted in its kind
  REQUIRE(pd.live_children() == 10);
  pd.reset();
  REQUIRE(failures.size() == 1);
  const destroy_failure &f = failures[0];
  CHECK(f.live_children == 10);
  CHECK(f.children[std::size_t(child_kind::memory_region)] == 3);
  CHECK(f.children[std::size_t(child_kind::memory_window)] == 6);
  CHECK(f.children[std::size_t(child_kind::grant_pool)] == 1);
  CHECK(f.children[std::size_t(child_kind::other)] == 0);
  char line[512];
  const std::size_t n = describe(f, line, sizeof line);
  CHECK(n == std::string(line).size());
  CHECK(std::string(line) ==
        "rdmaxx: ProtectionDomain destroyed while 10 child object(s) still use it (3 MemoryRegion, "
        "6 MemoryWindow, 1 GrantPool); named_destroy is deferred until the last of them is destroyed. "
        "Destroy children before their parent.");
  char tiny[16];
  CHECK(describe(f, tiny, sizeof tiny) == 15); // truncated, NUL-terminated
  CHECK(std::string(tiny) == "rdmaxx: Protect");
  // The last child destroys the orphan, as before.
  CHECK(destroyed == 1); // the MemoryWindow popped above
  mrs.clear();
  pool.drop();
  CHECK(destroyed == 1 + 3);
  mws.clear();
  CHECK(destroyed == 1 + 3 + 6 + 1); // the last window, then the orphaned PD
  CHECK(failures.size() == 1);
}

TEST_CASE("children released in order let the parent be destroyed", "[unit][handles]") {
  hook_guard g;
  fake pf{1}, c1{2}, c2{3};
  fake_handle parent(&pf, nullptr, detail::new_parent_node());
  fake_handle a(&c1, parent.node(), nullptr);
  fake_handle b(&c2, parent.node(), nullptr);
  CHECK(parent.live_children() == 2);
  fake_handle moved(std::move(b)); // moving a child does not change the count
  CHECK(parent.live_children() == 2);
  a.reset();
  moved.reset();
  CHECK(parent.live_children() == 0);
  CHECK(parent.destroy());
  CHECK(destroyed == 3);
  CHECK(failures.empty());
}

TEST_CASE("a failed destroy verb in a destructor goes to the hook", "[unit][handles]") {
  hook_guard g;
  fake f{1};
  destroy_rc = EBUSY;
  {
    fake_handle a(&f, nullptr, nullptr);
    auto r = a.destroy(); // checked path: error returned, handle keeps the object
    REQUIRE_FALSE(r);
    CHECK(r.error() == std::errc::device_or_resource_busy);
    CHECK(a);
  }
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].error == std::errc::device_or_resource_busy);
  CHECK(failures[0].live_children == 0);
  CHECK(destroyed == 2);
}

// A null QueuePair's batches go to the shared stand-in detail::null_qp (no null test per post):
// every operation is ignored, submit() answers null_handle, and nothing is ever posted through
// it, from any number of threads at once (its wr_id/wr_flags stores are relaxed atomics).
TEST_CASE("a null QueuePair's batches are refused with null_handle", "[unit][handles][batch]") {
  QueuePair empty;
  CHECK(empty.native_handle_ex() == nullptr);
  QueuePair moved_to = std::move(empty);
  QueuePair &moved_from = empty;
  for (QueuePair *q : {&moved_from, &moved_to}) {
    CHECK(q->native_handle_ex() == nullptr);
    const ibv_sge sge{0x1000, 64, 0x42};
    auto b = q->start_send();
    CHECK(b.native_handle() == &detail::null_qp);
    b.write({.id = 7, .flags = send_flag::signaled}, {0x2000, 0x99}, sge);
    b.send({.id = 8}, sge);
    b.local_inv({.id = 9}, 0x55);
    CHECK(b.submit().error() == errc::null_handle);
    CHECK(b.native_handle() == nullptr);
    CHECK(b.submit().error() == errc::wrong_state); // submitted: no longer open
    auto dropped = q->start_send();                 // dropped unsubmitted: aborted, no effect
    dropped.write({.id = 10}, {0x2000, 0x99}, sge);
  }
  // The stand-in stays what it was: RESET, no QP behind it.
  CHECK(detail::null_qp.qp_base.state == IBV_QPS_RESET);
  CHECK(detail::null_qp.qp_base.context == nullptr);
  std::atomic<int> refused{0};
  auto post = [&] {
    QueuePair none;
    for (int i = 0; i < 2000; ++i) {
      auto b = none.start_send();
      b.write({.id = std::uint64_t(i), .flags = send_flag::signaled}, {0x2000, 0x99}, ibv_sge{0x1000, 64, 0x42});
      if (b.submit().error() == errc::null_handle) ++refused;
    }
  };
  std::thread t1(post), t2(post);
  t1.join();
  t2.join();
  CHECK(refused == 4000);
}

// The posting pointer follows rdmaxx's transitions: the QP itself from RTS on (SQD, SQE and ERR
// included: a post in ERR is flushed), the stand-in unready_qp before, null_qp while null.
TEST_CASE("a QueuePair's posting pointer follows the transitions rdmaxx made", "[unit][handles][batch]") {
  ibv_qp_ex fake{};
  fake.qp_base.state = IBV_QPS_RESET;
  detail::qpx_ptr p;
  CHECK(p.post() == &detail::null_qp);
  p.set_state(IBV_QPS_RTS); // null: stays on null_qp
  CHECK(p.post() == &detail::null_qp);
  p.reset(&fake); // adopted as it is: RESET
  CHECK(p.get() == &fake);
  CHECK(p.post() == &detail::unready_qp);
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR}) {
    p.set_state(s);
    CHECK(p.post() == &detail::unready_qp);
  }
  for (ibv_qp_state s : {IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR}) {
    p.set_state(s);
    CHECK(p.post() == &fake);
  }
  p.set_state(IBV_QPS_RESET);
  CHECK(p.post() == &detail::unready_qp);
  p.set_state(IBV_QPS_RTS);
  detail::qpx_ptr q = std::move(p);
  CHECK(q.post() == &fake);
  CHECK(p.post() == &detail::null_qp);
  CHECK(p.get() == nullptr);
  fake.qp_base.state = IBV_QPS_RTS;
  p.reset(&fake); // adopted at RTS
  CHECK(p.post() == &fake);
  CHECK(q.release() == &fake);
  CHECK(q.post() == &detail::null_qp);

  // A batch of a QP before RTS goes to the stand-in: its operations do nothing, native_handle()
  // is still the QP's (batch forms check it), and submit() answers wrong_state.
  auto b = detail::batch_access::open(&detail::unready_qp, &fake, false);
  CHECK(b.native_handle() == &fake);
  CHECK_FALSE(detail::batch_access::on_qp(b));
  b.write({.id = 7, .flags = send_flag::signaled}, {0x2000, 0x99}, ibv_sge{0x1000, 64, 0x42});
  CHECK(b.submit().error() == errc::wrong_state);
  CHECK(b.native_handle() == nullptr);
  CHECK(detail::unready_qp.qp_base.state == IBV_QPS_RESET);
  CHECK(detail::unready_qp.qp_base.context == nullptr);
}

// poll() calls the poll entry cached in the CompletionQueue: a null one (default-constructed,
// moved from, destroyed) has a stand-in that answers EINVAL instead of reaching verbs.
TEST_CASE("a null CompletionQueue's poll answers EINVAL", "[unit][handles]") {
  CompletionQueue empty;
  std::array<ibv_wc, 4> wc{};
  wc[0].wr_id = 0x77;
  CHECK(empty.poll(wc).error() == std::errc::invalid_argument);
  CompletionQueue moved_to = std::move(empty);
  CHECK(moved_to.poll(wc).error() == std::errc::invalid_argument);
  CHECK(empty.poll(wc).error() == std::errc::invalid_argument);
  CHECK(moved_to.destroy());
  CHECK(moved_to.poll(wc).error() == std::errc::invalid_argument);
  CHECK(wc[0].wr_id == 0x77); // nothing written
}

TEST_CASE("empty handles are safe to query and destroy", "[unit][handles]") {
  hook_guard g;
  Context ctx;
  ProtectionDomain pd;
  MemoryRegion mr;
  CompletionQueue cq;
  QueuePair qp;
  CHECK_FALSE(ctx);
  CHECK_FALSE(pd);
  CHECK_FALSE(mr);
  CHECK_FALSE(cq);
  CHECK_FALSE(qp);
  CHECK(ctx.native_handle() == nullptr);
  CHECK(mr.lkey() == 0);
  CHECK(mr.length() == 0);
  CHECK(qp.qp_num() == 0);
  CHECK(pd.destroy());
  CHECK(mr.destroy());
  CHECK(cq.destroy());
  CHECK(qp.destroy());
  CHECK(ctx.destroy());
  CHECK(failures.empty());
}

TEST_CASE("live GrantPools never share a pool id: 65,536 at most, a freed id comes back last", "[unit][pool]") {
  // A pool's work request ids carry its 16-bit id; a masked counter gave the 65,537th pool the id
  // of the first, and a completion of either was taken for the other's.
  using ids = detail::pool_ids;
  std::vector<bool> seen(ids::count, false);
  std::vector<std::uint16_t> held;
  held.reserve(ids::count);
  for (std::uint32_t i = 0; i < ids::count; ++i) {
    const std::int32_t id = ids::acquire();
    REQUIRE(id >= 0);
    REQUIRE(id < std::int32_t(ids::count));
    REQUIRE_FALSE(seen[std::size_t(id)]);
    seen[std::size_t(id)] = true;
    held.push_back(std::uint16_t(id));
  }
  CHECK(ids::acquire() == ids::none); // all alive: refused, never a shared id
  ids::give_back(held[100]);
  const std::int32_t again = ids::acquire();
  CHECK(again == held[100]);
  for (const std::uint16_t id : held) ids::give_back(id);
  // Freed ids are handed out from a moving start: the next two differ.
  const std::int32_t a = ids::acquire(), b = ids::acquire();
  REQUIRE((a >= 0 && b >= 0));
  CHECK(a != b);
  ids::give_back(std::uint16_t(a));
  const std::int32_t c = ids::acquire();
  REQUIRE(c >= 0);
  CHECK(c != a);
  ids::give_back(std::uint16_t(b));
  ids::give_back(std::uint16_t(c));
}

// A deleter declared in one line (detail::deleter) gives the handle the same names, kind and
// parents as the six-line traits struct it replaced.
TEST_CASE("deleter: one-line traits give the object's kind, names and parents", "[handle]") {
  using mr_traits = detail::deleter<ibv_mr, ::ibv_dereg_mr, "MemoryRegion", "ibv_dereg_mr">;
  using qp_traits = detail::deleter<ibv_qp, detail::destroy_qp, "QueuePair", "ibv_destroy_qp", 3>;
  STATIC_REQUIRE(detail::handle<mr_traits>::kind == child_kind::memory_region);
  STATIC_REQUIRE(detail::handle<mr_traits>::parents == 1);
  STATIC_REQUIRE(detail::handle<qp_traits>::kind == child_kind::queue_pair);
  STATIC_REQUIRE(detail::handle<qp_traits>::parents == 3);
  CHECK(std::string_view(mr_traits::object) == "MemoryRegion");
  CHECK(std::string_view(mr_traits::verb) == "ibv_dereg_mr");
}

namespace {
struct counted_thing {
  detail::ref_count<> refs;
  int *deleted;
  explicit counted_thing(int *d) noexcept : deleted(d) {}
  ~counted_thing() { ++*deleted; }
};
struct finished_thing {
  detail::ref_count<> refs;
  static inline int finished = 0;
  static void finish(finished_thing *p) noexcept {
    ++finished;
    delete p;
  }
};
} // namespace

// The one counted core (detail/counted.hpp): the creator's reference plus one per share(); the
// holder that drops the last finishes the object, once.
TEST_CASE("counted core: the last holder finishes the object, once", "[handle]") {
  int deleted = 0;
  {
    detail::counted_ptr<counted_thing> a(new counted_thing(&deleted));
    CHECK(a->refs.holders() == 1);
    auto b = a.share();
    CHECK(a->refs.holders() == 2);
    CHECK(b.get() == a.get());
    detail::counted_ptr<counted_thing> c(std::move(a));
    CHECK_FALSE(a);
    CHECK(c->refs.holders() == 2);
    b.reset();
    CHECK_FALSE(b);
    CHECK(deleted == 0);
    CHECK(c->refs.holders() == 1);
    detail::counted_ptr<counted_thing> d;
    CHECK_FALSE(d.share());
    d = std::move(c);
    CHECK(deleted == 0);
  }
  CHECK(deleted == 1);
  {
    detail::counted_ptr<finished_thing> f(new finished_thing);
    auto g = f.share();
    f = detail::counted_ptr<finished_thing>();
    CHECK(finished_thing::finished == 0);
  }
  CHECK(finished_thing::finished == 1);
  detail::ref_count<detail::atomic<std::uint32_t>> n;
  n.add();
  CHECK(n.holders() == 2);
  CHECK(n.drop() == 1);
  CHECK(n.drop() == 0);
}
