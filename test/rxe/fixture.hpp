// Shared setup of the device tests: a real RDMA device (rxe0 under tools/rxe-vm, or the device
// named by RDMAXX_TEST_DEVICE), a PD, CQs and two loopback-connected RC QPs.
#pragma once

#include <rdmaxx/rdmaxx.hpp>

#include <catch2/catch.hpp>

#include <dirent.h>
#include <poll.h>
#include <sys/utsname.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace rxe {

using namespace rdmaxx;
using namespace std::chrono_literals;

// Tests of type-2 window behaviour on rxe accept the device-wide exposure (see type2_risk): each
// such test's peers are the test's own, and the suite runs in a throwaway VM.
inline constexpr type2_risk accept_risk = type2_risk::accept_kernel_panic_by_any_peer;

/// REQUIRE a result and hand back its value; on failure print the error message.
template <class T>
T need(result<T> r, const char *what) {
  INFO(what << ": " << (r ? std::string("ok") : r.error().message()));
  REQUIRE(r.has_value());
  return std::move(r).value();
}
inline void need(result<void> r, const char *what) {
  INFO(what << ": " << (r ? std::string("ok") : r.error().message()));
  REQUIRE(r.has_value());
}

inline Context open_device() {
  const char *name = std::getenv("RDMAXX_TEST_DEVICE");
  auto c = name ? Context::open(name) : Context::open_first();
  INFO("open device " << (name ? name : "(first)") << ": "
                      << (c ? "ok" : c.error().message()) << " -- run the rxe suite through tools/rxe-vm");
  REQUIRE(c.has_value());
  return std::move(c).value();
}

/// The counts the kernel holds per device (`rdma resource show`, e.g. "0: rxe0: pd 1 cq 2 qp 2
/// cm_id 0 mr 3 ctx 1 srq 0"): identical before and after a test means nothing leaked.
/// Everything a shell command writes to stdout (stderr too where the command says `2>&1`).
inline std::string shell_output(const char *cmd) {
  std::string out;
  if (FILE *p = ::popen(cmd, "r")) {
    char buf[512];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

inline std::string kernel_resources() { return shell_output("rdma resource show 2>/dev/null"); }

/// The file descriptors this process has open (entries of /proc/self/fd, less the directory's own).
inline long open_fds() {
  long n = 0;
  if (DIR *d = ::opendir("/proc/self/fd")) {
    while (dirent *e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    --n;
  }
  return n;
}

/// Poll `cq` until `n` completions arrived or `timeout` passed (emulated VMs are slow).
inline std::vector<ibv_wc> wait_wc(CompletionQueue &cq, std::size_t n,
                                   std::chrono::milliseconds timeout = 10s) {
  std::vector<ibv_wc> out;
  ibv_wc wc[16];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto got = cq.poll(wc);
    REQUIRE(got.has_value());
    out.insert(out.end(), wc, wc + got.value());
    if (got.value() == 0) std::this_thread::sleep_for(100us);
  }
  INFO("waited for " << n << " completion(s), got " << out.size());
  REQUIRE(out.size() == n);
  return out;
}

/// One completion, which must have the expected status.
inline ibv_wc wait_one(CompletionQueue &cq, ibv_wc_status expect = IBV_WC_SUCCESS) {
  const ibv_wc wc = wait_wc(cq, 1).front();
  INFO("completion status: " << ibv_wc_status_str(wc.status));
  REQUIRE(wc.status == expect);
  return wc;
}

/// Nothing arrives on `cq` for `quiet`.
inline void expect_no_completion(CompletionQueue &cq, std::chrono::milliseconds quiet = 300ms) {
  ibv_wc wc[4];
  const auto deadline = std::chrono::steady_clock::now() + quiet;
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = cq.poll(wc);
    REQUIRE(got.has_value());
    REQUIRE(got.value() == 0);
    std::this_thread::sleep_for(1ms);
  }
}

inline void fill(void *p, std::size_t n, unsigned seed) {
  auto *b = static_cast<unsigned char *>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 131 + seed * 7 + 1) & 0xff);
}
inline bool all_equal(const void *p, std::size_t n, unsigned char v) {
  auto *b = static_cast<const unsigned char *>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != v) return false;
  return true;
}

constexpr access_flags remote_rw = access::local_write | access::remote_write | access::remote_read;

