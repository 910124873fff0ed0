/// \file
/// rdmaxx/device.hpp: the device list, the device Context and its Capabilities.
///
/// Lifetime: a Context is the root parent. ProtectionDomains, CompletionQueues and
/// CompletionChannels borrow it and must be destroyed first (see detail/handle.hpp).
///
/// Allocation: DeviceList::get() and Context::open() allocate inside verbs; Context::open() also
/// allocates the small node that counts its children (new(nothrow): out of memory is an error code,
/// never an exception). Queries allocate nothing but what verbs and the live probes' scratch
/// objects allocate.
#pragma once

#include "detail/atomic.hpp"
#include "detail/handle.hpp"
#include "detail/span.hpp"
#include "error.hpp"

#include <infiniband/verbs.h>
#if RDMAXX_HAVE_MLX5
#include "mlx5/context_mlx5.hpp"
#endif

#include <cstddef>
#include <cstdint>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <poll.h>
#include <sys/utsname.h>
#include <span>
#include <string_view>

namespace rdmaxx {

/// The RDMA devices present (ibv_get_device_list(3)); owns the list, frees it on destruction.
class DeviceList {
public:
  DeviceList() noexcept = default;
  /// Moves the list; the moved-from list is empty (size() 0, no devices).
  DeviceList(DeviceList &&o) noexcept : h_(std::move(o.h_)), n_(std::exchange(o.n_, 0)) {}
  /// Frees the list held (ibv_free_device_list) and takes `o`'s; `o` is left empty.
  DeviceList &operator=(DeviceList &&o) noexcept {
    h_ = std::move(o.h_);
    n_ = std::exchange(o.n_, 0);
    return *this;
  }

  /// ibv_get_device_list. An empty list is not an error.
  /// \errors
  /// - the errno of ibv_get_device_list (ENOSYS: no kernel support, EPERM).
  /// \mallocs The list, inside verbs.
  [[nodiscard]] static result<DeviceList> get() noexcept {
    int n = 0;
    ibv_device **l = ::ibv_get_device_list(&n);
    if (!l) return last_errno();
    return DeviceList(l, n);
  }

