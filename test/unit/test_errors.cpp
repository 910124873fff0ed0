// Error model: mapping tables for every category rdmaxx defines.
#include <rdmaxx/error.hpp>
#include <rdmaxx/detail/rereg.hpp>

#include <catch2/catch.hpp>

#include <cerrno>
#include <future>

using namespace rdmaxx;

TEST_CASE("errno from verbs becomes a generic-category code", "[unit][errors]") {
  struct row { int in; int value; };
  const row rows[] = {{EINVAL, EINVAL}, {-EINVAL, EINVAL}, {ENOMEM, ENOMEM}, {EBUSY, EBUSY}};
  for (const auto &r : rows) {
    const auto ec = errno_code(r.in);
    CHECK(ec.category() == std::generic_category());
    CHECK(ec.value() == r.value);
  }
  // A failure that left errno at 0 must not read as success.
  const auto zero = errno_code(0);
  CHECK(zero);
  CHECK(zero == errc::verb_failed_without_errno);
  errno = EAGAIN;
  CHECK(last_errno() == std::errc::resource_unavailable_try_again);
}

TEST_CASE("not-supported answers are recognised by one check", "[unit][errors]") {
  for (int e : {EOPNOTSUPP, ENOTSUP, ENOSYS, EPROTONOSUPPORT, EAFNOSUPPORT}) {
    CHECK(is_unsupported(errno_code(e)));
    // A -4 answer with the same errno is "unsupported, MR unchanged", never "unusable".
    const auto o = detail::classify_rereg(IBV_REREG_MR_ERR_CMD, e);
    CHECK(o.state == rereg_state::old_valid);
    CHECK(o.unsupported);
  }
  for (int e : {EINVAL, ENOMEM, EFAULT})
    CHECK(detail::classify_rereg(IBV_REREG_MR_ERR_CMD, e).state == rereg_state::unusable);
  for (int e : {EINVAL, ENOMEM, EBUSY, EPERM, EACCES})
    CHECK_FALSE(is_unsupported(errno_code(e)));
  CHECK(is_unsupported(make_error_code(errc::unsupported)));
  CHECK(make_error_code(errc::unsupported) == condition::unsupported);
  CHECK_FALSE(is_unsupported(make_error_code(errc::busy)));
  CHECK(is_unsupported(rereg_error(rereg_state::old_valid, IBV_REREG_MR_ERR_CMD, EOPNOTSUPP)));
  CHECK(is_unsupported(qp_transition_error(IBV_QPS_INIT, IBV_QPS_RTR, 7, EOPNOTSUPP)));
  CHECK_FALSE(is_unsupported(wc_error(IBV_WC_REM_ACCESS_ERR)));
  CHECK_FALSE(is_unsupported(std::error_code{}));
}

TEST_CASE("rdmaxx::errc: every code has a message and a portable condition", "[unit][errors]") {
  struct row { errc e; std::errc cond; const char *words; };
  const row rows[] = {
      {errc::invalid_argument, std::errc::invalid_argument, "invalid"},
      {errc::null_address, std::errc::invalid_argument, "null address"},
      {errc::zero_length, std::errc::invalid_argument, "zero length"},
      {errc::remote_write_needs_local_write, std::errc::invalid_argument, "remote write requires local write"},
      {errc::remote_atomic_needs_local_write, std::errc::invalid_argument, "remote atomic requires local write"},
      {errc::unknown_access_flag, std::errc::invalid_argument, "unknown access"},
      {errc::out_of_range, std::errc::result_out_of_range, "out of range"},
      {errc::wrong_state, std::errc::operation_not_permitted, "wrong state"},
      {errc::null_handle, std::errc::invalid_argument, "null handle"},
      {errc::unusable, std::errc::operation_not_permitted, "unusable"},
      {errc::busy, std::errc::device_or_resource_busy, "in use"},
      {errc::unsupported, std::errc::operation_not_supported, "not supported"},
      {errc::pd_mismatch, std::errc::invalid_argument, "protection domains"},
      {errc::no_device, std::errc::no_such_device, "no such"},
      {errc::timeout, std::errc::timed_out, "timed out"},
      {errc::nothing_to_change, std::errc::invalid_argument, "nothing to change"},
      {errc::missing_access, std::errc::permission_denied, "lacks an access"},
      {errc::too_many_entries, std::errc::argument_list_too_long, "too many"},
      {errc::verb_failed_without_errno, std::errc::io_error, "without setting errno"},
      {errc::malformed_input, std::errc::bad_message, "malformed"},
      {errc::wrong_version, std::errc::bad_message, "version"},
      {errc::iova_page_offset_mismatch, std::errc::invalid_argument, "offset within a page"},
      {errc::not_bound, std::errc::operation_not_permitted, "not bound"},
      {errc::already_bound, std::errc::operation_not_permitted, "already bound"},
      {errc::wrong_type, std::errc::invalid_argument, "type"},
      {errc::provider_defect, std::errc::operation_not_supported, "provider mishandles"},
      {errc::context_mismatch, std::errc::invalid_argument, "different device contexts"},
      {errc::qp_mismatch, std::errc::invalid_argument, "another queue pair"},
      {errc::buffer_too_small, std::errc::no_buffer_space, "too small"},
      {errc::not_umr_qp, std::errc::invalid_argument, "mlx5 UMR send operations"},
      {errc::provider_limit, std::errc::value_too_large, "provider can carry"},
      {errc::too_many_pending, std::errc::resource_unavailable_try_again, "unconfirmed"},
      {errc::unsafe_grant, std::errc::operation_not_permitted, "crash"},
      {errc::private_data_too_long, std::errc::message_size, "private data too long"},
      {errc::bad_address, std::errc::invalid_argument, "bad address"},
      {errc::pool_exhausted, std::errc::resource_unavailable_try_again, "pool exhausted"},
      {errc::grant_outstanding, std::errc::device_or_resource_busy, "grant outstanding"},
      {errc::operation_unconfirmed, std::errc::operation_in_progress, "operation unconfirmed"},
      {errc::key_retired, std::errc::operation_not_permitted, "key retired"},
      {errc::send_queue_full, std::errc::resource_unavailable_try_again, "send queue full"},
      {errc::scatter_to_cqe, std::errc::operation_not_supported, "scatters to the CQE"},
      {errc::pool_mismatch, std::errc::invalid_argument, "another GrantPool"},
      {errc::bad_grant_rights, std::errc::invalid_argument, "local_write and mw_bind belong to the region"},
      {errc::unexpected_completion, std::errc::invalid_argument, "another work request completed first"},
  };
  for (const auto &r : rows) {
    const std::error_code ec = r.e;
    INFO(ec.message());
    CHECK(ec.category() == error_category());
    CHECK(std::string(ec.category().name()) == "rdmaxx");
    CHECK(ec == r.cond);
    CHECK(ec.message().find(r.words) != std::string::npos);
  }
}

