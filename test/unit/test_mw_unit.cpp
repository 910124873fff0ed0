// MemoryWindow without a device: the checks made before any bind is posted, the rxe-aware
// detection of remote invalidation, and refusals on empty handles.
#include <rdmaxx/memory_window.hpp>
#include <rdmaxx/strict_grant.hpp>

#include <catch2/catch.hpp>

#include <sys/utsname.h>

#include <string_view>
#include <type_traits>

using namespace rdmaxx;

static_assert(!std::is_copy_constructible_v<MemoryWindow> && !std::is_copy_assignable_v<MemoryWindow>);
static_assert(std::is_nothrow_move_constructible_v<MemoryWindow> &&
              std::is_nothrow_move_assignable_v<MemoryWindow> &&
              std::is_nothrow_default_constructible_v<MemoryWindow>);
static_assert(!std::is_copy_constructible_v<StrictGrant> && std::is_nothrow_move_constructible_v<StrictGrant>);
static_assert(std::is_trivially_copyable_v<remote_descriptor>);

TEST_CASE("check_window_bind: each rule a device may skip, in order", "[unit][mw]") {
  int pd1 = 0, pd2 = 0; // stand-ins: only identity matters
  const access_flags mr_ok = access::local_write | access::mw_bind;
  const access_flags rw = access::remote_read | access::remote_write;
  struct row {
    const char *what;
    mw_type type;
    const void *mw_pd, *mr_pd, *qp_pd;
    access_flags mr_access;
    std::uint64_t mr_len;
    window_range r;
    access_flags rights;
    std::error_code expect;
  };
  const row rows[] = {
      {"ok type 1", mw_type::type1, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 4096}, rw, {}},
      {"ok type 2 zero-based", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {100, 200},
       access::remote_read | access::zero_based, {}},
      {"ok read-only over an MR without local write", mw_type::type2, &pd1, &pd1, &pd1,
       access_flags(access::mw_bind), 4096, {0, 1}, access::remote_read, {}},
      {"MR of another PD (rxe does not check type 2)", mw_type::type2, &pd1, &pd2, &pd1, mr_ok, 4096,
       {0, 64}, rw, errc::pd_mismatch},
      {"QP of another PD", mw_type::type1, &pd1, &pd1, &pd2, mr_ok, 4096, {0, 64}, rw, errc::pd_mismatch},
      {"unknown rights bit", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 64},
       access_flags(1u << 29), errc::unknown_access_flag},
      {"local write is not a window right", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 64},
       access::local_write | access::remote_read, errc::bad_grant_rights},
      {"mw_bind is not a window right", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 64},
       access::mw_bind | access::remote_read, errc::bad_grant_rights},
      {"no remote right", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 64}, access_flags{},
       errc::bad_grant_rights},
      {"zero-based alone grants nothing", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 64},
       access_flags(access::zero_based), errc::bad_grant_rights},
      {"zero-based type 1", mw_type::type1, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 64},
       access::remote_read | access::zero_based, errc::wrong_type},
      {"empty range", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {0, 0}, rw, errc::zero_length},
      {"one byte past the end", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {1, 4096}, rw,
       errc::out_of_range},
      {"offset past the end", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {4097, 1}, rw,
       errc::out_of_range},
      {"offset + length wraps", mw_type::type2, &pd1, &pd1, &pd1, mr_ok, 4096, {8, ~0ull - 4}, rw,
       errc::out_of_range},
      {"MR without MW_BIND", mw_type::type2, &pd1, &pd1, &pd1, access_flags(access::local_write), 4096,
       {0, 64}, access::remote_read, errc::missing_access},
      {"remote write over an MR without local write", mw_type::type1, &pd1, &pd1, &pd1,
       access_flags(access::mw_bind), 4096, {0, 64}, access::remote_write, errc::missing_access},
      {"remote atomic over an MR without local write", mw_type::type2, &pd1, &pd1, &pd1,
       access_flags(access::mw_bind), 4096, {0, 64}, access::remote_atomic, errc::missing_access},
  };
  for (const auto &r : rows) {
    INFO(r.what);
    CHECK(check_window_bind(r.type, r.mw_pd, r.mr_pd, r.qp_pd, r.mr_access, r.mr_len, r.r, r.rights) ==
          r.expect);
  }
}

