/// \file
/// rdmaxx/mlx5/context_mlx5.hpp: opening an mlx5 device with a DEVX context.
///
/// mlx5dv_create_mkey (the indirect mkey behind hardware UMR) creates its object through DEVX,
/// so it needs a context opened by mlx5dv_open_device(3) with MLX5DV_CONTEXT_FLAGS_DEVX; a plain
/// ibv_open_device context makes it fail. Context::open() uses this on mlx5 devices (unless
/// context_options::mlx5_devx is false) and falls back to ibv_open_device when the provider
/// refuses (old kernel, DEVX not permitted). Compiled and contract-tested, NOT run on hardware.
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

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