/// One signalled RDMA write from `src` on `qp`; returns its completion status.
inline ibv_wc_status write_one(QueuePair &qp, CompletionQueue &cq, const ibv_sge &src,
                               remote_addr dst, std::uint64_t id = 1) {
  auto batch = qp.start_send();
  batch.write({id, send_flag::signaled}, dst, src);
  need(batch.submit(), "submit write");
  return wait_wc(cq, 1).front().status;
}
/// One signalled RDMA read into `dst` on `qp`; returns its completion status.
inline ibv_wc_status read_one(QueuePair &qp, CompletionQueue &cq, const ibv_sge &dst,
                              remote_addr src, std::uint64_t id = 2) {
  auto batch = qp.start_send();
  batch.read({id, send_flag::signaled}, src, dst);
  need(batch.submit(), "submit read");
  return wait_wc(cq, 1).front().status;
}
/// After a remote error both QPs are in ERR: drain flushed work and reconnect both. On Linux
/// 6.12 the reset can fall back to ERR (rxe finishes the failed request on a workqueue):
/// QueuePair::reset_and_reconnect resets again then (docs/kernels.md), so the fixture calls it
/// once, and a reconnect that fails there fails the test.
inline result<void> reconnect_after_error(QueuePair &q) { return q.reset_and_reconnect(); }
inline void recover_pair(QueuePair &a, CompletionQueue &cq_a, QueuePair &b, CompletionQueue &cq_b) {
  ibv_wc wc[16];
  while (cq_a.poll(wc).value() > 0) {}
  while (cq_b.poll(wc).value() > 0) {}
  need(reconnect_after_error(a), "reconnect a");
  need(reconnect_after_error(b), "reconnect b");
}

/// Post one work request on a peer's QP with plain libibverbs (ibv_post_send, no rdmaxx checks in
/// the way) and return the status of its completion: what a buggy or hostile peer can send.
inline ibv_wc_status peer_post(QueuePair &peer, CompletionQueue &cq, ibv_wr_opcode op, ibv_sge sge,
                        std::uint64_t raddr, std::uint32_t rkey, std::uint64_t id = 77) {
  ibv_send_wr w{};
  w.wr_id = id;
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.sg_list = &sge;
  w.num_sge = 1;
  if (op == IBV_WR_SEND_WITH_INV) {
    w.invalidate_rkey = rkey;
  } else if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
    w.wr.atomic.remote_addr = raddr;
    w.wr.atomic.rkey = rkey;
    w.wr.atomic.compare_add = 0; // fetch-add 0 / compare-swap: never changes a byte if refused
    w.wr.atomic.swap = 0x4141414141414141ull;
  } else {
    w.wr.rdma.remote_addr = raddr;
    w.wr.rdma.rkey = rkey;
  }
  ibv_send_wr *bad = nullptr;
  REQUIRE(::ibv_post_send(peer.native_handle(), &w, &bad) == 0);
  return wait_wc(cq, 1, 20s).front().status;
}

inline bool is_denial(ibv_wc_status s) { return s == IBV_WC_REM_ACCESS_ERR || s == IBV_WC_REM_INV_REQ_ERR; }

/// Two RC QPs of `pd` connected to each other: `a` initiates, `b` is the target.
struct qp_pair {
  CompletionQueue cq_a, cq_b;
  QueuePair a, b;
  qp_pair(const Context &ctx, const ProtectionDomain &pd, const connect_options &o = {})
      : cq_a(need(CompletionQueue::create(ctx, 64), "create_cq a")),
        cq_b(need(CompletionQueue::create(ctx, 64), "create_cq b")),
        a(need(QueuePair::create(pd, cq_a, cq_a), "create_qp a")),
        b(need(QueuePair::create(pd, cq_b, cq_b), "create_qp b")) {
    need(connect_loopback(a, b, o), "connect_loopback");
  }
  /// After a remote error both QPs are in ERR: drain flushed work and reconnect both.
  void recover() { recover_pair(a, cq_a, b, cq_b); }
  /// One signalled RDMA write from `src` on QP a; returns its completion status.
  ibv_wc_status write(const ibv_sge &src, remote_addr dst, std::uint64_t id = 1) {
    return write_one(a, cq_a, src, dst, id);
  }
  ibv_wc_status read(const ibv_sge &dst, remote_addr src, std::uint64_t id = 2) {
    return read_one(a, cq_a, dst, src, id);
  }
};

/// The running kernel (uname): rxe is part of the kernel, and a few of its answers differ between
/// the kernels the suite is run on (docs/kernels.md). A test that expects a kernel-specific value
/// names the kernel it was measured on and checks the property that matters on every kernel.
struct kernel_version {
  int major = 0, minor = 0;
  std::string release;
  bool is(int ma, int mi) const { return major == ma && minor == mi; }
};
inline const kernel_version &running_kernel() {
  static const kernel_version k = [] {
    kernel_version v;
    utsname u{};
    if (::uname(&u) == 0) {
      v.release = u.release;
      std::sscanf(u.release, "%d.%d", &v.major, &v.minor);
    }
    return v;
  }();
  return k;
}