TEST_CASE("invalidated_rkey: flagged and rxe-style (unflagged) remote invalidation", "[unit][mw]") {
  ibv_wc wc{};
  wc.status = IBV_WC_SUCCESS;
  wc.opcode = IBV_WC_RECV;
  wc.invalidated_rkey = 0x1234;
  // rxe: no IBV_WC_WITH_INV, but the key is there; counted only for a device known to omit the
  // flag (elsewhere the field can hold an earlier completion's immediate data, the peer's choice).
  CHECK(invalidated_rkey(wc, 0x1234, true) == 0x1234u);
  CHECK_FALSE(invalidated_rkey(wc, 0x1235, true).has_value());
  CHECK_FALSE(invalidated_rkey(wc, 0x1234).has_value());
  CHECK_FALSE(invalidated_rkey(wc, 0x1234, false).has_value());
  // Standard: flagged.
  wc.wc_flags = IBV_WC_WITH_INV;
  CHECK(invalidated_rkey(wc, 0x9999) == 0x1234u);
  // Immediate data shares the field: never read as a key.
  wc.wc_flags = IBV_WC_WITH_IMM;
  CHECK_FALSE(invalidated_rkey(wc, 0x1234, true).has_value());
  // Failed completions and other opcodes carry no invalidation.
  wc.wc_flags = IBV_WC_WITH_INV;
  wc.status = IBV_WC_WR_FLUSH_ERR;
  CHECK_FALSE(invalidated_rkey(wc, 0x1234).has_value());
  wc.status = IBV_WC_SUCCESS;
  wc.opcode = IBV_WC_RDMA_WRITE;
  CHECK_FALSE(invalidated_rkey(wc, 0x1234).has_value());
  // A key of 0 is never matched without the flag (a plain receive leaves 0 there).
  wc.opcode = IBV_WC_RECV;
  wc.wc_flags = 0;
  wc.invalidated_rkey = 0;
  CHECK_FALSE(invalidated_rkey(wc, 0).has_value());
}

TEST_CASE("an empty window refuses every operation and ignores completions", "[unit][mw]") {
  MemoryWindow mw;
  QueuePair qp;
  MemoryRegion mr;
  CHECK_FALSE(mw);
  CHECK(mw.state() == mw_state::unbound);
  CHECK(mw.pending() == 0);
  CHECK(mw.bind(qp, mr, {0, 64}, access::remote_read).error() == errc::null_handle);
  CHECK(mw.unbind(qp).error() == errc::null_handle);
  CHECK(mw.invalidate(qp).error() == errc::null_handle);
  CHECK(mw.destroy().has_value()); // nothing to free
  ibv_wc wc{};
  wc.status = IBV_WC_REM_ACCESS_ERR;
  CHECK_FALSE(mw.complete(wc));
  mw.cancel_pending();
  CHECK(mw.state() == mw_state::unbound);
  ProtectionDomain pd;
  CHECK(MemoryWindow::alloc(pd, mw_type::type2).error() == errc::null_handle);
  CHECK(StrictGrant::create(pd, mr, {0, 64}, mw_type::type2).error() == errc::null_handle);
}

TEST_CASE("a batch's undo list: newest first, moved with the batch, bounded", "[unit][mw][undo]") {
  struct log {
    int order[detail::undo_list::capacity + 1] = {};
    int n = 0;
  } lg;
  auto note = [](void *o, std::uint64_t tag) noexcept {
    auto *l = static_cast<log *>(o);
    l->order[l->n++] = int(tag);
  };
  {
    detail::undo_list u;
    for (std::uint64_t i = 0; i < detail::undo_list::capacity; ++i) {
      CHECK_FALSE(u.full());
      u.add(note, &lg, i);
    }
    CHECK(u.full()); // callers refuse one more with errc::too_many_pending
    detail::undo_list moved(std::move(u));
    u.run(); // the moved-from list undoes nothing
    CHECK(lg.n == 0);
    moved.run();
    REQUIRE(lg.n == int(detail::undo_list::capacity));
    for (int i = 0; i < lg.n; ++i) CHECK(lg.order[i] == lg.n - 1 - i);
    moved.run(); // each undo runs once
    CHECK(lg.n == int(detail::undo_list::capacity));
  }
  detail::undo_list c;
  c.add(note, &lg, 99);
  c.clear(); // submitted: nothing to undo
  c.run();
  CHECK(lg.n == int(detail::undo_list::capacity));
  STATIC_REQUIRE(SendBatch::max_undo == detail::undo_list::capacity);
  // A batch of a null QP is not open: window operations on it are refused before any undo.
  QueuePair qp;
  auto b = qp.start_send();
  MemoryWindow mw;
  MemoryRegion mr;
  CHECK(mw.bind(b, qp, mr, {0, 64}, access::remote_read).error() == errc::null_handle);
  CHECK(b.submit().error() == errc::null_handle); // a batch of a null QP: its submit says so
}

TEST_CASE("the descriptor of a window is the grant as the peer must use it", "[unit][mw]") {
  MemoryWindow mw; // unbound: an empty grant
  const auto d = mw.descriptor();
  CHECK(d.length == 0);
  CHECK(d.rights.empty());
  CHECK_FALSE(d.zero_based);
}

