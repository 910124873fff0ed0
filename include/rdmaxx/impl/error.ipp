/// \file
/// rdmaxx/impl/error.ipp: the longer bodies of error.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of error.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

inline std::string detail::rereg_category_impl::message(int v) const {
  static const char *const names[] = {"", " (IBV_REREG_MR_ERR_INPUT)", " (IBV_REREG_MR_ERR_DONT_FORK_NEW)",
                                      " (IBV_REREG_MR_ERR_DO_FORK_OLD)", " (IBV_REREG_MR_ERR_CMD)",
                                      " (IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW)", " (?)"};
  const int rc = (v >> 20) & 0xf;
  const char *left = "";
  switch (static_cast<rereg_state>((v >> 16) & 0xf)) {
  case rereg_state::old_valid: left = "; the old MR is unchanged and valid"; break;
  case rereg_state::new_valid: left = "; the new MR is in place and valid"; break;
  case rereg_state::unusable: left = "; the MR is unusable and can only be deregistered"; break;
  }
  const std::string why = std::generic_category().message(v & 0xffff);
  return join_text("re-registration failed", names[rc <= 5 ? rc : 6], left, ": ", why.c_str());
}

inline std::error_condition detail::wc_category_impl::default_error_condition(int c) const noexcept {
  switch (static_cast<ibv_wc_status>(c)) {
  case IBV_WC_SUCCESS: return {};
  case IBV_WC_REM_ACCESS_ERR:
  case IBV_WC_LOC_PROT_ERR:
  case IBV_WC_MW_BIND_ERR:
  case IBV_WC_LOC_ACCESS_ERR: return std::errc::permission_denied;
  case IBV_WC_WR_FLUSH_ERR: return std::errc::operation_canceled;
  case IBV_WC_RETRY_EXC_ERR:
  case IBV_WC_RNR_RETRY_EXC_ERR:
  case IBV_WC_RESP_TIMEOUT_ERR: return std::errc::timed_out;
  case IBV_WC_LOC_LEN_ERR:
  case IBV_WC_REM_INV_REQ_ERR:
  case IBV_WC_REM_INV_RD_REQ_ERR: return std::errc::invalid_argument;
  default: return std::errc::io_error;
  }
}

