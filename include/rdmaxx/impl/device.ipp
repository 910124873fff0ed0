/// \file
/// rdmaxx/impl/device.ipp: the longer bodies of device.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of device.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<Context> Context::open(ibv_device *dev, const context_options &o) noexcept {
  if (!dev) return make_error_code(errc::no_device);
#if RDMAXX_HAVE_MLX5
  const bool want_devx = o.mlx5_devx;
#else
  const bool want_devx = false;
  (void)o;
#endif
  bool devx = false;
  auto open_one = [&]() noexcept {
    const detail::opened_context oc = detail::open_context(
        dev, want_devx,
        [](ibv_device *d) noexcept -> ibv_context * {
#if RDMAXX_HAVE_MLX5
          return mlx5::open_devx(d);
#else
          (void)d;
          return nullptr;
#endif
        },
        [](ibv_device *d) noexcept { return ::ibv_open_device(d); });
    devx = oc.devx;
    return oc.ctx;
  };
  Context r;
  if (auto ec = detail::create_with_node(r.h_, nullptr, open_one)) return ec;
  r.devx_ = devx;
  return r;
}

[[nodiscard]] inline result<Capabilities> Context::query_capabilities(probe_options probes) const noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  ibv_device_attr_ex ax{};
  if (const int rc = ::ibv_query_device_ex(h_.get(), nullptr, &ax)) return errno_code(rc);
  const ibv_device_attr &a = ax.orig_attr;
  Capabilities c;
  const std::string_view n = name();
  n.copy(c.name, sizeof c.name - 1);
  c.vendor_id = a.vendor_id;
  c.vendor_part_id = a.vendor_part_id;
  c.phys_port_cnt = a.phys_port_cnt;
  c.mw_type1 = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW) != 0;
  c.mw_type2a = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A) != 0;
  c.mw_type2b = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
  c.max_mw = std::uint32_t(a.max_mw);
  c.max_mr = std::uint32_t(a.max_mr);
  c.max_mr_size = a.max_mr_size;
  c.max_sge = std::uint32_t(a.max_sge);
  c.max_qp_wr = std::uint32_t(a.max_qp_wr);
  c.max_cqe = std::uint32_t(a.max_cqe);
  c.max_qp_rd_atom = std::uint32_t(a.max_qp_rd_atom);
  c.atomics = a.atomic_cap != IBV_ATOMIC_NONE;
#if RDMAXX_HAVE_MLX5
  c.mlx5dv = ::mlx5dv_is_supported(h_.get()->device);
#endif
  c.mlx5_devx = mlx5_devx();
  c.umr_why = c.mlx5_devx ? umr_reason::chosen : umr_reason::no_devx; // unless probed
  if (!c.mlx5dv) probes.mlx5_umr = false;
  if (probes.inline_data || probes.native_rereg || probes.mlx5_umr) probe(c, probes);
  // As an #if, like every other use: undefined (a plain `g++ -I include` build) means 0.
#if RDMAXX_HAVE_MLX5
  constexpr bool built_with_mlx5 = true;
#else
  constexpr bool built_with_mlx5 = false;
#endif
  c.umr_why = detail::umr_reason_of(built_with_mlx5, c.mlx5dv, detail::umr_forced_software(), c.umr_why);
  // What IndirectKey::create's automatic choice makes: the software backend needs no window type
  // (without windows a key serves local use; remote rights are refused at configure).
  c.umr = c.umr_why == umr_reason::chosen ? umr_backend::mlx5 : umr_backend::software;
  detail::known_invalidate_defect(c.vendor_id, c.mlx5dv, c.remote_inv_unbound_mw_panics,
                                  c.defect_measured_on);
  const bool has_mw = c.max_mw != 0;
  const auto g = detail::choose_grant(has_mw && c.mw_type1, has_mw && c.mw_type2b,
                                      c.remote_inv_unbound_mw_panics, {}, std::getenv("RDMAXX_GRANT"));
  c.grant = g.mechanism;
  c.grant_reason = g.reason;
  return c;
}

[[gnu::cold]] inline void Context::probe(Capabilities &c, probe_options probes) const noexcept {
  ibv_pd *pd = ::ibv_alloc_pd(h_.get());
  if (!pd) return;
  if (probes.inline_data) {
    if (ibv_cq *cq = ::ibv_create_cq(h_.get(), 1, nullptr, nullptr, 0)) {
      for (std::uint32_t want : {1024u, 512u, 256u, 128u, 64u, 32u}) {
        ibv_qp_init_attr ia{};
        ia.send_cq = ia.recv_cq = cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap = {1, 1, 1, 1, want};
        if (ibv_qp *qp = ::ibv_create_qp(pd, &ia)) {
          c.max_inline_data = ia.cap.max_inline_data;
          ::ibv_destroy_qp(qp);
          break;
        }
      }
      ::ibv_destroy_cq(cq);
    }
  }
  if (probes.native_rereg) {
    void *buf = std::aligned_alloc(4096, 4096);
    const int acc = IBV_ACCESS_LOCAL_WRITE;
    if (ibv_mr *mr = buf ? ::ibv_reg_mr(pd, buf, 4096, acc) : nullptr) {
      errno = 0;
      const int rc = ::ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, acc);
      if (rc == 0)
        c.native_rereg = tristate::yes;
      else if (rc == IBV_REREG_MR_ERR_CMD && detail::is_unsupported_errno(errno))
        c.native_rereg = tristate::no;
      ::ibv_dereg_mr(mr);
    }
    std::free(buf);
  }
#if RDMAXX_HAVE_MLX5
  if (probes.mlx5_umr) {
    const mlx5::umr_probe p = mlx5::probe_umr_outcome(pd);
    c.mlx5_devx = p.outcome == mlx5::umr_probe::ok;
    c.umr_why = p.outcome == mlx5::umr_probe::ok                ? umr_reason::chosen
                : p.outcome == mlx5::umr_probe::atomic_disabled ? umr_reason::umr_modify_atomic_disabled
                : p.outcome == mlx5::umr_probe::query_failed    ? umr_reason::hca_query_failed
                : p.outcome == mlx5::umr_probe::indirect_disabled
                    ? umr_reason::umr_indirect_mkey_disabled
                    : umr_reason::mkey_creation_failed;
    c.umr_errno = p.outcome == mlx5::umr_probe::mkey_failed || p.outcome == mlx5::umr_probe::query_failed
                      ? p.err
                      : 0;
    if (p.outcome == mlx5::umr_probe::ok)
      c.umr_revocation = p.update_tag ? mkey_revocation::tag_rotation : mkey_revocation::quarantine;
  }
#endif
  ::ibv_dealloc_pd(pd);
}

} // namespace rdmaxx