TEST_CASE("grant mechanism: no key a peer could turn into a panic unless the caller opts in",
          "[unit][mw][grant]") {
  using detail::choose_grant;
  const grant_options untrusted{}, trusted{.trusted_peers = true},
      accepted{.type2 = type2_risk::accept_kernel_panic_by_any_peer};
  // rxe: both types, the panic is known: type 1 over an exact region. Trusting the peers is not
  // enough (the exposure is device-wide): only the accepted risk gives type 2.
  CHECK(choose_grant(true, true, tristate::yes, untrusted, nullptr).mechanism ==
        grant_mechanism::type1_exact_region);
  CHECK(std::string_view(choose_grant(true, true, tristate::yes, untrusted, nullptr).reason)
            .find("panics") != std::string_view::npos);
  CHECK(choose_grant(true, true, tristate::yes, trusted, nullptr).mechanism ==
        grant_mechanism::type1_exact_region);
  CHECK(choose_grant(true, true, tristate::yes, accepted, nullptr).mechanism ==
        grant_mechanism::type2_window);
  // Where the panic is not known, trusted peers get type 2.
  CHECK(choose_grant(true, true, tristate::unknown, trusted, nullptr).mechanism ==
        grant_mechanism::type2_window);
  // mlx5: no defect: type 2B is the fast default.
  CHECK(choose_grant(true, true, tristate::no, untrusted, nullptr).mechanism ==
        grant_mechanism::type2_window);
  // Unknown device: the safe one where it exists.
  CHECK(choose_grant(true, true, tristate::unknown, untrusted, nullptr).mechanism ==
        grant_mechanism::type1_exact_region);
  CHECK(choose_grant(false, true, tristate::unknown, untrusted, nullptr).mechanism ==
        grant_mechanism::type2_window);
  // Only type 2 and the panic known: no grants for untrusted peers.
  CHECK(choose_grant(false, true, tristate::yes, untrusted, nullptr).mechanism == grant_mechanism::none);
  CHECK(choose_grant(false, true, tristate::yes, untrusted, nullptr).unsafe);
  CHECK(choose_grant(false, true, tristate::yes, trusted, nullptr).unsafe);
  CHECK(choose_grant(false, true, tristate::yes, accepted, nullptr).mechanism ==
        grant_mechanism::type2_window);
  CHECK_FALSE(choose_grant(false, false, tristate::yes, untrusted, nullptr).unsafe);
  CHECK(choose_grant(false, false, tristate::no, trusted, nullptr).mechanism == grant_mechanism::none);
  // RDMAXX_GRANT forces a mechanism the device has, but never type 2 where the kernel is known
  // to panic (the environment is not the caller's acknowledgement).
  CHECK(choose_grant(true, true, tristate::yes, untrusted, "type2").mechanism ==
        grant_mechanism::type1_exact_region);
  CHECK(choose_grant(true, true, tristate::unknown, untrusted, "type2").mechanism ==
        grant_mechanism::type2_window);
  CHECK(choose_grant(true, false, tristate::no, untrusted, "type2").mechanism ==
        grant_mechanism::type1_exact_region);
  CHECK(choose_grant(true, true, tristate::no, untrusted, "type1").mechanism ==
        grant_mechanism::type1_exact_region);
  // What is known per device.
  tristate p = tristate::unknown;
  const char *on = "";
  detail::known_invalidate_defect(rxe_vendor_id, false, p, on);
  CHECK(p == tristate::yes);
  CHECK(std::string_view(on).find("6.1.0-57") != std::string_view::npos);
  CHECK(std::string_view(on).find("6.12.118") != std::string_view::npos);
  // The series measured, by release; any other rxe kernel is assumed to panic (p stays yes above,
  // whatever this host runs) and the text names it.
  CHECK(detail::rxe_defect_measured("6.1.0-57-amd64"));
  CHECK(detail::rxe_defect_measured("6.12.118+deb12-amd64"));
  CHECK(detail::rxe_defect_measured("6.12"));
  CHECK_FALSE(detail::rxe_defect_measured("6.10.3"));
  CHECK_FALSE(detail::rxe_defect_measured("6.123.0"));
  CHECK_FALSE(detail::rxe_defect_measured("6.8.0-31-generic"));
  CHECK_FALSE(detail::rxe_defect_measured("5.15.0"));
  utsname u{};
  REQUIRE(::uname(&u) == 0);
  const bool here_measured = detail::rxe_defect_measured(u.release);
  CHECK((std::string_view(on).find("assumed to panic") != std::string_view::npos) == !here_measured);
  CHECK((std::string_view(on).find(u.release) != std::string_view::npos) == !here_measured);
  p = tristate::unknown;
  detail::known_invalidate_defect(0x02c9, true, p, on);
  CHECK(p == tristate::no);
  p = tristate::unknown;
  detail::known_invalidate_defect(0x1234, false, p, on);
  CHECK(p == tristate::unknown);
}