  /// The number of devices.
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// True when there is no device (not an error: a host without RDMA).
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  /// Device `i` (`i < size()`, not checked).
  [[nodiscard]] ibv_device *operator[](std::size_t i) const noexcept { return h_.get()[i]; }
  /// All devices, for range-for.
  [[nodiscard]] std::span<ibv_device *const> devices() const noexcept {
    return detail::span_of(static_cast<ibv_device *const *>(h_.get()), n_);
  }
  /// The list as ibv_get_device_list returned it (owned by this object).
  [[nodiscard]] ibv_device **native_handle() const noexcept { return h_.get(); }
  /// The device called `name`, or nullptr.
  [[nodiscard]] ibv_device *find(std::string_view name) const noexcept {
    for (ibv_device *d : devices())
      if (name == ::ibv_get_device_name(d)) return d;
    return nullptr;
  }

private:
  using traits = detail::deleter<ibv_device *, ::ibv_free_device_list, "DeviceList", "ibv_free_device_list",
                                 1, detail::destroy_returns::nothing>;
  DeviceList(ibv_device **l, int n) noexcept : h_(l, nullptr, nullptr), n_(std::size_t(n)) {}
  detail::handle<traits> h_;
  std::size_t n_ = 0;
};

/// Yes / no / not known (a capability verbs does not report and that was not probed).
enum class tristate : std::uint8_t { unknown, no, yes };

/// How IndirectKey (indirect_key.hpp) works on a device: hardware UMR through mlx5dv, the
/// portable software path (flattened segments; remote use through type-2 memory windows), or
/// none (no hardware UMR and no type-2 windows: software keys work for local use only).
enum class umr_backend : std::uint8_t { none, software, mlx5 };

/// Why IndirectKey's automatic choice on a device is, or is not, the mlx5 backend
/// (Capabilities::umr_why; umr_reason_text() says it in words).
enum class umr_reason : std::uint8_t {
  chosen,                     ///< mlx5: an indirect mkey was created (or, unprobed, DEVX was opened)
  no_mlx5_build,              ///< rdmaxx was built without the mlx5 option (no mlx5dv at build time)
  not_mlx5_device,            ///< mlx5dv_is_supported says no: not an mlx5 device
  forced_software,            ///< RDMAXX_UMR=software in the environment
  /// The HCA reports umr_modify_atomic_disabled (DEVX QUERY_HCA_CAP): rdma-core 44 sets the
  /// atomic bit in every access-flags setter, so every configure would fail.
  umr_modify_atomic_disabled,
  /// mlx5dv_create_mkey of a 4-entry indirect mkey failed (Capabilities::umr_errno: EOPNOTSUPP
  /// for a context without DEVX, or no UMR).
  mkey_creation_failed,
  no_devx,                    ///< not probed (probe_options::mlx5_umr false), and not opened with DEVX
  /// DEVX QUERY_HCA_CAP failed (Capabilities::umr_errno: its errno): umr_modify_atomic_disabled
  /// is unknown, and a failed device query fails closed (no mlx5 backend).
  hca_query_failed,
  /// The HCA reports umr_indirect_mkey_disabled (DEVX QUERY_HCA_CAP): no indirect mkey can be
  /// configured through a UMR.
  umr_indirect_mkey_disabled,
};

/// One sentence for `r` (static storage).
[[nodiscard]] constexpr const char *umr_reason_text(umr_reason r) noexcept {
  switch (r) {
  case umr_reason::chosen: return "hardware UMR (mlx5dv indirect mkey)";
  case umr_reason::no_mlx5_build: return "rdmaxx was built without the mlx5 option (no mlx5dv at build time)";
  case umr_reason::not_mlx5_device: return "not an mlx5 device";
  case umr_reason::forced_software: return "forced to software by RDMAXX_UMR=software";
  case umr_reason::umr_modify_atomic_disabled:
    return "the device reports umr_modify_atomic_disabled: rdma-core 44 would fail every mkey configure";
  case umr_reason::mkey_creation_failed: return "mlx5dv_create_mkey failed (no DEVX context, or no UMR)";
  case umr_reason::no_devx: return "not probed, and the context was opened without DEVX";
  case umr_reason::hca_query_failed:
    return "DEVX QUERY_HCA_CAP failed: umr_modify_atomic_disabled unknown (fails closed)";
  case umr_reason::umr_indirect_mkey_disabled:
    return "the device reports umr_indirect_mkey_disabled: no indirect mkey can be configured";
  }
  return "unknown";
}

/// How the library grants a peer remote access to memory (StrictGrant::create without a window
/// type, and everything else that hands a peer a key). Chosen per device by
/// Context::query_capabilities (Capabilities::grant, with the reason in grant_reason).
enum class grant_mechanism : std::uint8_t {
  /// No memory windows: the library hands out no grant keys (StrictGrant::create answers
  /// errc::unsupported).
  none,
  /// A type-2B window bound over a region of exactly the granted bytes, revoked by a local or the
  /// peer's remote invalidation: the fast default where remote invalidation of an unbound window
  /// is handled by the device (mlx5), and the opt-in for trusted peers elsewhere. One
  /// construction for every grant form: StrictGrant, GrantPool's slots and each segment of a
  /// software IndirectKey.
  type2_window,
  /// A type-1 window bound over a region of exactly the granted bytes (the region is registered
  /// once per grant slot, the window bound and unbound per grant): bounds are the region's, which
  /// every device enforces, and a type-1 key cannot be remotely invalidated (a peer's
  /// send-with-invalidate naming it is refused with IBV_WC_REM_INV_REQ_ERR). Type-1 keys are
  /// PD-scoped: for per-peer isolation create each peer's grants on that peer's PD.
  type1_exact_region,
};

/// The acknowledgement every public path that would allocate a type-2 window asks for on a device
/// where a peer's send-with-invalidate of an unbound type-2 window panics the kernel
/// (Capabilities::remote_inv_unbound_mw_panics, rxe). The exposure is DEVICE-WIDE, not per peer:
/// rxe checks neither the PD nor the QP of a remote invalidation, and window keys are guessable
/// (a sequential index and 8 bits), so once one type-2 window exists on the device, any peer that
/// can reach it (another PD, another process, another host) can find its key and panic the
/// kernel. Only the panic canaries and tests of type-2 behaviour pass the acceptance.
enum class type2_risk : std::uint8_t {
  refuse,                          ///< the default: errc::unsafe_grant on such a device
  accept_kernel_panic_by_any_peer, ///< allocate anyway, knowing the whole device is exposed
};

/// How a revoked mlx5 indirect key's rkey is kept from answering again, across keys
/// (Capabilities::umr_revocation; mlx5/indirect_key_mlx5.hpp).
enum class mkey_revocation : std::uint8_t {
  none,         ///< no mlx5 backend here (or not probed)
  /// The kernel has mkey tag update: each key starts at a process-wide rotating variant and
  /// rotates its 8-bit tag at each configure; it retires when the tag comes back to its start.
  tag_rotation,
  /// No tag update (an mkey's only rkey is index << 8): rdmaxx quarantines every mkey index whose
  /// rkey it handed to the device, for the process's life (one 2 MiB table per device), refuses
  /// to configure an mkey the firmware created on such an index (errc::key_retired), and
  /// IndirectKey::create asks for another; one configure per key.
  quarantine,
};

struct Capabilities;

/// Opt-ins for StrictGrant::create (and anything else that hands a peer a key).
struct grant_options {
  /// The peers are trusted not to send a send-with-invalidate naming a key that is no longer bound
  /// (or one twice): type-2 windows and remote invalidation are used where the device is not
  /// known to panic on them. On a device known to panic (rxe) this is not enough (the exposure is
  /// device-wide, see type2_risk): type 2 there needs `type2`. Default false: the library chooses
  /// the mechanism (Capabilities::grant).
  bool trusted_peers = false;
  /// Type-2 windows on a device where any peer could then panic the kernel (see type2_risk).
  type2_risk type2 = type2_risk::refuse;
  /// The device's capabilities, if the caller has them (Context::query_capabilities of the same
  /// device; must outlive the call): the mechanism is then chosen from them, without an
  /// ibv_query_device_ex per grant. nullptr: the grant queries the device.
  const Capabilities *caps = nullptr;
};

/// The vendor id rxe (Soft-RoCE) reports (ibv_device_attr::vendor_id).
inline constexpr std::uint32_t rxe_vendor_id = 0xFFFFFF;

namespace detail {
/// Capabilities::umr_why from what is known, in the order IndirectKey::create decides (pure).
/// `probed`: the live probe's outcome (chosen, umr_modify_atomic_disabled, mkey_creation_failed),
/// or, unprobed, chosen / no_devx by how the context was opened.
[[nodiscard]] constexpr umr_reason umr_reason_of(bool built_mlx5, bool mlx5_device, bool forced_software,
                                                 umr_reason probed) noexcept {
  if (!built_mlx5) return umr_reason::no_mlx5_build;
  if (!mlx5_device) return umr_reason::not_mlx5_device;
  if (forced_software) return umr_reason::forced_software;
  return probed;
}
} // namespace detail

namespace detail {
/// RDMAXX_UMR=software forces the software backend (tests, devices where UMR misbehaves).
[[nodiscard]] inline bool umr_forced_software() noexcept {
  const char *v = std::getenv("RDMAXX_UMR");
  return v && std::string_view(v) == "software";
}
} // namespace detail

/// What a device can do for memory registration, windows and indirect keys.
struct Capabilities {
  /// Device name (ibv_get_device_name), NUL-terminated.
  char name[IBV_SYSFS_NAME_MAX] = {};
  /// IEEE vendor id (ibv_device_attr::vendor_id).
  std::uint32_t vendor_id = 0;
  /// The vendor's part id (vendor_part_id).
  std::uint32_t vendor_part_id = 0;
  /// Number of physical ports (phys_port_cnt).
  std::uint8_t phys_port_cnt = 0;
  bool mw_type1 = false;   ///< IBV_DEVICE_MEM_WINDOW
  bool mw_type2a = false;  ///< IBV_DEVICE_MEM_WINDOW_TYPE_2A
  bool mw_type2b = false;  ///< IBV_DEVICE_MEM_WINDOW_TYPE_2B
  /// Most memory windows (max_mw).
  std::uint32_t max_mw = 0;
  /// Most memory regions (max_mr).
  std::uint32_t max_mr = 0;
  /// Largest memory region in bytes (max_mr_size).
  std::uint64_t max_mr_size = 0;
  /// Most scatter/gather entries per work request (max_sge).
  std::uint32_t max_sge = 0;
  /// Most outstanding work requests per queue (max_qp_wr).
  std::uint32_t max_qp_wr = 0;
  /// Most entries of a completion queue (max_cqe).
  std::uint32_t max_cqe = 0;
  /// Most outstanding RDMA reads and atomics per QP as target (max_qp_rd_atom).
  std::uint32_t max_qp_rd_atom = 0;
  bool atomics = false;    ///< atomic_cap != IBV_ATOMIC_NONE
  /// Largest max_inline_data a RC QP accepted when probed (verbs does not report it);
  /// 0 when not probed or the probe failed.
  std::uint32_t max_inline_data = 0;
  bool mlx5dv = false;     ///< mlx5dv_is_supported (false when built without the mlx5 option)
  /// The context can create DEVX objects (hardware UMR needs it): with probe_options::mlx5_umr
  /// (the default) an indirect mkey was created and destroyed (mlx5::probe_umr, what
  /// IndirectKey::create does); without it, whether Context::open got DEVX through
  /// mlx5dv_open_device (a plain ibv_open_device may have DEVX too: see context_mlx5.hpp).
  bool mlx5_devx = false;
  /// ibv_rereg_mr works here: probed by re-registering a scratch MR with unchanged access.
  tristate native_rereg = tristate::unknown;
  /// The backend IndirectKey::create's automatic choice makes here (RDMAXX_UMR=software forces
  /// software): mlx5 when mlx5dv and mlx5_devx (with the default probe, exactly when create()
  /// chooses mlx5), software otherwise, with any window type or none (remote rights then need
  /// Capabilities::grant). none only in a default-constructed Capabilities.
  umr_backend umr = umr_backend::none;
  /// Why `umr` is, or is not, mlx5 (umr_reason_text() in words).
  umr_reason umr_why = umr_reason::no_mlx5_build;
  /// With umr_reason::mkey_creation_failed: the errno of the probe's mlx5dv_create_mkey; with
  /// umr_reason::hca_query_failed: the errno of its QUERY_HCA_CAP; else 0.
  int umr_errno = 0;
  /// With the mlx5 backend (probed): how revoked rkeys stay dead across keys, tag rotation where
  /// the kernel has mkey tag update, quarantine of mkey indexes where it has not (the firmware's
  /// index allocation is never relied on). mkey_revocation::none otherwise.
  mkey_revocation umr_revocation = mkey_revocation::none;
  /// Whether accesses through a window's rkey are confined to the window (rxe: no, only the MR's
  /// bounds are checked). Only probe_window_bounds() (probe.hpp) sets it.
  tristate mw_bounds_enforced = tristate::unknown;
  /// Whether the kernel panics when a peer's send-with-invalidate names a type-2 window that is
  /// allocated but not bound (the owner invalidated it, or the peer already did once): yes on rxe
  /// (NULL dereference in rxe_invalidate_mw from the responder; measured on the kernels named in
  /// defect_measured_on, Linux 6.1 and 6.12, and assumed on any other), no on mlx5 (hardware; not
  /// run here), unknown elsewhere. Known from the device, not probed (the probe would be the panic).
  tristate remote_inv_unbound_mw_panics = tristate::unknown;
  /// Where remote_inv_unbound_mw_panics was measured (empty when not measured); on rxe under a
  /// kernel of another series it also says so, with that kernel's release: "...; not on this
  /// kernel (Linux 6.8.0-31-generic): assumed to panic".
  const char *defect_measured_on = "";
  /// The grant mechanism the library uses on this device (see grant_mechanism) and why.
  grant_mechanism grant = grant_mechanism::none;
  /// One sentence: why `grant` was chosen.
  const char *grant_reason = "";
};

namespace detail {
/// The library's choice of grant mechanism (pure: no verbs). RDMAXX_GRANT=type2 (or type1) in
/// the environment forces that mechanism where the device has the window type, except type 2 on
/// a device known to panic (only grant_options::type2 allows that: the panic canaries pass it);
/// never set it for untrusted peers.
struct grant_choice {
  grant_mechanism mechanism = grant_mechanism::none;
  const char *reason = "";
  /// none because the only window type would be unsafe with untrusted peers (errc::unsafe_grant).
  bool unsafe = false;
};
[[nodiscard]] inline grant_choice choose_grant(bool type1, bool type2b, tristate panics,
                                               grant_options o, const char *forced) noexcept {
  const std::string_view f = forced ? forced : "";
  const bool risk = o.type2 == type2_risk::accept_kernel_panic_by_any_peer;
  const bool panics_yes = panics == tristate::yes;
  // The environment never exposes a kernel known to panic: only the caller's type2_risk does.
  if (f == "type2" && type2b && !panics_yes)
    return {grant_mechanism::type2_window, "forced by RDMAXX_GRANT=type2 (unsafe with untrusted peers)"};
  if (f == "type1" && type1)
    return {grant_mechanism::type1_exact_region, "forced by RDMAXX_GRANT=type1"};
  if (!type1 && !type2b) return {grant_mechanism::none, "the device has no memory windows"};
  if (risk && type2b)
    return {grant_mechanism::type2_window,
            "type-2B windows accepted with type2_risk::accept_kernel_panic_by_any_peer"};
  if (o.trusted_peers && type2b && !panics_yes)
    return {grant_mechanism::type2_window, "trusted peers (grant_options::trusted_peers): type-2B windows"};
  if (panics == tristate::no && type2b)
    return {grant_mechanism::type2_window,
            "the device handles remote invalidation of unbound windows: type-2B windows, fastest revoke"};
  if (type1)
    return {grant_mechanism::type1_exact_region,
            panics_yes
                ? "a peer's send-with-invalidate of an unbound type-2 window panics this kernel: "
                  "type-1 windows over exact regions (cannot be remotely invalidated)"
                : "remote invalidation of unbound type-2 windows not known safe here: "
                  "type-1 windows over exact regions (cannot be remotely invalidated)"};
  if (panics_yes)
    return {grant_mechanism::none,
            "only type-2 windows, and a peer's send-with-invalidate of an unbound one panics this "
            "kernel: no grants unless type2_risk::accept_kernel_panic_by_any_peer",
            true};
  return {grant_mechanism::type2_window, "only type-2 windows (defect not known for this device)"};
}
/// The kernels whose rxe was measured to panic on a peer's send-with-invalidate of an unbound
/// type-2 window (test/rxe/run-canaries: 4 of 4 on each; docs/kernels.md).
inline constexpr const char *rxe_defect_measured_kernels =
    "Linux 6.1.0-57-amd64 and 6.12.118+deb12-amd64 (Debian 12), rdma-core 44, rxe";
/// Whether a kernel release (uname -r, "6.12.118+deb12-amd64") is of a series the panic was
/// measured on: 6.1 or 6.12 ("6.1.x" and "6.1-x", not "6.10").
[[nodiscard]] constexpr bool rxe_defect_measured(std::string_view release) noexcept {
  for (const std::string_view series : {std::string_view("6.1"), std::string_view("6.12")}) {
    if (release.substr(0, series.size()) != series) continue;
    if (release.size() == series.size() || release[series.size()] == '.' || release[series.size()] == '-')
      return true;
  }
  return false;
}
/// Capabilities::defect_measured_on of rxe on the running kernel: the kernels measured and, on
/// any other kernel, that this one was not measured and the panic is assumed (fail closed). Built
/// once per process from uname(2): a process's kernel does not change.
[[nodiscard]] inline const char *rxe_defect_measured_on() noexcept {
  static const std::array<char, 320> text = [] {
    std::array<char, 320> t{};
    utsname u{};
    const bool known = ::uname(&u) == 0;
    if (known && rxe_defect_measured(u.release))
      std::snprintf(t.data(), t.size(), "%s", rxe_defect_measured_kernels);
    else
      std::snprintf(t.data(), t.size(), "%s; not on this kernel (Linux %s): assumed to panic",
                    rxe_defect_measured_kernels, known ? u.release : "of unknown version");
    return t;
  }();
  return text.data();
}
/// What is known of the remote-invalidate panic for a device (see Capabilities). rxe: yes on every
/// kernel, measured on 6.1 and 6.12 and assumed on any other (the text says which).
inline void known_invalidate_defect(std::uint32_t vendor_id, bool mlx5dv, tristate &panics,
                                    const char *&measured_on) noexcept {
  if (vendor_id == rxe_vendor_id) {
    panics = tristate::yes;
    measured_on = rxe_defect_measured_on();
  } else if (mlx5dv) {
    panics = tristate::no;
    measured_on = "";
  }
}
/// Whether a device's receive completions of a peer's send-with-invalidate lack IBV_WC_WITH_INV
/// (rxe copies the kernel's flag bit, which reads as IBV_WC_IP_CSUM_OK; see invalidated_rkey).
[[nodiscard]] constexpr bool known_omits_with_inv(std::uint32_t vendor_id) noexcept {
  return vendor_id == rxe_vendor_id;
}
} // namespace detail

/// FAULT INJECTION, for tests only: rxe's ibv_query_device_ex does not fail, so the rule that a
/// failed query refuses a grant (fails closed, never guesses a mechanism) cannot be shown on
/// it. A test may install a function called INSTEAD of ibv_query_device_ex by the grant
/// mechanism's choice (detail::query_defect: StrictGrant, GrantPool, IndirectKey, the type-2
/// check of MemoryWindow::alloc); nullptr restores the real verb. Never in production code.
namespace fault_injection {
/// The signature of ibv_query_device_ex(3).
using query_device_fn = int (*)(ibv_context *ctx, const ibv_query_device_ex_input *input,
                                ibv_device_attr_ex *attr);
/// The installed substitute (nullptr: the real verb). Install through set_query_device().
inline detail::atomic<query_device_fn> &query_device_override() noexcept {
  static detail::atomic<query_device_fn> fn{nullptr};
  return fn;
}
/// Install (or with nullptr remove) the substitute. Returns the previous one.
inline query_device_fn set_query_device(query_device_fn fn) noexcept {
  return query_device_override().exchange(fn);
}
} // namespace fault_injection

namespace detail {
/// ibv_query_device_ex into `ax`, and what is known of the remote-invalidate panic of that device
/// (known_invalidate_defect). Returns 0 or the query's errno.
[[nodiscard]] inline int query_defect(ibv_context *ctx, ibv_device_attr_ex &ax, tristate &panics) noexcept {
  auto query = fault_injection::query_device_override().load(detail::order::acquire);
  if (const int rc = query ? query(ctx, nullptr, &ax) : ::ibv_query_device_ex(ctx, nullptr, &ax)) return rc;
  bool mlx5dv = false;
#if RDMAXX_HAVE_MLX5
  mlx5dv = ::mlx5dv_is_supported(ctx->device);
#endif
  const char *measured = "";
  known_invalidate_defect(ax.orig_attr.vendor_id, mlx5dv, panics, measured);
  return 0;
}
/// Whether a type-2 window may be allocated on the device of `ctx` (one ibv_query_device_ex):
/// refused with errc::unsafe_grant where the kernel is known to panic (see type2_risk) unless
/// accepted; a failed query fails closed (its errno).
[[nodiscard]] inline std::error_code check_type2(ibv_context *ctx, type2_risk r) noexcept {
  if (r == type2_risk::accept_kernel_panic_by_any_peer) return {};
  ibv_device_attr_ex ax{};
  tristate panics = tristate::unknown;
  if (const int rc = query_defect(ctx, ax, panics)) return errno_code(rc);
  if (panics == tristate::yes) return make_error_code(errc::unsafe_grant);
  return {};
}
/// The grant mechanism for the device of `ctx`: from o.caps when given (they must be of that
/// device: errc::context_mismatch otherwise), else one ibv_query_device_ex (no probes).
[[nodiscard]] inline result<grant_choice> grant_for(ibv_context *ctx, grant_options o) noexcept {
  if (o.caps) {
    const Capabilities &c = *o.caps;
    if (std::string_view(c.name) != ::ibv_get_device_name(ctx->device))
      return make_error_code(errc::context_mismatch);
    const bool has_mw = c.max_mw != 0;
    return choose_grant(has_mw && c.mw_type1, has_mw && c.mw_type2b, c.remote_inv_unbound_mw_panics, o,
                        std::getenv("RDMAXX_GRANT"));
  }
  ibv_device_attr_ex ax{};
  tristate panics = tristate::unknown;
  if (const int rc = query_defect(ctx, ax, panics)) return errno_code(rc);
  const auto f = ax.orig_attr.device_cap_flags;
  const bool has_mw = ax.orig_attr.max_mw != 0;
  return choose_grant(has_mw && (f & IBV_DEVICE_MEM_WINDOW) != 0,
                      has_mw && (f & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0, panics, o,
                      std::getenv("RDMAXX_GRANT"));
}
} // namespace detail

/// Which live probes query_capabilities runs (each creates and destroys scratch objects).
struct probe_options {
  /// Probe the largest max_inline_data (scratch CQ and QPs).
  bool inline_data = true;
  /// Probe ibv_rereg_mr (registers and re-registers a scratch page).
  bool native_rereg = true;
  /// mlx5 devices: probe hardware UMR by creating and destroying a 4-entry indirect mkey.
  bool mlx5_umr = true;
};

/// How Context::open() opens a device.
struct context_options {
  /// On mlx5 devices, ask for a DEVX context explicitly (mlx5dv_open_device), which hardware
  /// UMR needs. false does not prevent DEVX: since rdma-core 29 ibv_open_device asks for it too
  /// (mlx5.c:2596-2622). Ignored for other devices and in builds without the mlx5 option.
  bool mlx5_devx = true;
};

namespace detail {
/// What Context::open opened: the context, and whether the explicit DEVX open gave it.
struct opened_context {
  ibv_context *ctx = nullptr;
  bool devx = false;
};
/// Context::open's choice of verb: `open_devx(dev)` first when `want_devx`, `open_plain(dev)`
/// when that was not asked for or gave nullptr. Separate so that the fallback is tested
/// without a device.
template <class OpenDevx, class OpenPlain>
[[nodiscard]] inline opened_context open_context(ibv_device *dev, bool want_devx, OpenDevx &&open_devx,
                                                 OpenPlain &&open_plain) noexcept {
  opened_context o;
  if (want_devx) o.devx = (o.ctx = open_devx(dev)) != nullptr;
  if (!o.ctx) o.ctx = open_plain(dev);
  return o;
}
} // namespace detail

/// An open device (ibv_open_device(3), or mlx5dv_open_device(3) on mlx5).
class Context {
public:
  Context() noexcept = default;

