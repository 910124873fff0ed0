// tools/hw_check.cpp (run it through tools/hw-check): the mlx5 contract of issue 42, live on the
// first mlx5 device when there is one, else against the device-free stand-in
// (test/mlx5_standin.hpp). It answers, and prints as a report:
//   - the send-queue credit after RTS (a batch larger than the room is refused whole);
//   - an old rkey refused after a re-tag;
//   - mkey index reuse across destroy and create, and that no revoked rkey comes back;
//   - the completion opcodes of the UMR and of the local invalidate;
//   - the UMR capability bits (QUERY_HCA_CAP) and how revocation across keys works here;
//   - the fenced local invalidate.
// Exit status: 0 every property held, 1 a property was violated, 2 the check could not run,
// 77 (skipped) rdmaxx was built without the mlx5 option.
//
//   hw-check            live on the first mlx5 device, else the stand-in
//   hw-check --standin  the stand-in even where a device exists
//   hw-check --live     live only (2 without an mlx5 device)
//
// The live path has NOT run on hardware (no ConnectX was available); the stand-in path runs in
// CI (meson test hw-check, suite unit).
#include <rdmaxx/rdmaxx.hpp>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#if RDMAXX_HAVE_MLX5
#include <rdmaxx/mlx5/context_mlx5.hpp>
#include <rdmaxx/mlx5/indirect_key_mlx5.hpp>
#include <rdmaxx/mlx5/umr_qp.hpp>

#include "../test/mlx5_standin.hpp"
#endif

