// test/mlx5_standin.hpp: a device-free stand-in for one mlx5 UMR QP and its device, for
// tools/hw_check.cpp when no mlx5 device is present (the [mlx5] unit tests keep their own,
// richer recorder in test/unit/test_mlx5_contract.cpp).
//
// It behaves as rdma-core 44's mlx5 provider (v44.0 providers/mlx5) where the hardware check
// looks:
//   - the QP's send queue (mlx5_wq_overflow, qp.c:186-199): a builder that finds it full sets
//     ENOMEM and writes through the last posted WQE (counted as a stale write);
//   - wr_complete rewritten at each state change (set_qp_operational_state, verbs.c:2250-2268):
//     the error variant at RESET, the real one at RTS; RESET drops unpolled CQEs;
//   - completion opcodes: IBV_WC_DRIVER1 (== MLX5DV_WC_UMR) for an mkey configure,
//     IBV_WC_LOCAL_INV for a local invalidate (qp.c:1256-1265);
//   - the WQE's fence bit: IBV_SEND_FENCE (qp.c:1272-1274);
//   - mlx5dv_create_mkey: tag 0 (lkey = index << 8, verbs.c:6832-6833), UPDATE_TAG only where the
//     context has it (verbs.c:6751-6762); the index from a firmware that hands a destroyed
//     mkey's index out again first (LIFO);
//   - the device's key check: a remote access with an rkey is accepted only while the mkey at
//     its index is configured and its context's tag (written by the last configure, qp.c:2876)
//     is the rkey's low byte.
// Not the provider, not a device: what hw_check proves against it is that rdmaxx drives this
// model as the contract says, nothing about hardware.
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <endian.h>

#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <map>
#include <vector>

namespace rdmaxx_standin {

struct wqe {
  std::uint64_t wr_id = 0;
  unsigned flags = 0;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  std::uint32_t index = 0; // configure / local invalidate: the mkey index
  std::uint8_t tag = 0;    // configure: the tag written into the mkey context
};

struct mkey_ctx {
  bool configured = false;
  std::uint8_t tag = 0;
};

struct device {
  ibv_qp_ex qpx{};
  mlx5dv_qp_ex mqp{};
  ibv_device dev{};
  ibv_context ctx{};
  ibv_pd pd{};
  unsigned max_post = 16;
  unsigned head = 0, tail = 0, nreq = 0;
  int err = 0;
  int stale_writes = 0;
  bool ctx_update_tag = true;
  std::vector<wqe> batch, posted;
  std::map<std::uint32_t, mkey_ctx> mkeys; // the firmware's mkeys by index
  std::vector<std::uint32_t> free_indexes;
  std::uint32_t next_index = 0x100;
  int (*real_complete)(ibv_qp_ex *) = nullptr;
  int (*error_complete)(ibv_qp_ex *) = nullptr;

  static device *&current() {
    static device *d = nullptr;
    return d;
  }
  bool wqe_init(ibv_wc_opcode op, std::uint32_t index = 0, std::uint8_t tag = 0) {
    if (head - tail + nreq >= max_post) { // qp.c:1236-1251: ENOMEM, cur_ctrl left stale
      if (!err) err = ENOMEM;
      ++stale_writes;
      return false;
    }
    batch.push_back({qpx.wr_id, qpx.wr_flags, op, index, tag});
    ++nreq;
    return true;
  }
  device() {
    current() = this;
    std::snprintf(dev.name, sizeof dev.name, "%s", "mlx5-standin");
    ctx.device = &dev;
    pd.context = &ctx;
    qpx.qp_base.qp_num = 0x44;
    qpx.qp_base.pd = &pd;
    qpx.qp_base.state = IBV_QPS_RESET;
    qpx.wr_start = [](ibv_qp_ex *) {
      device &d = *current();
      d.err = 0;
      d.nreq = 0;
      d.batch.clear();
    };
    real_complete = [](ibv_qp_ex *) {
      device &d = *current();
      const int rc = d.err;
      if (rc == 0) {
        d.posted.insert(d.posted.end(), d.batch.begin(), d.batch.end());
        d.head += d.nreq;
      }
      d.batch.clear();
      d.nreq = 0;
      return rc;
    };
    error_complete = [](ibv_qp_ex *) {
      device &d = *current();
      d.batch.clear();
      d.nreq = 0;
      return EINVAL;
    };
    qpx.wr_complete = error_complete; // created in RESET (verbs.c:2652)
    qpx.wr_abort = [](ibv_qp_ex *) {
      device &d = *current();
      d.batch.clear();
      d.nreq = 0;
    };
    qpx.wr_rdma_write = [](ibv_qp_ex *, uint32_t, uint64_t) { (void)current()->wqe_init(IBV_WC_RDMA_WRITE); };
    qpx.wr_rdma_read = [](ibv_qp_ex *, uint32_t, uint64_t) { (void)current()->wqe_init(IBV_WC_RDMA_READ); };
    qpx.wr_set_sge = [](ibv_qp_ex *, uint32_t, uint64_t, uint32_t) {
      if (current()->err == ENOMEM) ++current()->stale_writes;
    };
    qpx.wr_local_inv = [](ibv_qp_ex *, uint32_t key) { (void)current()->wqe_init(IBV_WC_LOCAL_INV, key >> 8); };
    mqp.wr_mkey_configure = [](mlx5dv_qp_ex *, mlx5dv_mkey *k, uint8_t, mlx5dv_mkey_conf_attr *) {
      device &d = *current();
      if (!(d.qpx.wr_flags & IBV_SEND_INLINE)) { // qp.c:2837-2840
        d.err = EOPNOTSUPP;
        return;
      }
      if (!d.wqe_init(IBV_WC_DRIVER1, k->lkey >> 8, std::uint8_t(k->lkey & 0xff))) return;
      if ((k->lkey & 0xff) && !d.ctx_update_tag) d.err = EOPNOTSUPP; // qp.c:2870-2875
    };
    mqp.wr_set_mkey_access_flags = [](mlx5dv_qp_ex *, uint32_t) {};
    mqp.wr_set_mkey_layout_list = [](mlx5dv_qp_ex *, uint16_t, const ibv_sge *) {};
    mqp.wr_set_mkey_layout_interleaved = [](mlx5dv_qp_ex *, uint32_t, uint16_t, const mlx5dv_mr_interleaved *) {};
  }
  device(const device &) = delete;
  device &operator=(const device &) = delete;
  ~device() { current() = nullptr; }