  /// ibv_open_device; on mlx5 devices (built with the mlx5 option) mlx5dv_open_device with a
  /// DEVX context first, which hardware UMR needs, falling back to ibv_open_device when refused.
  /// \errors
  /// - errc::no_device: `dev` is null.
  /// - the errno of ibv_open_device (ENOMEM, EPERM, ...).
  /// \mallocs One node that counts the Context's children (new(nothrow)), besides what verbs
  /// allocates.
  [[nodiscard]] static result<Context> open(ibv_device *dev, const context_options &o = {}) noexcept;
  /// Open the device called `name`.
  /// \errors
  /// - errc::no_device: no device is called `name`.
  /// - then those of open().
  /// \mallocs The device list (DeviceList::get(), freed before returning) and as open().
  [[nodiscard]] static result<Context> open(std::string_view name, const context_options &o = {}) noexcept {
    RDMAXX_TRY(list, DeviceList::get());
    return open(list.find(name), o);
  }
  /// Open the first device.
  /// \errors
  /// - errc::no_device: there is no device.
  /// - then those of open().
  /// \mallocs The device list (DeviceList::get(), freed before returning) and as open().
  [[nodiscard]] static result<Context> open_first(const context_options &o = {}) noexcept {
    RDMAXX_TRY(list, DeviceList::get());
    return open(list.empty() ? nullptr : list[0], o);
  }

