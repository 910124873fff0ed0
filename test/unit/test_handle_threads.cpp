// detail::handle across threads: a parent and its children are different handles, which the docs
// call independent, so destroying them on different threads at the same time must destroy each
// object exactly once, children first, and free every node (LeakSanitizer in the ASan run; data
// races: the TSan build of this file, `handle-threads`, in tools/dev test). The defect this exists
// for: the old two-counter scheme (children + orphaned flag, acquire/release only) leaked the
// parent when both sides read the other's flag before it was published, and the child read the
// node after its decrement, when the other thread may already have freed it.
#include <rdmaxx/detail/handle.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

using namespace rdmaxx;
using detail::parent_slot;

namespace {
struct obj {
  std::atomic<int> destroyed{0};
  obj *parents[3] = {};
  std::atomic<bool> parent_before_child{false};
};
std::atomic<long> reports{0};
void count_report(const destroy_failure &) noexcept { reports.fetch_add(1, std::memory_order_relaxed); }

template <std::size_t N>
struct traits {
  using native = obj;
  static constexpr const char *object = "Obj";
  static constexpr const char *verb = "obj_destroy";
  static constexpr std::size_t parents = N;
  static int destroy(native *o) noexcept {
    // Every parent must still be alive when a child is destroyed.
    for (obj *p : o->parents)
      if (p && p->destroyed.load(std::memory_order_acquire) != 0)
        o->parent_before_child.store(true, std::memory_order_relaxed);
    o->destroyed.fetch_add(1, std::memory_order_acq_rel);
    return 0;
  }
};
using one = detail::handle<traits<1>>;
using three = detail::handle<traits<3>>;

// Run `a(i)` and `b(i)` for i in [0, n) on two threads started together.
template <class A, class B>
void race(std::size_t n, A a, B b) {
  std::atomic<int> ready{0};
  auto run = [&](auto f) {
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    for (std::size_t i = 0; i < n; ++i) f(i);
  };
  std::thread t([&] { run(b); });
  run(a);
  t.join();
}

struct hook {
  destroy_failure_handler old = set_destroy_failure_handler(&count_report);
  ~hook() { set_destroy_failure_handler(old); }
};

constexpr std::size_t rounds = 60, batch = 5000; // 300,000 pairs
} // namespace

TEST_CASE("a parent and its last child destroyed on two threads: each once, children first",
          "[unit][handles][threads]") {
  hook h;
  long destroyed = 0, wrong_order = 0, deferred_total = 0;
  for (std::size_t r = 0; r < rounds; ++r) {
    auto objs = std::make_unique<obj[]>(2 * batch);
    std::vector<one> parents(batch), children(batch);
    for (std::size_t i = 0; i < batch; ++i) {
      obj &p = objs[2 * i], &c = objs[2 * i + 1];
      c.parents[0] = &p;
      parents[i] = one(&p, nullptr, detail::new_parent_node());
      children[i] = one(&c, parents[i].node(), nullptr);
    }
    const long before = reports.load();
    race(batch, [&](std::size_t i) { parents[i].reset(); }, [&](std::size_t i) { children[i].reset(); });
    deferred_total += reports.load() - before;
    for (std::size_t i = 0; i < 2 * batch; ++i) {
      destroyed += objs[i].destroyed.load();
      wrong_order += objs[i].parent_before_child.load();
    }
  }
  CHECK(destroyed == long(2 * rounds * batch)); // none leaked, none destroyed twice
  CHECK(wrong_order == 0);
  INFO("deferred destructions: " << deferred_total);
  CHECK(deferred_total <= long(rounds * batch));
}

TEST_CASE("a child of three parents and its parents destroyed on two threads",
          "[unit][handles][threads]") {
  hook h;
  long destroyed = 0, wrong_order = 0;
  constexpr std::size_t n = 2000;
  for (std::size_t r = 0; r < 20; ++r) {
    // Per group: 0 PD, 1 send CQ, 2 recv CQ, 3 QP (all three), 4 window (PD, QP).
    auto objs = std::make_unique<obj[]>(5 * n);
    std::vector<one> pd(n), scq(n), rcq(n);
    std::vector<three> qp(n), mw(n);
    for (std::size_t i = 0; i < n; ++i) {
      obj *o = &objs[5 * i];
      o[3].parents[0] = &o[0];
      o[3].parents[1] = &o[1];
      o[3].parents[2] = &o[2];
      o[4].parents[0] = &o[0];
      o[4].parents[2] = &o[3];
      pd[i] = one(&o[0], nullptr, detail::new_parent_node());
      scq[i] = one(&o[1], nullptr, detail::new_parent_node());
      rcq[i] = one(&o[2], nullptr, detail::new_parent_node());
      qp[i] = three(&o[3], pd[i].node(), detail::new_parent_node());
      qp[i].set_parent<parent_slot::second>(scq[i].node());
      qp[i].set_parent<parent_slot::third>(rcq[i].node());
      mw[i] = three(&o[4], pd[i].node(), nullptr);
      mw[i].set_parent<parent_slot::third>(qp[i].node());
    }
    // Thread A: parents first (every one deferred or not, depending on B); thread B: children.
    race(
        n,
        [&](std::size_t i) {
          scq[i].reset();
          pd[i].reset();
          qp[i].reset();
          rcq[i].reset();
        },
        [&](std::size_t i) { mw[i].reset(); });
    for (std::size_t i = 0; i < 5 * n; ++i) {
      destroyed += objs[i].destroyed.load();
      wrong_order += objs[i].parent_before_child.load();
    }
  }
  CHECK(destroyed == long(5 * 20 * n));
  CHECK(wrong_order == 0);
}

TEST_CASE("release() of a parent while a child goes on another thread frees the node once",
          "[unit][handles][threads]") {
  hook h;
  constexpr std::size_t n = 20000;
  auto objs = std::make_unique<obj[]>(2 * n);
  std::vector<one> parents(n), children(n);
  for (std::size_t i = 0; i < n; ++i) {
    objs[2 * i + 1].parents[0] = &objs[2 * i];
    parents[i] = one(&objs[2 * i], nullptr, detail::new_parent_node());
    children[i] = one(&objs[2 * i + 1], parents[i].node(), nullptr);
  }
  std::vector<obj *> released(n);
  race(n, [&](std::size_t i) { released[i] = parents[i].release(); },
       [&](std::size_t i) { children[i].reset(); });
  long parent_destroys = 0, child_destroys = 0;
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(released[i] == &objs[2 * i]);
    parent_destroys += objs[2 * i].destroyed.load(); // the caller owns it now: never destroyed
    child_destroys += objs[2 * i + 1].destroyed.load();
  }
  CHECK(parent_destroys == 0);
  CHECK(child_destroys == long(n));
}

TEST_CASE("a deferred destruction runs what it carries after the object, once",
          "[unit][handles]") {
  hook h;
  static int after_calls;
  static bool after_saw_destroyed;
  after_calls = 0;
  obj p, c;
  c.parents[0] = &p;
  one parent(&p, nullptr, detail::new_parent_node());
  one child(&c, parent.node(), nullptr);
  parent.reset({[](void *o, std::size_t n) noexcept {
                  ++after_calls;
                  after_saw_destroyed = static_cast<obj *>(o)->destroyed.load() == 1 && n == 7;
                },
                &p, 7});
  CHECK(p.destroyed.load() == 0); // deferred: a child lives
  CHECK(after_calls == 0);        // so its memory must stay
  child.reset();
  CHECK(p.destroyed.load() == 1);
  CHECK(after_calls == 1);
  CHECK(after_saw_destroyed);
}