  // ibv_modify_qp to `s` as rdma-core >= 40 runs it (verbs.c:3017-3031, 3063-3064).
  void modify(ibv_qp_state s) {
    if (s == IBV_QPS_RESET) {
      posted.clear();
      batch.clear();
      head = tail = nreq = 0;
      err = 0;
      qpx.wr_complete = error_complete;
    } else if (s == IBV_QPS_RTS) {
      qpx.wr_complete = real_complete;
    }
    qpx.qp_base.state = s;
  }
  // The device runs what was posted: each WQE in order; the mkey's context follows a configure
  // and a local invalidate; signaled ones give a completion.
  std::vector<ibv_wc> poll() {
    std::vector<ibv_wc> out;
    for (const wqe &q : posted) {
      if (q.opcode == IBV_WC_DRIVER1) mkeys[q.index] = {true, q.tag};
      if (q.opcode == IBV_WC_LOCAL_INV) mkeys[q.index].configured = false;
      if (!(q.flags & IBV_SEND_SIGNALED)) continue;
      ibv_wc wc{};
      wc.wr_id = q.wr_id;
      wc.qp_num = qpx.qp_base.qp_num;
      wc.status = IBV_WC_SUCCESS;
      wc.opcode = q.opcode;
      out.push_back(wc);
    }
    tail += unsigned(posted.size());
    posted.clear();
    return out;
  }
  // A peer's access with `rkey`: accepted only by a configured mkey whose tag matches.
  [[nodiscard]] bool accepts(std::uint32_t rkey) const {
    auto it = mkeys.find(rkey >> 8);
    return it != mkeys.end() && it->second.configured && it->second.tag == std::uint8_t(rkey & 0xff);
  }
  // mlx5dv_create_mkey / mlx5dv_destroy_mkey over the firmware's index allocator.
  static mlx5dv_mkey *create_mkey(mlx5dv_mkey_init_attr *a) {
    device &d = *current();
    if ((a->create_flags & MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG) && !d.ctx_update_tag) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    a->max_entries = std::uint16_t((a->max_entries + 3) & ~3u);
    std::uint32_t idx = d.next_index;
    if (!d.free_indexes.empty()) {
      idx = d.free_indexes.back();
      d.free_indexes.pop_back();
    } else {
      ++d.next_index;
    }
    d.mkeys[idx] = {};
    return new mlx5dv_mkey{idx << 8, idx << 8};
  }
  static int destroy_mkey(mlx5dv_mkey *m) {
    device &d = *current();
    d.mkeys.erase(m->lkey >> 8);
    d.free_indexes.push_back(m->lkey >> 8);
    delete m;
    return 0;
  }
  // mlx5dv_devx_general_cmd answering QUERY_HCA_CAP: a reply with max_indirection 4 and none of
  // the disabling bits (umr_modify_atomic_disabled 0x208, umr_indirect_mkey_disabled 0x209,
  // repeated_block_disabled 0x206; mlx5_ifc.h), after the 16-byte header.
  static int devx_cmd(ibv_context *, const void *, size_t, void *out, size_t outlen) {
    auto *o = static_cast<std::uint32_t *>(out);
    for (size_t i = 0; i < outlen / 4; ++i) o[i] = 0;
    const std::size_t b = 128 + 0x100;
    o[b / 32] = htobe32(std::uint32_t(4) << 24);
    return 0;
  }
  static mlx5dv_qp_ex *to_dv(ibv_qp_ex *) noexcept { return &current()->mqp; }
};

} // namespace rdmaxx_standin
