/// \file
/// rdmaxx/mlx5/context_mlx5.hpp: opening an mlx5 device with a DEVX context.
///
/// mlx5dv_create_mkey (the indirect mkey behind hardware UMR) creates its object through DEVX,
/// so it needs a context with DEVX. Context::open() asks for it explicitly on mlx5 devices
/// (mlx5dv_open_device(3) with MLX5DV_CONTEXT_FLAGS_DEVX, unless context_options::mlx5_devx is
/// false) and falls back to ibv_open_device when the provider refuses (old kernel, DEVX not
/// permitted). Since rdma-core 29 (commit ca93d3b73, "mlx5: Enable devx by default") a plain
/// ibv_open_device asks for DEVX too and silently retries without it (v44.0 mlx5.c:2596-2622),
/// so whether a context has DEVX is known only by trying: probe_umr() creates and destroys a
/// small indirect mkey, exactly what IndirectKey::create does, and Capabilities::umr follows it.
/// Compiled and contract-tested, NOT run on hardware.
#pragma once

#if RDMAXX_HAVE_MLX5

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

namespace rdmaxx::mlx5 {

/// The attributes given to mlx5dv_open_device: a DEVX context, nothing else.
[[nodiscard]] inline mlx5dv_context_attr devx_context_attr() noexcept {
  mlx5dv_context_attr a{};
  a.flags = MLX5DV_CONTEXT_FLAGS_DEVX;
  a.comp_mask = 0;
  return a;
}

/// mlx5dv_open_device with a DEVX context when `dev` is an mlx5 device (mlx5dv_is_supported);
/// nullptr for other devices or when the provider refuses (errno then says why). The caller
/// falls back to ibv_open_device.
[[nodiscard]] inline ibv_context *open_devx(ibv_device *dev) noexcept {
  if (!dev || !::mlx5dv_is_supported(dev)) return nullptr;
  mlx5dv_context_attr a = devx_context_attr();
  return ::mlx5dv_open_device(dev, &a);
}

/// True when an indirect mkey (4 entries) can be created on `pd` (mlx5dv_create_mkey, then
/// mlx5dv_destroy_mkey): the context has DEVX and the device UMR. The live probe behind
/// Capabilities::mlx5_devx / umr; IndirectKey::create decides the same way.
[[nodiscard]] inline bool probe_umr(ibv_pd *pd) noexcept {
  if (!pd || !::mlx5dv_is_supported(pd->context->device)) return false;
  mlx5dv_mkey_init_attr a{};
  a.pd = pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
  a.max_entries = 4;
  mlx5dv_mkey *k = ::mlx5dv_create_mkey(&a);
  if (!k) return false;
  (void)::mlx5dv_destroy_mkey(k);
  return true;
}

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
