// mlx5 backend contract tests: the mlx5dv builders (mlx5dv_wr_mkey_configure, ..._set_mkey_*)
// and ibv_wr_local_inv are static inline calls through the function pointers of mlx5dv_qp_ex and
// ibv_qp_ex. These tests hand the backend C structs whose pointers record every call and its
// arguments, and assert exactly what rdmaxx gives mlx5dv. No device, no mock of one.
//
// The provider's rules are taken from rdma-core tag v44.0 (providers/mlx5/qp.c, verbs.c, cq.c,
// mlx5.c, mlx5dv.h) and pyverbs' tests/test_mlx5_mkey.py, which passes on hardware; each test
// names the source lines it checks against. Only hardware can show that the device accepts what
// the provider builds (see README, "Support by device").
#include <rdmaxx/layout.hpp>

#if RDMAXX_HAVE_MLX5
#include <rdmaxx/device.hpp>
#include <rdmaxx/mlx5/context_mlx5.hpp>
#include <rdmaxx/indirect_key.hpp>
#include <rdmaxx/mlx5/indirect_key_mlx5.hpp>
#include <rdmaxx/mlx5/umr_qp.hpp>
#include <rdmaxx/queue_pair.hpp>

#include "../grant_contract.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

using namespace rdmaxx;

namespace {

struct call {
  std::string name;
  std::uint64_t wr_id = 0;
  unsigned wr_flags = 0;
  mlx5dv_mkey *mkey = nullptr;
  unsigned num_setters = 0;
  mlx5dv_mkey_conf_attr attr{};
  std::uint32_t access = 0;
  std::uint32_t repeat = 0;
  std::vector<ibv_sge> sges;
  std::vector<mlx5dv_mr_interleaved> il;
  std::uint32_t key = 0;
  std::uint8_t tag = 0; // mkey_configure: the tag written into the mkey context (lkey & 0xff)
};

// One WQE as the provider files it in _common_wqe_init_op (qp.c:1256-1265): its wr_id, whether
// it asks for a CQE (IBV_SEND_SIGNALED -> MLX5_WQE_CTRL_CQ_UPDATE, qp.c:1278-1280) and the
// opcode its completion reports (wr_data: IBV_WC_DRIVER1 for a configure, IBV_WC_LOCAL_INV for
// a local invalidate; cq.c:193-196 reports UMR completions with it).
struct wqe {
  std::uint64_t wr_id = 0;
  bool signaled = false;
  ibv_wc_opcode opcode = IBV_WC_SEND;
};

// The send queue of rdma-core 44's mlx5 QP, as far as the UMR path meets it. max_post 0: never
// full (the tests that do not look at the queue).
struct sq_model {
  unsigned max_post = 0;   // sq.max_post, the granted max_send_wr (verbs.c:1689, 2623)
  unsigned head = 0;       // sq.head: WQEs rung (post_send_db)
  unsigned tail = 0;       // sq.tail: advanced by polled completions (cq.c:807)
  unsigned nreq = 0;       // WQEs of the open batch
  int err = 0;             // mqp->err: cleared by wr_start (qp.c:1183), answered by wr_complete
  bool ctx_update_tag = true; // MLX5_CTX_FLAGS_MKEY_UPDATE_TAG_SUPPORTED (mlx5.c:2410-2412)
  bool in_error = false;   // the QP moved to ERR after an error completion (or to_error())
  int stale_writes = 0;    // builders that wrote through the last posted WQE's control segment
  std::vector<wqe> batch;  // built in the open batch
  std::vector<wqe> posted; // rung, not yet completed
};

// The recording QP: one ibv_qp_ex and its mlx5dv_qp_ex, as the provider would pair them.
struct recorder {
  ibv_qp_ex qpx{};
  mlx5dv_qp_ex mqp{};
  std::vector<call> calls;
  sq_model sq;
  // The provider's two wr_complete entries: mlx5_send_wr_complete (qp.c:1200-1218) and, since
  // rdma-core v40, mlx5_send_wr_complete_error (qp.c:1189-1198), which the provider installs at
  // RESET (creation included) and replaces at RTS (verbs.c:2250-2268; standin_modify_qp).
  int (*real_complete)(ibv_qp_ex *) = nullptr;
  int (*error_complete)(ibv_qp_ex *) = nullptr;
  recorder();
  // _common_wqe_init_op (qp.c:1236-1287): on a full queue (mlx5_wq_overflow, qp.c:186-199:
  // head - tail + nreq >= max_post) it sets ENOMEM and returns without a new cur_ctrl; the
  // mkey-configure and local-invalidate builders do not look at mqp->err and go on writing
  // through mqp->cur_ctrl, the last WQE already posted (qp.c:2849-2852, 1595-1597).
  bool wqe_init(ibv_wc_opcode op) {
    if (sq.max_post && sq.head - sq.tail + sq.nreq >= sq.max_post) {
      if (!sq.err) sq.err = ENOMEM;
      ++sq.stale_writes;
      return false;
    }
    sq.batch.push_back({qpx.wr_id, (qpx.wr_flags & IBV_SEND_SIGNALED) != 0, op});
    ++sq.nreq;
    return true;
  }
  // Poll what the device completes: each signaled WQE in order (an unsignaled one gives no CQE
  // and is retired only by a later CQE's tail update, cq.c:807). `fail` names a wr_id that
  // completes with `status`; the QP then goes to ERR and every later WQE completes with
  // IBV_WC_WR_FLUSH_ERR, signaled or not (IBTA: work requests completed in error always
  // generate a completion). Error completions carry only wr_id, status and qp_num.
  std::vector<ibv_wc> poll(std::uint64_t fail = ~std::uint64_t(0), ibv_wc_status status = IBV_WC_SUCCESS) {
    std::vector<ibv_wc> out;
    std::size_t retired = 0; // WQEs up to the last one that gave a CQE
    for (std::size_t i = 0; i < sq.posted.size(); ++i) {
      const wqe &q = sq.posted[i];
      ibv_wc wc{};
      wc.wr_id = q.wr_id;
      wc.qp_num = qpx.qp_base.qp_num;
      if (sq.in_error) {
        wc.status = IBV_WC_WR_FLUSH_ERR;
      } else if (q.wr_id == fail && status != IBV_WC_SUCCESS) {
        wc.status = status;
        sq.in_error = true;
      } else if (q.signaled) {
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = q.opcode;
      } else {
        continue;
      }
      out.push_back(wc);
      retired = i + 1;
    }
    sq.tail += unsigned(retired);
    sq.posted.erase(sq.posted.begin(), sq.posted.begin() + std::ptrdiff_t(retired));
    return out;
  }
};
recorder *current = nullptr;
int wr_complete_rc = 0; // what the recorder's ibv_wr_complete answers (0: as the provider)

call &record(const char *name) {
  call c;
  c.name = name;
  c.wr_id = current->qpx.wr_id;
  c.wr_flags = current->qpx.wr_flags;
  current->calls.push_back(c);
  return current->calls.back();
}

recorder::recorder() {
  current = this;
  mqp.wr_mkey_configure = [](mlx5dv_qp_ex *q, mlx5dv_mkey *k, uint8_t n, mlx5dv_mkey_conf_attr *a) {
    REQUIRE(q == &current->mqp);
    call &c = record("mkey_configure");
    c.mkey = k;
    c.num_setters = n;
    c.attr = *a;
    c.tag = std::uint8_t(k->lkey & 0xff);
    sq_model &sq = current->sq;
    if (!(current->qpx.wr_flags & IBV_SEND_INLINE)) { // qp.c:2837-2840
      sq.err = EOPNOTSUPP;
      return;
    }
    if (!current->wqe_init(IBV_WC_DRIVER1)) return; // qp.c:2849
    // a tag other than 0 needs the kernel's tag update (qp.c:2868-2874)
    if ((k->lkey & 0xff) && !sq.ctx_update_tag) sq.err = EOPNOTSUPP;
  };
  mqp.wr_set_mkey_access_flags = [](mlx5dv_qp_ex *q, uint32_t f) {
    REQUIRE(q == &current->mqp);
    record("set_mkey_access_flags").access = f;
  };
  mqp.wr_set_mkey_layout_list = [](mlx5dv_qp_ex *q, uint16_t n, const ibv_sge *s) {
    REQUIRE(q == &current->mqp);
    record("set_mkey_layout_list").sges.assign(s, s + n);
  };
  mqp.wr_set_mkey_layout_interleaved = [](mlx5dv_qp_ex *q, uint32_t rc, uint16_t n,
                                          const mlx5dv_mr_interleaved *d) {
    REQUIRE(q == &current->mqp);
    call &c = record("set_mkey_layout_interleaved");
    c.repeat = rc;
    c.il.assign(d, d + n);
  };
  // builders the backend must not use
  mqp.wr_mr_list = [](mlx5dv_qp_ex *, mlx5dv_mkey *, uint32_t, uint16_t, ibv_sge *) { record("mr_list"); };
  mqp.wr_mr_interleaved = [](mlx5dv_qp_ex *, mlx5dv_mkey *, uint32_t, uint32_t, uint16_t,
                             mlx5dv_mr_interleaved *) { record("mr_interleaved"); };
  qpx.wr_local_inv = [](ibv_qp_ex *q, uint32_t k) {
    REQUIRE(q == &current->qpx);
    record("local_inv").key = k;
    (void)current->wqe_init(IBV_WC_LOCAL_INV); // _build_umr_wqe, qp.c:1595
  };
  qpx.wr_rdma_write = [](ibv_qp_ex *, uint32_t, uint64_t) {
    record("rdma_write");
    // on a full queue _mlx5_send_wr_rdma writes the address segment through the stale
    // cur_ctrl as well (qp.c:1472-1485)
    (void)current->wqe_init(IBV_WC_RDMA_WRITE);
  };
  qpx.wr_set_sge = [](ibv_qp_ex *, uint32_t, uint64_t, uint32_t) {
    record("set_sge");
    // set_sge writes through cur_data, which a refused op left in the last posted WQE
    if (current->sq.err == ENOMEM) ++current->sq.stale_writes;
  };
  // the batch verbs, for the IndirectKey wrappers (SendBatch: ibv_wr_start, _complete, _abort)
  qpx.wr_start = [](ibv_qp_ex *q) { // qp.c:1176-1187
    REQUIRE(q == &current->qpx);
    record("wr_start");
    current->sq.err = 0;
    current->sq.nreq = 0;
    current->sq.batch.clear();
  };
  qpx.wr_complete = [](ibv_qp_ex *q) { // qp.c:1200-1218: an error rolls the batch back
    REQUIRE(q == &current->qpx);
    record("wr_complete");
    sq_model &sq = current->sq;
    const int rc = wr_complete_rc ? wr_complete_rc : sq.err;
    if (rc == 0) {
      sq.posted.insert(sq.posted.end(), sq.batch.begin(), sq.batch.end());
      sq.head += sq.nreq;
    }
    sq.batch.clear();
    sq.nreq = 0;
    return rc;
  };
  qpx.wr_abort = [](ibv_qp_ex *q) { // qp.c:1221-1230
    REQUIRE(q == &current->qpx);
    record("wr_abort");
    current->sq.batch.clear();
    current->sq.nreq = 0;
  };
  real_complete = qpx.wr_complete;
  error_complete = [](ibv_qp_ex *q) { // qp.c:1189-1198: rolls back, answers EINVAL
    REQUIRE(q == &current->qpx);
    record("wr_complete_error");
    current->sq.batch.clear();
    current->sq.nreq = 0;
    return EINVAL;
  };
}

// ibv_modify_qp on the recorder's QP as rdma-core >= 40 runs it (mlx5_modify_qp, verbs.c of
// v44.0): on a move to RESET the QP's unpolled CQEs are dropped (mlx5_cq_clean, 3019-3026) and
// the send queue starts anew (mlx5_init_qp_indices, 3028); then set_qp_operational_state
// (3063-3064, 2250-2268) rewrites wr_complete: the error variant at RESET, the real one at RTS.
// A move to ERR flushes every outstanding WQE. libibverbs then records qp->state.
int standin_modify_qp(ibv_qp *qp, ibv_qp_attr *a, int mask) {
  REQUIRE(qp == &current->qpx.qp_base);
  call &c = record("modify_qp");
  c.key = a->qp_state;
  if (mask & IBV_QP_STATE) {
    sq_model &sq = current->sq;
    if (a->qp_state == IBV_QPS_RESET) {
      sq.posted.clear();
      sq.batch.clear();
      sq.head = sq.tail = sq.nreq = 0;
      sq.err = 0;
      sq.in_error = false;
      current->qpx.wr_complete = current->error_complete;
    } else if (a->qp_state == IBV_QPS_RTS) {
      current->qpx.wr_complete = current->real_complete;
    } else if (a->qp_state == IBV_QPS_ERR) {
      sq.in_error = true;
    }
    qp->state = a->qp_state;
  }
  return 0;
}

// The device context the QP's transitions query (ibv_query_port in to_rtr): a RoCE port.
struct standin_context {
  verbs_context v{};
  standin_context() {
    v.sz = sizeof(verbs_context);
    v.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    v.query_port = [](ibv_context *, uint8_t, ibv_port_attr *pa, size_t) {
      *pa = ibv_port_attr{};
      pa->state = IBV_PORT_ACTIVE;
      pa->link_layer = IBV_LINK_LAYER_ETHERNET;
      pa->active_mtu = IBV_MTU_1024;
      return 0;
    };
  }
};
standin_context standin_ctx;

constexpr access_flags rw = access::local_write | access::remote_read | access::remote_write;
ibv_pd *const pd1 = reinterpret_cast<ibv_pd *>(0x1000);

region_ref mr(std::uint64_t iova, std::uint64_t len, std::uint32_t lkey,
             access_flags acc = rw | access::remote_atomic) {
  return region_ref::raw(iova, len, lkey, lkey, acc, pd1);
}
region_ref hw_key(std::uint64_t len, std::uint32_t lkey) {
  region_ref r = mr(0, len, lkey);
  r.indirect = true;
  return r;
}

const mlx5::umr_limits lim512{512, 32};

} // namespace

TEST_CASE("mlx5 contract: a list layout is one inline mkey-configure WR", "[unit][mlx5]") {
  recorder rec;
  mlx5dv_mkey mkey{0x1234, 0x1234};
  const layout l = layout::list({{mr(0x10000, 4096, 7), 3, 17}, {mr(0x20000, 100, 8), 99, 1},
                                 {hw_key(1000, 0x999), 250, 333}});
  REQUIRE(mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {42, send_flag::signaled}, l,
                               rw | access::remote_atomic, lim512)
              .has_value());
  REQUIRE(rec.calls.size() == 3);
  const call &c0 = rec.calls[0];
  CHECK(c0.name == "mkey_configure");
  CHECK(c0.mkey == &mkey);
  CHECK(c0.num_setters == 2); // access flags + layout
  CHECK(c0.attr.conf_flags == 0);
  CHECK(c0.attr.comp_mask == 0);
  CHECK(c0.wr_id == 42);
  CHECK(c0.wr_flags == (IBV_SEND_SIGNALED | IBV_SEND_INLINE)); // inline is mandatory
  CHECK(rec.calls[1].name == "set_mkey_access_flags");
  CHECK(rec.calls[1].access == unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                        IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC));
  const call &c2 = rec.calls[2];
  CHECK(c2.name == "set_mkey_layout_list");
  REQUIRE(c2.sges.size() == 3);
  CHECK((c2.sges[0].addr == 0x10003 && c2.sges[0].length == 17 && c2.sges[0].lkey == 7));
  CHECK((c2.sges[1].addr == 0x20000 + 99 && c2.sges[1].length == 1 && c2.sges[1].lkey == 8));
  // a nested hardware key is addressed zero-based through its own lkey
  CHECK((c2.sges[2].addr == 250 && c2.sges[2].length == 333 && c2.sges[2].lkey == 0x999));
  // unsignalled: only INLINE
  rec.calls.clear();
  REQUIRE(mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {43}, l, access::local_write, lim512)
              .has_value());
  CHECK(rec.calls[0].wr_flags == unsigned(IBV_SEND_INLINE));
  CHECK(rec.calls[1].access == unsigned(IBV_ACCESS_LOCAL_WRITE));
}

TEST_CASE("mlx5 contract: a repeat layout is set as interleaved", "[unit][mlx5]") {
  recorder rec;
  mlx5dv_mkey mkey{5, 5};
  const layout l = layout::repeat(7, {{mr(0x10000, 4096, 7), 1, 512, 4}, {mr(0x30000, 4096, 9), 0, 8, 0}});
  REQUIRE(mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {1, send_flag::signaled}, l, rw, lim512)
              .has_value());
  REQUIRE(rec.calls.size() == 3);
  CHECK(rec.calls[0].name == "mkey_configure");
  CHECK(rec.calls[0].num_setters == 2);
  const call &c = rec.calls[2];
  CHECK(c.name == "set_mkey_layout_interleaved");
  CHECK(c.repeat == 7);
  REQUIRE(c.il.size() == 2);
  CHECK((c.il[0].addr == 0x10001 && c.il[0].bytes_count == 512 && c.il[0].bytes_skip == 4 && c.il[0].lkey == 7));
  CHECK((c.il[1].addr == 0x30000 && c.il[1].bytes_count == 8 && c.il[1].bytes_skip == 0 && c.il[1].lkey == 9));
}

TEST_CASE("mlx5 contract: limits come from the inline size and the mkey's entries", "[unit][mlx5]") {
  CHECK(mlx5::inline_list_capacity(512) == 32);
  CHECK(mlx5::inline_list_capacity(64) == 4);
  CHECK(mlx5::inline_list_capacity(60) == 4);
  CHECK(mlx5::inline_list_capacity(59) == 3);
  const auto a = mlx5::limits_for({512, 32});
  CHECK(a.max_entries == 32);
  CHECK(a.max_repeat_entries == 31); // one entry is the strided header
  const auto b = mlx5::limits_for({512, 8});
  CHECK(b.max_entries == 8);
  CHECK(b.max_repeat_entries == 7);
  const auto c = mlx5::limits_for({60, 64}); // default WQE: 4 SGEs, 3 interleaved
  CHECK(c.max_entries == 4);
  CHECK(c.max_repeat_entries == 3);
  CHECK(c.interleave_16bit);
  CHECK(c.nested_hardware_only);
  CHECK(c.allowed_access == mlx5::allowed_access);
}

TEST_CASE("mlx5 contract: refused layouts post nothing", "[unit][mlx5]") {
  recorder rec;
  mlx5dv_mkey mkey{5, 5};
  const region_ref big = mr(0x10000, 1 << 20, 7);
  region_ref sw_key = mr(0, 100, 0);
  key_segment segs[1] = {{0x10000, 100, 7, 7, nullptr}};
  sw_key.indirect = true;
  sw_key.segments = segs;
  sw_key.nsegments = 1;
  layout five;
  for (int i = 0; i < 5; ++i) five.add(layout_entry{big, std::uint64_t(i), 1});
  layout four_rep = layout::repeat(2, std::span<const repeat_entry>{});
  for (int i = 0; i < 4; ++i) four_rep.add(repeat_entry{big, std::uint64_t(i) * 100, 1, 0});
  struct row {
    const char *what;
    layout l;
    access_flags acc;
    mlx5::umr_limits lim;
    errc expect;
    std::size_t entry;
  };
  const row rows[] = {
      {"5 list entries, inline 64", five, rw, {64, 32}, errc::too_many_entries, 4},
      {"5 list entries, mkey of 4", five, rw, {512, 4}, errc::too_many_entries, 4},
      {"4 interleaved, inline 64", four_rep, rw, {64, 32}, errc::too_many_entries, 3},
      {"4 interleaved, mkey of 4", four_rep, rw, {512, 4}, errc::too_many_entries, 3},
      {"bytes_count 2^16", layout::repeat(1, {{big, 0, 0x10000, 0}}), rw, lim512, errc::out_of_range, 0},
      {"count+skip 2^16", layout::repeat(2, {{big, 0, 1, 0}, {big, 0, 0xfff0, 0x10}}), rw, lim512,
       errc::out_of_range, 1},
      {"mw_bind right", layout::list({{big, 0, 1}}), rw | access::mw_bind, lim512,
       errc::unknown_access_flag, no_entry},
      {"zero-based right", layout::list({{big, 0, 1}}), rw | access::zero_based, lim512,
       errc::unknown_access_flag, no_entry},
      {"software key nested", layout::list({{big, 0, 1}, {sw_key, 0, 1}}), rw, lim512, errc::wrong_type, 1},
      {"entry outside its MR", layout::list({{big, (1 << 20) - 1, 2}}), rw, lim512, errc::out_of_range, 0},
  };
  for (const row &r : rows) {
    INFO(r.what);
    rec.calls.clear();
    auto res = mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {1}, r.l, r.acc, r.lim);
    REQUIRE_FALSE(res.has_value());
    INFO(res.error().message());
    CHECK(layout_errc(res.error()) == r.expect);
    CHECK(layout_error_entry(res.error()) == r.entry);
    CHECK(rec.calls.empty());
  }
  // the limits exactly: 0xffff fits, 4 entries with inline 64 fit
  rec.calls.clear();
  CHECK(mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {1},
                             layout::repeat(2, {{big, 0, 1, 0}, {big, 0, 0xfff0, 0xf}}), rw, lim512)
            .has_value());
  layout four;
  for (int i = 0; i < 4; ++i) four.add(layout_entry{big, std::uint64_t(i), 1});
  CHECK(mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {1}, four, rw, {64, 4}).has_value());
  CHECK(rec.calls.size() == 6);
  CHECK(mlx5::post_configure(nullptr, &rec.mqp, &mkey, pd1, {1}, four, rw, lim512).error() ==
        errc::null_handle);
  CHECK(mlx5::post_configure(&rec.qpx, &rec.mqp, nullptr, pd1, {1}, four, rw, lim512).error() ==
        errc::null_handle);
}