/// A region registered without remote access grants nothing remotely. rxe on Linux 6.1 gives it
/// rkey 0; rxe on 6.12 gives it rkey == lkey (rxe_mr_init sets both keys alike since "RDMA/rxe:
/// Let rkey == lkey for local access"), and its responder refuses that key for lack of remote
/// rights. The value is checked on those two kernels; on every kernel, a plain-verbs RDMA write and
/// RDMA read with the region's rkey from QP a of `pair` must be refused (remote access error) with
/// `mem` (the region's bytes) and `scratch` (a's local buffer, in the MR `scratch_mr`) unchanged.
/// Recovers the pair.
inline void check_local_only_rkey(qp_pair &pair, const MemoryRegion &mr, const unsigned char *mem,
                                  std::size_t len, const MemoryRegion &scratch_mr, unsigned char *scratch,
                                  std::size_t scratch_len) {
  const kernel_version &k = running_kernel();
  INFO("kernel " << k.release << ", local-only MR rkey " << mr.rkey() << ", lkey " << mr.lkey());
  if (k.is(6, 1)) CHECK(mr.rkey() == 0);
  if (k.is(6, 12)) CHECK(mr.rkey() == mr.lkey());
  const std::vector<unsigned char> before(mem, mem + len), scratch_before(scratch, scratch + scratch_len);
  const auto n = std::uint32_t(std::min<std::size_t>({len, scratch_len, 256}));
  const std::uint64_t addr = mr.iova();
  const ibv_wc_status w = peer_post(pair.a, pair.cq_a, IBV_WR_RDMA_WRITE, scratch_mr.sge(0, n), addr, mr.rkey());
  INFO("write with the local-only rkey: " << ibv_wc_status_str(w));
  CHECK(w == IBV_WC_REM_ACCESS_ERR);
  pair.recover();
  const ibv_wc_status r = peer_post(pair.a, pair.cq_a, IBV_WR_RDMA_READ, scratch_mr.sge(0, n), addr, mr.rkey());
  INFO("read with the local-only rkey: " << ibv_wc_status_str(r));
  CHECK(r == IBV_WC_REM_ACCESS_ERR);
  pair.recover();
  CHECK(std::memcmp(mem, before.data(), len) == 0);
  CHECK(std::memcmp(scratch, scratch_before.data(), scratch_len) == 0);
}

/// The device and a PD: the base of `loopback`, so that both exist before its QPs and outlive them.
struct device_pd {
  Context ctx = open_device();
  ProtectionDomain pd = need(ProtectionDomain::alloc(ctx), "alloc_pd");
};

/// A device with two RC QPs connected to each other (loopback). `a` initiates, `b` is the target.
struct loopback : device_pd, qp_pair {
  loopback() : qp_pair(ctx, pd) {}
};

/// The CQ-event tests' setup: QP a's CQ `cq` has the channel `ch`, b has a CQ of its own; `src`
/// (filled with `pattern`) and `dst` (zeroed) registered for a write of `bytes` from a to b.
struct channel_pair : device_pd {
  CompletionChannel ch = need(CompletionChannel::create(ctx), "channel");
  CompletionQueue cq = need(CompletionQueue::create(ctx, 16, &ch), "cq");
  CompletionQueue cq_b = need(CompletionQueue::create(ctx, 16), "cq b");
  QueuePair a = need(QueuePair::create(pd, cq, cq), "qp a");
  QueuePair b = need(QueuePair::create(pd, cq_b, cq_b), "qp b");
  std::vector<unsigned char> src, dst;
  MemoryRegion smr, dmr;
  channel_pair(std::size_t bytes, unsigned char pattern) : src(bytes), dst(bytes, 0) {
    need(connect_loopback(a, b), "connect");
    fill(src.data(), bytes, pattern);
    smr = need(MemoryRegion::reg(pd, src.data(), bytes, access::local_write), "src");
    dmr = need(MemoryRegion::reg(pd, dst.data(), bytes, remote_rw), "dst");
  }
  /// Post one signaled RDMA write of every byte of `src` to `dst` with `id` (true: posted).
  bool post_write(std::uint64_t id) {
    auto bt = a.start_send();
    bt.write({.id = id, .flags = send_flag::signaled}, {dmr.iova(), dmr.rkey()}, smr.sge());
    return bool(bt.submit());
  }
  /// post_write(id) on a thread of its own after `ms` milliseconds (a completion that comes while
  /// the caller sleeps on the channel); its result in `*posted` when given. Join it.
  std::thread post_write_after(std::uint64_t id, int ms, std::atomic<bool> *posted = nullptr) {
    return std::thread([this, id, ms, posted] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      const bool ok = post_write(id);
      if (posted) *posted = ok;
    });
  }
  /// The channel's fd holds an event (poll(2), no wait).
  bool readable() const {
    pollfd p{ch.fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
};

// Destroy `cq` on a thread of its own and report whether ibv_destroy_cq returned within
// `ms`: it waits until every event read from the CQ's channel was acknowledged, so a missing
// acknowledgement hangs it. A stuck CQ stays with its (detached) thread.
inline bool destroyed_within(CompletionQueue cq, int ms) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([q = std::move(cq), done]() mutable {
    q = CompletionQueue{};
    *done = true;
  });
  for (int i = 0; i < ms / 10 && !*done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool in_time = *done;
  if (in_time) t.join();
  else t.detach();
  return in_time;
}

} // namespace rxe