  /// True when opened with an mlx5 DEVX context (see context_options); false when null.
  [[nodiscard]] bool mlx5_devx() const noexcept { return h_ && devx_; }
  /// The ibv_context (owned: do not close it), or nullptr.
  [[nodiscard]] ibv_context *native_handle() const noexcept { return h_.get(); }
  /// True unless null (default-constructed, moved from or destroyed).
  [[nodiscard]] explicit operator bool() const noexcept { return bool(h_); }
  /// The device name (ibv_get_device_name); empty when null.
  [[nodiscard]] std::string_view name() const noexcept {
    return h_ ? ::ibv_get_device_name(h_.get()->device) : std::string_view{};
  }
  /// ibv_close_device(3) now, and report the outcome. On failure the Context stays valid. A null
  /// Context: success, nothing is called.
  /// \errors
  /// - errc::busy: children (PDs, CQs, channels) live; nothing is called.
  /// - the errno of ibv_close_device.
  /// \mallocs None.
  result<void> destroy() noexcept { return h_.destroy(); }
  /// The former name of destroy().
  [[deprecated("use destroy()")]] result<void> close() noexcept { return destroy(); }

  /// ibv_query_port.
  /// \errors
  /// - errc::null_handle: the Context is null.
  /// - the errno of ibv_query_port (EINVAL: bad port).
  /// \mallocs None.
  [[nodiscard]] result<ibv_port_attr> query_port(std::uint8_t port = 1) const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    ibv_port_attr a{};
    if (const int rc = ::ibv_query_port(h_.get(), port, &a)) return errno_code(rc);
    return a;
  }
  /// Wait up to `timeout_ms` for one asynchronous event of the device (ibv_get_async_event(3)),
  /// acknowledge it (ibv_ack_async_event) and return a copy. This is how failures that no
  /// completion carries are learned: a CQ overrun (IBV_EVENT_CQ_ERR), a QP fatal error, a port
  /// going down. The copy's element pointer (event.element.cq, .qp, ...) identifies the object;
  /// it must not be used after that object is destroyed; async_error() turns the event into an
  /// error_code (empty for informational events).
  /// \errors
  /// - errc::null_handle: the Context is null.
  /// - errc::timeout: no event within the time.
  /// - the errno of poll(2) / ibv_get_async_event.
  /// \mallocs None.
  [[nodiscard]] result<ibv_async_event> wait_async_event(int timeout_ms) const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    pollfd p{h_.get()->async_fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, timeout_ms);
    if (pr < 0) return last_errno();
    if (pr == 0) return make_error_code(errc::timeout);
    ibv_async_event ev{};
    if (::ibv_get_async_event(h_.get(), &ev)) return last_errno();
    const ibv_async_event copy = ev;
    ::ibv_ack_async_event(&ev);
    return copy;
  }
  /// ibv_query_gid.
  /// \errors
  /// - errc::null_handle: the Context is null.
  /// - the errno of ibv_query_gid.
  /// \mallocs None.
  [[nodiscard]] result<ibv_gid> query_gid(std::uint8_t port, int index) const noexcept {
    if (!h_) return make_error_code(errc::null_handle);
    ibv_gid g{};
    if (::ibv_query_gid(h_.get(), port, index, &g)) return last_errno();
    return g;
  }

  /// ibv_query_device_ex, plus the live probes chosen in `probes` (scratch PD, CQ, QP and MR,
  /// destroyed before returning).
  /// \errors
  /// - errc::null_handle: the Context is null.
  /// - the errno of ibv_query_device_ex.
  /// \mallocs Only the probes' scratch objects: inside verbs, plus one page (std::aligned_alloc,
  /// freed before returning) for the native_rereg probe.
  [[nodiscard]] result<Capabilities> query_capabilities(probe_options probes = {}) const noexcept;

private:
  using traits = detail::deleter<ibv_context, ::ibv_close_device, "Context", "ibv_close_device">;

  // The live probes use raw verbs: they run once, off the fast path, on scratch objects.
  [[gnu::cold]] void probe(Capabilities &c, probe_options probes) const noexcept;

  friend struct detail::handle_access; // children register with this object's node
  detail::handle<traits> h_;
  bool devx_ = false; // opened by mlx5dv_open_device with a DEVX context
};

} // namespace rdmaxx

// ProtectionDomain::alloc(const Context &) needs both classes: defined once both are declared.
#include "protection_domain.hpp"
#include "impl/protection_domain.ipp"

// The longer bodies, out of the class declarations.
#include "impl/device.ipp"