TEST_CASE("mlx5 contract: invalidation is a local invalidate of the mkey", "[unit][mlx5]") {
  recorder rec;
  mlx5dv_mkey mkey{0xabcd01, 0xabcd01};
  REQUIRE(mlx5::post_invalidate(&rec.qpx, &mkey, {77, send_flag::signaled}).has_value());
  REQUIRE(rec.calls.size() == 1);
  CHECK(rec.calls[0].name == "local_inv");
  CHECK(rec.calls[0].key == 0xabcd01);
  CHECK(rec.calls[0].wr_id == 77);
  // fenced whatever w.flags says (qp.c:1272-1274: MLX5_WQE_CTRL_FENCE): earlier reads land first
  CHECK(rec.calls[0].wr_flags == unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  CHECK(mlx5::post_invalidate(&rec.qpx, nullptr, {}).error() == errc::null_handle);
}

TEST_CASE("mlx5 contract: mkey creation attributes (indirect, remote invalidate when asked)", "[unit][mlx5]") {
  const auto a = mlx5::mkey_init_attr(pd1, 9);
  CHECK(a.pd == pd1);
  CHECK(a.create_flags == unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT));
  CHECK(a.max_entries == 9);
  // pyverbs test_mkey_remote_invalidate creates its mkey with INDIRECT | REMOTE_INVALIDATE; the
  // provider enables en_rinval only for that flag (verbs.c:6820-6822).
  const auto b = mlx5::mkey_init_attr(pd1, 9, true);
  CHECK(b.create_flags ==
        unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE));
  CHECK(ikey_options{}.remote_invalidate == false);
  std::uint32_t zero = 0, huge = 0x10000;
  CHECK(mlx5::create_mkey(pd1, zero).error() == errc::out_of_range);
  CHECK(mlx5::create_mkey(pd1, huge).error() == errc::out_of_range);
  CHECK(mlx5::create_mkey(nullptr, huge).error() == errc::null_handle);
}

TEST_CASE("mlx5 contract: max_entries must survive the provider's round-up into 16 bits", "[unit][mlx5]") {
  // verbs.c:6802 mkey->num_desc = align(max_entries, 4), num_desc is a uint16_t (mlx5.h:896), and
  // it becomes translations_octword_size and the entry limit of every layout (qp.c:2999-3006).
  auto provider_num_desc = [](std::uint32_t n) { return std::uint16_t((n + 3) & ~3u); };
  for (std::uint32_t n = 1; n <= mlx5::max_mkey_entries; ++n) {
    if (provider_num_desc(n) < n) FAIL("max_entries " << n << " wraps");
  }
  CHECK(provider_num_desc(65532) == 65532);
  for (std::uint32_t n : {65533u, 65534u, 65535u}) {
    INFO(n);
    CHECK(provider_num_desc(n) == 0); // what rdma-core 44 would store
    std::uint32_t want = n;
    // refused before mlx5dv_create_mkey is called (pd1 is not a real PD: a call would crash)
    CHECK(mlx5::create_mkey(pd1, want).error() == errc::out_of_range);
    CHECK(want == n);
  }
}

TEST_CASE("mlx5 contract: the UMR QP is created as pyverbs creates it", "[unit][mlx5]") {
  // pyverbs tests/test_mlx5_mkey.py (v44.0), Mlx5MkeyResources: comp_mask
  // MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS | _SEND_OPS_FLAGS, create_flags
  // MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE, max_inline_data 512 with MKEY_CONFIGURE, and
  // IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS on the verbs side.
  const mlx5dv_qp_init_attr dv = mlx5::umr_dv_attr();
  CHECK(dv.comp_mask ==
        (MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS | MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS));
  // scatter-to-CQE is on unless disabled (verbs.c:2330-2331); the provider then copies small
  // receives to the SGE address as a pointer (cq.c:237-242, qp.c:74-101), but indirect-key SGEs
  // are zero-based. DISABLE clears it (verbs.c:2371-2381), and ALLOW with DISABLE is EINVAL.
  CHECK(dv.create_flags == unsigned(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE));
  CHECK((dv.create_flags & MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE) == 0);
  CHECK(dv.send_ops_flags ==
        (MLX5DV_QP_EX_WITH_MR_LIST | MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MKEY_CONFIGURE));
  // only these (and RAW_WQE, MEMCPY) are accepted for an RC QP (qp.c:3574-3581)
  CHECK((dv.send_ops_flags & ~std::uint64_t(MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MR_LIST |
                                            MLX5DV_QP_EX_WITH_MKEY_CONFIGURE | MLX5DV_QP_EX_WITH_RAW_WQE |
                                            MLX5DV_QP_EX_WITH_MEMCPY)) == 0);
  CHECK(mlx5::has_umr_ops(dv.send_ops_flags));
  CHECK_FALSE(mlx5::has_umr_ops(0));

  // the verbs attributes: the same function QueuePair::create uses, with local invalidate added
  auto *cq = reinterpret_cast<ibv_cq *>(0x3000);
  const ibv_qp_init_attr_ex qa = detail::rc_qp_init_attr(
      pd1, cq, cq, mlx5::umr_default_caps, mlx5::umr_verbs_ops(send_op::rdma_write | send_op::rdma_read));
  CHECK(qa.qp_type == IBV_QPT_RC);
  CHECK(qa.pd == pd1);
  CHECK(qa.send_cq == cq);
  CHECK(qa.recv_cq == cq);
  CHECK(qa.cap.max_inline_data == 512);
  CHECK(qa.comp_mask == (IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS));
  CHECK(qa.send_ops_flags ==
        (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_LOCAL_INV));
  // every default op is one the mlx5 RC QP accepts (qp.c:3589: ops & ~MLX5_SUPPORTED_SEND_OPS_FLAGS_RC)
  CHECK((mlx5::umr_verbs_ops(all_send_ops).native() & IBV_QP_EX_WITH_LOCAL_INV) != 0);
  // 512 inline bytes hold 32 list entries, the most a layout has
  CHECK(mlx5::inline_list_capacity(mlx5::umr_default_caps.max_inline_data) == layout::capacity);
  // an ordinary QueuePair records no mlx5 send ops
  CHECK(QueuePair{}.mlx5_send_ops() == 0);
}

TEST_CASE("mlx5 contract: the limit formulas are the provider's expressions", "[unit][mlx5]") {
  // qp.c:2999-3006 (mlx5_send_wr_set_mkey_layout):
  //   interleaved: min((max_inline_data + sizeof(mlx5_wqe_inl_data_seg)) /
  //                    sizeof(mlx5_wqe_umr_repeat_ent_seg) - 1, mkey->num_desc)
  //   list:        min((max_inline_data + sizeof(mlx5_wqe_inl_data_seg)) /
  //                    sizeof(mlx5_wqe_data_seg), mkey->num_desc)
  // num_entries above that sets mqp->err = ENOMEM (qp.c:3009-3012): a failed ibv_wr_complete.
  for (std::uint32_t inl = 0; inl <= 1024; ++inl) {
    for (std::uint32_t desc : {4u, 8u, 32u, 64u}) {
      const std::size_t list = std::min<std::size_t>(
          (inl + sizeof(mlx5_wqe_inl_data_seg)) / sizeof(mlx5_wqe_data_seg), desc);
      const std::size_t fit_il = (inl + sizeof(mlx5_wqe_inl_data_seg)) / sizeof(mlx5_wqe_umr_repeat_ent_seg);
      const std::size_t il = std::min<std::size_t>(fit_il > 0 ? fit_il - 1 : 0, desc);
      const auto l = mlx5::limits_for({inl, desc});
      if (l.max_entries != std::min<std::size_t>(list, layout::capacity))
        FAIL("list limit differs at inline " << inl << ", desc " << desc);
      // rdmaxx is one stricter where the mkey is the bound: the repeat block header takes one of
      // its translation entries (xlat_size = (num_interleaved + 1) * 16, qp.c:2175)
      if (l.max_repeat_entries > il || l.max_repeat_entries + 1 > desc)
        FAIL("interleaved limit above the provider's at inline " << inl << ", desc " << desc);
    }
  }
  CHECK(sizeof(mlx5_wqe_inl_data_seg) == 4);
  CHECK(sizeof(mlx5_wqe_data_seg) == 16);
  CHECK(sizeof(mlx5_wqe_umr_repeat_ent_seg) == 16);
}

TEST_CASE("mlx5 contract: list entries and totals at and over 2 GiB", "[unit][mlx5]") {
  recorder rec;
  mlx5dv_mkey mkey{5, 5};
  constexpr std::uint64_t G2 = std::uint64_t(1) << 31;
  const region_ref big = mr(0x100000000, std::uint64_t(1) << 34, 7);
  struct row {
    const char *what;
    layout l;
    bool ok;
    std::size_t entry;
  };
  const row rows[] = {
      // umr_sg_list_create sums into an int (qp.c:2102, 2115) and stores it sign-extended as the
      // mkey length (qp.c:2121, 3036): a list of 2^31 bytes or more in total gets a wrong length
      {"one entry of 2^31 - 1", layout::list({{big, 0, G2 - 1}}), true, no_entry},
      {"one entry of 2^31", layout::list({{big, 0, G2}}), false, 0},
      {"two entries of 2^30: total 2^31", layout::list({{big, 0, G2 / 2}, {big, G2 / 2, G2 / 2}}), false, 1},
      {"three entries, total 2^31 - 1", layout::list({{big, 0, G2 / 2}, {big, 0, G2 / 4}, {big, 0, G2 / 4 - 1}}),
       true, no_entry},
      // a KLM reaches 2 GiB ("KLM support only 2GB", qp.c:624-626; UCX splits at 0x80000000)
      {"one entry of 2^31 + 1", layout::list({{big, 0, G2 + 1}}), false, 0},
      {"one entry of 2^32 - 1", layout::list({{big, 0, 0xffffffffu}}), false, 0},
      // interleaved lengths are summed into a uint64_t (qp.c:2145, 2168-2169): no such limit
      {"interleaved, 2^16 x 2^15 bytes", layout::repeat(1u << 16, {{big, 0, 0x8000, 0}}), true, no_entry},
  };
  for (const row &r : rows) {
    INFO(r.what);
    rec.calls.clear();
    auto res = mlx5::post_configure(&rec.qpx, &rec.mqp, &mkey, pd1, {1}, r.l, rw, lim512);
    CHECK(res.has_value() == r.ok);
    if (r.ok) {
      CHECK(rec.calls.size() == 3);
      continue;
    }
    INFO(res.error().message());
    CHECK(layout_errc(res.error()) == errc::provider_limit);
    CHECK(layout_error_entry(res.error()) == r.entry);
    CHECK(rec.calls.empty());
  }
  CHECK(mlx5::max_list_total == G2 - 1); // RDMAXX_MLX5_LIST_TOTAL_FIXED is 0 in this build
}

namespace {
ibv_wc wc_of(std::uint64_t id, std::uint32_t qpn, ibv_wc_status st = IBV_WC_SUCCESS,
             ibv_wc_opcode op = IBV_WC_DRIVER1) {
  ibv_wc wc{};
  wc.wr_id = id;
  wc.qp_num = qpn;
  wc.status = st;
  wc.opcode = op;
  return wc;
}
int to_dv_calls = 0;
mlx5dv_qp_ex *to_dv_recorder(ibv_qp_ex *) noexcept {
  ++to_dv_calls;
  return &current->mqp;
}
} // namespace

TEST_CASE("mlx5 contract: a configure through a QP without the UMR send ops reaches no builder", "[unit][mlx5]") {
  // A QP from ibv_create_qp_ex has no mkey builders: mlx5_qp_fill_wr_pfns fills them only when
  // mlx5 send ops were given (qp.c:3595-3609), and mlx5dv_wr_mkey_configure calls through the
  // pointer unchecked. The recorder here is such a QP: its mlx5dv builders are all NULL.
  recorder rec;
  rec.mqp = mlx5dv_qp_ex{};
  rec.qpx.qp_base.qp_num = 0x11;
  mlx5dv_mkey mkey{5, 5};
  mlx5::key_state k;
  k.mkey = &mkey;
  to_dv_calls = 0;
  const layout l = layout::list({{mr(0x10000, 4096, 7), 0, 64}});
  for (std::uint64_t ops : {std::uint64_t(0), std::uint64_t(MLX5DV_QP_EX_WITH_RAW_WQE)}) {
    auto r = mlx5::configure_key(k, ops, &rec.qpx, pd1, {1}, l, rw, lim512, to_dv_recorder);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::not_umr_qp);
    INFO(r.error().message());
    CHECK(r.error().message().find("create_umr_qp") != std::string::npos);
  }
  CHECK(to_dv_calls == 0); // refused before the mlx5dv_qp_ex is even computed
  CHECK(rec.calls.empty());
  CHECK(k.phase == mlx5::key_phase::idle);
  // the same call through a UMR QP (its builders filled in) posts the configure
  recorder umr;
  umr.qpx.qp_base.qp_num = 0x11;
  REQUIRE(mlx5::configure_key(k, mlx5::umr_send_ops, &umr.qpx, pd1, {1}, l, rw, lim512, to_dv_recorder)
              .has_value());
  CHECK(to_dv_calls == 1);
  CHECK(umr.calls.size() == 3);
}

