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

#include <endian.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

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

/// The signature of mlx5dv_devx_general_cmd(3).
using devx_cmd_verb = int (*)(ibv_context *, const void *, size_t, void *, size_t);

/// QUERY_HCA_CAP for the general device capabilities, current values, as rdma-core 44 builds it
/// (get_hca_general_caps, verbs.c:3784-3796): opcode MLX5_CMD_OP_QUERY_HCA_CAP = 0x100 in bits 0x00-0x0f, op_mod
/// (MLX5_CAP_GENERAL << 1) | HCA_CAP_OPMOD_GET_CUR = 1 in bits 0x30-0x3f (providers/mlx5/mlx5_ifc.h
/// v44.0, lines 38-45, 1510-1521, 1533), big-endian as DEVX_SET writes it.
inline constexpr std::uint16_t query_hca_cap_opcode = 0x100;
/// The op_mod of the query: the general capabilities, current values.
inline constexpr std::uint16_t hca_cap_general_cur = 1;
/// The reply: a 16-byte header (status, syndrome, reserved), then the 4096-byte capability union
/// (mlx5_ifc.h:1484-1508). umr_modify_atomic_disabled is bit 0x208 of cmd_hca_cap
/// (mlx5_ifc.h:819-983; its neighbours umr_modify_entity_size_disabled at 0x207 and
/// umr_indirect_mkey_disabled at 0x209).
inline constexpr std::size_t hca_cap_out_bytes = 16 + 4096;
/// The bit of umr_modify_atomic_disabled in the reply (after the 16-byte header).
inline constexpr std::size_t umr_modify_atomic_disabled_bit = 16 * 8 + 0x208;
/// The bit of umr_indirect_mkey_disabled (cmd_hca_cap bit 0x209, mlx5_ifc.h:984): the device
/// cannot configure an indirect mkey through a UMR.
inline constexpr std::size_t umr_indirect_mkey_disabled_bit = 16 * 8 + 0x209;
/// The bit of repeated_block_disabled (cmd_hca_cap bit 0x206, mlx5_ifc.h:981): no repeat
/// (interleaved, strided) block in a UMR.
inline constexpr std::size_t repeated_block_disabled_bit = 16 * 8 + 0x206;
/// The first bit of max_indirection, 8 bits (cmd_hca_cap bits 0x100-0x107, mlx5_ifc.h:870): the
/// most levels of indirect mkeys one access may go through.
inline constexpr std::size_t max_indirection_bit = 16 * 8 + 0x100;

/// The UMR capabilities of the device's general HCA caps that rdmaxx reads.
struct umr_hca_caps {
  /// umr_modify_atomic_disabled: rdma-core 44 sets the atomic bit in every access-flags setter's
  /// mask (qp.c:2929-2933), so every mkey configure fails at completion.
  bool atomic_disabled = false;
  /// umr_indirect_mkey_disabled: an indirect mkey cannot be configured through a UMR.
  bool indirect_mkey_disabled = false;
  /// repeated_block_disabled: no repeat layout (mlx5dv_wr_set_mkey_layout_interleaved).
  bool repeated_block_disabled = false;
  /// max_indirection: levels of indirect mkeys one access may go through (a key over regions
  /// only is one level, a key nesting such a key two). 0: the device reports none; rdmaxx then
  /// does not enforce a depth (see limits_for).
  std::uint8_t max_indirection = 0;
};

/// Read the UMR capabilities (umr_hca_caps) with one QUERY_HCA_CAP (mlx5dv_devx_general_cmd;
/// the contract tests hand a stand-in `cmd`) into `out`. Returns false when nothing is known:
/// a null `ctx` (`err`: EINVAL), or the command failed (`err`: its errno; on a context of
/// another provider it answers EOPNOTSUPP, verbs.c:5883-5892, mlx5.c:2732-2740); `out` is then
/// unchanged. `err`, when given, is 0 on success. Allocation-free (the 4 KiB reply is on the
/// stack).
[[nodiscard]] inline bool query_umr_caps(ibv_context *ctx, umr_hca_caps &out,
                                         devx_cmd_verb cmd = &::mlx5dv_devx_general_cmd,
                                         int *err = nullptr) noexcept {
  if (err) *err = ctx ? 0 : EINVAL;
  if (!ctx) return false;
  std::uint32_t in[4] = {};
  in[0] = htobe32(std::uint32_t(query_hca_cap_opcode) << 16);
  in[1] = htobe32(hca_cap_general_cur);
  std::uint32_t reply[hca_cap_out_bytes / 4] = {};
  if (const int rc = cmd(ctx, in, sizeof in, reply, sizeof reply); rc != 0) {
    if (err) *err = rc > 0 ? rc : EIO; // the provider answers an errno; never report success
    return false;
  }
  const auto bit = [&reply](std::size_t b) {
    return ((be32toh(reply[b / 32]) >> (31 - b % 32)) & 1) != 0;
  };
  umr_hca_caps c;
  c.atomic_disabled = bit(umr_modify_atomic_disabled_bit);
  c.indirect_mkey_disabled = bit(umr_indirect_mkey_disabled_bit);
  c.repeated_block_disabled = bit(repeated_block_disabled_bit);
  static_assert(max_indirection_bit % 32 == 0, "max_indirection is the top byte of its dword");
  c.max_indirection = std::uint8_t(be32toh(reply[max_indirection_bit / 32]) >> 24);
  out = c;
  return true;
}