TEST_CASE("work-completion status is an error_code", "[unit][errors]") {
  CHECK_FALSE(wc_error(IBV_WC_SUCCESS));
  struct row { ibv_wc_status s; std::errc cond; };
  const row rows[] = {
      {IBV_WC_REM_ACCESS_ERR, std::errc::permission_denied},
      {IBV_WC_LOC_PROT_ERR, std::errc::permission_denied},
      {IBV_WC_MW_BIND_ERR, std::errc::permission_denied},
      {IBV_WC_WR_FLUSH_ERR, std::errc::operation_canceled},
      {IBV_WC_RETRY_EXC_ERR, std::errc::timed_out},
      {IBV_WC_RNR_RETRY_EXC_ERR, std::errc::timed_out},
      {IBV_WC_LOC_LEN_ERR, std::errc::invalid_argument},
      {IBV_WC_REM_INV_REQ_ERR, std::errc::invalid_argument},
      {IBV_WC_GENERAL_ERR, std::errc::io_error},
  };
  for (const auto &r : rows) {
    const auto ec = wc_error(r.s);
    CHECK(ec.category() == wc_category());
    CHECK(ec.value() == int(r.s));
    CHECK(ec == r.cond);
    CHECK(ec.message() == ibv_wc_status_str(r.s));
  }
  ibv_wc wc{};
  wc.status = IBV_WC_REM_ACCESS_ERR;
  CHECK(wc_error(wc) == std::errc::permission_denied);
}

TEST_CASE("asynchronous events: errors become error_codes, information does not", "[unit][errors]") {
  struct row { ibv_event_type t; bool error; std::errc cond; };
  const row rows[] = {
      {IBV_EVENT_CQ_ERR, true, std::errc::no_buffer_space},
      {IBV_EVENT_QP_FATAL, true, std::errc::io_error},
      {IBV_EVENT_QP_REQ_ERR, true, std::errc::io_error},
      {IBV_EVENT_QP_ACCESS_ERR, true, std::errc::permission_denied},
      {IBV_EVENT_PORT_ERR, true, std::errc::network_down},
      {IBV_EVENT_DEVICE_FATAL, true, std::errc::io_error},
      {IBV_EVENT_SRQ_ERR, true, std::errc::io_error},
      {IBV_EVENT_WQ_FATAL, true, std::errc::io_error},
      {IBV_EVENT_PATH_MIG_ERR, true, std::errc::io_error},
      {IBV_EVENT_PORT_ACTIVE, false, {}},
      {IBV_EVENT_COMM_EST, false, {}},
      {IBV_EVENT_QP_LAST_WQE_REACHED, false, {}},
      {IBV_EVENT_SQ_DRAINED, false, {}},
      {IBV_EVENT_GID_CHANGE, false, {}},
  };
  for (const auto &r : rows) {
    ibv_async_event ev{};
    ev.event_type = r.t;
    const std::error_code ec = async_error(ev);
    INFO(ibv_event_type_str(r.t));
    CHECK(bool(ec) == r.error);
    if (!r.error) {
      CHECK(async_event_type(ec) == -1);
      continue;
    }
    CHECK(ec.category() == async_event_category());
    CHECK(async_event_type(ec) == int(r.t));
    CHECK(ec == r.cond);
    CHECK(ec.message() == ibv_event_type_str(r.t));
    CHECK_FALSE(is_unsupported(ec));
  }
}