TEST_CASE("mlx5 contract: key state follows the submit and the completion", "[unit][mlx5]") {
  recorder rec;
  rec.qpx.qp_base.qp_num = 0x22;
  mlx5dv_mkey mkey{0x4400, 0x4400};
  mlx5::key_state k;
  mlx5::init_key(k, &mkey, true);
  const layout l = layout::list({{mr(0x10000, 4096, 7), 0, 64}});
  auto configure = [&](std::uint64_t id) {
    return mlx5::configure_key(k, mlx5::umr_send_ops, &rec.qpx, pd1, {id, send_flag::signaled}, l, rw,
                               lim512, to_dv_recorder);
  };
  // nothing to invalidate yet
  CHECK(mlx5::invalidate_key(k, &rec.qpx, {9}).error() == errc::not_bound);

  // queued: not configured until the device says so
  REQUIRE(configure(1).has_value());
  CHECK(k.phase == mlx5::key_phase::configuring);
  CHECK(k.live());
  CHECK(k.pending());
  CHECK(configure(2).error() == errc::operation_unconfirmed);
  CHECK(mlx5::invalidate_key(k, &rec.qpx, {3}).error() == errc::operation_unconfirmed);
  // the batch was aborted or its submit failed (ENOMEM full SQ, EINVAL/EOPNOTSUPP builder error,
  // QP before RTS): nothing was posted
  mlx5::cancel_key(k);
  CHECK(k.phase == mlx5::key_phase::idle);
  CHECK_FALSE(k.live());

  // posted, then completed in error: not configured
  REQUIRE(configure(4).has_value());
  CHECK_FALSE(mlx5::complete_key(k, wc_of(4, 0x99)));                               // another QP
  CHECK_FALSE(mlx5::complete_key(k, wc_of(4, 0x22, IBV_WC_SUCCESS, IBV_WC_RECV)));  // a receive
  CHECK_FALSE(mlx5::complete_key(k, wc_of(77, 0x22, IBV_WC_REM_ACCESS_ERR)));       // another WR's error
  CHECK(k.phase == mlx5::key_phase::configuring);
  CHECK(mlx5::complete_key(k, wc_of(4, 0x22, IBV_WC_MW_BIND_ERR)));
  CHECK(k.phase == mlx5::key_phase::idle);
  REQUIRE(configure(5).has_value());
  CHECK(mlx5::complete_key(k, wc_of(5, 0x22, IBV_WC_WR_FLUSH_ERR)));
  CHECK(k.phase == mlx5::key_phase::idle);

  // posted and completed: configured. A UMR completes with opcode MLX5DV_WC_UMR ==
  // IBV_WC_DRIVER1 (mlx5dv.h:437; qp.c:1263 records it for the WQE), whose value has the
  // IBV_WC_RECV bit: it must not be taken for a receive.
  CHECK((unsigned(MLX5DV_WC_UMR) & IBV_WC_RECV) != 0);
  REQUIRE(configure(6).has_value());
  CHECK(mlx5::complete_key(k, wc_of(6, 0x22)));
  CHECK(k.phase == mlx5::key_phase::configured);
  CHECK_FALSE(k.pending());
  CHECK(configure(7).error() == errc::already_bound);

  // an invalidate is not a revocation until it completes
  rec.calls.clear();
  REQUIRE(mlx5::invalidate_key(k, &rec.qpx, {8, send_flag::signaled}).has_value());
  REQUIRE(rec.calls.size() == 1);
  CHECK(rec.calls[0].name == "local_inv");
  CHECK(k.phase == mlx5::key_phase::invalidating);
  CHECK(k.live()); // the key may still work
  mlx5::cancel_key(k); // its batch failed: still configured
  CHECK(k.phase == mlx5::key_phase::configured);
  REQUIRE(mlx5::invalidate_key(k, &rec.qpx, {10}).has_value());
  CHECK(mlx5::complete_key(k, wc_of(10, 0x22, IBV_WC_LOC_PROT_ERR))); // failed: still configured
  CHECK(k.phase == mlx5::key_phase::configured);
  rec.calls.clear();
  REQUIRE(mlx5::invalidate_key(k, &rec.qpx, {11}).has_value()); // asked unsignaled: posted signaled
  CHECK(rec.calls.back().wr_flags == unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  CHECK_FALSE(mlx5::complete_key(k, wc_of(12, 0x22, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE))); // another WR
  CHECK_FALSE(mlx5::complete_key(k, wc_of(11, 0x22, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE))); // same id, a write
  CHECK(k.phase == mlx5::key_phase::invalidating);
  CHECK(mlx5::complete_key(k, wc_of(11, 0x22, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV))); // its own
  CHECK(k.phase == mlx5::key_phase::idle);
  CHECK_FALSE(k.live());
  CHECK_FALSE(mlx5::complete_key(k, wc_of(11, 0x22, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV))); // nothing pending
}

TEST_CASE("mlx5 contract: refused operations leave the key state alone", "[unit][mlx5]") {
  recorder rec;
  rec.qpx.qp_base.qp_num = 0x33;
  mlx5dv_mkey mkey{5, 5};
  mlx5::key_state k;
  k.mkey = &mkey;
  layout too_long = layout::list({{mr(0x10000, 4096, 7), 4000, 200}}); // outside its MR
  CHECK(layout_errc(mlx5::configure_key(k, mlx5::umr_send_ops, &rec.qpx, pd1, {1}, too_long, rw, lim512,
                                        to_dv_recorder)
                        .error()) == errc::out_of_range);
  CHECK(k.phase == mlx5::key_phase::idle);
  CHECK(rec.calls.empty());
  mlx5::key_state none;
  CHECK(mlx5::configure_key(none, mlx5::umr_send_ops, &rec.qpx, pd1, {1}, too_long, rw, lim512,
                            to_dv_recorder)
            .error() == errc::null_handle);
  CHECK(mlx5::invalidate_key(none, &rec.qpx, {}).error() == errc::null_handle);
}

TEST_CASE("mlx5 contract: the context is opened with DEVX, which mlx5dv_create_mkey needs", "[unit][mlx5]") {
  const mlx5dv_context_attr a = mlx5::devx_context_attr();
  CHECK(a.flags == MLX5DV_CONTEXT_FLAGS_DEVX);
  CHECK(a.comp_mask == 0);
  // No device: nothing is opened, the caller falls back (and reports no_device).
  CHECK(mlx5::open_devx(nullptr) == nullptr);
  CHECK(Context::open(static_cast<ibv_device *>(nullptr), {.mlx5_devx = true}).error() == errc::no_device);
}

TEST_CASE("mlx5 contract: Context::open falls back to ibv_open_device when DEVX is refused", "[unit][mlx5]") {
  // Context::open's verb choice (detail::open_context) with stand-in openers that record calls.
  static int devx_calls, plain_calls;
  static ibv_context devx_ctx{}, plain_ctx{};
  auto *dev = reinterpret_cast<ibv_device *>(0x5000);
  auto devx_ok = [](ibv_device *) noexcept { ++devx_calls; return &devx_ctx; };
  auto devx_refused = [](ibv_device *) noexcept -> ibv_context * { ++devx_calls; errno = EPERM; return nullptr; };
  auto plain_ok = [](ibv_device *) noexcept { ++plain_calls; return &plain_ctx; };
  auto plain_fails = [](ibv_device *) noexcept -> ibv_context * { ++plain_calls; errno = ENOMEM; return nullptr; };
  struct row {
    const char *what;
    bool want;
    int which_devx; // 0 ok, 1 refused
    int which_plain; // 0 ok, 1 fails
    ibv_context *ctx;
    bool devx;
    int devx_calls, plain_calls;
  };
  const row rows[] = {
      {"DEVX granted", true, 0, 0, &devx_ctx, true, 1, 0},
      {"DEVX refused: plain open", true, 1, 0, &plain_ctx, false, 1, 1},
      {"DEVX refused, plain fails", true, 1, 1, nullptr, false, 1, 1},
      {"DEVX not asked for", false, 0, 0, &plain_ctx, false, 0, 1},
  };
  for (const row &r : rows) {
    INFO(r.what);
    devx_calls = plain_calls = 0;
    detail::opened_context o;
    if (r.which_devx == 0 && r.which_plain == 0) o = detail::open_context(dev, r.want, devx_ok, plain_ok);
    else if (r.which_devx == 1 && r.which_plain == 0) o = detail::open_context(dev, r.want, devx_refused, plain_ok);
    else o = detail::open_context(dev, r.want, devx_refused, plain_fails);
    CHECK(o.ctx == r.ctx);
    CHECK(o.devx == r.devx);
    CHECK(devx_calls == r.devx_calls);
    CHECK(plain_calls == r.plain_calls);
    if (!o.ctx) CHECK(errno == ENOMEM); // the caller reports the plain open's errno
  }
  // the default asks for DEVX; the UMR probe is on by default, so Capabilities::umr follows
  // what IndirectKey::create can do (a plain ibv_open_device may hold DEVX as well: since
  // rdma-core 29, mlx5.c:2596-2622 of v44.0 asks for it and retries without)
  CHECK(context_options{}.mlx5_devx);
  CHECK(probe_options{}.mlx5_umr);
  CHECK_FALSE(mlx5::probe_umr(nullptr));
}


// ---------------------------------------------------------------------------------------------
// The IndirectKey wrappers on the mlx5 path. The seam: detail::test_access (declared in
// queue_pair.hpp, defined only here) builds a QueuePair over a recorder's ibv_qp_ex and an
// mlx5 IndirectKey over a stand-in mkey, with the recorder's mlx5dv_qp_ex as the key's
// to_dv conversion; SendBatch then drives the recorder's wr_start / wr_complete / wr_abort.

namespace rdmaxx::detail {
struct test_access {
  // No node and no parents: nothing here can become the stand-in QP's child.
  // `scatter_off`: as rdmaxx creates QPs on mlx5 (MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE).
  static QueuePair qp(ibv_qp_ex &q, qp_caps caps, std::uint64_t mlx5_ops, bool scatter_off = true) {
    QueuePair r;
    r.h_ = decltype(r.h_)(&q.qp_base, nullptr, nullptr);
    r.qpx_.reset(&q);
    r.caps_ = caps;
    r.mlx5_send_ops_ = mlx5_ops;
    r.no_scatter_to_cqe_ = scatter_off;
    return r;
  }
  // QueuePair::create's mlx5 path through a stand-in mlx5dv_create_qp.
  template <class Verb>
  static result<QueuePair> create_mlx5(const ProtectionDomain &pd, const CompletionQueue &cq, qp_caps caps,
                                       send_ops ops, Verb verb) {
    return QueuePair::create_mlx5(pd, cq, cq, caps, ops, verb);
  }
  // The stand-in is not the provider's: never reaches ibv_destroy_qp.
  static void disown(QueuePair &q) {
    q.h_.replace(nullptr);
    q.qpx_.release();
  }
  // As IndirectKey::create makes one (a child counter of its own, the tag-update choice).
  // `remote_inv`: created with MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE. The key keeps the
  // mkey's tag (no variant) and has no quarantine (see quarantine_in).
  static IndirectKey mlx5_key(mlx5dv_mkey *mkey, ibv_pd *pd, std::uint32_t max_entries,
                              mlx5::to_dv_qp to_dv, bool update_tag = true, bool remote_inv = true) {
    auto *st = new ikey_state;
    st->backend = umr_backend::mlx5;
    st->pd = pd;
    st->max_entries = max_entries;
    st->mkey = mkey;
    mlx5::init_key(st->mk, mkey, update_tag, remote_inv);
    st->to_dv = to_dv;
    return IndirectKey(st, ProtectionDomain{}, new_parent_node());
  }
  // The key's mkey destroyed through `verb` instead of mlx5dv_destroy_mkey.
  static void destroy_mkey_through(IndirectKey &k, int (*verb)(mlx5dv_mkey *)) { k.st().destroy_mkey = verb; }
  // The key's state (to free one the library kept after a refused destruction).
  static ikey_state *state(const IndirectKey &k) { return k.h_.get(); }
  // configure() reaches the mlx5dv_qp_ex of a batch's QP through `to_dv`.
  static void to_dv_through(IndirectKey &k, mlx5::to_dv_qp to_dv) { k.st().to_dv = to_dv; }
  // The grant mechanism a software key chose at creation.
  static grant_mechanism grant(const IndirectKey &k) { return k.st().grant; }
  static std::uint32_t children(const IndirectKey &k) { return k.h_.live_children(); }
  static const mlx5::key_state &mk(const IndirectKey &k) { return k.st().mk; }
  // A key without tag update checked against the quarantine `q` (as IndirectKey::create sets it).
  static void quarantine_in(IndirectKey &k, mlx5::seen_indexes *q) { k.st().mk.seen = q; }
  // Never mlx5dv_destroy_mkey on the stand-in mkey.
  static void disown(IndirectKey &k) {
    if (k) k.st().mkey = nullptr;
  }
  // A PD and a CQ over stand-ins (no node: a QP made on them registers with nothing).
  static ProtectionDomain pd(ibv_pd &p) {
    ProtectionDomain r;
    r.h_ = decltype(r.h_)(&p, nullptr, nullptr);
    return r;
  }
  static void disown(ProtectionDomain &p) { p.h_.replace(nullptr); }
  static CompletionQueue cq(ibv_cq &c) {
    CompletionQueue r;
    r.h_ = decltype(r.h_)(&c, nullptr, nullptr);
    return r;
  }
  static void disown(CompletionQueue &c) { c.h_.replace(nullptr); }
  // A transition as rdmaxx's own record it (the stand-in's state is set by hand).
  static void note_state(QueuePair &q, ibv_qp_state s) { q.qpx_.set_state(s); }
  // The QP's transitions (to_init ... to_reset, to_error) through `verb` instead of ibv_modify_qp.
  static void modify_through(QueuePair &q, int (*verb)(ibv_qp *, ibv_qp_attr *, int)) { q.modify_ = verb; }
  // A QueuePair made by a stand-in verb: its node is freed, ibv_destroy_qp never called.
  static void disown_created(QueuePair &q) {
    (void)q.h_.release();
    q.qpx_.release();
  }
};
} // namespace rdmaxx::detail

namespace {
using detail::test_access;

ibv_pd *const pd2 = reinterpret_cast<ibv_pd *>(0x2000);
constexpr std::uint32_t umr_qpn = 0x44;

// A recorder-backed UMR QP (connected: RTS) and an mlx5 key of 32 entries on pd1.
struct mlx5_rig {
  recorder rec;
  mlx5dv_mkey mkey{0x7700, 0x7700}; // rkey == lkey, tag 0 (verbs.c:6826-6827)
  QueuePair qp;
  IndirectKey key;
  explicit mlx5_rig(qp_caps caps = {.max_inline_data = 512}, std::uint64_t ops = mlx5::umr_send_ops) {
    rec.qpx.qp_base.qp_num = umr_qpn;
    rec.qpx.qp_base.pd = pd1;
    rec.qpx.qp_base.state = IBV_QPS_RTS;
    qp = test_access::qp(rec.qpx, caps, ops);
    key = test_access::mlx5_key(&mkey, pd1, 32, to_dv_recorder);
    to_dv_calls = 0;
    wr_complete_rc = 0;
  }
  ~mlx5_rig() {
    test_access::disown(key);
    test_access::disown(qp);
    detail::sq_credit::free(rec.qpx.qp_base.qp_context); // install_credit's, if any
    wr_complete_rc = 0;
  }
  // Count the QP's send queue as mlx5::create_umr_qp does (max_post: the granted max_send_wr),
  // `node` as the QP's child counter.
  void install_credit(unsigned max_post, detail::parent_node *node) {
    rec.sq.max_post = max_post;
    REQUIRE(detail::sq_credit::install(&rec.qpx, max_post, node));
  }
  // The QP as mlx5::create_umr_qp leaves it on rdma-core >= 40: in RESET, its wr_complete the
  // provider's error variant (set_qp_operational_state at creation, verbs.c:2652), the credit
  // installed over that (`max_post`, `node`); its transitions go through the stand-in provider
  // (standin_modify_qp), which rewrites wr_complete at each of them. connect() to reach RTS.
  void created_v40(unsigned max_post, detail::parent_node *node) {
    rec.qpx.qp_base.state = IBV_QPS_RESET;
    rec.qpx.qp_base.context = &standin_ctx.v.context;
    rec.qpx.wr_complete = rec.error_complete;
    test_access::note_state(qp, IBV_QPS_RESET);
    test_access::modify_through(qp, standin_modify_qp);
    install_credit(max_post, node);
  }
  // QueuePair::connect (RESET -> INIT -> RTR -> RTS) to a peer on the stand-in's RoCE port.
  [[nodiscard]] result<void> connect() {
    connect_options o;
    o.gid_index = 0;
    endpoint peer;
    peer.qpn = 0x99;
    return qp.connect(peer, o);
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (const call &c : rec.calls) v.push_back(c.name);
    return v;
  }
  [[nodiscard]] mlx5::key_phase phase() const { return test_access::mk(key).phase; }
};
using names = std::vector<std::string>;
const names configure_calls = {"mkey_configure", "set_mkey_access_flags", "set_mkey_layout_list"};
names with(names a, const names &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
} // namespace

TEST_CASE("mlx5 contract: IndirectKey::configure checks everything before any mlx5dv call", "[unit][mlx5][ikey]") {
  const layout one = layout::list({{mr(0x10000, 4096, 7), 0, 64}});
  layout five;
  for (int i = 0; i < 5; ++i) five.add(layout_entry{mr(0x10000, 4096, 7), std::uint64_t(i), 1});
  const layout over_2g = layout::list({{mr(0x100000000, std::uint64_t(1) << 33, 7), 0, std::uint64_t(1) << 31}});
  struct row {
    const char *what;
    qp_caps caps;
    std::uint64_t ops;
    ibv_pd *qp_pd;
    const layout *l;
    access_flags acc;
    errc expect;
  };
  const row rows[] = {
      {"QP on another PD", {.max_inline_data = 512}, mlx5::umr_send_ops, pd2, &one, rw, errc::pd_mismatch},
      {"QP without the UMR send ops", {.max_inline_data = 512}, 0, pd1, &one, rw, errc::not_umr_qp},
      {"QP with other mlx5 ops only", {.max_inline_data = 512}, MLX5DV_QP_EX_WITH_RAW_WQE, pd1, &one, rw,
       errc::not_umr_qp},
      // the limit is the QP's granted max_inline_data (caps()): 60 bytes hold 4 list entries
      {"5 entries, 60 inline bytes granted", {.max_inline_data = 60}, mlx5::umr_send_ops, pd1, &five, rw,
       errc::too_many_entries},
      {"a list entry of 2 GiB", {.max_inline_data = 512}, mlx5::umr_send_ops, pd1, &over_2g, rw,
       errc::provider_limit},
      {"mw_bind is no mkey right", {.max_inline_data = 512}, mlx5::umr_send_ops, pd1, &one,
       rw | access::mw_bind, errc::unknown_access_flag},
  };
  for (const row &r : rows) {
    INFO(r.what);
    mlx5_rig g(r.caps, r.ops);
    g.rec.qpx.qp_base.pd = r.qp_pd;
    auto batch = g.qp.start_send();
    auto res = g.key.configure(batch, g.qp, *r.l, r.acc, {5, send_flag::signaled});
    REQUIRE_FALSE(res.has_value());
    INFO(res.error().message());
    const bool layout_code = res.error().category() == layout_category();
    CHECK((layout_code ? layout_errc(res.error()) : errc(res.error().value())) == r.expect);
    CHECK(g.names() == names{"wr_start"}); // the batch opened, nothing added to it
    CHECK(to_dv_calls == (r.expect == errc::not_umr_qp || r.expect == errc::pd_mismatch ? 0 : 1));
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK_FALSE(g.key.configured());
    CHECK_FALSE(g.key.pending());
  }
  SECTION("null key, null QP, a batch not open or of another QP") {
    mlx5_rig g;
    auto batch = g.qp.start_send();
    IndirectKey none;
    CHECK(none.configure(batch, g.qp, one, rw).error() == errc::null_handle);
    QueuePair no_qp;
    CHECK(g.key.configure(batch, no_qp, one, rw).error() == errc::null_handle);
    auto closed = no_qp.start_send(); // a batch of no QP: never the key's QP's
    CHECK(g.key.configure(closed, g.qp, one, rw).error() == errc::qp_mismatch);
    ibv_qp_ex other{};
    other.qp_base.pd = pd1;
    other.qp_base.qp_num = 0x45;
    other.wr_start = [](ibv_qp_ex *) {};
    other.wr_abort = [](ibv_qp_ex *) {};
    QueuePair other_qp = test_access::qp(other, {.max_inline_data = 512}, mlx5::umr_send_ops);
    auto other_batch = other_qp.start_send();
    CHECK(g.key.configure(other_batch, g.qp, one, rw).error() == errc::qp_mismatch);
    REQUIRE(batch.submit().has_value());
    CHECK(g.key.configure(batch, g.qp, one, rw).error() == errc::wrong_state); // submitted
    CHECK(g.names() == (names{"wr_start", "wr_complete"})); // the other batches are not its QP's
    CHECK(to_dv_calls == 0);
    CHECK(g.phase() == mlx5::key_phase::idle);
    (void)other_batch.submit(); // before RTS: aborted, not completed
    test_access::disown(other_qp);
  }
}

// Two mlx5 keys on one UMR QP with the library's default work request ids: each posts with its
// own id (IndirectKey::wr_id()), so one key's completion handed to both (or to the other only)
// confirms only its own configure. With one shared default id (before), the first completion
// confirmed both while the second UMR was still the device's.
TEST_CASE("mlx5 contract: two keys on one QP, default ids: a completion confirms only its own key", "[unit][mlx5][ikey]") {
  mlx5_rig g;
  mlx5dv_mkey mkey2{0x8800, 0x8800};
  IndirectKey other = test_access::mlx5_key(&mkey2, pd1, 32, to_dv_recorder);
  const layout l = layout::list({{mr(0x10000, 4096, 7), 0, 64}});
  CHECK(g.key.wr_id() != 0);
  CHECK(other.wr_id() != 0);
  CHECK(g.key.wr_id() != other.wr_id());
  {
    auto batch = g.qp.start_send();
    REQUIRE(g.key.configure(batch, g.qp, l, rw).has_value()); // default: own_wr_id
    REQUIRE(other.configure(batch, g.qp, l, rw).has_value());
    REQUIRE(batch.submit().has_value());
  }
  CHECK(g.rec.calls[1].wr_id == g.key.wr_id());
  const auto wcs = g.rec.poll();
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == g.key.wr_id());
  CHECK(wcs[1].wr_id == other.wr_id());
  // Each completion to the wrong key only: nothing confirmed.
  CHECK_FALSE(other.complete(wcs[0]));
  CHECK_FALSE(g.key.complete(wcs[1]));
  CHECK(g.key.pending());
  CHECK(other.pending());
  // The first completion to both keys: only the first key is confirmed.
  CHECK(g.key.complete(wcs[0]));
  CHECK_FALSE(other.complete(wcs[0]));
  CHECK_FALSE(g.key.pending());
  CHECK(other.pending());
  CHECK(other.descriptor().error() == errc::operation_unconfirmed);
  CHECK(other.complete(wcs[1]));
  CHECK_FALSE(other.pending());
  // Another object's own id given explicitly: refused before any mlx5dv call.
  g.rec.calls.clear();
  auto b2 = g.qp.start_send();
  CHECK(g.key.revoke(b2, {other.wr_id(), send_flag::signaled}).error() == errc::foreign_wr_id);
  CHECK(g.names() == names{"wr_start"});
  test_access::disown(other);
}

TEST_CASE("mlx5 contract: IndirectKey posts the configure, then follows its completion", "[unit][mlx5][ikey]") {
  mlx5_rig g;
  const layout l = layout::list({{mr(0x10000, 4096, 7), 8, 100}, {mr(0x20000, 4096, 9), 0, 28}});
  CHECK(g.key.backend() == umr_backend::mlx5);
  CHECK(g.key.limits(g.qp).max_entries == 32);
  auto batch = g.qp.start_send();
  REQUIRE(g.key.configure(batch, g.qp, l, rw, {0x51, send_flag::signaled}).has_value());
  REQUIRE(g.names() == with({"wr_start"}, configure_calls));
  const call &c = g.rec.calls[1];
  CHECK(c.mkey == &g.mkey);
  CHECK(c.wr_id == 0x51);
  CHECK(c.wr_flags == (IBV_SEND_SIGNALED | IBV_SEND_INLINE));
  CHECK(g.rec.calls[2].access == unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
  REQUIRE(g.rec.calls[3].sges.size() == 2);
  CHECK((g.rec.calls[3].sges[0].addr == 0x10008 && g.rec.calls[3].sges[0].length == 100 &&
         g.rec.calls[3].sges[0].lkey == 7));
  CHECK((g.rec.calls[3].sges[1].addr == 0x20000 && g.rec.calls[3].sges[1].length == 28 &&
         g.rec.calls[3].sges[1].lkey == 9));
  CHECK(to_dv_calls == 1);
  // queued, not confirmed: live for local use, no descriptor for a peer yet
  CHECK(g.phase() == mlx5::key_phase::configuring);
  CHECK(g.key.pending());
  CHECK(g.key.configured());
  CHECK(g.key.length() == 128);
  CHECK(g.key.lkey() == 0x7700);
  CHECK(g.key.rkey() == 0x7700);
  CHECK(g.key.descriptor().error() == errc::operation_unconfirmed);
  ibv_sge sge[1];
  // local use waits for the confirmation too: work on another QP is not ordered after the UMR
  CHECK(g.key.sges(0, 128, sge).error() == errc::operation_unconfirmed);
  CHECK(region_ref(g.key).problem == errc::operation_unconfirmed);
  // a second operation while one is unconfirmed: before already_bound, nothing added
  CHECK(g.key.configure(batch, g.qp, l, rw).error() == errc::operation_unconfirmed);
  CHECK(g.key.revoke(batch).error() == errc::operation_unconfirmed);
  REQUIRE(batch.submit().has_value());
  CHECK(g.names() == with(with({"wr_start"}, configure_calls), {"wr_complete"}));

  // completions of another QP, a receive, another WR's failure: ignored
  CHECK_FALSE(g.key.complete(wc_of(0x51, 0x99)));
  CHECK_FALSE(g.key.complete(wc_of(0x51, umr_qpn, IBV_WC_SUCCESS, IBV_WC_RECV)));
  CHECK_FALSE(g.key.complete(wc_of(0x52, umr_qpn, IBV_WC_REM_ACCESS_ERR)));
  CHECK(g.key.pending());
  CHECK(g.key.complete(wc_of(0x51, umr_qpn))); // MLX5DV_WC_UMR
  CHECK(g.phase() == mlx5::key_phase::configured);
  CHECK(g.key.sges(0, 128, sge).value() == 1u);
  CHECK((sge[0].addr == 0 && sge[0].length == 128 && sge[0].lkey == 0x7700));
  // for a QP: only one with scatter-to-CQE disabled (every QP rdmaxx creates on mlx5); a QP
  // with the provider's default (verbs.c:2330-2331) would copy a small receive to address
  // 0 + offset
  CHECK(g.key.sges(g.qp, 0, 128, sge).value() == 1u);
  {
    ibv_qp_ex plain{};
    QueuePair scattering = test_access::qp(plain, {.max_inline_data = 512}, mlx5::umr_send_ops, false);
    CHECK(g.key.sges(scattering, 0, 128, sge).error() == errc::scatter_to_cqe);
    CHECK(g.key.sges(QueuePair{}, 0, 128, sge).error() == errc::scatter_to_cqe);
    test_access::disown(scattering);
    QueuePair ordinary = test_access::qp(plain, {.max_inline_data = 512}, 0, true); // QueuePair::create's
    CHECK(g.key.sges(ordinary, 0, 128, sge).value() == 1u);
    test_access::disown(ordinary);
  }
  CHECK_FALSE(g.key.pending());
  CHECK(g.key.configured());
  auto d = g.key.descriptor();
  REQUIRE(d.has_value());
  REQUIRE(d.value().segments().size() == 1);
  CHECK(d.value().segments()[0].rkey == 0x7700);
  CHECK(d.value().segments()[0].length == 128);
  CHECK(d.value().length() == 128);

  // configured: another configure is refused before the QP is looked at
  g.rec.calls.clear();
  auto b2 = g.qp.start_send();
  CHECK(g.key.configure(b2, g.qp, l, rw).error() == errc::already_bound);
  CHECK(g.names() == names{"wr_start"});

  // the invalidate: a local invalidate of the mkey's lkey; live until its completion
  REQUIRE(g.key.revoke(b2, {0x61, send_flag::signaled}).has_value());
  REQUIRE(g.names() == (names{"wr_start", "local_inv"}));
  CHECK(g.rec.calls[1].key == 0x7700);
  CHECK(g.rec.calls[1].wr_id == 0x61);
  CHECK(g.rec.calls[1].wr_flags == unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  CHECK(g.phase() == mlx5::key_phase::invalidating);
  CHECK(g.key.configured()); // it may still work
  CHECK(g.key.descriptor().error() == errc::operation_unconfirmed);
  CHECK(g.key.sges(0, 1, sge).error() == errc::operation_unconfirmed);
  REQUIRE(b2.submit().has_value());
  CHECK(g.key.complete(wc_of(0x61, umr_qpn, IBV_WC_LOC_PROT_ERR))); // failed: still configured
  CHECK(g.phase() == mlx5::key_phase::configured);
  CHECK(g.key.configured());
  CHECK_FALSE(g.key.pending());
  auto b3 = g.qp.start_send();
  g.rec.calls.clear();
  REQUIRE(g.key.revoke(b3, {0x62}).has_value()); // asked unsignaled: posted signaled
  CHECK(g.rec.calls.back().wr_flags == unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  REQUIRE(b3.submit().has_value());
  CHECK_FALSE(g.key.complete(wc_of(0x63, umr_qpn, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE))); // another WR
  CHECK(g.phase() == mlx5::key_phase::invalidating);
  CHECK(g.key.complete(wc_of(0x62, umr_qpn, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV)));
  CHECK(g.phase() == mlx5::key_phase::idle);
  CHECK_FALSE(g.key.configured());
  CHECK(g.key.length() == 0);
  auto b4 = g.qp.start_send();
  CHECK(g.key.revoke(b4).error() == errc::not_bound);
  CHECK(g.key.revoke().error() == errc::wrong_type); // the software form
}

namespace {
// The send WQE of an RC QP as rdma-core 44 sizes it: _sq_overhead (verbs.c:1463-1530) takes the
// largest operation (a UMR: ctrl + umr ctrl + mkey context + 64, for local invalidate, bind or
// the MR_LIST / MR_INTERLEAVED mlx5 ops), mlx5_calc_send_wqe (verbs.c:1583-1622) adds the inline
// data (or the SGEs) and rounds to 64-byte basic blocks, mlx5_calc_sq_size (verbs.c:1644-1692)
// grants max_inline_data = wqe - overhead - 4 and max_post = pow2(max_send_wr * wqe) / wqe.
struct sq_grant {
  std::uint32_t wqe_size, max_inline_data, max_send_wr;
};
sq_grant provider_grant(std::uint64_t ops, std::uint64_t mlx5_ops, std::uint32_t max_send_wr,
                        std::uint32_t max_send_sge, std::uint32_t max_inline) {
  std::size_t size = sizeof(mlx5_wqe_ctrl_seg);
  if (ops & (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ))
    size = std::max(size, sizeof(mlx5_wqe_ctrl_seg) + sizeof(mlx5_wqe_raddr_seg));
  if (ops & (IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD))
    size = std::max(size, sizeof(mlx5_wqe_ctrl_seg) + sizeof(mlx5_wqe_raddr_seg) + sizeof(mlx5_wqe_atomic_seg));
  if ((ops & (IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV)) ||
      (mlx5_ops & (MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MR_LIST)))
    size = std::max(size, sizeof(mlx5_wqe_ctrl_seg) + sizeof(mlx5_wqe_umr_ctrl_seg) +
                              sizeof(mlx5_wqe_mkey_context_seg) + std::max<std::size_t>(sizeof(mlx5_wqe_umr_klm_seg), 64));
  const std::size_t overhead = size;
  const std::size_t inl = max_inline ? overhead + ((sizeof(mlx5_wqe_inl_data_seg) + max_inline + 15) & ~std::size_t(15)) : 0;
  const std::size_t tot = std::max(overhead + max_send_sge * sizeof(mlx5_wqe_data_seg), inl);
  const std::uint32_t wqe = std::uint32_t((tot + MLX5_SEND_WQE_BB - 1) & ~std::size_t(MLX5_SEND_WQE_BB - 1));
  std::uint32_t wq = 1;
  while (wq < max_send_wr * wqe) wq <<= 1;
  return {wqe, std::uint32_t(wqe - overhead - sizeof(mlx5_wqe_inl_data_seg)), wq / wqe};
}

// mlx5dv_create_qp as the provider behaves: it writes the granted caps back into the attributes
// (verbs.c:1667-1669, 2623), computed as above.
int verb_calls = 0;
ibv_qp_init_attr_ex verb_attr{};
mlx5dv_qp_init_attr verb_dv{};
struct standin_qp {
  ibv_qp_ex qpx{};
  unsigned char verbs_qp_tail[256]{}; // verbs_qp's comp_mask reads 0: ibv_qp_to_qp_ex gives NULL
} made_qp;
ibv_qp *granting_verb(ibv_context *c, ibv_qp_init_attr_ex *a, mlx5dv_qp_init_attr *dv) {
  ++verb_calls;
  verb_attr = *a;
  verb_dv = *dv;
  const sq_grant g = provider_grant(a->send_ops_flags, dv->send_ops_flags, a->cap.max_send_wr,
                                    a->cap.max_send_sge, a->cap.max_inline_data);
  a->cap.max_inline_data = g.max_inline_data;
  a->cap.max_send_wr = g.max_send_wr;
  made_qp.qpx.qp_base.context = c;
  made_qp.qpx.qp_base.pd = a->pd;
  made_qp.qpx.qp_base.qp_num = 0x66;
  return &made_qp.qpx.qp_base;
}
ibv_qp *refusing_verb(ibv_context *, ibv_qp_init_attr_ex *, mlx5dv_qp_init_attr *) {
  ++verb_calls;
  errno = EINVAL;
  return nullptr;
}
} // namespace

TEST_CASE("mlx5 contract: create_umr_qp keeps the inline size the provider granted", "[unit][mlx5][ikey]") {
  ibv_pd raw_pd{};
  ibv_cq raw_cq{};
  ProtectionDomain pd = test_access::pd(raw_pd);
  CompletionQueue cq = test_access::cq(raw_cq);
  verb_calls = 0;
  auto r = mlx5::qp_factory::create_with(pd, cq, cq, {.max_send_wr = 100, .max_inline_data = 60},
                                         send_op::rdma_write, granting_verb);
  REQUIRE(r.has_value());
  QueuePair qp = std::move(r.value());
  CHECK(verb_calls == 1);
  // what the verb was given: the request, the UMR attributes
  CHECK(verb_attr.cap.max_inline_data == 60);
  CHECK(verb_attr.cap.max_send_wr == 100);
  CHECK(verb_attr.pd == &raw_pd);
  CHECK(verb_attr.send_ops_flags == (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_LOCAL_INV));
  CHECK(verb_dv.comp_mask == mlx5::umr_dv_attr().comp_mask);
  CHECK(verb_dv.create_flags == mlx5::umr_dv_attr().create_flags);
  CHECK(verb_dv.send_ops_flags == mlx5::umr_send_ops);
  // what the QueuePair keeps: the grant, not the request. A UMR op makes the overhead 192 bytes,
  // 60 inline bytes fit in a 256-byte WQE exactly: 60 granted; 100 x 256 -> 32 KiB -> 128 WRs.
  CHECK(qp.caps().max_inline_data == 60);
  CHECK(qp.caps().max_send_wr == 128);
  CHECK(qp.mlx5_send_ops() == mlx5::umr_send_ops);
  CHECK(qp.qp_num() == 0x66);
  // and the key's limits through that QP follow the grant: (60 + 4) / 16 = 4 list entries
  mlx5dv_mkey mkey{1, 1};
  IndirectKey key = test_access::mlx5_key(&mkey, &raw_pd, 32, to_dv_recorder);
  CHECK(key.limits(qp).max_entries == 4);
  CHECK(key.limits(qp).max_repeat_entries == 3);
  // rdmaxx's UMR QP against pyverbs' (IBV_QP_EX_WITH_SEND, MKEY_CONFIGURE only): with 512 inline
  // bytes a 768-byte WQE granting 572, against 576 bytes granting 556; both hold 32 list entries
  const sq_grant ours = provider_grant(mlx5::umr_verbs_ops(all_send_ops).native(), mlx5::umr_send_ops, 64, 1, 512);
  const sq_grant py = provider_grant(IBV_QP_EX_WITH_SEND, MLX5DV_QP_EX_WITH_MKEY_CONFIGURE, 64, 1, 512);
  CHECK((ours.wqe_size == 768 && ours.max_inline_data == 572));
  CHECK((py.wqe_size == 576 && py.max_inline_data == 556));
  CHECK(mlx5::inline_list_capacity(ours.max_inline_data) >= layout::capacity);
  test_access::disown(key);
  test_access::disown_created(qp);

  // a refused creation: the verb's errno, nothing kept
  auto bad = mlx5::qp_factory::create_with(pd, cq, cq, {}, all_send_ops, refusing_verb);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error() == std::errc::invalid_argument);
  CHECK(verb_calls == 2);
  // null handles are refused before any verb
  CHECK(mlx5::create_umr_qp(ProtectionDomain{}, cq, cq).error() == errc::null_handle);
  CHECK(mlx5::create_umr_qp(pd, CompletionQueue{}, cq).error() == errc::null_handle);
  CHECK(verb_calls == 2);
  test_access::disown(pd);
  test_access::disown(cq);
}

namespace {
// The scatter-to-CQE decision of rdma-core 44's create_qp (verbs.c:2330-2379): on unless the
// environment says MLX5_SCATTER_TO_CQE=0 (verbs.c:887-896); MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
// (with MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) clears it, EINVAL together with _ALLOW_.
bool provider_scatter_to_cqe = true;
ibv_qp *scatter_verb(ibv_context *c, ibv_qp_init_attr_ex *a, mlx5dv_qp_init_attr *dv) {
  bool scatter = true; // use_scatter_to_cqe(), MLX5_SCATTER_TO_CQE unset
  if (dv && (dv->comp_mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS)) {
    if ((dv->create_flags & MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE) &&
        (dv->create_flags & MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE)) {
      errno = EINVAL;
      return nullptr;
    }
    if (dv->create_flags & MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE) scatter = false;
    if (dv->create_flags & MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE) scatter = true;
  }
  provider_scatter_to_cqe = scatter;
  return granting_verb(c, a, dv);
}
} // namespace

TEST_CASE("mlx5 contract: every RC QP rdmaxx creates on mlx5 has scatter-to-CQE disabled", "[unit][mlx5][ikey]") {
  ibv_pd raw_pd{};
  ibv_cq raw_cq{};
  ProtectionDomain pd = test_access::pd(raw_pd);
  CompletionQueue cq = test_access::cq(raw_cq);
  verb_calls = 0;
  provider_scatter_to_cqe = true;
  // QueuePair::create on an mlx5 device: mlx5dv_create_qp, the verbs attributes unchanged
  auto r = test_access::create_mlx5(pd, cq, {.max_send_wr = 16, .max_inline_data = 64}, all_send_ops, scatter_verb);
  REQUIRE(r.has_value());
  QueuePair qp = std::move(r.value());
  CHECK(verb_calls == 1);
  CHECK_FALSE(provider_scatter_to_cqe); // what the provider then does
  CHECK(verb_dv.comp_mask == MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS);
  CHECK(verb_dv.create_flags == MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE);
  CHECK(verb_attr.send_ops_flags == all_send_ops.native());
  CHECK(verb_attr.qp_type == IBV_QPT_RC);
  CHECK(qp.scatter_to_cqe_disabled());
  CHECK(qp.mlx5_send_ops() == 0); // an ordinary QP: no UMR builders
  // so an mlx5 key's zero-based SGEs may be posted on it, while a configure through it is refused
  mlx5dv_mkey mkey{0x900, 0x900};
  IndirectKey key = test_access::mlx5_key(&mkey, &raw_pd, 4, to_dv_recorder);
  ibv_sge sge[1];
  CHECK(key.sges(qp, 0, 1, sge).error() == errc::wrong_state); // past the QP check: not configured
  test_access::disown(key);
  test_access::disown_created(qp);
  // the UMR QP too
  provider_scatter_to_cqe = true;
  auto u = mlx5::qp_factory::create_with(pd, cq, cq, {}, all_send_ops, scatter_verb);
  REQUIRE(u.has_value());
  CHECK_FALSE(provider_scatter_to_cqe);
  CHECK(u.value().scatter_to_cqe_disabled());
  test_access::disown_created(u.value());
  // a refused creation keeps nothing
  auto bad = test_access::create_mlx5(pd, cq, {}, all_send_ops, refusing_verb);
  CHECK(bad.error() == std::errc::invalid_argument);
  CHECK_FALSE(QueuePair{}.scatter_to_cqe_disabled());
  test_access::disown(pd);
  test_access::disown(cq);
}

// ---------------------------------------------------------------------------------------------
// Issue 21: key state and revocation against the provider model of the recorder (sq_model: the
// send queue, error and flush completions, the tag check of rdma-core 44).

namespace {
const layout one_entry = layout::list({{mr(0x10000, 4096, 7), 0, 64}});
// Post an RDMA write on the open batch of the recorder (as SendBatch's write would).
void post_write(SendBatch &b, std::uint64_t id, bool signaled) {
  ibv_qp_ex *x = b.native_handle();
  x->wr_id = id;
  x->wr_flags = signaled ? IBV_SEND_SIGNALED : 0;
  ::ibv_wr_rdma_write(x, 0x55, 0x1000);
}
// Hand every completion to the key; the number that changed its state.
int feed(IndirectKey &k, const std::vector<ibv_wc> &wcs) {
  int n = 0;
  for (const ibv_wc &wc : wcs) n += k.complete(wc) ? 1 : 0;
  return n;
}
// Configure `k` through the rig's QP and confirm it with the device's completions.
void configure_confirmed(mlx5_rig &g, IndirectKey &k, const layout &l, std::uint64_t id) {
  REQUIRE(k.configure(g.qp, l, rw, {id}).has_value());
  REQUIRE(feed(k, g.rec.poll()) == 1);
  REQUIRE(test_access::mk(k).phase == mlx5::key_phase::configured);
}
void invalidate_confirmed(mlx5_rig &g, IndirectKey &k, std::uint64_t id) {
  REQUIRE(k.revoke(g.qp, {id}).has_value());
  REQUIRE(feed(k, g.rec.poll()) == 1);
  REQUIRE(test_access::mk(k).phase == mlx5::key_phase::idle);
}
} // namespace

namespace {
// mlx5dv_create_mkey as rdma-core 44 answers (verbs.c:6738-6831): the create flags checked
// against those the context allows, UPDATE_TAG only with MLX5_CTX_FLAGS_MKEY_UPDATE_TAG_SUPPORTED
// (6751-6763, EOPNOTSUPP otherwise); num_desc = align(max_entries, 4) (6802) written back
// (6825); lkey = mkey_index << 8 with tag 0, rkey = lkey (6826-6827).
bool ctx_update_tag = true;
std::vector<mlx5dv_mkey_init_attr> mkey_asked;
mlx5dv_mkey made_mkey{};
mlx5dv_mkey *standin_create_mkey(mlx5dv_mkey_init_attr *a) {
  mkey_asked.push_back(*a);
  const unsigned allowed = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE |
                           MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO |
                           (ctx_update_tag ? unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG) : 0u) |
                           MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE;
  if (!a->create_flags || (a->create_flags & ~allowed)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  a->max_entries = std::uint16_t((a->max_entries + 3) & ~3u);
  made_mkey.lkey = made_mkey.rkey = (0x123u << 8) | 0;
  return &made_mkey;
}
} // namespace

TEST_CASE("mlx5 contract: the mkey is created with tag update where the kernel has it", "[unit][mlx5]") {
  ibv_pd raw_pd{};
  for (bool tag : {true, false}) {
    INFO("context with tag update: " << tag);
    ctx_update_tag = tag;
    mkey_asked.clear();
    auto r = mlx5::create_mkey(&raw_pd, mlx5::mkey_entries_for(4), true, standin_create_mkey);
    REQUIRE(r.has_value());
    CHECK(r.value().mkey == &made_mkey);
    CHECK(r.value().update_tag == tag);
    CHECK(r.value().max_entries == 8); // asked 5: rounded up
    REQUIRE(mkey_asked.size() == (tag ? 1u : 2u));
    const unsigned base = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE;
    CHECK(mkey_asked[0].create_flags == (base | MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG));
    CHECK(mkey_asked.back().create_flags == (tag ? base | MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG : base));
    CHECK(mkey_asked[0].max_entries == 5);
    mlx5::key_state k;
    mlx5::init_key(k, r.value().mkey, r.value().update_tag);
    CHECK(k.max_generations() == (tag ? 256u : 1u));
    CHECK(k.first_tag == 0);
  }
  ctx_update_tag = true;
  // another refusal is not retried
  mkey_asked.clear();
  auto refuse = [](mlx5dv_mkey_init_attr *a) -> mlx5dv_mkey * {
    mkey_asked.push_back(*a);
    errno = ENOMEM;
    return nullptr;
  };
  CHECK(mlx5::create_mkey(&raw_pd, 4, false, refuse).error() == std::errc::not_enough_memory);
  CHECK(mkey_asked.size() == 1);
}

TEST_CASE("mlx5 contract: a key of N entries takes N repeat entries", "[unit][mlx5]") {
  // IndirectKey::create asks the provider for mkey_entries_for(N) entries: with 4, the old
  // request of 4 gave num_desc 4 and only 3 repeat entries (the header takes one, qp.c:2175).
  for (std::uint32_t n = 1; n <= layout::capacity; ++n) {
    INFO(n);
    const std::uint32_t granted = (mlx5::mkey_entries_for(n) + 3) & ~3u; // verbs.c:6802
    const auto l = mlx5::limits_for({512, granted});
    CHECK(l.max_entries >= n);
    CHECK(l.max_repeat_entries >= std::min<std::uint32_t>(n, 31)); // 31: what 512 inline bytes hold
  }
  CHECK(mlx5::mkey_entries_for(mlx5::max_mkey_entries) == mlx5::max_mkey_entries); // never wraps
}

TEST_CASE("mlx5 contract: a configured key is a child of its regions and nested keys", "[unit][mlx5][ikey]") {
  mlx5_rig g;
  detail::parent_node mr_a, mr_b;
  region_ref a = mr(0x10000, 4096, 7);
  a.node = &mr_a;
  region_ref b = mr(0x20000, 4096, 9);
  b.node = &mr_b;
  const layout l = layout::list({{a, 0, 64}, {b, 0, 64}, {a, 100, 8}});
  REQUIRE(g.key.configure(g.qp, l, rw, {1}).has_value());
  CHECK(mr_a.live_children() == 2); // posted: the device may be reading the layout already
  CHECK(mr_b.live_children() == 1);
  CHECK(feed(g.key, g.rec.poll(1, IBV_WC_LOC_PROT_ERR)) == 1); // failed: released
  CHECK(mr_a.live_children() == 0);
  CHECK(mr_b.live_children() == 0);
  g.rec.sq.in_error = false;
  wr_complete_rc = ENOMEM; // never posted: released
  CHECK_FALSE(g.key.configure(g.qp, l, rw, {2}).has_value());
  CHECK(mr_a.live_children() == 0);
  wr_complete_rc = 0;
  configure_confirmed(g, g.key, l, 3);
  CHECK(mr_a.live_children() == 2);
  CHECK(mr_b.live_children() == 1);

  // an outer key over this one: the inner key cannot be destroyed under it
  mlx5dv_mkey outer_mkey{0x8800, 0x8800};
  IndirectKey outer = test_access::mlx5_key(&outer_mkey, pd1, 32, to_dv_recorder);
  const layout nested = layout::list({{g.key, 0, 100}, {b, 0, 1}});
  configure_confirmed(g, outer, nested, 4);
  CHECK(test_access::children(g.key) == 1);
  CHECK(mr_b.live_children() == 2);
  CHECK(g.key.destroy().error() == errc::busy);
  CHECK(g.key.configured());
  invalidate_confirmed(g, outer, 5);
  CHECK(test_access::children(g.key) == 0);
  CHECK(mr_b.live_children() == 1);
  invalidate_confirmed(g, g.key, 6);
  CHECK(mr_a.live_children() == 0);
  CHECK(mr_b.live_children() == 0);
  test_access::disown(outer);
}

TEST_CASE("mlx5 contract: destroy() refuses while an operation is unconfirmed", "[unit][mlx5][ikey]") {
  mlx5_rig g;
  REQUIRE(g.key.configure(g.qp, one_entry, rw, {1}).has_value());
  auto r = g.key.destroy();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error() == errc::operation_unconfirmed);
  CHECK(r.error() != errc::busy); // no child is involved
  CHECK(g.key);
  CHECK(g.key.pending());
  REQUIRE(feed(g.key, g.rec.poll()) == 1);
  REQUIRE(g.key.revoke(g.qp, {2}).has_value());
  CHECK(g.key.destroy().error() == errc::operation_unconfirmed);
  REQUIRE(feed(g.key, g.rec.poll()) == 1);
  CHECK_FALSE(g.key.pending()); // destroy() would now reach mlx5dv_destroy_mkey (not on a stand-in)
}

TEST_CASE("mlx5 contract: a peer's send-with-invalidate revokes the key", "[unit][mlx5][ikey]") {
  // cq.c:313-316: MLX5_CQE_RESP_SEND_INV gives IBV_WC_RECV, IBV_WC_WITH_INV and the rkey, on
  // whatever QP the peer's send arrived (not the UMR QP).
  auto recv_inv = [](std::uint32_t rkey, std::uint32_t qpn = umr_qpn) { // the key's own QP
    ibv_wc wc{};
    wc.wr_id = 0x4242;
    wc.qp_num = qpn;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    wc.wc_flags = IBV_WC_WITH_INV;
    wc.invalidated_rkey = rkey;
    return wc;
  };
  mlx5_rig g;
  detail::parent_node mr_a;
  region_ref a = mr(0x10000, 4096, 7);
  a.node = &mr_a;
  const layout l = layout::list({{a, 0, 64}});
  configure_confirmed(g, g.key, l, 1);
  SECTION("configured") {
    ibv_wc plain = recv_inv(g.key.rkey());
    plain.wc_flags = 0; // a plain receive
    CHECK_FALSE(g.key.complete(plain));
    CHECK_FALSE(g.key.complete(recv_inv(g.key.rkey() + 1))); // another key
    CHECK(g.key.configured());
    CHECK(g.key.complete(recv_inv(g.key.rkey())));
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK_FALSE(g.key.configured());
    CHECK(g.key.descriptor().error() == errc::wrong_state);
    CHECK(mr_a.live_children() == 0);
    // the next generation does not answer to the old rkey's invalidation
    const std::uint32_t old = g.key.rkey();
    configure_confirmed(g, g.key, l, 2);
    CHECK_FALSE(g.key.complete(recv_inv(old)));
    CHECK(g.key.configured());
  }
  SECTION("while the local invalidate is unconfirmed") {
    REQUIRE(g.key.revoke(g.qp, {3}).has_value());
    CHECK(g.key.complete(recv_inv(g.key.rkey())));
    CHECK(g.key.pending());
    // the local invalidate of a key the peer already invalidated fails: the key is gone anyway
    CHECK(feed(g.key, g.rec.poll(3, IBV_WC_MW_BIND_ERR)) == 1);
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK(mr_a.live_children() == 0);
  }
}

TEST_CASE("mlx5 contract: without a credit, rdma-core 44 writes a full queue's WR into the last posted one", "[unit][mlx5][ikey]") {
  // mlx5_wq_overflow (qp.c:186-199) counts posted WQEs not yet retired by a polled completion.
  // With the queue full, _common_wqe_init_op sets ENOMEM and the builders go on writing through
  // the last posted WQE (qp.c:2849-2852): what the provider does on a QP whose send queue rdmaxx
  // does not count (the stand-in QP here has no credit; mlx5::create_umr_qp installs one).
  mlx5_rig g;
  g.rec.sq.max_post = 2;
  {
    auto b = g.qp.start_send();
    post_write(b, 0x30, false);
    post_write(b, 0x31, true);
    REQUIRE(b.submit().has_value());
  }
  CHECK(g.qp.send_queue_room() == UINT32_MAX); // not counted
  auto r = g.key.configure(g.qp, one_entry, rw, {0x32});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error() == std::errc::not_enough_memory); // the provider's ENOMEM at submit
  CHECK(g.rec.sq.stale_writes == 1); // the provider's defect: a posted WQE was written to
  CHECK(g.phase() == mlx5::key_phase::idle);
}

TEST_CASE("mlx5 contract: a UMR QP's counted send queue refuses a full queue before any builder", "[unit][mlx5][ikey]") {
  detail::parent_node qp_node, mr_a; // the QP's child counter, a region's: they outlive the key
  mlx5_rig g;
  g.install_credit(2, &qp_node);
  region_ref a = mr(0x10000, 4096, 7);
  a.node = &mr_a;
  const layout la = layout::list({{a, 0, 64}});
  CHECK(g.qp.send_queue_room() == 2);
  {
    auto b = g.qp.start_send();
    post_write(b, 0x30, false); // through the credit: raw ibv_wr_* calls are counted too
    post_write(b, 0x31, true);
    REQUIRE(b.submit().has_value());
  }
  CHECK(g.rec.sq.head - g.rec.sq.tail == 2);
  CHECK(g.qp.send_queue_room() == 0);
  const std::vector<wqe> posted = g.rec.sq.posted;
  g.rec.calls.clear();
  SECTION("a configure is refused at once: no builder, the posted WQEs untouched, the key unchanged") {
    auto batch = g.qp.start_send();
    CHECK(g.key.configure(batch, g.qp, la, rw, {0x32}).error() == errc::send_queue_full);
    CHECK(g.names() == names{"wr_start"});
    CHECK(to_dv_calls == 0);
    CHECK(g.rec.sq.stale_writes == 0);
    CHECK(g.rec.sq.err == 0);
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK(g.key.rkey() == 0x7700); // no tag used
    CHECK(mr_a.live_children() == 0);
    CHECK(qp_node.live_children() == 0);
    REQUIRE(batch.submit().has_value()); // an empty batch
    // the posting form and the invalidate alike
    CHECK(g.key.configure(g.qp, la, rw, {0x33}).error() == errc::send_queue_full);
    CHECK(g.rec.sq.stale_writes == 0);
  }
  SECTION("an ordinary write is refused at submit: neither the op nor its setter reaches the provider") {
    auto batch = g.qp.start_send();
    const ibv_sge s{0x5000, 64, 9};
    batch.write({0x34, send_flag::signaled}, {0x9000, 0x55}, s);
    auto r = batch.submit();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::send_queue_full);
    INFO(r.error().message());
    CHECK(g.names() == (names{"wr_start", "wr_abort"})); // no rdma_write, no set_sge
    CHECK(g.rec.sq.stale_writes == 0);
  }
  // the posted WQEs are as they were
  CHECK(g.rec.sq.posted.size() == posted.size());
  for (std::size_t i = 0; i < posted.size() && i < g.rec.sq.posted.size(); ++i) {
    CHECK(g.rec.sq.posted[i].wr_id == posted[i].wr_id);
    CHECK(g.rec.sq.posted[i].signaled == posted[i].signaled);
    CHECK(g.rec.sq.posted[i].opcode == posted[i].opcode);
  }
  CHECK(g.rec.sq.head - g.rec.sq.tail == 2);

  // room comes back only through completions handed back: the signaled write's retires both
  const auto wcs = g.rec.poll();
  REQUIRE(wcs.size() == 1);
  CHECK(g.qp.send_queue_room() == 0); // polled, not handed back: rdmaxx does not know yet
  ibv_wc other = wcs[0];
  other.qp_num = 0x99;
  CHECK_FALSE(g.qp.retire(other)); // another QP's
  ibv_wc failed = wcs[0];
  failed.status = IBV_WC_REM_ACCESS_ERR;
  CHECK_FALSE(g.qp.retire(failed)); // error completions retire nothing
  ibv_wc recv = wcs[0];
  recv.opcode = IBV_WC_RECV;
  CHECK_FALSE(g.qp.retire(recv)); // a receive
  CHECK(g.qp.retire(wcs[0]));
  CHECK(g.qp.send_queue_room() == 2);
  CHECK_FALSE(g.qp.retire(wcs[0])); // once

  // the configure now goes through; while unconfirmed it holds the QP, its completion retires it
  g.rec.calls.clear();
  REQUIRE(g.key.configure(g.qp, la, rw, {0x35}).has_value());
  CHECK(g.rec.calls[1].tag == 0); // the tag of the refused configure was never used
  CHECK(g.qp.send_queue_room() == 1);
  CHECK(qp_node.live_children() == 1);
  CHECK(mr_a.live_children() == 1);
  {
    // a write behind it, and an invalidate: the queue is full again
    auto b = g.qp.start_send();
    post_write(b, 0x36, false);
    REQUIRE(b.submit().has_value());
  }
  CHECK(g.qp.send_queue_room() == 0);
  REQUIRE(feed(g.key, g.rec.poll()) == 1); // the configure's own completion
  CHECK(g.phase() == mlx5::key_phase::configured);
  CHECK(qp_node.live_children() == 0);
  CHECK(g.qp.send_queue_room() == 1); // the configure retired; the write after it not yet
  REQUIRE(g.key.revoke(g.qp, {0x37}).has_value());
  CHECK(g.qp.send_queue_room() == 0);
  auto b = g.qp.start_send();
  CHECK(g.key.revoke(b, {0x38}).error() == errc::operation_unconfirmed);
  REQUIRE(b.submit().has_value());
  {
    // a flushed invalidate (the QP went to ERR) retires nothing and lets the QP go
    const auto flushed = g.rec.poll(0x36, IBV_WC_REM_ACCESS_ERR);
    REQUIRE(flushed.size() == 2);
    CHECK_FALSE(g.qp.retire(flushed[0]));
    CHECK(feed(g.key, flushed) == 1);
    CHECK(g.phase() == mlx5::key_phase::configured); // the invalidate did not run
    CHECK(qp_node.live_children() == 0);
    CHECK(g.qp.send_queue_room() == 0);
  }
  // RESET gives every credit back (the provider resets its indices, verbs.c:3017-3031); a
  // completion of before the reset retires nothing after it
  detail::sq_credit *c = detail::sq_credit::of(&g.rec.qpx);
  const std::uint32_t old_epoch = c->epoch.load();
  c->reset();
  g.rec.sq = sq_model{};
  g.rec.sq.max_post = 2;
  CHECK(g.qp.send_queue_room() == 2);
  {
    auto b2 = g.qp.start_send();
    post_write(b2, 0x40, true);
    REQUIRE(b2.submit().has_value());
  }
  c->retire_through(0, old_epoch);
  CHECK(g.qp.send_queue_room() == 1);
  c->retire_through(0, c->epoch.load());
  CHECK(g.qp.send_queue_room() == 2);
}