inline const char *detail::errc_text(int c) noexcept {
  switch (static_cast<errc>(c)) {
  case errc::invalid_argument: return "invalid argument";
  case errc::null_address: return "null address: a registered range needs real memory";
  case errc::zero_length: return "zero length: the range must not be empty";
  case errc::remote_write_needs_local_write:
    return "invalid access: remote write requires local write";
  case errc::remote_atomic_needs_local_write:
    return "invalid access: remote atomic requires local write";
  case errc::unknown_access_flag: return "invalid access: unknown access flag bit";
  case errc::out_of_range: return "out of range: the range does not lie inside its object";
  case errc::wrong_state: return "wrong state for this operation";
  case errc::null_handle: return "null handle (moved from or never created)";
  case errc::unusable: return "object is unusable after a failed operation; it can only be destroyed";
  case errc::busy: return "object is still in use by dependent objects";
  case errc::unsupported: return "operation not supported by this device or build";
  case errc::pd_mismatch: return "objects belong to different protection domains";
  case errc::no_device: return "no such RDMA device";
  case errc::timeout: return "timed out";
  case errc::nothing_to_change: return "nothing to change: no modification was requested";
  case errc::missing_access: return "the region lacks an access right this operation needs";
  case errc::too_many_entries: return "too many entries for this object or device";
  case errc::verb_failed_without_errno: return "a verb failed without setting errno";
  case errc::malformed_input: return "malformed input";
  case errc::wrong_version: return "input has an unsupported version";
  case errc::iova_page_offset_mismatch:
    return "IOVA and address must have the same offset within a page";
  case errc::not_bound: return "not bound: there is nothing to invalidate or use";
  case errc::already_bound: return "already bound: invalidate or unbind it first";
  case errc::wrong_type: return "not valid for this object's type";
  case errc::provider_defect: return "not supported: this device's provider mishandles the request";
  case errc::context_mismatch: return "the objects belong to different device contexts";
  case errc::qp_mismatch: return "the batch, window or key belongs to another queue pair";
  case errc::buffer_too_small: return "the output buffer is too small";
  case errc::not_umr_qp:
    return "the queue pair lacks the mlx5 UMR send operations (create it with mlx5::create_umr_qp)";
  case errc::provider_limit: return "beyond what this device's provider can carry: split the request";
  case errc::too_many_pending:
    return "too many unconfirmed operations: hand their completions to complete() first";
  case errc::unsafe_grant:
    return "unsafe grant: a type-2 window here lets any peer that reaches this device crash its "
           "kernel; use the library's default grant (StrictGrant, GrantPool) or a type-1 window";
  case errc::private_data_too_long:
    return "private data too long: at most 56 bytes on connect, 196 on accept, 148 on reject";
  case errc::bad_address: return "bad address: expected A.B.C.D:PORT, [IPV6]:PORT or PORT";
  case errc::pool_exhausted:
    return "pool exhausted: every slot is leased or waits for its revocation to be confirmed";
  case errc::grant_outstanding:
    return "grant outstanding: the buffer is granted or its revocation is not confirmed yet";
  case errc::operation_unconfirmed:
    return "operation unconfirmed: hand its completion to complete() first";
  case errc::key_retired:
    return "key retired: reconfiguring would revive a revoked key; create a new key";
  case errc::send_queue_full:
    return "send queue full: hand the queue pair its send completions (retire) first";
  case errc::scatter_to_cqe:
    return "the queue pair scatters to the CQE: zero-based SGEs would be written to as addresses";
  case errc::pool_mismatch:
    return "the lease belongs to another GrantPool: hand it to the pool that leased it";
  case errc::unexpected_completion:
    return "unexpected completion: another work request completed first (handed back to the caller)";
  case errc::foreign_wr_id:
    return "foreign work request id: it is another object's own id (leave the default own_wr_id)";
  case errc::region_granted:
    return "the region is granted: an ExactGrant, StrictGrant, GrantPool or IndirectKey reaches its "
           "memory; destroy or revoke the grant first";
  case errc::stale_key:
    return "stale key: a key nested in its layout was invalidated or re-tagged since it was configured; "
           "revoke it and configure it again";
  case errc::bad_grant_rights:
    return "bad grant rights: a peer can be granted only remote_read, remote_write and remote_atomic "
           "(at least one); local_write and mw_bind belong to the region's registration";
  }
  return "unknown rdmaxx error";
}

inline std::error_condition detail::rdmaxx_category_impl::default_error_condition(int c) const noexcept {
  switch (static_cast<errc>(c)) {
  case errc::out_of_range: return std::errc::result_out_of_range;
  case errc::wrong_state:
  case errc::not_bound:
  case errc::already_bound:
  case errc::unusable: return std::errc::operation_not_permitted;
  case errc::busy: return std::errc::device_or_resource_busy;
  case errc::too_many_pending:
  case errc::pool_exhausted: return std::errc::resource_unavailable_try_again;
  case errc::grant_outstanding:
  case errc::region_granted: return std::errc::device_or_resource_busy;
  case errc::operation_unconfirmed: return std::errc::operation_in_progress;
  case errc::key_retired: return std::errc::operation_not_permitted;
  case errc::stale_key: return std::errc::operation_not_permitted;
  case errc::send_queue_full: return std::errc::resource_unavailable_try_again;
  case errc::scatter_to_cqe: return std::errc::operation_not_supported;
  case errc::unsafe_grant: return std::errc::operation_not_permitted;
  case errc::unsupported: return std::errc::operation_not_supported;
  case errc::no_device: return std::errc::no_such_device;
  case errc::timeout: return std::errc::timed_out;
  case errc::missing_access: return std::errc::permission_denied;
  case errc::too_many_entries: return std::errc::argument_list_too_long;
  case errc::buffer_too_small: return std::errc::no_buffer_space;
  case errc::malformed_input:
  case errc::wrong_version: return std::errc::bad_message;
  case errc::verb_failed_without_errno: return std::errc::io_error;
  case errc::provider_defect: return std::errc::operation_not_supported;
  case errc::provider_limit: return std::errc::value_too_large;
  case errc::private_data_too_long: return std::errc::message_size;
  default: return std::errc::invalid_argument;
  }
}

} // namespace rdmaxx