namespace {

int violations = 0;
void report(bool ok, const char *what, const std::string &detail) {
  std::printf("[%s] %s: %s\n", ok ? "PASS" : "FAIL", what, detail.c_str());
  if (!ok) ++violations;
}
void info(const char *what, const std::string &detail) { std::printf("[INFO] %s: %s\n", what, detail.c_str()); }
std::string hex(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

#if RDMAXX_HAVE_MLX5
using namespace rdmaxx;
constexpr access_flags rw = access::local_write | access::remote_read | access::remote_write;

void caps_report(const mlx5::umr_hca_caps &c) {
  info("capability bits (QUERY_HCA_CAP)",
       std::string("umr_modify_atomic_disabled ") + (c.atomic_disabled ? "1" : "0") +
           ", umr_indirect_mkey_disabled " + (c.indirect_mkey_disabled ? "1" : "0") +
           ", repeated_block_disabled " + (c.repeated_block_disabled ? "1" : "0") + ", max_indirection " +
           std::to_string(c.max_indirection));
}

// ---- the stand-in: the same properties, against test/mlx5_standin.hpp ----
int run_standin() {
  std::printf("no mlx5 device checked: running against the stand-in (rdma-core 44's provider as "
              "modelled in test/mlx5_standin.hpp). This proves nothing about hardware.\n");
  rdmaxx_standin::device d;
  mlx5::umr_hca_caps hca;
  report(mlx5::query_umr_caps(&d.ctx, hca, rdmaxx_standin::device::devx_cmd), "capability bits read", "QUERY_HCA_CAP answered");
  caps_report(hca);

  // credit after RTS: installed at creation (RESET), rerouted after the transition as
  // QueuePair does; the provider rewrote wr_complete at RTS.
  if (!detail::sq_credit::install(&d.qpx, d.max_post, nullptr)) return 2;
  d.modify(IBV_QPS_INIT);
  detail::sq_credit::reroute(&d.qpx);
  d.modify(IBV_QPS_RTR);
  detail::sq_credit::reroute(&d.qpx);
  d.modify(IBV_QPS_RTS);
  detail::sq_credit::reroute(&d.qpx);
  {
    ::ibv_wr_start(&d.qpx);
    for (unsigned i = 0; i <= d.max_post; ++i) {
      d.qpx.wr_id = i;
      d.qpx.wr_flags = 0;
      ::ibv_wr_rdma_write(&d.qpx, 0x55, 0x1000);
      ::ibv_wr_set_sge(&d.qpx, 1, 0x2000, 8);
    }
    const int rc = ::ibv_wr_complete(&d.qpx);
    report(rc == detail::sq_credit::refused_rc && d.posted.empty() && d.stale_writes == 0,
           "send-queue credit after RTS",
           "a batch of " + std::to_string(d.max_post + 1) + " writes on a queue of " + std::to_string(d.max_post) +
               ": wr_complete " + std::to_string(rc) + ", " + std::to_string(d.posted.size()) + " posted, " +
               std::to_string(d.stale_writes) + " stale writes");
  }

  const region_ref src = region_ref::raw(0x10000, 4096, 7, 7, rw, &d.pd);
  const layout l = layout::list({{src, 0, 256}});
  const mlx5::umr_limits lim{512, 32};
  std::set<std::uint32_t> issued;
  auto configure = [&](mlx5::key_state &k, std::uint64_t id) {
    ::ibv_wr_start(&d.qpx);
    if (!mlx5::configure_key(k, mlx5::umr_send_ops, &d.qpx, &d.pd, {id}, l, rw, lim, rdmaxx_standin::device::to_dv))
      return ibv_wc_opcode(-1);
    if (::ibv_wr_complete(&d.qpx) != 0) return ibv_wc_opcode(-1);
    ibv_wc_opcode op = ibv_wc_opcode(-1);
    for (const ibv_wc &wc : d.poll())
      if (mlx5::complete_key(k, wc)) op = wc.opcode;
    issued.insert(k.mkey->rkey);
    return op;
  };
  auto invalidate = [&](mlx5::key_state &k, std::uint64_t id, unsigned *flags) {
    ::ibv_wr_start(&d.qpx);
    if (!mlx5::invalidate_key(k, &d.qpx, {id})) return ibv_wc_opcode(-1);
    if (flags) *flags = d.batch.empty() ? 0 : d.batch.back().flags;
    if (::ibv_wr_complete(&d.qpx) != 0) return ibv_wc_opcode(-1);
    ibv_wc_opcode op = ibv_wc_opcode(-1);
    for (const ibv_wc &wc : d.poll())
      if (mlx5::complete_key(k, wc)) op = wc.opcode;
    return op;
  };
  auto make_key = [&](mlx5::key_state &k) {
    auto m = mlx5::create_fresh_mkey(&d.pd, 5, true, rdmaxx_standin::device::create_mkey,
                                     rdmaxx_standin::device::destroy_mkey, &d.dev);
    if (!m) return false;
    mlx5::init_key(k, m.value().mkey, m.value().update_tag, true);
    mlx5::start_at_variant(k, mlx5::next_variant());
    k.seen = m.value().seen;
    return true;
  };

  // completion opcodes, old rkey after a re-tag, fence
  mlx5::key_state a;
  if (!make_key(a)) return 2;
  const ibv_wc_opcode umr_op = configure(a, 1);
  report(umr_op == ibv_wc_opcode(MLX5DV_WC_UMR), "UMR completion opcode",
         std::to_string(int(umr_op)) + " (MLX5DV_WC_UMR = " + std::to_string(int(MLX5DV_WC_UMR)) + ")");
  const std::uint32_t old = a.mkey->rkey;
  const bool first_ok = d.accepts(old);
  unsigned inv_flags = 0;
  const ibv_wc_opcode inv_op = invalidate(a, 2, &inv_flags);
  report(inv_op == IBV_WC_LOCAL_INV, "LOCAL_INV completion opcode",
         std::to_string(int(inv_op)) + " (IBV_WC_LOCAL_INV = " + std::to_string(int(IBV_WC_LOCAL_INV)) + ")");
  report((inv_flags & IBV_SEND_FENCE) != 0, "fenced invalidate", "local invalidate WQE flags " + hex(inv_flags));
  (void)configure(a, 3);
  report(first_ok && a.mkey->rkey != old && d.accepts(a.mkey->rkey) && !d.accepts(old), "old rkey refused after a re-tag",
         "old " + hex(old) + " refused, new " + hex(a.mkey->rkey) + " accepted");
  (void)invalidate(a, 4, nullptr);

  // index reuse across destroy and create, with tag update and without
  for (bool tags : {true, false}) {
    d.ctx_update_tag = tags;
    mlx5::key_state k1, k2;
    if (!make_key(k1)) return 2;
    (void)configure(k1, 5);
    (void)invalidate(k1, 6, nullptr);
    const std::uint32_t idx = k1.mkey->lkey >> 8;
    (void)rdmaxx_standin::device::destroy_mkey(k1.mkey);
    if (!make_key(k2)) return 2;
    const bool reused = (k2.mkey->lkey >> 8) == idx;
    info(tags ? "mkey index reuse (tag update)" : "mkey index reuse (no tag update)",
         std::string("the firmware offered index ") + hex(idx) + " again; the new key got index " +
             hex(k2.mkey->lkey >> 8) + (reused ? " (reused)" : " (another)"));
    // the rkey the new key's first configure writes is none a peer held before
    const std::uint32_t now = k2.mkey->rkey;
    const bool fresh = !issued.count(now);
    (void)configure(k2, 7);
    bool dead = true;
    for (std::uint32_t r : issued)
      if (r != now && d.accepts(r)) dead = false;
    report(fresh && dead, tags ? "no revoked rkey re-issued (tag update)" : "no revoked rkey re-issued (quarantine)",
           "new key's rkey " + hex(now) + (fresh ? " (never issued before)" : " (issued before)") +
               (dead ? ", every earlier rkey refused" : ", an earlier rkey answers"));
    (void)invalidate(k2, 8, nullptr);
    (void)rdmaxx_standin::device::destroy_mkey(k2.mkey);
  }
  (void)rdmaxx_standin::device::destroy_mkey(a.mkey);
  detail::sq_credit::free(d.qpx.qp_base.qp_context);
  return violations ? 1 : 0;
}

// ---- live: the first mlx5 device ----
struct live {
  Context ctx;
  ProtectionDomain pd;
  CompletionQueue cq;
  QueuePair a, b; // a: the UMR QP (keys configured through it); b: its loopback peer
};

// Poll until the completion of `id` on `qpn`; every other send completion of `a` is retired.
result<ibv_wc> wait_for(live &L, std::uint64_t id, std::uint32_t qpn) {
  ibv_wc wc[8];
  for (long spins = 0; spins < 200'000'000; ++spins) {
    RDMAXX_TRY(n, L.cq.poll(wc));
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].wr_id == id && wc[i].qp_num == qpn) return wc[i];
      if (wc[i].qp_num == L.a.qp_num()) (void)L.a.retire(wc[i]);
    }
  }
  return make_error_code(errc::timeout);
}