TEST_CASE("mlx5 contract: the credit matches completions by wr_id, never retiring more than the device did", "[unit][mlx5]") {
  mlx5_rig g;
  g.install_credit(8, nullptr);
  auto b = g.qp.start_send();
  post_write(b, 7, false); // the same wr_id, unsignaled
  post_write(b, 1, true);
  post_write(b, 7, true);
  post_write(b, 2, true);
  REQUIRE(b.submit().has_value());
  CHECK(g.qp.send_queue_room() == 4);
  const auto wcs = g.rec.poll();
  REQUIRE(wcs.size() == 3);
  CHECK(wcs[1].wr_id == 7);
  // the completion of the second WR 7 matches the first one: one WR retired, not three
  CHECK(g.qp.retire(wcs[1]));
  CHECK(g.qp.send_queue_room() == 5);
  CHECK(g.qp.retire(wcs[0])); // WR 1: retires through it
  CHECK(g.qp.send_queue_room() == 6);
  CHECK(g.qp.retire(wcs[1])); // now the second 7
  CHECK(g.qp.send_queue_room() == 7);
  CHECK(g.qp.retire(wcs[2]));
  CHECK(g.qp.send_queue_room() == 8);
  // the provider's send opcodes (UMR: IBV_WC_DRIVER1) count; receive-side ones do not
  CHECK(detail::sq_credit::is_send_opcode(IBV_WC_RDMA_WRITE));
  CHECK(detail::sq_credit::is_send_opcode(IBV_WC_LOCAL_INV));
  CHECK(detail::sq_credit::is_send_opcode(IBV_WC_DRIVER1));
  CHECK_FALSE(detail::sq_credit::is_send_opcode(IBV_WC_RECV));
  CHECK_FALSE(detail::sq_credit::is_send_opcode(IBV_WC_RECV_RDMA_WITH_IMM));
  CHECK_FALSE(detail::sq_credit::is_send_opcode(IBV_WC_TM_RECV));
}