/// What the device says about changing the atomic right of an mkey through a UMR.
enum class umr_atomic : std::uint8_t {
  allowed,  ///< umr_modify_atomic_disabled is 0
  disabled, ///< 1: rdma-core 44 puts the atomic bit into every access-flags setter's mask
            ///< (qp.c:2929-2933), so every mkey configure fails at completion
  unknown,  ///< the command failed (no DEVX, not permitted): nothing is known
};

/// Read umr_modify_atomic_disabled with QUERY_HCA_CAP (mlx5dv_devx_general_cmd; the contract
/// tests hand a stand-in `cmd`). On a context of another provider the command answers
/// EOPNOTSUPP (verbs.c:5883-5892, mlx5.c:2732-2740): unknown. `err`, when given, receives the
/// command's errno when it failed (EINVAL for a null `ctx`), else 0. Allocation-free (the 4 KiB
/// reply is on the stack).
[[nodiscard]] inline umr_atomic query_umr_atomic(ibv_context *ctx,
                                                 devx_cmd_verb cmd = &::mlx5dv_devx_general_cmd,
                                                 int *err = nullptr) noexcept {
  umr_hca_caps c;
  if (!query_umr_caps(ctx, c, cmd, err)) return umr_atomic::unknown;
  return c.atomic_disabled ? umr_atomic::disabled : umr_atomic::allowed;
}

/// What probe_umr_outcome() found.
struct umr_probe {
  /// The outcome.
  enum kind : std::uint8_t {
    ok,              ///< an indirect mkey was created and destroyed
    not_mlx5,        ///< `pd` is null or not on an mlx5 device
    atomic_disabled, ///< the device reports umr_modify_atomic_disabled (query_umr_caps)
    mkey_failed,     ///< mlx5dv_create_mkey failed (`err`: its errno, EOPNOTSUPP without DEVX)
    query_failed,    ///< QUERY_HCA_CAP failed (`err`: its errno): nothing known, no mlx5 (fails closed)
    indirect_disabled, ///< the device reports umr_indirect_mkey_disabled (query_umr_caps)
  };
  kind outcome = not_mlx5; ///< what was found
  int err = 0; ///< with mkey_failed: the errno of mlx5dv_create_mkey; query_failed: the command's
  /// With ok: the mkey was created with MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG (the kernel
  /// reports MLX5_CTX_FLAGS_MKEY_UPDATE_TAG_SUPPORTED): keys rotate their tags; without, rdmaxx
  /// quarantines mkey indexes (Capabilities::umr_revocation).
  bool update_tag = false;
};

/// Whether an indirect mkey (4 entries) can be created on `pd` (mlx5dv_create_mkey, then
/// mlx5dv_destroy_mkey), and if not, why: the context has DEVX and the device UMR, and the
/// device reports neither umr_modify_atomic_disabled nor umr_indirect_mkey_disabled
/// (query_umr_caps, asked first: every configure would fail there; a failed query fails
/// closed). The live probe behind Capabilities::mlx5_devx / umr / umr_why; IndirectKey::create
/// decides the same way, in the same order.
[[nodiscard]] inline umr_probe probe_umr_outcome(ibv_pd *pd) noexcept {
  if (!pd || !::mlx5dv_is_supported(pd->context->device)) return {umr_probe::not_mlx5, 0};
  int qerr = 0;
  umr_hca_caps caps;
  if (!query_umr_caps(pd->context, caps, &::mlx5dv_devx_general_cmd, &qerr)) return {umr_probe::query_failed, qerr};
  if (caps.atomic_disabled) return {umr_probe::atomic_disabled, 0};
  if (caps.indirect_mkey_disabled) return {umr_probe::indirect_disabled, 0};
  // As IndirectKey::create: with tag update first, without it on EOPNOTSUPP (verbs.c:6751-6762).
  mlx5dv_mkey_init_attr a{};
  a.pd = pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG;
  a.max_entries = 4;
  bool tag = true;
  mlx5dv_mkey *k = ::mlx5dv_create_mkey(&a);
  if (!k && errno == EOPNOTSUPP) {
    a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
    a.max_entries = 4;
    tag = false;
    k = ::mlx5dv_create_mkey(&a);
  }
  if (!k) return {umr_probe::mkey_failed, errno};
  (void)::mlx5dv_destroy_mkey(k);
  return {umr_probe::ok, 0, tag};
}

/// True when probe_umr_outcome(pd) finds an indirect mkey can be created.
[[nodiscard]] inline bool probe_umr(ibv_pd *pd) noexcept { return probe_umr_outcome(pd).outcome == umr_probe::ok; }

} // namespace rdmaxx::mlx5

#endif // RDMAXX_HAVE_MLX5
