// mlx5 backend contract tests: the mlx5dv builders (mlx5dv_wr_mkey_configure, ..._set_mkey_*)
// and ibv_wr_local_inv are static inline calls through the function pointers of mlx5dv_qp_ex and
// ibv_qp_ex. These tests hand the backend C structs whose pointers record every call and its
// arguments, and assert exactly what rdmaxx gives mlx5dv. No device, no mock of one.
#include <rdmaxx/layout.hpp>

#if RDMAXX_HAVE_MLX5
#include <rdmaxx/device.hpp>
#include <rdmaxx/mlx5/context_mlx5.hpp>
#include <rdmaxx/mlx5/indirect_key_mlx5.hpp>

#include <catch2/catch.hpp>

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
};

// The recording QP: one ibv_qp_ex and its mlx5dv_qp_ex, as the provider would pair them.
struct recorder {
  ibv_qp_ex qpx{};
  mlx5dv_qp_ex mqp{};
  std::vector<call> calls;
  recorder();
};
recorder *current = nullptr;

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
  };
  qpx.wr_rdma_write = [](ibv_qp_ex *, uint32_t, uint64_t) { record("rdma_write"); };
}

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
  CHECK(rec.calls[0].wr_flags == unsigned(IBV_SEND_SIGNALED));
  CHECK(mlx5::post_invalidate(&rec.qpx, nullptr, {}).error() == errc::null_handle);
}

TEST_CASE("mlx5 contract: mkey and QP creation attributes", "[unit][mlx5]") {
  const auto a = mlx5::mkey_init_attr(pd1, 9);
  CHECK(a.pd == pd1);
  CHECK(a.create_flags == unsigned(MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT));
  CHECK(a.max_entries == 9);
  std::uint32_t zero = 0, huge = 0x10000;
  CHECK(mlx5::create_mkey(pd1, zero).error() == errc::out_of_range);
  CHECK(mlx5::create_mkey(pd1, huge).error() == errc::out_of_range);
  CHECK(mlx5::create_mkey(nullptr, huge).error() == errc::null_handle);

  ibv_qp_init_attr_ex qa;
  mlx5dv_qp_init_attr dv;
  auto *cq = reinterpret_cast<ibv_cq *>(0x3000);
  mlx5::umr_qp_attrs(pd1, cq, cq, {.max_inline_data = 512}, send_op::rdma_write | send_op::rdma_read, qa, dv);
  CHECK(qa.qp_type == IBV_QPT_RC);
  CHECK(qa.pd == pd1);
  CHECK(qa.send_cq == cq);
  CHECK(qa.cap.max_inline_data == 512);
  CHECK(qa.comp_mask == (IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS));
  CHECK(qa.send_ops_flags ==
        (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_LOCAL_INV));
  CHECK(dv.comp_mask == MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS);
  CHECK(dv.send_ops_flags ==
        (MLX5DV_QP_EX_WITH_MR_LIST | MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MKEY_CONFIGURE));
  CHECK(dv.create_flags == 0);
}

TEST_CASE("mlx5 contract: the context is opened with DEVX, which mlx5dv_create_mkey needs", "[unit][mlx5]") {
  const mlx5dv_context_attr a = mlx5::devx_context_attr();
  CHECK(a.flags == MLX5DV_CONTEXT_FLAGS_DEVX);
  CHECK(a.comp_mask == 0);
  // No device: nothing is opened, the caller falls back (and reports no_device).
  CHECK(mlx5::open_devx(nullptr) == nullptr);
  CHECK(Context::open(static_cast<ibv_device *>(nullptr), {.mlx5_devx = true}).error() == errc::no_device);
}

#endif // RDMAXX_HAVE_MLX5