// rdma-core v40 (988f90bc1) rewrites ibqp->wr_complete at every state change: the error variant
// at creation and RESET, mlx5_send_wr_complete at RTS (verbs.c:2250-2268, 2652, 3063-3064;
// qp.c:3536-3550). A credit installed once, right after creation, would be bypassed from the first
// RTS on: nothing rung would count, a full queue's configure would reach the builders (stale
// write), and a batch larger than the room would be rung without the work requests refused.
TEST_CASE("mlx5 contract: the credit still counts after rdma-core >= 40 rewrites wr_complete at RTS", "[unit][mlx5][ikey]") {
  detail::parent_node qp_node, mr_a;
  mlx5_rig g;
  g.created_v40(2, &qp_node);
  region_ref a = mr(0x10000, 4096, 7);
  a.node = &mr_a;
  const layout la = layout::list({{a, 0, 64}});
  const ibv_sge s{0x5000, 64, 9};
  REQUIRE(g.connect().has_value());
  CHECK(g.rec.qpx.qp_base.state == IBV_QPS_RTS);
  CHECK(g.rec.qpx.wr_complete != g.rec.real_complete); // routed through the credit again
  CHECK(g.qp.send_queue_room() == 2);
  {
    auto b = g.qp.start_send();
    b.write({0x30}, {0x9000, 0x55}, s);
    b.write({0x31, send_flag::signaled}, {0x9000, 0x55}, s);
    REQUIRE(b.submit().has_value());
  }
  REQUIRE(g.rec.sq.head == 2); // rung by the provider's real wr_complete
  CHECK(g.qp.send_queue_room() == 0);
  g.rec.calls.clear();
  {
    // a full queue: the configure reaches no builder, nothing is written to a posted WQE
    auto batch = g.qp.start_send();
    CHECK(g.key.configure(batch, g.qp, la, rw, {0x32}).error() == errc::send_queue_full);
    CHECK(g.names() == names{"wr_start"});
    CHECK(to_dv_calls == 0);
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK(mr_a.live_children() == 0);
    CHECK(qp_node.live_children() == 0);
  }
  CHECK(g.rec.sq.stale_writes == 0);
  CHECK(g.rec.sq.err == 0);
  // room back through the completion handed back
  const auto wcs = g.rec.poll();
  REQUIRE(wcs.size() == 1);
  CHECK(g.qp.retire(wcs[0]));
  CHECK(g.qp.send_queue_room() == 2);
  g.rec.calls.clear();
  {
    // a batch of three with room for two: refused whole with send_queue_full; the third write
    // reaches neither its builder nor its setter, and nothing of the batch is rung
    auto b = g.qp.start_send();
    b.write({0x33}, {0x9000, 0x55}, s);
    b.write({0x34}, {0x9000, 0x55}, s);
    b.write({0x35, send_flag::signaled}, {0x9000, 0x55}, s);
    auto r = b.submit();
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::send_queue_full);
    CHECK(g.names() == (names{"wr_start", "rdma_write", "set_sge", "rdma_write", "set_sge", "wr_abort"}));
  }
  CHECK(g.rec.sq.head == 2);
  CHECK(g.rec.sq.posted.empty());
  CHECK(g.rec.sq.stale_writes == 0);
  CHECK(g.qp.send_queue_room() == 2);

  // a configure that fits goes through, and its completion gives its room back
  REQUIRE(g.key.configure(g.qp, la, rw, {0x36}).has_value());
  CHECK(g.qp.send_queue_room() == 1);
  REQUIRE(feed(g.key, g.rec.poll()) == 1);
  CHECK(g.qp.send_queue_room() == 2);
  invalidate_confirmed(g, g.key, 0x37);

  SECTION("reset_and_reconnect: RESET writes the error variant, RTS the real one; the credit holds") {
    {
      auto b = g.qp.start_send();
      b.write({0x38, send_flag::signaled}, {0x9000, 0x55}, s);
      REQUIRE(b.submit().has_value());
    }
    CHECK(g.qp.send_queue_room() == 1);
    REQUIRE(g.qp.reset_and_reconnect().has_value()); // the write's CQE is dropped (mlx5_cq_clean)
    CHECK(g.rec.sq.head == 0);
    CHECK(g.rec.qpx.wr_complete != g.rec.real_complete);
    CHECK(g.qp.send_queue_room() == 2); // every credit back, as the provider's indices
    {
      auto b = g.qp.start_send();
      b.write({0x39}, {0x9000, 0x55}, s);
      b.write({0x3a, send_flag::signaled}, {0x9000, 0x55}, s);
      REQUIRE(b.submit().has_value());
    }
    CHECK(g.qp.send_queue_room() == 0);
    g.rec.calls.clear();
    CHECK(g.key.configure(g.qp, la, rw, {0x3b}).error() == errc::send_queue_full);
    CHECK(g.names() == (names{"wr_start", "wr_abort"})); // the dropped batch of the posting form
    CHECK(g.rec.sq.stale_writes == 0);
    CHECK(g.phase() == mlx5::key_phase::idle);
  }
  SECTION("a transition rdmaxx did not make (raw ibv_modify_qp, devx): wr_start takes it back") {
    // the provider rewrote wr_complete behind rdmaxx's back (its state record is unchanged)
    g.rec.qpx.wr_complete = g.rec.real_complete;
    {
      auto b = g.qp.start_send();
      b.write({0x3c}, {0x9000, 0x55}, s);
      b.write({0x3d, send_flag::signaled}, {0x9000, 0x55}, s);
      REQUIRE(b.submit().has_value());
    }
    CHECK(g.rec.qpx.wr_complete != g.rec.real_complete);
    CHECK(g.qp.send_queue_room() == 0);
    CHECK(g.key.configure(g.qp, la, rw, {0x3e}).error() == errc::send_queue_full);
    CHECK(g.rec.sq.stale_writes == 0);
  }
}

// RESET drops a QP's unpolled CQEs (mlx5_cq_clean, verbs.c:3019-3026): a key operation whose
// completion is dropped would stay unconfirmed forever (configure and invalidate answering
// operation_unconfirmed, destroy() refused, the QP busy). to_reset() and reset_and_reconnect()
// answer errc::busy instead, change nothing, and go through once the operation's completion was
// handed over: in ERR its flushed completion rolls it back.
TEST_CASE("mlx5 contract: a reset with an unconfirmed key operation answers busy; ERR flushes it", "[unit][mlx5][ikey]") {
  detail::parent_node qp_node;
  mlx5_rig g;
  g.created_v40(8, &qp_node);
  REQUIRE(g.connect().has_value());
  SECTION("an unconfirmed configure") {
    REQUIRE(g.key.configure(g.qp, one_entry, rw, {0x50}).has_value());
    g.rec.calls.clear();
    CHECK(g.qp.to_reset().error() == errc::busy);
    CHECK(g.qp.reset_and_reconnect().error() == errc::busy);
    CHECK(g.names().empty()); // no ibv_modify_qp: its completion is still there
    CHECK(g.rec.qpx.qp_base.state == IBV_QPS_RTS);
    CHECK(g.rec.sq.posted.size() == 1);
    CHECK(g.key.pending());
    // giving up on it: ERR flushes the configure, whose completion rolls it back
    REQUIRE(g.qp.to_error().has_value());
    CHECK(feed(g.key, g.rec.poll()) == 1);
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK(qp_node.live_children() == 0);
    REQUIRE(g.qp.reset_and_reconnect().has_value());
    configure_confirmed(g, g.key, one_entry, 0x51); // the key works again, on a new tag
    CHECK(g.key.rkey() == 0x7701); // the flushed configure's tag stays used
  }
  SECTION("an unconfirmed invalidate") {
    configure_confirmed(g, g.key, one_entry, 0x52);
    REQUIRE(g.key.revoke(g.qp, {0x53}).has_value());
    CHECK(g.qp.to_reset().error() == errc::busy);
    CHECK(g.key.pending());
    // its own completion handed over: the reset goes through
    CHECK(feed(g.key, g.rec.poll()) == 1);
    CHECK(g.phase() == mlx5::key_phase::idle);
    REQUIRE(g.qp.to_reset().has_value());
    CHECK(g.rec.qpx.qp_base.state == IBV_QPS_RESET);
  }
  SECTION("other work requests alone do not hold the reset (their completions may be dropped)") {
    {
      auto b = g.qp.start_send();
      post_write(b, 0x54, true);
      REQUIRE(b.submit().has_value());
    }
    REQUIRE(g.qp.to_reset().has_value());
    CHECK(g.rec.sq.posted.empty());
    CHECK(g.qp.send_queue_room() == 8);
  }
}

// cancel_pending() said "no effect otherwise", yet after a successful submit it undid the state
// and gave back the tag the posted UMR may have written (the next configure would then re-issue
// it). Once posted, only the operation's own completion settles it.
TEST_CASE("mlx5 contract: cancel_pending() after a successful submit changes nothing", "[unit][mlx5][ikey]") {
  detail::parent_node qp_node;
  mlx5_rig g;
  g.install_credit(8, &qp_node);
  REQUIRE(g.key.configure(g.qp, one_entry, rw, {0x60}).has_value()); // posted
  g.key.cancel_pending();
  CHECK(g.phase() == mlx5::key_phase::configuring);
  CHECK(g.key.pending());
  CHECK(g.key.configured());
  CHECK(qp_node.live_children() == 1); // still holds the QP
  CHECK(g.qp.send_queue_room() == 7);  // and its room
  CHECK(feed(g.key, g.rec.poll()) == 1); // the device ran it: confirmed
  CHECK(g.phase() == mlx5::key_phase::configured);
  CHECK(g.qp.send_queue_room() == 8);
  invalidate_confirmed(g, g.key, 0x61);
  // the second generation: its tag stays used
  REQUIRE(g.key.configure(g.qp, one_entry, rw, {0x62}).has_value());
  CHECK(g.key.rkey() == 0x7701);
  g.key.cancel_pending();
  CHECK(g.key.rkey() == 0x7701);
  CHECK(g.key.lkey() == 0x7701);
  CHECK(g.phase() == mlx5::key_phase::configuring);
  CHECK(feed(g.key, g.rec.poll()) == 1);
  CHECK(g.phase() == mlx5::key_phase::configured);
  // a posted invalidate: the key may already be revoked, and stays invalidating until its completion
  REQUIRE(g.key.revoke(g.qp, {0x63}).has_value());
  g.key.cancel_pending();
  CHECK(g.phase() == mlx5::key_phase::invalidating);
  CHECK(g.key.descriptor().error() == errc::operation_unconfirmed);
  CHECK(feed(g.key, g.rec.poll()) == 1);
  CHECK(g.phase() == mlx5::key_phase::idle);
  // while the batch is still open it changes nothing either; dropping the batch undoes the
  // configure (never posted: its tag given back)
  {
    auto b = g.qp.start_send();
    REQUIRE(g.key.configure(b, g.qp, one_entry, rw, {0x64}).has_value());
    CHECK(g.key.rkey() == 0x7702);
    g.key.cancel_pending();
    CHECK(g.phase() == mlx5::key_phase::configuring);
  }
  CHECK(g.phase() == mlx5::key_phase::idle);
  CHECK(g.key.rkey() == 0x7701);
  CHECK(qp_node.live_children() == 0);
  CHECK(g.qp.send_queue_room() == 8);
}