TEST_CASE("a failed QP transition names the transition, the attribute and the errno", "[unit][errors]") {
  const auto ec = qp_transition_error(IBV_QPS_INIT, IBV_QPS_RTR, __builtin_ctz(IBV_QP_PATH_MTU), EINVAL);
  CHECK(ec.category() == qp_transition_category());
  CHECK(ec == std::errc::invalid_argument);
  CHECK(qp_transition_attribute(ec) == __builtin_ctz(IBV_QP_PATH_MTU));
  const std::string m = ec.message();
  INFO(m);
  CHECK(m.find("INIT->RTR") != std::string::npos);
  CHECK(m.find("IBV_QP_PATH_MTU") != std::string::npos);
  CHECK(m.find(std::generic_category().message(EINVAL)) != std::string::npos);

  const auto unknown = qp_transition_error(IBV_QPS_RTR, IBV_QPS_RTS, -1, EPERM);
  CHECK(unknown.message().find("RTR->RTS") != std::string::npos);
  CHECK(unknown.message().find("not identified") != std::string::npos);
  CHECK(qp_transition_attribute(unknown) == -1);
  CHECK(unknown == std::errc::operation_not_permitted);
  // Every attribute bit the library can blame has a name.
  for (int bit = 0; bit <= 20; ++bit)
    CHECK(qp_transition_error(IBV_QPS_RESET, IBV_QPS_INIT, bit, EINVAL).message().find("IBV_QP_?") ==
          std::string::npos);
  CHECK(qp_transition_attribute(make_error_code(errc::busy)) == -1);
}

TEST_CASE("rereg codes carry the state left behind (ibv_rereg_mr(3) table)", "[unit][errors]") {
  struct row { int rc; rereg_state s; const char *name; const char *state_words; };
  const row rows[] = {
      {IBV_REREG_MR_ERR_INPUT, rereg_state::old_valid, "IBV_REREG_MR_ERR_INPUT", "old MR is unchanged"},
      {IBV_REREG_MR_ERR_DONT_FORK_NEW, rereg_state::old_valid, "IBV_REREG_MR_ERR_DONT_FORK_NEW", "old MR"},
      {IBV_REREG_MR_ERR_DO_FORK_OLD, rereg_state::new_valid, "IBV_REREG_MR_ERR_DO_FORK_OLD", "new MR is in place"},
      {IBV_REREG_MR_ERR_CMD, rereg_state::unusable, "IBV_REREG_MR_ERR_CMD", "unusable"},
      {IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW, rereg_state::unusable, "IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW", "unusable"},
  };
  for (const auto &r : rows) {
    const auto ec = rereg_error(r.s, r.rc, ENOMEM);
    const std::string m = ec.message();
    INFO(m);
    CHECK(rereg_state_of(ec) == r.s);
    CHECK(m.find(r.name) != std::string::npos);
    CHECK(m.find(r.state_words) != std::string::npos);
    CHECK(ec == std::errc::not_enough_memory);
  }
  CHECK(rereg_state_of(make_error_code(errc::invalid_argument)) == rereg_state::old_valid);
  CHECK(rereg_state_of(errno_code(EINVAL)) == rereg_state::old_valid);
}

TEST_CASE("retry_hint_of tells codes that share a condition apart by what the caller can do",
          "[unit][errors]") {
  using rdmaxx::retry_hint;
  using rdmaxx::retry_hint_of;
  // Same std::errc condition, different advice.
  CHECK(make_error_code(errc::pd_mismatch) == std::errc::invalid_argument);
  CHECK(make_error_code(errc::null_handle) == std::errc::invalid_argument);
  CHECK(retry_hint_of(make_error_code(errc::pd_mismatch)) == retry_hint::no);
  CHECK(retry_hint_of(make_error_code(errc::qp_mismatch)) == retry_hint::no);
  CHECK(make_error_code(errc::busy) == std::errc::device_or_resource_busy);
  CHECK(make_error_code(errc::grant_outstanding) == std::errc::device_or_resource_busy);
  CHECK(retry_hint_of(make_error_code(errc::busy)) == retry_hint::after_progress);
  CHECK(retry_hint_of(make_error_code(errc::grant_outstanding)) == retry_hint::after_progress);
  CHECK(retry_hint_of(make_error_code(errc::pool_exhausted)) == retry_hint::after_progress);
  CHECK(retry_hint_of(make_error_code(errc::timeout)) == retry_hint::yes);
  CHECK(retry_hint_of(make_error_code(errc::unsafe_grant)) == retry_hint::no);
  CHECK(retry_hint_of(make_error_code(errc::malformed_input)) == retry_hint::no);
  CHECK(retry_hint_of(std::error_code(EAGAIN, std::generic_category())) == retry_hint::yes);
  CHECK(retry_hint_of(std::error_code(EBUSY, std::generic_category())) == retry_hint::after_progress);
  CHECK(retry_hint_of(std::error_code(EINVAL, std::generic_category())) == retry_hint::no);
  CHECK(retry_hint_of(std::error_code(1, std::future_category())) == retry_hint::no);
}