int run_live(ibv_device *dev) {
  std::printf("live on %s (mlx5). Keep this report with the issue.\n", ::ibv_get_device_name(dev));
  auto ctx = Context::open(dev);
  if (!ctx) return std::printf("cannot open: %s\n", ctx.error().message().c_str()), 2;
  live L{std::move(ctx.value()), {}, {}, {}, {}};
  auto caps = L.ctx.query_capabilities();
  if (!caps) return std::printf("query_capabilities: %s\n", caps.error().message().c_str()), 2;
  info("Capabilities::umr_why", umr_reason_text(caps.value().umr_why));
  info("Capabilities::umr_revocation", caps.value().umr_revocation == mkey_revocation::tag_rotation ? "tag_rotation"
                                       : caps.value().umr_revocation == mkey_revocation::quarantine ? "quarantine"
                                                                                                    : "none");
  mlx5::umr_hca_caps hca;
  int qerr = 0;
  report(mlx5::query_umr_caps(L.ctx.native_handle(), hca, &::mlx5dv_devx_general_cmd, &qerr), "capability bits read",
         qerr ? "QUERY_HCA_CAP errno " + std::to_string(qerr) : "QUERY_HCA_CAP answered");
  caps_report(hca);
  if (caps.value().umr != umr_backend::mlx5) {
    std::printf("the mlx5 backend is not chosen here: nothing else can be checked\n");
    return 2;
  }
  auto pd = ProtectionDomain::alloc(L.ctx);
  auto cq = pd ? CompletionQueue::create(L.ctx, 256) : result<CompletionQueue>(pd.error());
  if (!cq) return std::printf("PD/CQ: %s\n", cq.error().message().c_str()), 2;
  L.pd = std::move(pd.value());
  L.cq = std::move(cq.value());
  auto a = mlx5::create_umr_qp(L.pd, L.cq, L.cq);
  auto b = a ? mlx5::create_umr_qp(L.pd, L.cq, L.cq) : result<QueuePair>(a.error());
  if (!b) return std::printf("create_umr_qp: %s\n", b.error().message().c_str()), 2;
  L.a = std::move(a.value());
  L.b = std::move(b.value());
  if (auto r = connect_loopback(L.a, L.b); !r) return std::printf("connect: %s\n", r.error().message().c_str()), 2;

  // credit after RTS: one write more than the room, refused whole before any builder
  {
    const std::uint32_t room = L.a.send_queue_room();
    static char scratch[64];
    auto mr = MemoryRegion::reg(L.pd, scratch, sizeof scratch, access::local_write | access::remote_write);
    if (!mr) return 2;
    auto batch = L.a.start_send();
    for (std::uint32_t i = 0; i <= room; ++i) batch.write({i + 1}, {mr.value().iova(), mr.value().rkey()}, mr.value().sge());
    auto r = batch.submit();
    report(!r && r.error() == errc::send_queue_full && L.a.send_queue_room() == room, "send-queue credit after RTS",
           std::to_string(room + 1) + " writes on a room of " + std::to_string(room) + ": " +
               (r ? std::string("submitted") : r.error().message()));
  }

  static char target[4096], source[4096], far[4096];
  auto tmr = MemoryRegion::reg(L.pd, target, sizeof target, rw);
  auto smr = MemoryRegion::reg(L.pd, source, sizeof source, access::local_write);
  auto fmr = MemoryRegion::reg(L.pd, far, sizeof far, rw);
  auto key = IndirectKey::create(L.pd, 4, {.backend = umr_backend::mlx5});
  if (!tmr || !smr || !fmr || !key) return std::printf("regions/key: failed\n"), 2;
  IndirectKey &k = key.value();
  const layout l = layout::list({{tmr.value(), 0, 256}});
  std::set<std::uint32_t> issued;
  // configure / invalidate and confirm; the completion's opcode, or -1
  auto configure = [&](IndirectKey &x) {
    if (!x.configure(L.a, l, rw, {x.wr_id()})) return -1;
    auto wc = wait_for(L, x.wr_id(), L.a.qp_num());
    if (!wc || !x.complete(wc.value()) || wc.value().status != IBV_WC_SUCCESS) return -1;
    issued.insert(x.rkey());
    return int(wc.value().opcode);
  };
  auto invalidate = [&](IndirectKey &x) {
    if (!x.revoke(L.a, {x.wr_id()})) return -1;
    auto wc = wait_for(L, x.wr_id(), L.a.qp_num());
    if (!wc || !x.complete(wc.value()) || wc.value().status != IBV_WC_SUCCESS) return -1;
    return int(wc.value().opcode);
  };
  // b writes 8 bytes through `rkey`: the completion's status
  auto peer_write = [&](std::uint32_t rkey, std::uint64_t id) {
    std::memcpy(source, "rdmaxx!", 8);
    auto batch = L.b.start_send();
    batch.write({id, send_flag::signaled}, {0, rkey}, smr.value().sge(0, 8));
    if (!batch.submit()) return IBV_WC_GENERAL_ERR;
    auto wc = wait_for(L, id, L.b.qp_num());
    return wc ? wc.value().status : IBV_WC_GENERAL_ERR;
  };

  const int umr_op = configure(k);
  report(umr_op == int(MLX5DV_WC_UMR), "UMR completion opcode", std::to_string(umr_op));
  const std::uint32_t old = k.rkey();
  const ibv_wc_status first = peer_write(old, 100);
  report(first == IBV_WC_SUCCESS && std::memcmp(target, "rdmaxx!", 8) == 0, "a write through the key lands",
         ibv_wc_status_str(first));

  // fenced invalidate: a read into the key, then the invalidate, in one batch
  {
    std::memcpy(far, "far-away", 8);
    ibv_sge sge[1];
    auto n = k.sges(L.a, 16, 8, sge);
    auto batch = L.a.start_send();
    if (n) batch.read({200, send_flag::signaled}, {fmr.value().iova(), fmr.value().rkey()}, sge[0]);
    const bool posted = n && k.revoke(batch, {k.wr_id()}) && batch.submit();
    auto rd = posted ? wait_for(L, 200, L.a.qp_num()) : result<ibv_wc>(make_error_code(errc::wrong_state));
    auto iv = posted ? wait_for(L, k.wr_id(), L.a.qp_num()) : result<ibv_wc>(make_error_code(errc::wrong_state));
    const bool ok = rd && iv && rd.value().status == IBV_WC_SUCCESS && k.complete(iv.value()) &&
                    iv.value().status == IBV_WC_SUCCESS && std::memcmp(target + 16, "far-away", 8) == 0;
    report(ok, "fenced invalidate", "a read into the key before its local invalidate landed whole");
    if (iv) report(iv.value().opcode == IBV_WC_LOCAL_INV, "LOCAL_INV completion opcode", std::to_string(int(iv.value().opcode)));
  }

  // re-tag: the old rkey must be refused
  (void)configure(k);
  const std::uint32_t now = k.rkey();
  const ibv_wc_status with_new = peer_write(now, 101);
  const ibv_wc_status with_old = peer_write(old, 102);
  report(now != old && with_new == IBV_WC_SUCCESS && with_old != IBV_WC_SUCCESS, "old rkey refused after a re-tag",
         "old " + hex(old) + ": " + ibv_wc_status_str(with_old) + ", new " + hex(now) + ": " + ibv_wc_status_str(with_new));
  // the refused write moved both QPs to ERR: flush, then reset and reconnect
  (void)L.a.to_error();
  for (int i = 0; i < 1000 && k.pending(); ++i) {
    ibv_wc wc[8];
    auto n = L.cq.poll(wc);
    for (std::size_t j = 0; n && j < n.value(); ++j) (void)k.complete(wc[j]);
  }
  if (!L.a.reset_and_reconnect() || !L.b.reset_and_reconnect())
    return std::printf("reconnect after the refused write failed\n"), violations ? 1 : 2;

  // index reuse across destroy and create
  const std::uint32_t idx = k.rkey() >> 8;
  if (k.configured()) (void)invalidate(k);
  (void)k.destroy();
  auto k2 = IndirectKey::create(L.pd, 4, {.backend = umr_backend::mlx5});
  if (!k2) return 2;
  info("mkey index reuse", "destroyed index " + hex(idx) + ", the next mkey got " + hex(k2.value().rkey() >> 8) +
                               ((k2.value().rkey() >> 8) == idx ? " (reused)" : " (another)"));
  const bool fresh = !issued.count(k2.value().rkey()); // what its first configure will carry
  (void)configure(k2.value());
  report(fresh, "no revoked rkey re-issued", "the new key's rkey " + hex(k2.value().rkey()));
  const ibv_wc_status revived = peer_write(old, 103);
  report(revived != IBV_WC_SUCCESS, "the first key's old rkey still refused", ibv_wc_status_str(revived));
  return violations ? 1 : 0;
}
#endif

} // namespace

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (!mode.empty() && mode != "--standin" && mode != "--live") {
    std::fprintf(stderr, "usage: hw-check [--standin | --live]\n");
    return 2;
  }
#if RDMAXX_HAVE_MLX5
  ibv_device *first = nullptr;
  int n = 0;
  ibv_device **list = mode == "--standin" ? nullptr : ::ibv_get_device_list(&n);
  for (int i = 0; list && i < n && !first; ++i)
    if (::mlx5dv_is_supported(list[i])) first = list[i];
  int rc;
  if (first) {
    rc = run_live(first);
  } else if (mode == "--live") {
    std::printf("no mlx5 device\n");
    rc = 2;
  } else {
    if (mode.empty()) std::printf("no mlx5 device found. ");
    rc = run_standin();
  }
  if (list) ::ibv_free_device_list(list);
  std::printf("%s: %d propert%s violated\n", rc == 0 ? "OK" : rc == 1 ? "VIOLATED" : "NOT RUN", violations,
              violations == 1 ? "y" : "ies");
  return rc;
#else
  (void)report;
  (void)info;
  (void)hex;
  std::printf("rdmaxx was built without the mlx5 option: nothing to check (skipped)\n");
  return 77;
#endif
}