namespace {
std::vector<mlx5dv_mkey *> destroyed_mkeys;
int record_destroy_mkey(mlx5dv_mkey *m) {
  destroyed_mkeys.push_back(m);
  return 0;
}
std::vector<destroy_failure> key_reports;
void capture_key_report(const destroy_failure &f) noexcept { key_reports.push_back(f); }
} // namespace

// The destructor and the move assignment destroyed the mkey under a posted UMR or local
// invalidate (only destroy() checked). On a counted queue (a UMR QP from create_umr_qp) the
// destruction is now deferred, as a parent's with live children, until the queue shows the
// operation ended; on a queue that is not counted the mkey is kept and reported.
TEST_CASE("mlx5 contract: a key destroyed or assigned over under a posted operation defers the mkey's destruction", "[unit][mlx5][ikey]") {
  struct restore {
    destroy_failure_handler h;
    ~restore() { set_destroy_failure_handler(h); }
  } const r{set_destroy_failure_handler(&capture_key_report)};
  detail::parent_node qp_node, mr_a;
  region_ref a = mr(0x10000, 4096, 7);
  a.node = &mr_a;
  const layout la = layout::list({{a, 0, 64}});
  mlx5dv_mkey m2{0x8800, 0x8800};
  destroyed_mkeys.clear();
  key_reports.clear();
  auto make = [&] {
    IndirectKey k = test_access::mlx5_key(&m2, pd1, 32, to_dv_recorder);
    test_access::destroy_mkey_through(k, record_destroy_mkey);
    return k;
  };
  auto deferred = [&] { // the report of a deferred destruction: one QueuePair still uses it
    REQUIRE(key_reports.size() == 1);
    CHECK(std::string(key_reports[0].object) == "IndirectKey");
    CHECK(key_reports[0].error == errc::busy);
    CHECK(key_reports[0].live_children == 1);
    CHECK(key_reports[0].children[std::size_t(child_kind::queue_pair)] == 1);
  };
  const std::vector<mlx5dv_mkey *> once{&m2};
  SECTION("the destructor under a posted configure: destroyed when its completion is retired") {
    mlx5_rig g;
    g.install_credit(8, &qp_node);
    {
      IndirectKey k = make();
      REQUIRE(k.configure(g.qp, la, rw, {0x70}).has_value());
      CHECK(qp_node.live_children() == 1);
    }
    CHECK(destroyed_mkeys.empty()); // the UMR may still run
    deferred();
    CHECK(mr_a.live_children() == 1);    // the mkey may still reach the region
    CHECK(qp_node.live_children() == 0); // the QP is let go at once
    CHECK(detail::sq_credit::of(&g.rec.qpx)->key_ops.load() == 0); // its reset is not held
    // the device runs it; its completion (no key left to take it) handed to the QP
    const auto wcs = g.rec.poll();
    REQUIRE(wcs.size() == 1);
    CHECK(g.qp.retire(wcs[0]));
    CHECK(destroyed_mkeys == once);
    CHECK(mr_a.live_children() == 0);
    CHECK(key_reports.size() == 1);
  }
  SECTION("a later completion retires it too") {
    mlx5_rig g;
    g.install_credit(8, &qp_node);
    {
      IndirectKey k = make();
      REQUIRE(k.configure(g.qp, la, rw, {0x71}).has_value());
    }
    {
      auto b = g.qp.start_send();
      post_write(b, 0x72, true);
      REQUIRE(b.submit().has_value());
    }
    const auto wcs = g.rec.poll();
    REQUIRE(wcs.size() == 2);
    CHECK(g.qp.retire(wcs[1])); // the write's: RC completes in order, so the UMR ended before it
    CHECK(destroyed_mkeys == once);
  }
  SECTION("an error completion retires nothing: the QP's reset settles it") {
    mlx5_rig g;
    g.created_v40(8, &qp_node);
    REQUIRE(g.connect().has_value());
    IndirectKey k = make();
    configure_confirmed(g, k, la, 0x73);
    REQUIRE(k.revoke(g.qp, {0x74}).has_value());
    k = IndirectKey{}; // move assignment over the key with a posted invalidate
    CHECK(destroyed_mkeys.empty());
    deferred();
    REQUIRE(g.qp.to_error().has_value());
    const auto flushed = g.rec.poll();
    REQUIRE(flushed.size() == 1);
    CHECK_FALSE(g.qp.retire(flushed[0]));
    CHECK(destroyed_mkeys.empty());
    REQUIRE(g.qp.to_reset().has_value()); // not held by the orphaned invalidate
    CHECK(destroyed_mkeys == once);
    CHECK(mr_a.live_children() == 0);
  }
  SECTION("the QP destroyed first settles it") {
    {
      mlx5_rig g;
      g.install_credit(8, &qp_node);
      IndirectKey k = make();
      REQUIRE(k.configure(g.qp, la, rw, {0x75}).has_value());
      k = IndirectKey{};
      CHECK(destroyed_mkeys.empty());
    } // the rig frees the QP's credit as the QP's destruction does (after ibv_destroy_qp)
    CHECK(destroyed_mkeys == once);
    CHECK(mr_a.live_children() == 0);
  }
  SECTION("its completion retired before the key goes: destroyed at once, nothing reported") {
    mlx5_rig g;
    g.install_credit(8, &qp_node);
    IndirectKey k = make();
    REQUIRE(k.configure(g.qp, la, rw, {0x76}).has_value());
    const auto wcs = g.rec.poll();
    REQUIRE(wcs.size() == 1);
    CHECK(g.qp.retire(wcs[0])); // handed to the QP, not to the key
    CHECK(k.pending());
    k = IndirectKey{};
    CHECK(destroyed_mkeys == once);
    CHECK(key_reports.empty());
  }
  SECTION("a queue that is not counted: the mkey is kept for good and reported") {
    mlx5_rig g; // no credit
    detail::ikey_state *kept = nullptr;
    {
      IndirectKey k = make();
      REQUIRE(k.configure(g.qp, la, rw, {0x77}).has_value());
      kept = test_access::state(k);
    }
    CHECK(destroyed_mkeys.empty());
    REQUIRE(key_reports.size() == 1);
    CHECK(key_reports[0].error == std::errc::device_or_resource_busy);
    CHECK(key_reports[0].live_children == 0);
    CHECK(mr_a.live_children() == 1);
    if (destroyed_mkeys.empty()) { // freed here for the leak checker
      kept->mkey = nullptr;
      delete kept;
    }
  }
  SECTION("confirmed first: the destructor destroys the mkey, nothing reported") {
    mlx5_rig g;
    g.install_credit(8, &qp_node);
    {
      IndirectKey k = make();
      configure_confirmed(g, k, la, 0x78);
    }
    CHECK(destroyed_mkeys == once);
    CHECK(key_reports.empty());
    CHECK(mr_a.live_children() == 0);
  }
}

namespace {
// mlx5dv_devx_general_cmd as the firmware answers QUERY_HCA_CAP: the command checked as
// rdma-core 44 builds it (get_hca_general_caps, verbs.c:3784-3796), the reply a 16-byte header
// and the capability union with cmd_hca_cap.umr_modify_atomic_disabled at bit 0x208
// (mlx5_ifc.h:819-983, 1499-1508; DEVX_SET/GET are big-endian, bit 0 the MSB of dword 0).
int devx_calls = 0;
bool atomic_disabled = false;
bool indirect_disabled = false;   // umr_indirect_mkey_disabled, cmd_hca_cap bit 0x209
bool repeat_disabled = false;     // repeated_block_disabled, bit 0x206
std::uint8_t max_indirection = 0; // max_indirection, bits 0x100-0x107 (0: none reported)
int standin_devx_cmd(ibv_context *, const void *in, size_t inlen, void *out, size_t outlen) {
  ++devx_calls;
  REQUIRE(inlen == 16);
  REQUIRE(outlen == 16 + 4096);
  const auto *i = static_cast<const std::uint32_t *>(in);
  CHECK(be32toh(i[0]) >> 16 == 0x100u); // MLX5_CMD_OP_QUERY_HCA_CAP
  CHECK((be32toh(i[1]) & 0xffff) == 1u); // MLX5_CAP_GENERAL << 1 | HCA_CAP_OPMOD_GET_CUR
  auto *o = static_cast<std::uint32_t *>(out);
  // a device with every neighbouring UMR cap bit set, so that an off-by-one reads a 1
  auto set_bit = [o](std::size_t cap_bit) {
    const std::size_t b = 128 + cap_bit;
    o[b / 32] = htobe32(be32toh(o[b / 32]) | (1u << (31 - b % 32)));
  };
  set_bit(0x205); // ib_striding_wq
  set_bit(0x207); // umr_modify_entity_size_disabled
  set_bit(0x20a); // umr_fence
  if (indirect_disabled) set_bit(0x209); // umr_indirect_mkey_disabled
  if (repeat_disabled) set_bit(0x206);   // repeated_block_disabled
  if (atomic_disabled) set_bit(0x208);
  // max_indirection, bits 0x100-0x107, between log_max_eq (0xfc-0xff) and fixed_buffer_size
  // (0x108), both set
  for (std::size_t b = 0xfc; b < 0x100; ++b) set_bit(b);
  set_bit(0x108);
  for (std::size_t b = 0; b < 8; ++b)
    if (max_indirection & (0x80u >> b)) set_bit(0x100 + b);
  return 0;
}
int failing_devx_cmd(ibv_context *, const void *, size_t, void *, size_t) {
  ++devx_calls;
  return EPERM;
}
} // namespace

TEST_CASE("mlx5 contract: umr_modify_atomic_disabled is read from the HCA capabilities", "[unit][mlx5]") {
  ibv_context ctx{};
  devx_calls = 0;
  atomic_disabled = false;
  indirect_disabled = repeat_disabled = true; // both neighbours of 0x208 set
  CHECK(mlx5::query_umr_atomic(&ctx, standin_devx_cmd) == mlx5::umr_atomic::allowed);
  atomic_disabled = true;
  CHECK(mlx5::query_umr_atomic(&ctx, standin_devx_cmd) == mlx5::umr_atomic::disabled);
  CHECK(mlx5::query_umr_atomic(&ctx, failing_devx_cmd) == mlx5::umr_atomic::unknown);
  CHECK(mlx5::query_umr_atomic(nullptr, standin_devx_cmd) == mlx5::umr_atomic::unknown);
  CHECK(devx_calls == 3);
  atomic_disabled = false;
  // the command's errno for the caller that fails closed on it (IndirectKey::create, the probe)
  int err = -1;
  CHECK(mlx5::query_umr_atomic(&ctx, failing_devx_cmd, &err) == mlx5::umr_atomic::unknown);
  CHECK(err == EPERM);
  CHECK(mlx5::query_umr_atomic(&ctx, standin_devx_cmd, &err) == mlx5::umr_atomic::allowed);
  CHECK(err == 0);
  CHECK(mlx5::query_umr_atomic(nullptr, standin_devx_cmd, &err) == mlx5::umr_atomic::unknown);
  CHECK(err == EINVAL);
  indirect_disabled = repeat_disabled = false;
}

// ---------------------------------------------------------------------------------------------
// The grant contract (test/grant_contract.hpp) for the mlx5 key, device-free: the six properties
// the rxe suite checks for StrictGrant, a GrantPool lease and a software IndirectKey segment
// (test/rxe/test_grant_contract.cpp), through an adapter of the same shape, against the
// recorder's model of rdma-core 44's mlx5 provider. What the device itself does with the mkey
// (that it bounds the bytes, refuses a re-tagged key's old rkey, really reports these
// completions) only hardware shows: not run on hardware.

namespace {
// The owner's memory: a stand-in region of 64 KiB; the grant covers [off, off + len).
struct owner_region {
  static constexpr std::uint64_t iova = 0x100000, n = 65536, off = 8192, len = 4096;
  static constexpr std::uint32_t lkey = 0x31;
};
constexpr access_flags grant_rights = access::remote_write;
constexpr access_flags grant_access = access::local_write | grant_rights;

// The mlx5 IndirectKey of a rig as a grant form: grant = configure (signaled whatever asked),
// confirmed = its own completion handed to complete() (descriptor() refuses before), revoke =
// a local invalidate, done at its own completion.
struct mlx5_key_form {
  static constexpr const char *name = "mlx5 IndirectKey";
  static constexpr bool confirms_grant = true;
  static constexpr bool revoke_is_posted = true;
  mlx5_rig &g;
  layout granted = layout::list(
      {{mr(owner_region::iova, owner_region::n, owner_region::lkey), owner_region::off, owner_region::len}});
  // The key the configure names (zero-based, as descriptor() will say once it is confirmed).
  remote_descriptor grant(SendBatch &b, std::uint64_t id) {
    REQUIRE(g.key.configure(b, g.qp, granted, grant_access, {id}).has_value());
    return {0, g.key.length(), g.key.rkey(), grant_rights, true};
  }
  [[nodiscard]] bool confirmed() const { return g.key.configured() && g.key.descriptor().has_value(); }
  [[nodiscard]] bool idle() const { return test_access::mk(g.key).phase == mlx5::key_phase::idle; }
  void complete(const ibv_wc &wc) { (void)g.key.complete(wc); }
  void post_revoke(std::uint64_t id) { REQUIRE(g.key.revoke(g.qp, {id}).has_value()); }
};
static_assert(grant_contract::grant_form<mlx5_key_form>);

// Grant through a submitted batch and confirm with what the device completes.
remote_descriptor grant_confirmed(mlx5_key_form &f, std::uint64_t id) {
  auto b = f.g.qp.start_send();
  const remote_descriptor d = f.grant(b, id);
  REQUIRE(b.submit().has_value());
  for (const ibv_wc &wc : f.g.rec.poll()) f.complete(wc);
  REQUIRE(f.confirmed());
  return d;
}
void revoke_confirmed(mlx5_key_form &f, std::uint64_t id) {
  f.post_revoke(id);
  for (const ibv_wc &wc : f.g.rec.poll()) f.complete(wc);
  REQUIRE(f.idle());
}
} // namespace

TEST_CASE(GRANT_CONTRACT_EXACT_BYTES " (mlx5 key, device-free)", "[unit][mlx5][ikey][grant-contract]") {
  mlx5_rig g;
  mlx5_key_form f{g};
  g.rec.calls.clear();
  const remote_descriptor d = grant_confirmed(f, 11);
  // One configure whose layout is exactly the granted bytes of the region, with exactly the
  // rights asked (no read, no atomic): what the device is told to reach.
  REQUIRE(g.names() == with(with({"wr_start"}, configure_calls), {"wr_complete"}));
  REQUIRE(g.rec.calls[3].sges.size() == 1);
  const ibv_sge &sg = g.rec.calls[3].sges[0];
  CHECK(sg.addr == owner_region::iova + owner_region::off);
  CHECK(sg.length == owner_region::len);
  CHECK(sg.lkey == owner_region::lkey);
  CHECK(g.rec.calls[2].access == unsigned(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  // The peer's view: zero-based, exactly the granted length; the last 64 bytes are in, one byte
  // past them is not.
  const ikey_descriptor desc = g.key.descriptor().value();
  REQUIRE(desc.segments().size() == 1);
  CHECK(desc.segments()[0].rkey == d.rkey);
  CHECK(desc.segments()[0].length == owner_region::len);
  CHECK(desc.length() == owner_region::len);
  CHECK((d.zero_based && d.addr == 0 && d.length == owner_region::len));
  CHECK(d.slice(owner_region::len - 64, 64).has_value());
  CHECK(d.slice(owner_region::len - 63, 64).error() == errc::out_of_range);
  revoke_confirmed(f, 12);
  // Bytes past the region, or a region without the right: refused before any builder, the key
  // left as it was.
  const layout past = layout::list(
      {{mr(owner_region::iova, owner_region::n, owner_region::lkey), owner_region::n - owner_region::len + 1,
        owner_region::len}});
  const layout no_right = layout::list(
      {{mr(owner_region::iova, owner_region::n, owner_region::lkey, access::local_write | access::remote_read),
        owner_region::off, owner_region::len}});
  g.rec.calls.clear();
  auto b = g.qp.start_send();
  CHECK(layout_errc(g.key.configure(b, g.qp, past, grant_access, {13}).error()) == errc::out_of_range);
  CHECK(layout_errc(g.key.configure(b, g.qp, no_right, grant_access, {14}).error()) == errc::missing_access);
  CHECK(g.names() == names{"wr_start"});
  CHECK(f.idle());
  CHECK(g.key.rkey() == 0x7700); // no tag used
  REQUIRE(b.submit().has_value());
}

TEST_CASE(GRANT_CONTRACT_OWN_COMPLETION " (mlx5 key, device-free)", "[unit][mlx5][ikey][grant-contract]") {
  mlx5_rig g;
  mlx5_key_form f{g};
  SECTION("the form's steps: another work request's completion, or its wr_id on another QP, confirms nothing") {
    auto b = g.qp.start_send();
    const remote_descriptor d = f.grant(b, 21);
    REQUIRE(b.submit().has_value());
    const auto wcs = g.rec.poll();
    REQUIRE(wcs.size() == 1);
    const ibv_wc own = wcs[0];
    grant_contract::foreign_completions_confirm_nothing(f, own);
    CHECK(g.key.descriptor().error() == errc::operation_unconfirmed);
    f.complete(own);
    REQUIRE(f.confirmed());
    CHECK(g.key.descriptor().value().segments()[0].rkey == d.rkey);
    f.post_revoke(22);
    const auto inv = g.rec.poll();
    REQUIRE(inv.size() == 1);
    ibv_wc other = inv[0];
    other.wr_id ^= 0x40;
    f.complete(other);
    CHECK_FALSE(f.idle()); // not revoked as far as the key knows: the buffer is not free yet
    CHECK(g.key.configured());
    f.complete(inv[0]);
    CHECK(f.idle());
  }
  SECTION("a configure behind two writes, one with its wr_id") {
    auto batch = g.qp.start_send();
    post_write(batch, 0x90, true);
    post_write(batch, 0x91, true); // the same wr_id as the configure, another opcode
    // asked unsignaled: posted signaled all the same, or no completion would ever say it ran
    REQUIRE(g.key.configure(batch, g.qp, one_entry, rw, {0x91}).has_value());
    CHECK(g.rec.calls.back().name == "set_mkey_layout_list");
    CHECK(g.rec.calls[3].name == "mkey_configure");
    CHECK(g.rec.calls[3].wr_flags == (IBV_SEND_SIGNALED | IBV_SEND_INLINE));
    REQUIRE(batch.submit().has_value());
    SECTION("the earlier writes complete first") {
      const auto wcs = g.rec.poll();
      REQUIRE(wcs.size() == 3);
      CHECK(wcs[2].opcode == IBV_WC_DRIVER1); // MLX5DV_WC_UMR (cq.c:193-196)
      CHECK_FALSE(g.key.complete(wcs[0]));
      CHECK_FALSE(g.key.complete(wcs[1])); // wr_id 0x91, IBV_WC_RDMA_WRITE
      CHECK(g.key.pending());
      CHECK(g.key.descriptor().error() == errc::operation_unconfirmed); // no rkey before the UMR ran
      CHECK(g.key.complete(wcs[2]));
      CHECK(g.phase() == mlx5::key_phase::configured);
      CHECK(g.key.descriptor().value().segments()[0].rkey == 0x7700);
    }
    SECTION("an earlier write fails: the QP goes to ERR, the configure is flushed and undone") {
      const auto wcs = g.rec.poll(0x90, IBV_WC_REM_ACCESS_ERR);
      REQUIRE(wcs.size() == 3);
      CHECK(wcs[1].status == IBV_WC_WR_FLUSH_ERR);
      CHECK(wcs[2].status == IBV_WC_WR_FLUSH_ERR);
      CHECK_FALSE(g.key.complete(wcs[0])); // another wr_id: the configure's own completion follows
      CHECK(g.key.pending());
      // An error completion carries no opcode (ibv_poll_cq(3)), so the write's flush with the
      // configure's wr_id undoes it: right all the same, the QP is in ERR and the configure
      // behind it cannot run. Success needs the opcode too (above).
      CHECK(g.key.complete(wcs[1]));
      CHECK(g.phase() == mlx5::key_phase::idle);
      CHECK_FALSE(g.key.complete(wcs[2])); // nothing pending any more
      CHECK_FALSE(g.key.configured());
      CHECK(g.key.descriptor().error() == errc::wrong_state);
    }
  }
  SECTION("an invalidate behind a write is done only at its own completion") {
    configure_confirmed(g, g.key, one_entry, 0x1);
    auto batch = g.qp.start_send();
    post_write(batch, 0x20, true);
    REQUIRE(g.key.revoke(batch, {0x21}).has_value()); // asked unsignaled
    CHECK(g.rec.calls.back().name == "local_inv");
    CHECK(g.rec.calls.back().wr_flags == unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
    REQUIRE(batch.submit().has_value());
    const auto wcs = g.rec.poll();
    REQUIRE(wcs.size() == 2);
    CHECK(wcs[1].opcode == IBV_WC_LOCAL_INV);
    CHECK_FALSE(g.key.complete(wcs[0])); // the write before it says nothing about the invalidate
    CHECK(g.phase() == mlx5::key_phase::invalidating);
    CHECK(g.key.configured()); // a peer's write may still land: the buffer is not free yet
    CHECK(g.key.complete(wcs[1]));
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK_FALSE(g.key.configured());
  }
}

TEST_CASE(GRANT_CONTRACT_ROLLBACK " (mlx5 key, device-free)", "[unit][mlx5][ikey][grant-contract]") {
  const layout l = one_entry;
  SECTION("the form's steps: a dropped batch, a flushed configure, then the form grants again") {
    mlx5_rig g;
    mlx5_key_form f{g};
    {
      auto b = g.qp.start_send();
      (void)f.grant(b, 31);
      CHECK(g.key.pending());
    } // dropped: nothing was posted, the batch undoes the configure by itself
    CHECK(g.names() == with(with({"wr_start"}, configure_calls), {"wr_abort"}));
    CHECK(g.rec.sq.posted.empty());
    CHECK(f.idle());
    CHECK_FALSE(f.confirmed());
    CHECK(g.key.descriptor().error() == errc::wrong_state); // no key handed out
    CHECK(g.key.rkey() == 0x7700); // the state before: the device never saw it, its tag is given back
    // A configure that fails on the device: the QP is in ERR, the configure is flushed.
    g.rec.sq.in_error = true;
    auto b = g.qp.start_send();
    const remote_descriptor flushed = f.grant(b, 32);
    REQUIRE(b.submit().has_value());
    const auto wcs = g.rec.poll();
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_WR_FLUSH_ERR);
    f.complete(wcs[0]);
    CHECK(f.idle());
    CHECK_FALSE(f.confirmed());
    CHECK(g.key.descriptor().error() == errc::wrong_state);
    g.rec.sq.in_error = false; // the QP was recovered
    // The form grants again, with a key the flushed configure never named (its tag is burnt).
    const remote_descriptor d = grant_confirmed(f, 33);
    CHECK(d.rkey != flushed.rkey);
    CHECK(d.rkey == 0x7701);
    revoke_confirmed(f, 34);
  }
  SECTION("completed in error, then flushed") {
    mlx5_rig g;
    REQUIRE(g.key.configure(g.qp, l, rw, {0x71, send_flag::signaled}).has_value());
    CHECK(g.names() == with(with({"wr_start"}, configure_calls), {"wr_complete"}));
    CHECK(g.key.complete(wc_of(0x71, umr_qpn, IBV_WC_MW_BIND_ERR)));
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK_FALSE(g.key.configured());
    CHECK(g.key.length() == 0);
    REQUIRE(g.key.configure(g.qp, l, rw, {0x72, send_flag::signaled}).has_value());
    CHECK(g.key.complete(wc_of(0x72, umr_qpn, IBV_WC_WR_FLUSH_ERR)));
    CHECK_FALSE(g.key.configured());
    CHECK_FALSE(g.key.complete(wc_of(0x72, umr_qpn, IBV_WC_WR_FLUSH_ERR))); // nothing pending
  }
  SECTION("the posting form's submit fails (ibv_wr_complete): cancelled, the error returned") {
    mlx5_rig g;
    wr_complete_rc = ENOMEM; // send queue full
    auto r = g.key.configure(g.qp, l, rw, {0x73, send_flag::signaled});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == std::errc::not_enough_memory);
    CHECK(g.names() == with(with({"wr_start"}, configure_calls), {"wr_complete"}));
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK_FALSE(g.key.pending());
    CHECK_FALSE(g.key.configured());
    CHECK(g.key.descriptor().error() == errc::wrong_state);
  }
  SECTION("the QP has not reached RTS: nothing reaches it, the key stays idle") {
    mlx5_rig g;
    g.rec.qpx.qp_base.state = IBV_QPS_RTR;
    test_access::note_state(g.qp, IBV_QPS_RTR); // as rdmaxx's transitions record it
    CHECK(g.key.configure(g.qp, l, rw).error() == errc::wrong_state);
    CHECK(g.names().empty()); // the batch went to detail::unready_qp
    CHECK(g.phase() == mlx5::key_phase::idle);
  }
  SECTION("a dropped batch: undone with the batch; cancel_pending() after it changes nothing") {
    mlx5_rig g;
    {
      auto batch = g.qp.start_send();
      REQUIRE(g.key.configure(batch, g.qp, l, rw).has_value());
      CHECK(g.key.pending());
    } // aborted
    CHECK(g.names() == with(with({"wr_start"}, configure_calls), {"wr_abort"}));
    CHECK(g.phase() == mlx5::key_phase::idle);
    CHECK_FALSE(g.key.configured());
    g.key.cancel_pending(); // nothing pending: no effect
    CHECK(g.phase() == mlx5::key_phase::idle);
  }
  SECTION("the posting invalidate's submit fails: still configured, the key still handed out") {
    mlx5_rig g;
    REQUIRE(g.key.configure(g.qp, l, rw, {0x74, send_flag::signaled}).has_value());
    REQUIRE(g.key.complete(wc_of(0x74, umr_qpn)));
    g.rec.calls.clear();
    wr_complete_rc = EINVAL;
    CHECK(g.key.revoke(g.qp, {0x75, send_flag::signaled}).error() == std::errc::invalid_argument);
    CHECK(g.names() == (names{"wr_start", "local_inv", "wr_complete"}));
    CHECK(g.phase() == mlx5::key_phase::configured);
    CHECK(g.key.configured());
    CHECK(g.key.descriptor().has_value());
    wr_complete_rc = 0;
    REQUIRE(g.key.revoke(g.qp, {0x76, send_flag::signaled}).has_value());
    CHECK(g.key.complete(wc_of(0x76, umr_qpn, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV)));
    CHECK_FALSE(g.key.configured());
  }
  SECTION("a configure that never reached the device gives its tag back") {
    mlx5_rig g;
    configure_confirmed(g, g.key, one_entry, 1);
    invalidate_confirmed(g, g.key, 2);
    wr_complete_rc = ENOMEM;
    CHECK(g.key.configure(g.qp, one_entry, rw).error() == std::errc::not_enough_memory);
    CHECK(g.key.rkey() == 0x7700);
    wr_complete_rc = 0;
    g.rec.calls.clear();
    configure_confirmed(g, g.key, one_entry, 3);
    CHECK(g.rec.calls[1].tag == 1);
    CHECK(g.key.rkey() == 0x7701); // index 0x77, tag 1
    CHECK(g.key.lkey() == 0x7701);
  }
  SECTION("a configure that failed on the device burns its tag") {
    mlx5_rig g;
    REQUIRE(g.key.configure(g.qp, one_entry, rw, {1}).has_value());
    CHECK(feed(g.key, g.rec.poll(1, IBV_WC_LOC_PROT_ERR)) == 1);
    CHECK_FALSE(g.key.configured());
    g.rec.sq.in_error = false; // the QP was recovered
    g.rec.calls.clear();
    configure_confirmed(g, g.key, one_entry, 2);
    CHECK(g.rec.calls[1].tag == 1);
  }
}

TEST_CASE(GRANT_CONTRACT_REUSE " (mlx5 key, device-free: 256 tags, then errc::key_retired)",
          "[unit][mlx5][ikey][grant-contract]") {
  // The mkey's rkey is its index << 8 | an 8-bit tag (verbs.c:6826-6827); each configure after
  // the first writes a new tag into the mkey context (qp.c:2868-2874). So one mkey carries 256
  // keys where the kernel has tag update (MLX5_CTX_FLAGS_MKEY_UPDATE_TAG_SUPPORTED), 1 where it
  // has not: the real limit. Past it the key refuses (errc::key_retired) rather than give a
  // revoked rkey back; a new IndirectKey (a new mkey index) continues.
  SECTION("tag update: 256 keys, each one new, no configure while the one before may be live") {
    mlx5_rig g;
    mlx5_key_form f{g};
    std::set<std::uint32_t> keys; // every rkey handed out
    int handed = 0, retired = 0;
    for (int i = 0; i < grant_contract::reuse_cycles; ++i) {
      INFO("cycle #" << i);
      g.rec.calls.clear();
      if (i < 256) {
        const remote_descriptor d = grant_confirmed(f, 0x1000u + unsigned(i));
        CHECK(g.rec.calls[1].tag == std::uint8_t(i)); // what the provider writes (qp.c:2874)
        const std::uint32_t rkey = g.key.descriptor().value().segments()[0].rkey;
        CHECK(rkey == d.rkey);
        REQUIRE(keys.insert(rkey).second); // never a key handed out before
        CHECK((rkey >> 8) == 0x77u);       // the same mkey
        // While this key may work, no other configure is accepted: configured, then invalidating.
        CHECK(g.key.configure(g.qp, f.granted, grant_access).error() == errc::already_bound);
        f.post_revoke(0x5000u + unsigned(i));
        const call &inv = g.rec.calls[g.rec.calls.size() - 2];
        CHECK(inv.name == "local_inv");
        CHECK(inv.key == rkey); // it invalidates this very key
        CHECK(g.key.configure(g.qp, f.granted, grant_access).error() == errc::operation_unconfirmed);
        for (const ibv_wc &wc : g.rec.poll()) f.complete(wc);
        REQUIRE(f.idle());
        ++handed;
      } else {
        auto b = g.qp.start_send();
        CHECK(g.key.configure(b, g.qp, f.granted, grant_access, {0x1000u + unsigned(i)}).error() ==
              errc::key_retired);
        CHECK(g.names() == names{"wr_start"}); // no builder reached
        REQUIRE(b.submit().has_value());
        CHECK(f.idle());
        CHECK(g.key.descriptor().error() == errc::wrong_state); // no key handed out
        ++retired;
      }
    }
    CHECK(handed == 256);
    CHECK(retired == grant_contract::reuse_cycles - 256);
    CHECK(keys.size() == 256);
    CHECK(g.rec.sq.err == 0); // the model's tag check held: the context has tag update
  }
  SECTION("no tag update: one key, then retired") {
    mlx5_rig g;
    g.rec.sq.ctx_update_tag = false;
    test_access::disown(g.key);
    g.key = test_access::mlx5_key(&g.mkey, pd1, 32, to_dv_recorder, false);
    mlx5_key_form f{g};
    const remote_descriptor d = grant_confirmed(f, 1);
    revoke_confirmed(f, 2);
    for (int i = 1; i < grant_contract::reuse_cycles; ++i) {
      g.rec.calls.clear();
      CHECK(g.key.configure(g.qp, f.granted, grant_access).error() == errc::key_retired);
      CHECK(g.names() == (names{"wr_start", "wr_abort"}));
    }
    CHECK(g.key.rkey() == d.rkey); // unchanged, and never configured again
    CHECK(f.idle());
  }
}

namespace {
// A device for IndirectKey::create without one: the PD's context names an ibv_device called
// "mlx5_0" (ibv_get_device_name reads the name); the mlx5 verbs are stand-ins.
struct standin_device {
  ibv_device dev{};
  ibv_context ctx{};
  ibv_pd raw_pd{};
  ProtectionDomain pd;
  standin_device() {
    std::strcpy(dev.name, "mlx5_0");
    ctx.device = &dev;
    raw_pd.context = &ctx;
    pd = test_access::pd(raw_pd);
  }
  ~standin_device() { test_access::disown(pd); }
  standin_device(const standin_device &) = delete;
  standin_device &operator=(const standin_device &) = delete;
};
bool is_mlx5(ibv_device *) { return true; }
mlx5dv_mkey *no_mkey(mlx5dv_mkey_init_attr *a) { // no UMR (or no DEVX): EOPNOTSUPP, with or without tag update
  mkey_asked.push_back(*a);
  errno = EOPNOTSUPP;
  return nullptr;
}
int query_calls = 0;
int failing_query(ibv_context *, const ibv_query_device_ex_input *, ibv_device_attr_ex *) {
  ++query_calls;
  errno = EIO;
  return EIO;
}
// Capabilities of the stand-in device: both window types; `panics` as the device is known.
Capabilities caps_of(tristate panics) {
  Capabilities c;
  std::strcpy(c.name, "mlx5_0");
  c.mw_type1 = c.mw_type2b = true;
  c.max_mw = 64;
  c.remote_inv_unbound_mw_panics = panics;
  return c;
}
} // namespace

TEST_CASE(GRANT_CONTRACT_QUERY_FAILS_CLOSED " (FAULT INJECTION: QUERY_HCA_CAP, ibv_query_device_ex; "
                                            "mlx5 key, device-free)",
          "[unit][mlx5][ikey][grant-contract]") {
  // The mlx5 choice rests on DEVX QUERY_HCA_CAP (umr_modify_atomic_disabled), the software
  // fallback's mechanism on ibv_query_device_ex: each failure refuses, none is guessed past.
  standin_device sd;
  const auto previous = fault_injection::set_query_device(&failing_query);
  struct row {
    const char *what;
    umr_backend backend;
    mlx5::devx_cmd_verb devx;
    mlx5::create_mkey_verb mkey;
    bool atomic_off;
    std::error_code expect; // {}: an mlx5 key
    int devx_calls, mkey_calls, query_calls;
  };
  const row rows[] = {
      {"automatic, QUERY_HCA_CAP fails: no mlx5 key; the software fallback's query fails: no key",
       umr_backend::none, failing_devx_cmd, standin_create_mkey, false, std::make_error_code(std::errc::io_error), 1, 0, 1},
      {"mlx5 forced, QUERY_HCA_CAP fails: its errno, no mkey", umr_backend::mlx5, failing_devx_cmd,
       standin_create_mkey, false, std::make_error_code(std::errc::operation_not_permitted), 1, 0, 0},
      {"automatic, umr_modify_atomic_disabled: software, whose query fails: no key", umr_backend::none,
       standin_devx_cmd, standin_create_mkey, true, std::make_error_code(std::errc::io_error), 1, 0, 1},
      {"automatic, no mkey (EOPNOTSUPP with and without tag update): software, whose query fails: no key",
       umr_backend::none, standin_devx_cmd, no_mkey, false, std::make_error_code(std::errc::io_error), 1, 2, 1},
      {"automatic, every query answers: the mlx5 key (it needs no ibv_query_device_ex)", umr_backend::none,
       standin_devx_cmd, standin_create_mkey, false, {}, 1, 1, 0},
  };
  for (const row &r : rows) {
    INFO(r.what);
    devx_calls = 0;
    query_calls = 0;
    mkey_asked.clear();
    atomic_disabled = r.atomic_off;
    auto k = IndirectKey::create_with(sd.pd, 4, {.backend = r.backend}, {is_mlx5, r.devx, r.mkey});
    CHECK(devx_calls == r.devx_calls);
    CHECK(int(mkey_asked.size()) == r.mkey_calls);
    CHECK(query_calls == r.query_calls);
    if (k.has_value()) {
      CHECK(k.value().backend() == umr_backend::mlx5);
      CHECK(k.value().native_handle() == &made_mkey);
      test_access::disown(k.value()); // never mlx5dv_destroy_mkey on the stand-in
    }
    CHECK(k.has_value() == !r.expect);
    if (r.expect && !k.has_value()) CHECK(k.error() == r.expect);
  }
  atomic_disabled = false;
  // With the caller's Capabilities no ibv_query_device_ex is made: the injected failure does not
  // matter, the mechanism comes from them (here an mlx5 device's: type-2B windows).
  const Capabilities caps = caps_of(tristate::no);
  query_calls = 0;
  auto with_caps = IndirectKey::create_with(sd.pd, 4, {.grant = {.caps = &caps}}, {is_mlx5, failing_devx_cmd, standin_create_mkey});
  fault_injection::set_query_device(previous);
  REQUIRE(with_caps.has_value());
  CHECK(with_caps.value().backend() == umr_backend::software);
  CHECK(test_access::grant(with_caps.value()) == grant_mechanism::type2_window);
  CHECK(query_calls == 0);
}

TEST_CASE(GRANT_CONTRACT_TYPE2 " (mlx5 key, device-free: the mkey is no window; the fallback refuses type 2)",
          "[unit][mlx5][ikey][grant-contract]") {
  // The mlx5 key allocates no window, so the rxe defect (a peer's send-with-invalidate of an
  // unbound type-2 window panics the kernel) has nothing to reach: the acknowledgement changes
  // nothing there, and a peer may invalidate the mkey only where the owner asked
  // (ikey_options::remote_invalidate). Where no mkey can be made, the software fallback on a
  // device with the defect refuses type 2 without the acknowledgement, as on rxe.
  standin_device sd;
  const Capabilities defect = caps_of(tristate::yes);
  const ikey_options asks[] = {
      {.grant = {.caps = &defect}},
      {.grant = {.trusted_peers = true, .caps = &defect}},
      {.grant = {.trusted_peers = true, .type2 = type2_risk::accept_kernel_panic_by_any_peer, .caps = &defect}},
  };
  SECTION("an mkey: the same key whatever the type-2 options; remote invalidation only when asked") {
    for (const ikey_options &o : asks) {
      mkey_asked.clear();
      auto k = IndirectKey::create_with(sd.pd, 4, o, {is_mlx5, standin_devx_cmd, standin_create_mkey});
      REQUIRE(k.has_value());
      CHECK(k.value().backend() == umr_backend::mlx5);
      REQUIRE(mkey_asked.size() == 1);
      CHECK((mkey_asked[0].create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE) == 0);
      test_access::disown(k.value());
    }
    mkey_asked.clear();
    auto k = IndirectKey::create_with(sd.pd, 4, {.remote_invalidate = true, .grant = {.caps = &defect}},
                                      {is_mlx5, standin_devx_cmd, standin_create_mkey});
    REQUIRE(k.has_value());
    REQUIRE(mkey_asked.size() == 1);
    CHECK((mkey_asked[0].create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE) != 0);
    test_access::disown(k.value());
  }
  SECTION("no mkey, a device with the defect: software, type 2 only with the acknowledgement") {
    const grant_mechanism expect[] = {grant_mechanism::type1_exact_region, grant_mechanism::type1_exact_region,
                                      grant_mechanism::type2_window};
    for (std::size_t i = 0; i < 3; ++i) {
      INFO("options #" << i);
      auto k = IndirectKey::create_with(sd.pd, 4, asks[i], {is_mlx5, standin_devx_cmd, no_mkey});
      REQUIRE(k.has_value());
      CHECK(k.value().backend() == umr_backend::software);
      CHECK(test_access::grant(k.value()) == expect[i]);
    }
  }
}

// The HCA's UMR capabilities besides umr_modify_atomic_disabled (cmd_hca_cap, mlx5_ifc.h of
// v44.0 lines 870, 981, 984): umr_indirect_mkey_disabled (0x209) makes the mlx5 backend unusable,
// repeated_block_disabled (0x206) takes repeat layouts away, max_indirection (0x100-0x107) bounds
// how deep keys nest. Read at create() from the same QUERY_HCA_CAP and enforced before any
// mlx5dv call.
TEST_CASE("mlx5 contract: umr_indirect_mkey_disabled, repeated_block_disabled and max_indirection are read and enforced", "[unit][mlx5][ikey]") {
  standin_device sd;
  ibv_pd *const pd = sd.pd.native_handle();
  struct reset_caps {
    ~reset_caps() {
      indirect_disabled = repeat_disabled = atomic_disabled = false;
      max_indirection = 0;
    }
  } const reset;
  SECTION("umr_indirect_mkey_disabled: a forced mlx5 backend is refused, no mkey is made") {
    indirect_disabled = true;
    mkey_asked.clear();
    auto k = IndirectKey::create_with(sd.pd, 4, {.backend = umr_backend::mlx5}, {is_mlx5, standin_devx_cmd, standin_create_mkey});
    if (k.has_value()) test_access::disown(k.value()); // never mlx5dv_destroy_mkey on the stand-in
    CHECK_FALSE(k.has_value());
    if (!k.has_value()) CHECK(k.error() == errc::unsupported);
    CHECK(mkey_asked.empty());
    // chosen automatically: not the mlx5 backend (the software fallback's own query then fails)
    const auto previous = fault_injection::set_query_device(&failing_query);
    auto a = IndirectKey::create_with(sd.pd, 4, {}, {is_mlx5, standin_devx_cmd, standin_create_mkey});
    fault_injection::set_query_device(previous);
    CHECK(mkey_asked.empty());
    if (a.has_value()) {
      CHECK(a.value().backend() != umr_backend::mlx5);
      test_access::disown(a.value());
    }
  }
  SECTION("repeated_block_disabled and max_indirection 2: a repeat layout and a third level refused") {
    repeat_disabled = true;
    max_indirection = 2;
    auto made = IndirectKey::create_with(sd.pd, 4, {.backend = umr_backend::mlx5}, {is_mlx5, standin_devx_cmd, standin_create_mkey});
    REQUIRE(made.has_value());
    mlx5_rig g;
    IndirectKey &outer = made.value();
    test_access::to_dv_through(outer, to_dv_recorder);
    g.rec.qpx.qp_base.pd = pd;
    mlx5dv_mkey ma{0x8800, 0x8800}, mb{0x9900, 0x9900};
    IndirectKey a = test_access::mlx5_key(&ma, pd, 32, to_dv_recorder);
    IndirectKey b = test_access::mlx5_key(&mb, pd, 32, to_dv_recorder);
    struct disown_all { // whatever fails: never mlx5dv_destroy_mkey on a stand-in
      IndirectKey *k[3];
      ~disown_all() {
        for (IndirectKey *x : k) test_access::disown(*x);
      }
    } const guard{{&outer, &a, &b}};
    const region_ref r = region_ref::raw(0x10000, 4096, 7, 7, rw | access::remote_atomic, pd);
    configure_confirmed(g, a, layout::list({{r, 0, 64}}), 1); // one level
    configure_confirmed(g, b, layout::list({{a, 0, 64}}), 2); // two levels
    g.rec.calls.clear();
    to_dv_calls = 0;
    {
      auto batch = g.qp.start_send();
      const auto rep = outer.configure(batch, g.qp, layout::repeat(2, {{r, 0, 8, 8}}), rw);
      CHECK_FALSE(rep.has_value());
      if (!rep.has_value()) CHECK(layout_errc(rep.error()) == errc::unsupported);
      CHECK(g.names() == names{"wr_start"}); // nothing reached a builder
      CHECK_FALSE(outer.pending());
    }
    g.rec.calls.clear();
    {
      auto batch = g.qp.start_send();
      const auto deep = outer.configure(batch, g.qp, layout::list({{r, 0, 8}, {b, 0, 64}}), rw);
      CHECK_FALSE(deep.has_value());
      if (!deep.has_value()) {
        CHECK(layout_errc(deep.error()) == errc::out_of_range);
        CHECK(layout_error_entry(deep.error()) == 1); // the nested key of two levels
      }
      CHECK(g.names() == names{"wr_start"}); // nothing reached a builder
      CHECK_FALSE(outer.pending());
    } // dropped
    // two levels are allowed: over `a`
    configure_confirmed(g, outer, layout::list({{a, 0, 64}}), 3);
    CHECK(outer.configured());
    invalidate_confirmed(g, outer, 4);
    invalidate_confirmed(g, b, 5);
    invalidate_confirmed(g, a, 6);
  }
}

TEST_CASE("mlx5 contract: query_umr_caps reads each UMR capability from its own bits", "[unit][mlx5]") {
  ibv_context ctx{};
  struct reset_caps {
    ~reset_caps() {
      indirect_disabled = repeat_disabled = atomic_disabled = false;
      max_indirection = 0;
    }
  } const reset;
  mlx5::umr_hca_caps c;
  REQUIRE(mlx5::query_umr_caps(&ctx, c, standin_devx_cmd));
  CHECK_FALSE(c.atomic_disabled); // the neighbours set by the stand-in are not read
  CHECK_FALSE(c.indirect_mkey_disabled);
  CHECK_FALSE(c.repeated_block_disabled);
  CHECK(c.max_indirection == 0);
  for (int which = 0; which < 3; ++which) {
    INFO(which);
    atomic_disabled = which == 0;
    indirect_disabled = which == 1;
    repeat_disabled = which == 2;
    REQUIRE(mlx5::query_umr_caps(&ctx, c, standin_devx_cmd));
    CHECK(c.atomic_disabled == (which == 0));
    CHECK(c.indirect_mkey_disabled == (which == 1));
    CHECK(c.repeated_block_disabled == (which == 2));
  }
  for (std::uint8_t v : {std::uint8_t(1), std::uint8_t(2), std::uint8_t(0x80), std::uint8_t(0xff)}) {
    max_indirection = v;
    REQUIRE(mlx5::query_umr_caps(&ctx, c, standin_devx_cmd));
    CHECK(c.max_indirection == v);
  }
  // a failed command: nothing known, `c` unchanged, its errno
  int err = 0;
  c.max_indirection = 7;
  CHECK_FALSE(mlx5::query_umr_caps(&ctx, c, failing_devx_cmd, &err));
  CHECK(err == EPERM);
  CHECK(c.max_indirection == 7);
  CHECK_FALSE(mlx5::query_umr_caps(nullptr, c, standin_devx_cmd, &err));
  CHECK(err == EINVAL);
  // the limits follow: 0 enforces nothing, a repeat layout is refused only where disabled
  CHECK(mlx5::limits_for({512, 32}).max_depth == UINT32_MAX);
  CHECK(mlx5::limits_for({512, 32, 3, false}).max_depth == 3);
  CHECK(mlx5::limits_for({512, 32}).repeat_layouts);
  CHECK_FALSE(mlx5::limits_for({512, 32, 0, true}).repeat_layouts);
}

// ---------------------------------------------------------------------------------------------
// Issue 42, the rest: tags across keys, the stale outer key, remote invalidation by QP, the
// fenced local invalidate.

namespace {
// mlx5dv_create_mkey and mlx5dv_destroy_mkey over a firmware index allocator: rdma-core 44
// creates every mkey at tag 0 (lkey = mkey_index << 8, rkey = lkey, verbs.c:6832-6833) and asks
// for UPDATE_TAG only where the context has it (verbs.c:6751-6762); the index comes from the
// firmware, which here hands a destroyed mkey's index out again first (LIFO), the case that
// would re-issue a revoked rkey. `fixed`: every mkey lands on index 0x2a (a firmware whose free
// list holds only quarantined indexes).
struct index_firmware {
  std::vector<std::uint32_t> free_list;
  std::uint32_t next = 0x300;
  bool fixed = false;
  int creates = 0;
  int destroys = 0;
};
index_firmware fw;
mlx5dv_mkey *fw_create_mkey(mlx5dv_mkey_init_attr *a) {
  if ((a->create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG) && !ctx_update_tag) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  a->max_entries = std::uint16_t((a->max_entries + 3) & ~3u);
  std::uint32_t idx = fw.next;
  if (fw.fixed) {
    idx = 0x2a;
  } else if (!fw.free_list.empty()) {
    idx = fw.free_list.back();
    fw.free_list.pop_back();
  } else {
    ++fw.next;
  }
  ++fw.creates;
  return new mlx5dv_mkey{idx << 8, idx << 8};
}
int fw_destroy_mkey(mlx5dv_mkey *m) {
  fw.free_list.push_back(m->lkey >> 8);
  ++fw.destroys;
  delete m;
  return 0;
}
// One device for these cases (the quarantine has a table per device, for the process's life).
struct standin_device &fw_device() {
  static standin_device d;
  return d;
}
region_ref fw_region(ibv_pd *pd) { return region_ref::raw(0x10000, 4096, 7, 7, rw | access::remote_atomic, pd); }
// An mlx5 key made by IndirectKey::create over the stand-in firmware, configured through `g`.
IndirectKey fw_key(mlx5_rig &g) {
  auto k = IndirectKey::create_with(fw_device().pd, 4, {.backend = umr_backend::mlx5},
                                    {is_mlx5, standin_devx_cmd, fw_create_mkey, fw_destroy_mkey});
  REQUIRE(k.has_value());
  test_access::to_dv_through(k.value(), to_dv_recorder);
  g.rec.qpx.qp_base.pd = &fw_device().raw_pd;
  return std::move(k.value());
}
} // namespace

// mlx5dv_create_mkey creates tag 0, so with a tag rotation that starts at the mkey's own tag
// every new key began at 0: a key on an index the firmware reused answered, at its first
// configure, to the rkey a peer held for the destroyed key's first configure.
TEST_CASE("mlx5 contract: each new key starts at a process-wide rotating variant, set before its first configure; it retires when its tag comes back",
          "[unit][mlx5][ikey]") {
  mlx5_rig g;
  ctx_update_tag = true;
  fw = {};
  IndirectKey a = fw_key(g);
  IndirectKey b = fw_key(g);
  const std::uint8_t ta = std::uint8_t(a.rkey() & 0xff), tb = std::uint8_t(b.rkey() & 0xff);
  CHECK(tb == std::uint8_t(ta + 1)); // consecutive variants (no other key made in between)
  CHECK((a.rkey() >> 8) == 0x300);
  CHECK((b.rkey() >> 8) == 0x301);
  CHECK(a.lkey() == a.rkey());
  // a's index reused by the firmware for c: c does not start where a started
  REQUIRE(a.destroy().has_value());
  IndirectKey c = fw_key(g);
  CHECK((c.rkey() >> 8) == 0x300);
  CHECK(std::uint8_t(c.rkey() & 0xff) != ta);
  // the first configure writes the variant into the mkey context (qp.c:2870-2876)
  const layout l = layout::list({{fw_region(&fw_device().raw_pd), 0, 64}});
  const std::uint8_t tc = std::uint8_t(c.rkey() & 0xff);
  std::set<std::uint32_t> rkeys;
  for (int i = 0; i < 256; ++i) {
    g.rec.calls.clear();
    configure_confirmed(g, c, l, 1);
    REQUIRE(g.rec.calls.size() >= 2);
    CHECK(g.rec.calls[1].name == "mkey_configure");
    CHECK(g.rec.calls[1].tag == std::uint8_t(tc + i));
    rkeys.insert(c.rkey());
    invalidate_confirmed(g, c, 2);
  }
  CHECK(rkeys.size() == 256);
  CHECK(c.configure(g.qp, l, rw, {3}).error() == errc::key_retired); // the tag would be tc again
  CHECK(c.rkey() == ((0x300u << 8) | std::uint8_t(tc + 255)));
  REQUIRE(b.destroy().has_value());
  REQUIRE(c.destroy().has_value());
  CHECK(fw.destroys == 3);
}

// Without tag update an mkey's only rkey is index << 8: revocation rested on the firmware never
// handing a destroyed mkey's index out again. Now every index whose rkey was handed to the
// device is quarantined: the next key gets another index, and a key on a quarantined index is
// never configured.
TEST_CASE("mlx5 contract: without tag update an index whose rkey was handed out is quarantined: destroy and create never re-issue it",
          "[unit][mlx5][ikey]") {
  mlx5_rig g;
  ctx_update_tag = false;
  g.rec.sq.ctx_update_tag = false;
  fw = {};
  mlx5::seen_indexes *q = mlx5::seen_indexes::of(&fw_device().dev);
  REQUIRE(q);
  q->clear();
  const layout l = layout::list({{fw_region(&fw_device().raw_pd), 0, 64}});
  IndirectKey a = fw_key(g);
  const std::uint32_t old = a.rkey();
  CHECK(old == (0x300u << 8)); // tag 0: no variant without tag update
  configure_confirmed(g, a, l, 1);
  CHECK(g.rec.calls[1].tag == 0);
  CHECK(q->seen(old));
  CHECK(a.configure(g.qp, l, rw, {2}).error() == errc::already_bound);
  invalidate_confirmed(g, a, 3);
  CHECK(a.configure(g.qp, l, rw, {4}).error() == errc::key_retired); // one configure per key
  REQUIRE(a.destroy().has_value());
  REQUIRE(fw.free_list == std::vector<std::uint32_t>{0x300});

  SECTION("the next key lands on another index; the firmware's offer of the old one is held and given back") {
    IndirectKey b = fw_key(g);
    CHECK(b.rkey() != old);
    CHECK(b.rkey() == (0x301u << 8));
    CHECK(fw.creates == 3);  // a, the refused offer of 0x300 (held meanwhile), b
    CHECK(fw.destroys == 2); // a, then the held one
    configure_confirmed(g, b, l, 5);
    CHECK(g.rec.calls.back().name != "mkey_configure");
    REQUIRE(b.destroy().has_value());
  }
  SECTION("a firmware that offers only quarantined indexes: no key") {
    fw.fixed = true;
    q->mark(0x2a << 8);
    auto r = IndirectKey::create_with(fw_device().pd, 4, {.backend = umr_backend::mlx5},
                                      {is_mlx5, standin_devx_cmd, fw_create_mkey, fw_destroy_mkey});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error() == errc::key_retired);
    CHECK(fw.creates == 1 + mlx5::max_index_tries + 1);
    CHECK(fw.destroys == 1 + mlx5::max_index_tries + 1); // every one tried given back
  }
  SECTION("an mkey on a quarantined index is never configured; a dropped batch gives the index back") {
    mlx5dv_mkey m{old, old}; // as if the firmware re-issued it
    IndirectKey k = test_access::mlx5_key(&m, &fw_device().raw_pd, 32, to_dv_recorder, false);
    test_access::quarantine_in(k, q);
    g.rec.calls.clear();
    CHECK(k.configure(g.qp, l, rw, {6}).error() == errc::key_retired);
    CHECK(g.names() == names{"wr_start", "wr_abort"}); // nothing reached a builder
    mlx5dv_mkey fresh{0x555u << 8, 0x555u << 8};
    IndirectKey f = test_access::mlx5_key(&fresh, &fw_device().raw_pd, 32, to_dv_recorder, false);
    test_access::quarantine_in(f, q);
    {
      auto batch = g.qp.start_send();
      REQUIRE(f.configure(batch, g.qp, l, rw, {7}).has_value());
      CHECK(q->seen(fresh.lkey)); // marked before the device can see it
    } // dropped: never posted
    CHECK_FALSE(q->seen(fresh.lkey));
    configure_confirmed(g, f, l, 8);
    CHECK(q->seen(fresh.lkey));
    invalidate_confirmed(g, f, 9);
    test_access::disown(k);
    test_access::disown(f);
  }
  ctx_update_tag = true;
}

// The outer key's mkey translates through the inner key's lkey as it was at the outer's
// configure: once the inner key is invalidated or re-tagged the device refuses every access
// through the outer one, which still read configured and handed out its descriptor.
TEST_CASE("mlx5 contract: an outer key over an invalidated or re-tagged inner key is stale until reconfigured", "[unit][mlx5][ikey]") {
  mlx5_rig g;
  const layout l = layout::list({{mr(0x10000, 4096, 7), 0, 256}});
  configure_confirmed(g, g.key, l, 1);
  mlx5dv_mkey om{0x8800, 0x8800}, om2{0x9900, 0x9900};
  IndirectKey outer = test_access::mlx5_key(&om, pd1, 32, to_dv_recorder);
  IndirectKey outer2 = test_access::mlx5_key(&om2, pd1, 32, to_dv_recorder);
  configure_confirmed(g, outer, layout::list({{g.key, 0, 128}}), 2);
  configure_confirmed(g, outer2, layout::list({{outer, 0, 64}}), 3);
  CHECK_FALSE(outer.stale());
  CHECK(outer.descriptor().has_value());
  CHECK(outer2.descriptor().has_value());
  ibv_sge sge[1];

  invalidate_confirmed(g, g.key, 4); // an inner key can be revoked under its outer keys
  for (IndirectKey *k : {&outer, &outer2}) {
    CHECK(k->configured());
    CHECK(k->stale());
    CHECK(k->descriptor().error() == errc::stale_key);
    CHECK(k->sges(0, 8, sge).error() == errc::stale_key);
    CHECK(k->sges(g.qp, 0, 8, sge).error() == errc::stale_key);
    CHECK(region_ref(*k).problem == errc::stale_key);
  }
  // the inner key configured again carries a new tag: the outer keys still point at the old one
  configure_confirmed(g, g.key, l, 5);
  CHECK(g.key.rkey() == 0x7701);
  CHECK(outer.stale());
  CHECK(outer2.stale());
  CHECK(outer.descriptor().error() == errc::stale_key);
  CHECK(make_error_code(errc::stale_key).message().find("stale") != std::string::npos);
  // reconfigured over the inner key as it is now: usable again, and so is what nests it
  invalidate_confirmed(g, outer2, 6);
  invalidate_confirmed(g, outer, 7);
  configure_confirmed(g, outer, layout::list({{g.key, 0, 128}}), 8);
  CHECK_FALSE(outer.stale());
  REQUIRE(outer.descriptor().has_value());
  CHECK(outer.descriptor().value().segments()[0].rkey == outer.rkey());
  configure_confirmed(g, outer2, layout::list({{outer, 0, 64}}), 9);
  CHECK(outer2.descriptor().has_value());
  // an inner invalidate only posted: the outer keys stop being handed out at once
  REQUIRE(g.key.revoke(g.qp, {10}).has_value());
  CHECK(outer.descriptor().error() == errc::stale_key);
  CHECK(outer2.descriptor().error() == errc::stale_key);
  REQUIRE(feed(g.key, g.rec.poll()) == 1);
  invalidate_confirmed(g, outer2, 11);
  invalidate_confirmed(g, outer, 12);
  test_access::disown(outer2);
  test_access::disown(outer);
}

// A peer's send-with-invalidate was matched by rkey value on any QP: a receive on another QP
// (another device's, whose keys are numbered alike) naming the same value revoked the key's
// state while its mkey stayed live, and dropped its links to the regions.
TEST_CASE("mlx5 contract: a peer's send-with-invalidate counts on the key's QP or a QP of its PD, and only for a key made for it",
          "[unit][mlx5][ikey]") {
  auto recv_inv = [](std::uint32_t rkey, std::uint32_t qpn) {
    ibv_wc wc{};
    wc.wr_id = 0x4242;
    wc.qp_num = qpn;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    wc.wc_flags = IBV_WC_WITH_INV;
    wc.invalidated_rkey = rkey;
    return wc;
  };
  mlx5_rig g;
  detail::parent_node mr_a;
  region_ref a = mr(0x10000, 4096, 7);
  a.node = &mr_a;
  const layout l = layout::list({{a, 0, 64}});
  configure_confirmed(g, g.key, l, 1);
  // the same rkey value received on another QP: not this key's
  CHECK_FALSE(g.key.complete(recv_inv(g.key.rkey(), 0x99)));
  CHECK(g.key.configured());
  CHECK(mr_a.live_children() == 1);
  // named on a QP of the key's PD: counts there
  ibv_qp_ex peer_side{};
  peer_side.qp_base.qp_num = 0x99;
  peer_side.qp_base.pd = pd1;
  QueuePair on_pd = test_access::qp(peer_side, {}, 0);
  ibv_qp_ex other_pd{};
  other_pd.qp_base.qp_num = 0x99;
  other_pd.qp_base.pd = pd2;
  QueuePair off_pd = test_access::qp(other_pd, {}, 0);
  CHECK_FALSE(g.key.complete(recv_inv(g.key.rkey(), 0x99), off_pd)); // another PD (or device)
  CHECK_FALSE(g.key.complete(recv_inv(g.key.rkey(), 0x98), on_pd));  // not that QP's receive
  CHECK(g.key.configured());
  CHECK(g.key.complete(recv_inv(g.key.rkey(), 0x99), on_pd));
  CHECK_FALSE(g.key.configured());
  CHECK(mr_a.live_children() == 0);
  // on the QP the key was configured through: counts
  configure_confirmed(g, g.key, l, 2);
  CHECK(g.key.complete(recv_inv(g.key.rkey(), umr_qpn)));
  CHECK_FALSE(g.key.configured());
  // a key made without remote invalidation: the device refuses a peer's send-with-invalidate
  // of it, so a receive naming its rkey is another key's
  mlx5dv_mkey m{0x8800, 0x8800};
  IndirectKey no_rinv = test_access::mlx5_key(&m, pd1, 32, to_dv_recorder, true, false);
  configure_confirmed(g, no_rinv, l, 3);
  CHECK_FALSE(no_rinv.complete(recv_inv(no_rinv.rkey(), umr_qpn)));
  CHECK_FALSE(no_rinv.complete(recv_inv(no_rinv.rkey(), 0x99), on_pd));
  CHECK(no_rinv.configured());
  invalidate_confirmed(g, no_rinv, 4);
  test_access::disown(no_rinv);
  test_access::disown(on_pd);
  test_access::disown(off_pd);
}

// The local invalidate went out without a fence: an RDMA read posted before it, whose response
// lands through the key, could meet an invalidated key halfway (IB orders a send-queue WR after
// earlier reads' responses only with the fence indicator).
TEST_CASE("mlx5 contract: the local invalidate is fenced behind earlier work of its QP", "[unit][mlx5][ikey]") {
  mlx5_rig g;
  configure_confirmed(g, g.key, one_entry, 1);
  auto batch = g.qp.start_send();
  post_write(batch, 0x20, false); // earlier work in the same batch (a read's completion order is the same)
  REQUIRE(g.key.revoke(batch, {0x21}).has_value());
  REQUIRE(batch.submit().has_value());
  const call &w = g.rec.calls[g.rec.calls.size() - 3];
  const call &inv = g.rec.calls[g.rec.calls.size() - 2];
  CHECK(w.name == "rdma_write");
  CHECK_FALSE(w.wr_flags & IBV_SEND_FENCE); // nothing else is fenced (the fast path is unchanged)
  CHECK(inv.name == "local_inv");
  CHECK((inv.wr_flags & IBV_SEND_FENCE) != 0); // MLX5_WQE_CTRL_FENCE, qp.c:1272-1274
  CHECK((inv.wr_flags & IBV_SEND_SIGNALED) != 0);
  REQUIRE(feed(g.key, g.rec.poll()) == 1);
  CHECK_FALSE(g.key.configured());
}

#endif // RDMAXX_HAVE_MLX5
