// [bad-input] One table of bad inputs for every public creating or mutating call of rdmaxx
// (mlx5/ internals and the fault-injection seam aside), run on a real rxe device.
//
// Each row names the call and the bad input, makes one attempt that returns a std::error_code,
// and says which error the call's doc comment promises: an rdmaxx::errc, a layout / rereg /
// qp_transition / completion code, or a verb's errno where verbs is the one to answer. A row
// passes only with that exact, clear error (never success, never a bare EINVAL where rdmaxx
// promises its own code). After the rows the objects they used must still work: real RDMA
// writes through the loopback QPs, windows, a strict grant and indirect keys land the right bytes,
// memory that a rejected call pointed at is byte-for-byte unchanged, and every object is
// destroyed through its checked call (destroy(), dealloc(), dereg(), release(), close()).
//
// One test case per handle, each with its own tag, runs the rows of that handle only:
//   rxe-tests '[bad-input]'        every handle (one test case each)
//   rxe-tests '[bad-input][mr]'    the MemoryRegion rows alone
// Tags: [context] [pd] [access] [mr] [cq] [qp] [send-batch] [window] [strict-grant]
// [remote-descriptor] [ikey-descriptor] [indirect-key]. Each case builds the same objects and the
// whole table, runs the rows of its handle, then checks and destroys every object, so that it
// passes or fails on its own. How no row is lost: every case checks that each handle named in the
// table has a test case of its own (registered with Catch, "bad inputs: HANDLE"), so every row of
// the table runs in exactly one case; at the end of the run a listener prints how many rows ran,
// per handle and in total, against the table's size ("bad inputs tried: 332 of 332 rows").
//
// The one MR left unusable is made so by a failed re-registration substituted through
// fault_injection::set_rereg_mr (rxe has no native rereg that could fail that way).

// The listener below (end-of-run totals) needs Catch's reporter interfaces.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "fixture.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace rxe;

namespace {

// ---------------------------------------------------------------------------------------------
// the table

struct expectation {
  std::string text;
  std::function<bool(const std::error_code &)> matches;
};

/// Exactly this rdmaxx::errc (category and value).
expectation is(errc e) {
  return {"rdmaxx: " + make_error_code(e).message(),
          [e](const std::error_code &ec) { return ec == make_error_code(e); }};
}
/// A descriptor_category() code holding `e` whose message contains `words`.
expectation descriptor_is(errc e, std::string words) {
  return {"descriptor: " + make_error_code(e).message() + " (\"" + words + "\")",
          [e, words](const std::error_code &ec) {
            return ec.category() == descriptor_category() && descriptor_errc(ec) == e &&
                   ec.message().find(words) != std::string::npos;
          }};
}
/// An errno, as a verb (or mmap) gave it (generic category).
expectation sys_errno(std::errc c) {
  return {"errno: " + std::make_error_code(c).message(), [c](const std::error_code &ec) {
            return ec.category() == std::generic_category() && ec.value() == int(c);
          }};
}
/// "Not supported by this device", from whichever source.
expectation unsupported() {
  return {"unsupported (condition)", [](const std::error_code &ec) { return is_unsupported(ec); }};
}
/// A layout_category() code naming `entry` (no_entry: the layout as a whole).
expectation layout_is(errc e, std::size_t entry) {
  return {"layout entry " + (entry == no_entry ? std::string("(none)") : std::to_string(entry)) + ": " +
              make_error_code(e).message(),
          [e, entry](const std::error_code &ec) {
            return ec.category() == layout_category() && layout_errc(ec) == e &&
                   layout_error_entry(ec) == entry;
          }};
}
/// A failed QP transition blaming the attribute IBV_QP_* == 1 << bit.
expectation transition(int bit) {
  return {"qp transition blaming " + std::string(detail::qp_attr_name(bit)),
          [bit](const std::error_code &ec) {
            return ec.category() == qp_transition_category() && qp_transition_attribute(ec) == bit;
          }};
}
/// A failed native re-registration that left the old MR valid, with this errno.
expectation rereg_old_valid(std::errc c) {
  return {"rereg, old MR valid: " + std::make_error_code(c).message(), [c](const std::error_code &ec) {
            return ec.category() == rereg_category() && rereg_state_of(ec) == rereg_state::old_valid &&
                   ec == c;
          }};
}
/// A work completion with this status (or, when given, that one: devices differ in which local
/// error they report).
expectation completion(ibv_wc_status s, ibv_wc_status or_s = IBV_WC_SUCCESS) {
  std::string text = std::string("completion: ") + ibv_wc_status_str(s);
  if (or_s != IBV_WC_SUCCESS) text += std::string(" or ") + ibv_wc_status_str(or_s);
  return {text, [s, or_s](const std::error_code &ec) {
            return ec == wc_error(s) || (or_s != IBV_WC_SUCCESS && ec == wc_error(or_s));
          }};
}

struct row {
  const char *handle;
  const char *call;
  const char *input;
  std::function<std::error_code()> attempt;
  expectation expected;
};

struct table {
  std::vector<row> rows;
  const char *handle = "";
  void add(const char *call, const char *input, expectation e, std::function<std::error_code()> f) {
    rows.push_back({handle, call, input, std::move(f), std::move(e)});
  }
};

template <class T> std::error_code err(const result<T> &r) {
  return r.has_value() ? std::error_code{} : r.error();
}

std::string describe(const std::error_code &ec) {
  if (!ec) return "success";
  return std::string(ec.category().name()) + ":" + std::to_string(ec.value()) + " \"" + ec.message() + "\"";
}
/// A message that says something (not the "unknown error" of a category that did not know it).
bool clear_message(const std::error_code &ec) {
  const std::string m = ec.message();
  return !m.empty() && m.rfind("Unknown error", 0) != 0 && m != "unknown rdmaxx error" &&
         m.find("IBV_QP_?") == std::string::npos;
}

/// Leave `h` moved-from; what it held is destroyed with the sink.
template <class T> void move_away(T &h) {
  T sink(std::move(h));
}

// Every ibv_rereg_mr fails with -4/EIO: the MR is left unusable (fault injection).
int rereg_fails_unusable(ibv_mr *, int, ibv_pd *, void *, std::size_t, int) {
  errno = EIO;
  return IBV_REREG_MR_ERR_CMD;
}

/// Bind `w` through `qp` and hand its completion to the window.
remote_descriptor bind_wait(MemoryWindow &w, QueuePair &qp, CompletionQueue &cq, const MemoryRegion &mr,
                            window_range r, access_flags rights, std::uint64_t id) {
  auto d = need(w.bind(qp, mr, r, rights, {id, send_flag::signaled}), "bind");
  const ibv_wc wc = wait_one(cq);
  CHECK(w.complete(wc));
  CHECK(w.pending() == 0);
  return d;
}

template <class T> void destroyed(result<T> r, const char *what) {
  INFO("explicit destruction of " << what << ": " << describe(err(r)));
  CHECK(r.has_value());
}

// How many rows ran, per handle, and the table's size: printed at the end of the run.
struct tally {
  std::map<std::string, std::size_t> ran;
  std::size_t table = 0;
};
tally &totals() {
  static tally t;
  return t;
}

const std::string case_prefix = "bad inputs: ";

/// Build the objects and the whole table, run the rows of `only` (a handle name), then check and
/// destroy every object.
void bad_inputs(const std::string &only) {
  // ---- the objects the rows use ----
  Context ctx = open_device();
  const std::string dev_name(ctx.name());
  auto pd = need(ProtectionDomain::alloc(ctx), "pd");
  auto pd2 = need(ProtectionDomain::alloc(ctx), "pd2");
  Context ctx_x = open_device(); // the same device opened again: another context ("another device")
  auto pd_x = need(ProtectionDomain::alloc(ctx_x), "pd of the other context");
  auto cq_x = need(CompletionQueue::create(ctx_x, 4), "cq of the other context");
  auto ch = need(CompletionChannel::create(ctx), "channel");
  auto ch_x = need(CompletionChannel::create(ctx_x), "channel of the other context");
  auto cq_ch = need(CompletionQueue::create(ctx, 8, &ch), "cq with channel");
  auto cq_s = need(CompletionQueue::create(ctx, 64), "scratch cq for fresh QPs");
  qp_pair lb(ctx, pd);  // a initiates, b is the target and binds the windows
  qp_pair p2(ctx, pd2); // the other PD's pair
  qp_pair vp(ctx, pd);  // the victim: rows that put a QP into ERR use it, then recover it

  constexpr std::size_t N = 4096;
  std::vector<unsigned char> tgt(N), tgt2(N), tgt_x(N), src(N), dst(N), rbuf(N), aux(N);
  fill(tgt.data(), N, 1);
  fill(tgt2.data(), N, 2);
  fill(tgt_x.data(), N, 3);
  fill(src.data(), N, 4);
  fill(dst.data(), N, 5);
  fill(rbuf.data(), N, 6);
  fill(aux.data(), N, 7);
  constexpr access_flags target_access = remote_rw | access::mw_bind;
  constexpr access_flags rw_rights = access::remote_read | access::remote_write; // window rights
  auto mt = need(MemoryRegion::reg(pd, tgt.data(), N, target_access), "reg target");
  auto mt2 = need(MemoryRegion::reg(pd2, tgt2.data(), N, target_access), "reg target on pd2");
  auto mt_x = need(MemoryRegion::reg(pd_x, tgt_x.data(), N, target_access), "reg target, other context");
  auto ms = need(MemoryRegion::reg(pd, src.data(), N, access::local_write), "reg source");
  auto md = need(MemoryRegion::reg(pd, dst.data(), N, remote_rw), "reg destination");
  auto mrr = need(MemoryRegion::reg(pd, rbuf.data(), N, remote_rw), "reg rereg subject");
  auto ma = need(MemoryRegion::allocate(pd, N, remote_rw), "allocate");
  fill(ma.address(), N, 8);
  auto m_nobind = need(MemoryRegion::reg(pd, tgt.data(), N, access::local_write | access::remote_read),
                       "reg target without MW_BIND");
  auto m_nolw = need(MemoryRegion::reg(pd, tgt.data(), N, access::mw_bind | access::remote_read),
                     "reg target without LOCAL_WRITE");
  auto mu = need(MemoryRegion::reg(pd, aux.data(), N, target_access), "reg, to be left unusable");
  {
    fault_injection::set_rereg_mr(&rereg_fails_unusable);
    auto r = mu.rereg(change_access(access::local_write), rereg_policy::native_only);
    fault_injection::set_rereg_mr(nullptr);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(mu.state() == mr_state::unusable);
  }
  const std::uint32_t mrr_lkey = mrr.lkey(), mrr_rkey = mrr.rkey();

  // Windows: unbound of each type, bound of each type, an invalidated one, one of pd2.
  auto w1 = need(MemoryWindow::alloc(pd, mw_type::type1), "alloc w1");
  auto w2 = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc w2");
  auto w1b = need(MemoryWindow::alloc(pd, mw_type::type1), "alloc w1b");
  auto w2b = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc w2b");
  auto w2i = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "alloc w2i");
  auto w2x = need(MemoryWindow::alloc(pd2, mw_type::type2, accept_risk), "alloc w2x");
  bind_wait(w1b, lb.b, lb.cq_b, mt, {0, 1024}, access::remote_read, 11);
  const remote_descriptor d2b = bind_wait(w2b, lb.b, lb.cq_b, mt, {1024, 1024}, rw_rights, 12);
  bind_wait(w2i, lb.b, lb.cq_b, mt, {0, 64}, access::remote_read, 13);
  need(w2i.invalidate(lb.b, {14, send_flag::signaled}), "invalidate w2i");
  CHECK(w2i.complete(wait_one(lb.cq_b)));
  REQUIRE(w2i.state() == mw_state::invalidated);

  auto g = need(StrictGrant::create(pd, mt, {2048, 512}, mw_type::type2, accept_risk), "strict grant");

  // Indirect keys: unconfigured, configured with remote rights, configured local-only, of pd2.
  auto k = need(IndirectKey::create(pd, 8), "key");
  auto kc = need(IndirectKey::create(pd, 8), "configured key");
  auto kl = need(IndirectKey::create(pd, 8), "local-only key");
  auto k2 = need(IndirectKey::create(pd2, 8), "key on pd2");
  auto kt = need(IndirectKey::create(pd, 8, {.trusted_peers = true, .type2 = accept_risk}), "type-2 software key");
  {
    auto b = lb.b.start_send();
    need(kc.configure(b, lb.b, layout::list({{mt, 3000, 100}, {mt, 100, 50}}), remote_rw,
                      {15, send_flag::signaled}),
         "configure kc");
    need(b.submit(), "submit kc");
    const ibv_wc wc = wait_one(lb.cq_b);
    CHECK(wc.wr_id == 15);
    CHECK(kc.complete(wc));
    auto bl = lb.a.start_send();
    need(kl.configure(bl, lb.a, layout::list({{ms, 0, 64}}), access::local_write), "configure kl");
    need(bl.submit(), "submit kl (empty)");
  }
  const ikey_descriptor dk = need(kc.descriptor(), "kc descriptor");
  const ikey_descriptor dk_ro = need(ikey_descriptor::make(dk.segments(), access::remote_read), "read-only");
  const ikey_descriptor dk_wo =
      need(ikey_descriptor::make(dk.segments(), access::remote_write), "write-only");

  // Moved-from handles of every type.
  Context ctx_moved = open_device();
  move_away(ctx_moved);
  auto pd_moved = need(ProtectionDomain::alloc(ctx), "pd to move");
  move_away(pd_moved);
  auto mr_moved = need(MemoryRegion::reg(pd, src.data(), N, access::local_write), "mr to move");
  move_away(mr_moved);
  auto ch_moved = need(CompletionChannel::create(ctx), "channel to move");
  move_away(ch_moved);
  auto cq_moved = need(CompletionQueue::create(ctx, 4), "cq to move");
  move_away(cq_moved);
  auto qp_moved = need(QueuePair::create(pd, cq_s, cq_s), "qp to move");
  move_away(qp_moved);
  auto w_moved = need(MemoryWindow::alloc(pd, mw_type::type2, accept_risk), "window to move");
  move_away(w_moved);
  auto g_moved = need(StrictGrant::create(pd, mt, {0, 64}, mw_type::type2, accept_risk), "grant to move");
  move_away(g_moved);
  auto k_moved = need(IndirectKey::create(pd, 4), "key to move");
  move_away(k_moved);

  // A fresh RC QP (RESET) on the scratch CQ; one connected to itself.
  auto fresh = [&] { return need(QueuePair::create(pd, cq_s, cq_s), "fresh qp"); };
  auto fresh_rts = [&] {
    auto q = fresh();
    need(q.connect(need(q.local_endpoint(), "endpoint")), "connect to itself");
    return q;
  };
  // The victim's work: post on vp.a, return the completion's code, recover the pair.
  auto on_victim = [&](const std::function<void(SendBatch &)> &add) -> std::error_code {
    auto b = vp.a.start_send();
    add(b);
    if (auto s = b.submit(); !s) return s.error();
    const ibv_wc wc = wait_wc(vp.cq_a, 1).front();
    vp.recover();
    return wc_error(wc);
  };

  // What the rejected calls point at, to compare after the table.
  const auto snap_tgt = tgt, snap_tgt2 = tgt2, snap_tgt_x = tgt_x, snap_src = src, snap_dst = dst,
             snap_rbuf = rbuf, snap_aux = aux;
  std::vector<unsigned char> snap_ma(N);
  std::memcpy(snap_ma.data(), ma.data(), N);

  table t;
  const std::size_t big = SIZE_MAX;
  const access_flags unknown_bit = access_flags(1u << 28);

  // =============================================================================================
  t.handle = "Context";
  t.add("Context::open(ibv_device *)", "null device", is(errc::no_device),
        [&] { return err(Context::open(static_cast<ibv_device *>(nullptr))); });
  t.add("Context::open(name)", "a name no device has", is(errc::no_device),
        [&] { return err(Context::open("rdmaxx-no-such-device")); });
  t.add("Context::open(name)", "empty name", is(errc::no_device),
        [&] { return err(Context::open(std::string_view{})); });
  t.add("Context::query_port", "port 0", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_port(0)); });
  t.add("Context::query_port", "port 2 (rxe has one)", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_port(2)); });
  t.add("Context::query_port", "port 255", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_port(255)); });
  t.add("Context::query_gid", "index -1", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_gid(1, -1)); });
  t.add("Context::query_gid", "index 1 << 20", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_gid(1, 1 << 20)); });
  t.add("Context::query_gid", "port 0", sys_errno(std::errc::invalid_argument),
        [&] { return err(ctx.query_gid(0, 0)); });
  t.add("Context::query_port", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.query_port()); });
  t.add("Context::query_port", "default-constructed context", is(errc::null_handle),
        [&] { return err(Context{}.query_port()); });
  t.add("Context::query_gid", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.query_gid(1, 0)); });
  t.add("Context::query_capabilities", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.query_capabilities()); });
  t.add("Context::wait_async_event", "moved-from context", is(errc::null_handle),
        [&] { return err(ctx_moved.wait_async_event(0)); });
  t.add("Context::wait_async_event", "zero timeout, no event", is(errc::timeout),
        [&] { return err(ctx.wait_async_event(0)); });
  t.add("Context::close", "children alive", is(errc::busy), [&] { return err(ctx.close()); });
  t.add("probe_window_bounds", "moved-from context", is(errc::null_handle), [&] {
    Capabilities c;
    c.mw_type2b = true;
    return err(probe_window_bounds(ctx_moved, c));
  });
  t.add("probe_window_bounds", "capabilities without window types", is(errc::unsupported), [&] {
    Capabilities c;
    return err(probe_window_bounds(ctx, c));
  });
  t.add("probe_window_bounds", "gid index 200", transition(__builtin_ctz(IBV_QP_AV)), [&] {
    auto c = need(ctx.query_capabilities({false, false}), "caps");
    return err(probe_window_bounds(ctx, c, 200));
  });
  t.add(
      "DeviceList::find", "moved-from list", is(errc::no_device),
      [&] {
        auto l = need(DeviceList::get(), "device list");
        DeviceList sink(std::move(l));
        // A moved-from list that still reports devices would dereference its null list.
        if (l.size() != 0 || !l.devices().empty()) return make_error_code(errc::wrong_state);
        return err(Context::open(l.find(dev_name)));
      });

  // =============================================================================================
  t.handle = "ProtectionDomain";
  t.add("ProtectionDomain::alloc", "moved-from context", is(errc::null_handle),
        [&] { return err(ProtectionDomain::alloc(ctx_moved)); });
  t.add("ProtectionDomain::alloc", "default-constructed context", is(errc::null_handle),
        [&] { return err(ProtectionDomain::alloc(Context{})); });
  t.add("ProtectionDomain::dealloc", "MRs, windows and QPs alive", is(errc::busy),
        [&] { return err(pd.dealloc()); });

  // =============================================================================================
  t.handle = "access";
  t.add("check_access", "unknown bit", is(errc::unknown_access_flag),
        [&] { return check_access(unknown_bit); });
  t.add("check_access", "remote write without local write", is(errc::remote_write_needs_local_write),
        [&] { return check_access(access::remote_write); });
  t.add("check_access", "remote atomic without local write", is(errc::remote_atomic_needs_local_write),
        [&] { return check_access(access::remote_atomic); });

  // =============================================================================================
  t.handle = "MemoryRegion";
  const auto lw = access_flags(access::local_write);
  t.add("MemoryRegion::reg", "null address", is(errc::null_address),
        [&] { return err(MemoryRegion::reg(pd, nullptr, 64, lw)); });
  t.add("MemoryRegion::reg", "zero length", is(errc::zero_length),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), 0, lw)); });
  t.add("MemoryRegion::reg", "length SIZE_MAX", is(errc::out_of_range),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), big, lw)); });
  t.add("MemoryRegion::reg", "address + length wraps", is(errc::out_of_range), [&] {
    const std::size_t wrap = SIZE_MAX - reinterpret_cast<std::uintptr_t>(aux.data()) + 2;
    return err(MemoryRegion::reg(pd, aux.data(), wrap, lw));
  });
  t.add("MemoryRegion::reg", "unknown access bit", is(errc::unknown_access_flag),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), N, unknown_bit)); });
  t.add("MemoryRegion::reg", "remote write without local write", is(errc::remote_write_needs_local_write),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), N, access::remote_write)); });
  t.add(
      "MemoryRegion::reg", "remote atomic without local write", is(errc::remote_atomic_needs_local_write),
      [&] { return err(MemoryRegion::reg(pd, aux.data(), N, access::remote_atomic | access::remote_read)); });
  t.add("MemoryRegion::reg", "on-demand paging (rxe has none)", unsupported(),
        [&] { return err(MemoryRegion::reg(pd, aux.data(), N, access::local_write | access::on_demand)); });
  t.add("MemoryRegion::reg", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryRegion::reg(pd_moved, aux.data(), N, lw)); });
  const auto page_off = reinterpret_cast<std::uintptr_t>(aux.data()) & 4095;
  t.add("MemoryRegion::reg_iova", "IOVA with another page offset", is(errc::iova_page_offset_mismatch), [&] {
    return err(MemoryRegion::reg_iova(pd, aux.data(), N, 0x10000000 + ((page_off + 8) & 4095), lw));
  });
  t.add("MemoryRegion::reg_iova", "null address", is(errc::null_address),
        [&] { return err(MemoryRegion::reg_iova(pd, nullptr, N, 0x10000000, lw)); });
  t.add("MemoryRegion::reg_iova", "zero length", is(errc::zero_length),
        [&] { return err(MemoryRegion::reg_iova(pd, aux.data(), 0, 0x10000000 + page_off, lw)); });
  t.add("MemoryRegion::reg_iova", "IOVA + length wraps", is(errc::out_of_range), [&] {
    return err(MemoryRegion::reg_iova(pd, aux.data(), N, (UINT64_MAX & ~std::uint64_t(4095)) + page_off, lw));
  });
  t.add("MemoryRegion::reg_iova", "remote write without local write",
        is(errc::remote_write_needs_local_write), [&] {
          return err(MemoryRegion::reg_iova(pd, aux.data(), N, 0x10000000 + page_off, access::remote_write));
        });
  t.add("MemoryRegion::reg_iova", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryRegion::reg_iova(pd_moved, aux.data(), N, 0x10000000 + page_off, lw)); });
  t.add("MemoryRegion::allocate", "zero length", is(errc::zero_length),
        [&] { return err(MemoryRegion::allocate(pd, 0, lw)); });
  t.add("MemoryRegion::allocate", "length SIZE_MAX", sys_errno(std::errc::not_enough_memory),
        [&] { return err(MemoryRegion::allocate(pd, big, lw)); });
  t.add("MemoryRegion::allocate", "1 PiB (more than the address space)",
        sys_errno(std::errc::not_enough_memory),
        [&] { return err(MemoryRegion::allocate(pd, std::size_t(1) << 50, lw)); });
  t.add("MemoryRegion::allocate", "unknown access bit", is(errc::unknown_access_flag),
        [&] { return err(MemoryRegion::allocate(pd, N, unknown_bit)); });
  t.add("MemoryRegion::allocate", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryRegion::allocate(pd_moved, N, lw)); });
  t.add("MemoryRegion::slice", "zero length", is(errc::zero_length), [&] { return err(md.slice(0, 0)); });
  t.add("MemoryRegion::slice", "offset past the end", is(errc::out_of_range),
        [&] { return err(md.slice(N + 1, 1)); });
  t.add("MemoryRegion::slice", "last byte + 1", is(errc::out_of_range),
        [&] { return err(md.slice(N - 1, 2)); });
  t.add("MemoryRegion::slice", "offset + length wraps", is(errc::out_of_range),
        [&] { return err(md.slice(1, big)); });
  t.add("MemoryRegion::slice", "moved-from MR", is(errc::null_handle),
        [&] { return err(mr_moved.slice(0, 1)); });
  t.add("MemoryRegion::slice", "unusable MR", is(errc::unusable), [&] { return err(mu.slice(0, 1)); });
  t.add("MemoryRegion::rereg", "no change", is(errc::nothing_to_change),
        [&] { return err(mrr.rereg(rereg_changes{})); });
  t.add("MemoryRegion::rereg", "the same access", is(errc::nothing_to_change),
        [&] { return err(mrr.rereg(change_access(remote_rw))); });
  t.add("MemoryRegion::rereg", "the same PD", is(errc::nothing_to_change),
        [&] { return err(mrr.rereg(change_pd(pd))); });
  t.add("MemoryRegion::rereg", "translation to a null address", is(errc::null_address),
        [&] { return err(mrr.rereg(change_translation(nullptr, N))); });
  t.add("MemoryRegion::rereg", "translation to zero length", is(errc::zero_length),
        [&] { return err(mrr.rereg(change_translation(aux.data(), 0))); });
  t.add("MemoryRegion::rereg", "translation whose address + length wraps", is(errc::out_of_range),
        [&] { return err(mrr.rereg(change_translation(aux.data(), big))); });
  t.add("MemoryRegion::rereg", "translation of an allocate()d MR", is(errc::wrong_type),
        [&] { return err(ma.rereg(change_translation(aux.data(), N))); });
  t.add("MemoryRegion::rereg", "unknown access bit", is(errc::unknown_access_flag),
        [&] { return err(mrr.rereg(change_access(unknown_bit))); });
  t.add("MemoryRegion::rereg", "on-demand paging (rxe has none)", is(errc::unsupported),
        [&] { return err(mrr.rereg(change_access(access::local_write | access::on_demand))); });
  t.add("MemoryRegion::rereg", "remote write without local write", is(errc::remote_write_needs_local_write),
        [&] { return err(mrr.rereg(change_access(access::remote_write))); });
  t.add("MemoryRegion::rereg", "moved-from PD", is(errc::null_handle),
        [&] { return err(mrr.rereg(change_pd(pd_moved))); });
  t.add("MemoryRegion::rereg", "PD of another context", is(errc::pd_mismatch),
        [&] { return err(mrr.rereg(change_pd(pd_x))); });
  t.add("MemoryRegion::rereg", "windows bound to the MR", is(errc::busy),
        [&] { return err(mt.rereg(change_access(access::local_write | access::mw_bind))); });
  t.add("MemoryRegion::rereg", "native_only where the device has none", is(errc::unsupported),
        [&] { return err(mrr.rereg(change_access(access::local_write), rereg_policy::native_only)); });
  t.add("MemoryRegion::rereg", "moved-from MR", is(errc::null_handle),
        [&] { return err(mr_moved.rereg(change_access(lw))); });
  t.add("MemoryRegion::rereg", "unusable MR", is(errc::unusable),
        [&] { return err(mu.rereg(change_access(remote_rw))); });
  t.add("MemoryRegion::rereg_native_unchecked", "unknown flag bit",
        rereg_old_valid(std::errc::invalid_argument),
        [&] { return err(mrr.rereg_native_unchecked(1 << 10, nullptr, nullptr, 0, 0)); });
  t.add("MemoryRegion::rereg_native_unchecked", "translation to a null address",
        rereg_old_valid(std::errc::invalid_argument), [&] {
          return err(mrr.rereg_native_unchecked(IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, N, 0));
        });
  t.add("MemoryRegion::rereg_native_unchecked", "moved-from MR", is(errc::null_handle), [&] {
    return err(mr_moved.rereg_native_unchecked(IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 1));
  });
  t.add("MemoryRegion::dereg", "windows bound to the MR", is(errc::busy), [&] { return err(mt.dereg()); });

  // =============================================================================================
  t.handle = "CompletionQueue";
  t.add("CompletionChannel::create", "moved-from context", is(errc::null_handle),
        [&] { return err(CompletionChannel::create(ctx_moved)); });
  t.add("CompletionQueue::create", "moved-from context", is(errc::null_handle),
        [&] { return err(CompletionQueue::create(ctx_moved, 4)); });
  t.add("CompletionQueue::create", "cqe 0", is(errc::zero_length),
        [&] { return err(CompletionQueue::create(ctx, 0)); });
  t.add("CompletionQueue::create", "cqe -1", is(errc::zero_length),
        [&] { return err(CompletionQueue::create(ctx, -1)); });
  t.add("CompletionQueue::create", "cqe INT_MAX (above max_cqe)", sys_errno(std::errc::invalid_argument),
        [&] { return err(CompletionQueue::create(ctx, INT_MAX)); });
  t.add("CompletionQueue::create", "moved-from channel", is(errc::null_handle),
        [&] { return err(CompletionQueue::create(ctx, 4, &ch_moved)); });
  t.add(
      "CompletionQueue::create", "channel of another context", is(errc::context_mismatch),
      [&] { return err(CompletionQueue::create(ctx, 4, &ch_x)); });
  ibv_wc wcs[4];
  t.add("CompletionQueue::wait", "moved-from CQ", is(errc::null_handle),
        [&] { return err(cq_moved.wait(wcs, 0)); });
  t.add("CompletionQueue::wait", "CQ without a channel (busy poll), zero timeout, nothing completed", is(errc::timeout),
        [&] { return err(lb.cq_a.wait(wcs, 0)); });
  t.add("CompletionQueue::wait", "zero timeout, nothing completed", is(errc::timeout),
        [&] { return err(cq_ch.wait(wcs, 0)); });
  t.add("CompletionQueue::wait", "negative timeout", is(errc::timeout),
        [&] { return err(cq_ch.wait(wcs, -5)); });
  t.add(
      "CompletionQueue::wait", "empty output span", is(errc::zero_length),
      [&] { return err(cq_ch.wait(std::span<ibv_wc>{}, 30)); });
  t.add("CompletionQueue::destroy", "QPs use it", is(errc::busy), [&] { return err(lb.cq_a.destroy()); });
  t.add("CompletionChannel::destroy", "a CQ uses it", is(errc::busy), [&] { return err(ch.destroy()); });
  // poll() on a null CQ is a precondition violation (unchecked fast path, documented), not a row.

  // =============================================================================================
  t.handle = "QueuePair";
  t.add("QueuePair::create", "moved-from PD", is(errc::null_handle),
        [&] { return err(QueuePair::create(pd_moved, cq_s, cq_s)); });
  t.add("QueuePair::create", "moved-from send CQ", is(errc::null_handle),
        [&] { return err(QueuePair::create(pd, cq_moved, cq_s)); });
  t.add("QueuePair::create", "moved-from receive CQ", is(errc::null_handle),
        [&] { return err(QueuePair::create(pd, cq_s, cq_moved)); });
  t.add("QueuePair::create", "CQ of another context", is(errc::context_mismatch),
        [&] { return err(QueuePair::create(pd, cq_s, cq_x)); });
  t.add("QueuePair::create", "max_send_wr 1 << 30", sys_errno(std::errc::invalid_argument), [&] {
    qp_caps c;
    c.max_send_wr = 1u << 30;
    return err(QueuePair::create(pd, cq_s, cq_s, c));
  });
  t.add("QueuePair::create", "max_send_sge 100000", sys_errno(std::errc::invalid_argument), [&] {
    qp_caps c;
    c.max_send_sge = 100000;
    return err(QueuePair::create(pd, cq_s, cq_s, c));
  });
  t.add("QueuePair::create", "max_inline_data 1 MiB", sys_errno(std::errc::invalid_argument), [&] {
    qp_caps c;
    c.max_inline_data = 1u << 20;
    return err(QueuePair::create(pd, cq_s, cq_s, c));
  });
  t.add("QueuePair::create", "a send operation rxe lacks (TSO)", unsupported(), [&] {
    return err(QueuePair::create(pd, cq_s, cq_s, {}, send_ops(std::uint64_t(IBV_QP_EX_WITH_TSO))));
  });
  t.add("QueuePair::post_recv", "moved-from QP", is(errc::null_handle),
        [&] { return err(qp_moved.post_recv(1, ms.sge(0, 8))); });
  t.add("QueuePair::post_recv", "more SGEs than max_recv_sge", sys_errno(std::errc::invalid_argument), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    std::vector<ibv_sge> sg(q.caps().max_recv_sge + 1, ms.sge(0, 8));
    return err(q.post_recv(1, sg));
  });
  t.add("QueuePair::post_recv", "receive queue full", sys_errno(std::errc::not_enough_memory), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    // rxe's queue holds more than the max_recv_wr it reports: post until it refuses
    for (std::uint32_t i = 0; i <= 8 * q.caps().max_recv_wr + 64; ++i)
      if (auto r = q.post_recv(i, ms.sge(0, 8)); !r) return r.error();
    return std::error_code{};
  });
  t.add("QueuePair::local_endpoint", "port 0", sys_errno(std::errc::invalid_argument), [&] {
    connect_options o;
    o.port = 0;
    return err(lb.a.local_endpoint(o));
  });
  t.add("QueuePair::local_endpoint", "gid index 1 << 20", sys_errno(std::errc::invalid_argument), [&] {
    connect_options o;
    o.gid_index = 1 << 20;
    return err(lb.a.local_endpoint(o));
  });
  t.add("QueuePair::to_rts", "before to_rtr (INIT)", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    return err(q.to_rts());
  });
  t.add("QueuePair::to_rts", "in RESET", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(fresh().to_rts()); });
  t.add("QueuePair::to_rtr", "in RESET", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    return err(q.to_rtr(need(q.local_endpoint(), "endpoint")));
  });
  t.add("QueuePair::to_rts", "already in RTS", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(fresh_rts().to_rts()); });
  t.add("QueuePair::to_init", "port 0", transition(__builtin_ctz(IBV_QP_PORT)), [&] {
    connect_options o;
    o.port = 0;
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_init", "port 2 (rxe has one)", transition(__builtin_ctz(IBV_QP_PORT)), [&] {
    connect_options o;
    o.port = 2;
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_init", "unknown QP access bits", is(errc::unknown_access_flag), [&] {
    connect_options o;
    o.qp_access |= access_flags(1u << 28);
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_init", "MW_BIND as a QP access right", is(errc::unknown_access_flag), [&] {
    connect_options o;
    o.qp_access |= access::mw_bind;
    return err(fresh().to_init(o));
  });
  t.add("QueuePair::to_rtr", "gid index 200", transition(__builtin_ctz(IBV_QP_AV)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    connect_options o;
    o.gid_index = 200;
    return err(q.to_rtr(need(q.local_endpoint(), "endpoint"), o));
  });
  t.add("QueuePair::to_rts", "max_rd_atomic 255", transition(__builtin_ctz(IBV_QP_MAX_QP_RD_ATOMIC)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    need(q.to_rtr(need(q.local_endpoint(), "endpoint")), "to_rtr");
    connect_options o;
    o.max_rd_atomic = 255;
    return err(q.to_rts(o));
  });
  t.add("QueuePair::to_rts", "in ERR", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init"); // RESET->ERR is not a legal transition
    need(q.to_error(), "to_error");
    return err(q.to_rts());
  });
  t.add("QueuePair::to_init", "in ERR", transition(__builtin_ctz(IBV_QP_STATE)), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    need(q.to_error(), "to_error");
    return err(q.to_init());
  });
  t.add("QueuePair::connect", "a connected QP, twice", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(lb.a.connect(need(lb.b.local_endpoint(), "endpoint b"))); });
  t.add("connect_loopback", "a connected pair, twice", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(connect_loopback(lb.a, lb.b)); });
  t.add("QueuePair::to_error", "in RESET (not a legal transition)", transition(__builtin_ctz(IBV_QP_STATE)),
        [&] { return err(fresh().to_error()); });
  t.add("QueuePair::connect", "gid index 200 (an empty GID slot)", transition(__builtin_ctz(IBV_QP_AV)), [&] {
    auto q = fresh();
    connect_options o;
    o.gid_index = 200;
    return err(q.connect(need(q.local_endpoint(), "endpoint"), o));
  });
  t.add("QueuePair::connect", "port 0", transition(__builtin_ctz(IBV_QP_PORT)), [&] {
    auto q = fresh();
    connect_options o;
    o.port = 0;
    return err(q.connect(need(q.local_endpoint(), "endpoint"), o));
  });
  t.add("QueuePair::reset_and_reconnect", "never connected", is(errc::wrong_state),
        [&] { return err(fresh().reset_and_reconnect()); });
  t.add("QueuePair::destroy", "a type-2 window bound through it", is(errc::busy),
        [&] { return err(lb.b.destroy()); });
  t.add("connect_loopback", "moved-from QP", is(errc::null_handle),
        [&] { return err(connect_loopback(qp_moved, vp.b)); });
  {
    const endpoint ep{};
    t.add("QueuePair::local_endpoint", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.local_endpoint()); });
    t.add("QueuePair::to_init", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.to_init()); });
    t.add("QueuePair::to_rtr", "moved-from QP", is(errc::null_handle),
          [&, ep] { return err(qp_moved.to_rtr(ep)); });
    t.add("QueuePair::to_rts", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.to_rts()); });
    t.add("QueuePair::connect", "moved-from QP", is(errc::null_handle),
          [&, ep] { return err(qp_moved.connect(ep)); });
    t.add("QueuePair::reset_and_reconnect", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.reset_and_reconnect()); });
    t.add("QueuePair::to_reset", "moved-from QP", is(errc::null_handle), [&] { return err(qp_moved.to_reset()); });
    t.add("QueuePair::to_error", "moved-from QP", is(errc::null_handle),
          [&] { return err(qp_moved.to_error()); });
    t.add("QueuePair::state", "moved-from QP", is(errc::null_handle), [&] { return err(qp_moved.state()); });
  }
#if RDMAXX_HAVE_MLX5
  t.add("mlx5::create_umr_qp", "not an mlx5 device", is(errc::unsupported),
        [&] { return err(mlx5::create_umr_qp(pd, cq_s, cq_s)); });
  t.add("mlx5::create_umr_qp", "moved-from PD", is(errc::null_handle),
        [&] { return err(mlx5::create_umr_qp(pd_moved, cq_s, cq_s)); });
  t.add("mlx5::create_umr_qp", "moved-from CQ", is(errc::null_handle),
        [&] { return err(mlx5::create_umr_qp(pd, cq_moved, cq_s)); });
#endif

  // =============================================================================================
  t.handle = "SendBatch";
  t.add("SendBatch::submit", "twice", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    need(b.submit(), "first submit (empty batch)");
    return err(b.submit());
  });
  t.add("QueuePair::start_send + submit", "moved-from QP", is(errc::null_handle), [&] {
    auto b = qp_moved.start_send();
    b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    return err(b.submit());
  });
  t.add("SendBatch::submit", "moved-from batch", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    move_away(b);
    return err(b.submit());
  });
  t.add("SendBatch::write + submit", "a write added after submit", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    need(b.submit(), "submit (empty batch)");
    b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    return err(b.submit());
  });
  t.add("SendBatch::read/send/... + submit", "every operation on a moved-from batch", is(errc::wrong_state),
        [&] {
          auto b = lb.a.start_send();
          move_away(b);
          const std::byte bytes[4]{};
          const ibv_sge s = ms.sge(0, 8);
          b.read({1}, {md.iova(), md.rkey()}, s)
              .write_inline({2}, {md.iova(), md.rkey()}, bytes)
              .write_imm({3}, {md.iova(), md.rkey()}, 7, s)
              .send({4}, s)
              .send_inline({5}, bytes)
              .send_imm({6}, 7, s)
              .send_inv({7}, 1, std::span<const ibv_sge>(&s, 1))
              .local_inv({8}, 1)
              .atomic_cmp_swp({9}, {md.iova(), md.rkey()}, 0, 1, s)
              .atomic_fetch_add({10}, {md.iova(), md.rkey()}, 1, s);
          return err(b.submit());
        });
  // Before RTS rxe fails ibv_wr_complete but keeps the work requests queued; they ran once the QP
  // was connected. Each of these rows then connects the QP and checks that only a follow-up runs.
  auto refused_then_follow_up = [&](QueuePair &q, const std::function<std::error_code()> &post) {
    const std::error_code ec = post();
    if (need(q.state(), "state") == IBV_QPS_RESET) need(q.to_init(), "to_init");
    if (need(q.state(), "state") == IBV_QPS_INIT)
      need(q.to_rtr(need(q.local_endpoint(), "endpoint")), "to_rtr");
    need(q.to_rts(), "to_rts");
    {
      auto b = q.start_send();
      b.write({2, send_flag::signaled}, {mrr.iova() + 2048, mrr.rkey()}, ms.sge(0, 8));
      need(b.submit(), "submit the follow-up write");
    }
    const auto wcs = wait_wc(cq_s, 1);
    CHECK(wcs.front().wr_id == 2);
    expect_no_completion(cq_s, 200ms);
    std::memcpy(rbuf.data() + 2048, snap_rbuf.data() + 2048, 8); // undo the follow-up
    return ec;
  };
  auto write_md = [&](QueuePair &q) {
    auto b = q.start_send();
    b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    return err(b.submit());
  };
  t.add("SendBatch::write + submit", "on a QP in RESET", is(errc::wrong_state), [&] {
    auto q = fresh();
    return refused_then_follow_up(q, [&] { return write_md(q); });
  });
  t.add("SendBatch::write + submit", "on a QP in INIT", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    return refused_then_follow_up(q, [&] { return write_md(q); });
  });
  t.add("SendBatch::write + submit", "on a QP in RTR", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    need(q.to_rtr(need(q.local_endpoint(), "endpoint")), "to_rtr");
    return refused_then_follow_up(q, [&] { return write_md(q); });
  });
  // rxe's provider answers ENOSPC for work requests that do not fit the QP.
  t.add("SendBatch::write(span) + submit", "more SGEs than max_send_sge",
        sys_errno(std::errc::no_space_on_device), [&] {
          std::vector<ibv_sge> sg(vp.a.caps().max_send_sge + 1, ms.sge(0, 8));
          auto b = vp.a.start_send();
          b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, sg);
          return err(b.submit());
        });
  t.add("SendBatch::write_inline + submit", "more than max_inline_data",
        sys_errno(std::errc::no_space_on_device), [&] {
          std::vector<std::byte> data(vp.a.caps().max_inline_data + 1);
          auto b = vp.a.start_send();
          b.write_inline({1, send_flag::signaled}, {md.iova(), md.rkey()}, data);
          return err(b.submit());
        });
  t.add("SendBatch::write + submit", "more work requests than the send queue holds",
        sys_errno(std::errc::no_space_on_device), [&] {
          // rxe's queue holds more than the max_send_wr it reports: add until it cannot hold them
          auto b = vp.a.start_send();
          for (std::uint32_t i = 0; i <= 8 * vp.a.caps().max_send_wr + 64; ++i)
            b.write({i}, {md.iova(), md.rkey()}, ms.sge(0, 8));
          return err(b.submit());
        });
  t.add("SendBatch::write", "a local SGE with an lkey that does not exist",
        completion(IBV_WC_LOC_PROT_ERR, IBV_WC_LOC_QP_OP_ERR), [&] {
          return on_victim([&](SendBatch &b) {
            b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, {ms.iova(), 64, ms.lkey() ^ 0x5a5a00});
          });
        });
  t.add("SendBatch::write", "a remote range past the end of the MR", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    return on_victim([&](SendBatch &b) {
      b.write({1, send_flag::signaled}, {mt.iova() + N - 8, mt.rkey()}, ms.sge(0, 64));
    });
  });
  t.add("SendBatch::write", "rkey 0", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    return on_victim([&](SendBatch &b) { b.write({1, send_flag::signaled}, {mt.iova(), 0}, ms.sge(0, 64)); });
  });
  t.add("SendBatch::write", "through a read-only type-1 window", completion(IBV_WC_REM_ACCESS_ERR), [&] {
    return on_victim([&](SendBatch &b) {
      b.write({1, send_flag::signaled}, w1b.descriptor().at(0), ms.sge(0, 64));
    });
  });
  t.add("SendBatch::read", "into a local SGE past the end of its MR", completion(IBV_WC_LOC_PROT_ERR), [&] {
    return on_victim([&](SendBatch &b) {
      b.read({1, send_flag::signaled}, {mt.iova(), mt.rkey()}, {ms.iova() + N - 8, 64, ms.lkey()});
    });
  });
  t.add("SendBatch::write", "on a QP in ERR", completion(IBV_WC_WR_FLUSH_ERR), [&] {
    need(vp.a.to_error(), "to_error");
    return on_victim([&](SendBatch &b) {
      b.write({1, send_flag::signaled}, {md.iova(), md.rkey()}, ms.sge(0, 64));
    });
  });

  // =============================================================================================
  t.handle = "MemoryWindow";
  auto bind_now = [&](MemoryWindow &w, QueuePair &qp, const MemoryRegion &m, window_range r,
                      access_flags rights) { return err(w.bind(qp, m, r, rights)); };
  // The batch form; a batch that got a bind is dropped, so the window's pending bind is cancelled.
  auto bind_batched = [&](MemoryWindow &w, QueuePair &qp, const MemoryRegion &m, window_range r,
                          access_flags rights) {
    auto b = qp.start_send();
    auto res = w.bind(b, qp, m, r, rights);
    if (res) w.cancel_pending();
    return err(res);
  };
  t.add("MemoryWindow::alloc", "moved-from PD", is(errc::null_handle),
        [&] { return err(MemoryWindow::alloc(pd_moved, mw_type::type2, accept_risk)); });
  t.add("MemoryWindow::alloc", "a type that does not exist (7)", sys_errno(std::errc::invalid_argument),
        [&] { return err(MemoryWindow::alloc(pd, static_cast<mw_type>(7))); });
  for (MemoryWindow *w : {&w2, &w1}) {
    const char *call = w == &w2 ? "MemoryWindow::bind (type 2)" : "MemoryWindow::bind (type 1)";
    t.add(call, "zero length", is(errc::zero_length), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 0}, rw_rights);
    });
    t.add(call, "range past the end of the MR", is(errc::out_of_range), [&, w] {
      return bind_now(*w, lb.b, mt, {N - 8, 64}, rw_rights);
    });
    t.add(call, "offset + length wraps", is(errc::out_of_range), [&, w] {
      return bind_now(*w, lb.b, mt, {1, UINT64_MAX}, rw_rights);
    });
    t.add(call, "no rights", is(errc::bad_grant_rights), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 64}, access_flags{});
    });
    t.add(call, "local write as a window right", is(errc::bad_grant_rights), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 64}, access::local_write | access::remote_read);
    });
    t.add(call, "unknown access bit", is(errc::unknown_access_flag), [&, w] {
      return bind_now(*w, lb.b, mt, {0, 64}, unknown_bit | access::remote_read);
    });
    t.add(call, "MR without MW_BIND", is(errc::missing_access), [&, w] {
      return bind_now(*w, lb.b, m_nobind, {0, 64}, access::remote_read);
    });
    t.add(call, "remote write over an MR without LOCAL_WRITE", is(errc::missing_access), [&, w] {
      return bind_now(*w, lb.b, m_nolw, {0, 64}, access::remote_write);
    });
    t.add(call, "MR of another PD", is(errc::pd_mismatch), [&, w] {
      return bind_now(*w, lb.b, mt2, {0, 64}, access::remote_read);
    });
    t.add(call, "QP of another PD", is(errc::pd_mismatch), [&, w] {
      return bind_now(*w, p2.b, mt, {0, 64}, access::remote_read);
    });
    t.add(call, "moved-from MR", is(errc::null_handle), [&, w] {
      return bind_now(*w, lb.b, mr_moved, {0, 64}, access::remote_read);
    });
    t.add(call, "unusable MR", is(errc::unusable), [&, w] {
      return bind_now(*w, lb.b, mu, {0, 64}, access::remote_read);
    });
    t.add(call, "moved-from QP", is(errc::null_handle), [&, w] {
      return bind_now(*w, qp_moved, mt, {0, 64}, access::remote_read);
    });
  }
  t.add("MemoryWindow::bind (type 2)", "remote atomic over an MR without LOCAL_WRITE",
        is(errc::missing_access), [&] {
          return bind_now(w2, lb.b, m_nolw, {0, 64}, access::remote_atomic);
        });
  t.add("MemoryWindow::bind (type 2)", "MR of another context", is(errc::pd_mismatch), [&] {
    return bind_now(w2, lb.b, mt_x, {0, 64}, access::remote_read);
  });
  t.add("MemoryWindow::bind (type 2)", "a window of another PD, through that PD's QP", is(errc::pd_mismatch),
        [&] {
          return bind_now(w2x, p2.b, mt, {0, 64}, access::remote_read);
        });
  t.add("MemoryWindow::bind (type 2)", "a bound window, again", is(errc::already_bound), [&] {
    return bind_now(w2b, lb.b, mt, {0, 64}, access::remote_read);
  });
  t.add("MemoryWindow::bind (type 2)", "moved-from window", is(errc::null_handle), [&] {
    return bind_now(w_moved, lb.b, mt, {0, 64}, access::remote_read);
  });
  t.add("MemoryWindow::bind (type 1)", "through a QP in RESET", is(errc::wrong_state), [&] {
    auto q = fresh();
    const auto ec = refused_then_follow_up(q, [&] {
      return bind_now(w1, q, mt, {0, 64}, access::remote_read);
    });
    CHECK(w1.state() == mw_state::unbound);
    CHECK(w1.pending() == 0);
    return ec;
  });
  t.add("MemoryWindow::bind (type 2)", "through a QP in INIT", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    const std::uint32_t key = w2.rkey();
    const auto ec = refused_then_follow_up(q, [&] {
      return bind_now(w2, q, mt, {0, 64}, access::remote_read);
    });
    CHECK(w2.state() == mw_state::unbound);
    CHECK(w2.rkey() == key);
    CHECK(w2.native_handle()->rkey == key);
    CHECK(q.live_children() == 0);
    return ec;
  });
  t.add("MemoryWindow::unbind", "through a QP in INIT", is(errc::wrong_state), [&] {
    auto q = fresh();
    need(q.to_init(), "to_init");
    const auto ec = refused_then_follow_up(q, [&] { return err(w1b.unbind(q)); });
    CHECK(w1b.state() == mw_state::bound);
    return ec;
  });
  t.add("MemoryWindow::bind (type 1)", "zero-based", is(errc::wrong_type), [&] {
    return bind_now(w1, lb.b, mt, {0, 64}, access::remote_read | access::zero_based);
  });
  t.add("MemoryWindow::bind (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(w2.bind(b, lb.b, mt, {0, 64}, access::remote_read));
  });
  t.add("MemoryWindow::bind (batch)", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(w2.bind(b, lb.b, mt, {0, 64}, access::remote_read));
  });
  t.add("MemoryWindow::bind (batch)", "moved-from batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    move_away(b);
    return err(w1.bind(b, lb.b, mt, {0, 64}, access::remote_read));
  });
  t.add("MemoryWindow::bind (batch)", "zero length", is(errc::zero_length), [&] {
    return bind_batched(w2, lb.b, mt, {0, 0}, rw_rights);
  });
  t.add("MemoryWindow::bind (batch)", "QP of another PD", is(errc::pd_mismatch), [&] {
    return bind_batched(w2, p2.b, mt, {0, 64}, rw_rights);
  });
  t.add("MemoryWindow::bind (batch)", "a bound type-2 window", is(errc::already_bound), [&] {
    return bind_batched(w2b, lb.b, mt, {0, 64}, rw_rights);
  });
  t.add("MemoryWindow::bind (batch)", "type 1, zero-based", is(errc::wrong_type), [&] {
    return bind_batched(w1, lb.b, mt, {0, 64}, access::remote_read | access::zero_based);
  });
  t.add("MemoryWindow::bind (batch)", "a 5th unconfirmed operation", is(errc::too_many_pending), [&] {
    auto b = lb.b.start_send();
    std::error_code ec;
    for (std::size_t i = 0; i <= MemoryWindow::max_pending && !ec; ++i)
      ec = err(w1.bind(b, lb.b, mt, {64 * i, 64}, access::remote_read, {100 + i}));
    CHECK(w1.pending() == MemoryWindow::max_pending);
    w1.cancel_pending(); // the batch is dropped: nothing of it was posted
    return ec;
  });
  t.add("MemoryWindow::bind (batch)", "while an operation is unconfirmed on another QP",
        is(errc::wrong_state), [&] {
          auto bb = lb.b.start_send();
          need(w1.bind(bb, lb.b, mt, {0, 64}, access::remote_read, {110}), "first bind");
          auto ba = lb.a.start_send();
          const auto ec = err(w1.bind(ba, lb.a, mt, {0, 64}, access::remote_read, {111}));
          w1.cancel_pending();
          return ec;
        });
  t.add("MemoryWindow::unbind", "type 2", is(errc::wrong_type), [&] { return err(w2b.unbind(lb.b)); });
  t.add("MemoryWindow::unbind", "unbound type 1", is(errc::not_bound), [&] { return err(w1.unbind(lb.b)); });
  t.add("MemoryWindow::unbind", "moved-from window", is(errc::null_handle),
        [&] { return err(w_moved.unbind(lb.b)); });
  t.add("MemoryWindow::unbind", "moved-from QP", is(errc::null_handle),
        [&] { return err(w1b.unbind(qp_moved)); });
  t.add("MemoryWindow::unbind (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(w1b.unbind(b, lb.b));
  });
  t.add("MemoryWindow::unbind (batch)", "type 2", is(errc::wrong_type), [&] {
    auto b = lb.b.start_send();
    return err(w2b.unbind(b, lb.b));
  });
  t.add("MemoryWindow::invalidate", "type 1", is(errc::wrong_type),
        [&] { return err(w1b.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "never bound", is(errc::not_bound),
        [&] { return err(w2.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "already invalidated", is(errc::not_bound),
        [&] { return err(w2i.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "through another QP than the bind's", is(errc::qp_mismatch),
        [&] { return err(w2b.invalidate(lb.a)); });
  t.add("MemoryWindow::invalidate", "moved-from window", is(errc::null_handle),
        [&] { return err(w_moved.invalidate(lb.b)); });
  t.add("MemoryWindow::invalidate", "moved-from QP", is(errc::null_handle),
        [&] { return err(w2b.invalidate(qp_moved)); });
  t.add("MemoryWindow::invalidate (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(w2b.invalidate(b, lb.b));
  });
  t.add("MemoryWindow::invalidate (batch)", "never bound", is(errc::not_bound), [&] {
    auto b = lb.b.start_send();
    return err(w2.invalidate(b, lb.b));
  });
  t.add("MemoryWindow::invalidate (batch)", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(w2b.invalidate(b, lb.b));
  });

  // =============================================================================================
  t.handle = "StrictGrant";
  t.add("StrictGrant::create", "moved-from PD", is(errc::null_handle), [&] {
    return err(StrictGrant::create(pd_moved, mt, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "moved-from MR", is(errc::null_handle), [&] {
    return err(StrictGrant::create(pd, mr_moved, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "unusable MR", is(errc::unusable), [&] {
    return err(StrictGrant::create(pd, mu, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "PD other than the MR's", is(errc::pd_mismatch), [&] {
    return err(StrictGrant::create(pd2, mt, {0, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "zero length", is(errc::zero_length), [&] {
    return err(StrictGrant::create(pd, mt, {0, 0}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "range past the end of the MR", is(errc::out_of_range), [&] {
    return err(StrictGrant::create(pd, mt, {N - 8, 64}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "offset + length wraps", is(errc::out_of_range), [&] {
    return err(StrictGrant::create(pd, mt, {8, UINT64_MAX - 4}, mw_type::type2, accept_risk));
  });
  t.add("StrictGrant::create", "a window type that does not exist (7)",
        sys_errno(std::errc::invalid_argument), [&] {
          return err(StrictGrant::create(pd, mt, {0, 64}, static_cast<mw_type>(7)));
        });
  t.add("StrictGrant::grant", "no rights", is(errc::bad_grant_rights),
        [&] { return err(g.grant(lb.b, access_flags{})); });
  t.add("StrictGrant::grant", "QP of another PD", is(errc::pd_mismatch),
        [&] { return err(g.grant(p2.b, access::remote_read)); });
  t.add("StrictGrant::grant", "moved-from QP", is(errc::null_handle),
        [&] { return err(g.grant(qp_moved, access::remote_read)); });
  t.add("StrictGrant::grant", "moved-from grant", is(errc::null_handle),
        [&] { return err(g_moved.grant(lb.b, access::remote_read)); });
  t.add("StrictGrant::grant", "type 1, zero-based", is(errc::wrong_type), [&] {
    auto g1 = need(StrictGrant::create(pd, mt, {0, 64}, mw_type::type1), "type-1 grant");
    return err(g1.grant(lb.b, access::remote_read | access::zero_based));
  });
  t.add("StrictGrant::grant", "remote write over an MR without LOCAL_WRITE", is(errc::missing_access), [&] {
    auto gr = need(StrictGrant::create(pd, m_nolw, {0, 64}, mw_type::type2, accept_risk), "grant over m_nolw");
    return err(gr.grant(lb.b, access::remote_write));
  });
  t.add("StrictGrant::grant", "a bound type-2 grant, again", is(errc::already_bound), [&] {
    auto gb = need(StrictGrant::create(pd, mt, {128, 64}, mw_type::type2, accept_risk), "grant");
    need(gb.grant(lb.b, access::remote_read, {120, send_flag::signaled}), "first bind");
    CHECK(gb.window().complete(wait_one(lb.cq_b)));
    const auto ec = err(gb.grant(lb.b, access::remote_read));
    need(gb.destroy(), "revoke");
    return ec;
  });
  t.add("StrictGrant::grant (batch)", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(g.grant(b, lb.b, access::remote_read));
  });

  // =============================================================================================
  t.handle = "remote_descriptor";
  const remote_descriptor good{0x1000, 256, 0x1234, rw_rights, false};
  const auto wire = good.encode();
  using wire_t = std::array<std::byte, remote_descriptor::encoded_size>;
  auto decode_with = [wire](std::function<void(wire_t &)> f) {
    wire_t w = wire;
    f(w);
    return err(remote_descriptor::decode(w));
  };
  t.add("remote_descriptor::decode", "no bytes", is(errc::malformed_input),
        [&] { return err(remote_descriptor::decode({})); });
  t.add("remote_descriptor::decode", "7 bytes (a partial header)", is(errc::malformed_input),
        [&] { return err(remote_descriptor::decode(std::span(wire).first(7))); });
  t.add("remote_descriptor::decode", "31 bytes (truncated body)", is(errc::malformed_input),
        [&] { return err(remote_descriptor::decode(std::span(wire).first(31))); });
  t.add("remote_descriptor::decode", "33 bytes (a trailing byte)",
        descriptor_is(errc::malformed_input, "1 byte(s) after the descriptor"), [&] {
    std::array<std::byte, 33> w{};
    std::memcpy(w.data(), wire.data(), wire.size());
    return err(remote_descriptor::decode(w));
  });
  t.add("remote_descriptor::decode", "wrong magic", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[0] = std::byte{'X'}; }); });
  t.add("remote_descriptor::decode", "version 0", is(errc::wrong_version),
        [&] { return decode_with([](wire_t &w) { w[4] = std::byte{0}; }); });
  t.add("remote_descriptor::decode", "version 2", is(errc::wrong_version),
        [&] { return decode_with([](wire_t &w) { w[4] = std::byte{2}; }); });
  t.add("remote_descriptor::decode", "kind 2 (another descriptor kind)",
        descriptor_is(errc::wrong_type, "kind 2 (indirect key) where kind 1 (window) was expected"),
        [&] { return decode_with([](wire_t &w) { w[5] = std::byte{2}; }); });
  t.add("remote_descriptor::decode", "kind 0", descriptor_is(errc::wrong_type, "kind 0 (unknown)"),
        [&] { return decode_with([](wire_t &w) { w[5] = std::byte{0}; }); });
  t.add("remote_descriptor::decode", "body length 23", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[7] = std::byte{23}; }); });
  t.add("remote_descriptor::decode", "no rights", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[28] = std::byte{0}; }); });
  t.add("remote_descriptor::decode", "unknown rights bit", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[28] |= std::byte{8}; }); });
  t.add("remote_descriptor::decode", "unknown flag bit", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[29] = std::byte{2}; }); });
  t.add("remote_descriptor::decode", "reserved bytes set", is(errc::malformed_input),
        [&] { return decode_with([](wire_t &w) { w[31] = std::byte{1}; }); });
  t.add("remote_descriptor::decode", "length 0", is(errc::malformed_input), [&] {
    return decode_with([](wire_t &w) {
      for (int i = 16; i < 24; ++i) w[i] = std::byte{0};
    });
  });
  t.add("remote_descriptor::decode", "address + length wraps", is(errc::malformed_input), [&] {
    return decode_with([](wire_t &w) {
      for (int i = 8; i < 16; ++i) w[i] = std::byte{0xff};
    });
  });
  t.add("descriptor_header::peek", "no bytes", is(errc::malformed_input),
        [&] { return err(descriptor_header::peek({})); });
  t.add("descriptor_header::peek", "wrong magic", is(errc::malformed_input), [&] {
    wire_t w = wire;
    w[3] = std::byte{0};
    return err(descriptor_header::peek(w));
  });
  t.add("descriptor_header::peek", "version 9", is(errc::wrong_version), [&] {
    wire_t w = wire;
    w[4] = std::byte{9};
    return err(descriptor_header::peek(std::span(w).first(8)));
  });
  t.add("remote_descriptor::slice", "zero length", is(errc::zero_length),
        [&] { return err(good.slice(0, 0)); });
  t.add("remote_descriptor::slice", "past the end", is(errc::out_of_range),
        [&] { return err(good.slice(200, 57)); });
  t.add("remote_descriptor::slice", "offset + length wraps", is(errc::out_of_range),
        [&] { return err(good.slice(1, UINT64_MAX)); });
  t.add("remote_descriptor::encode_to", "31-byte buffer", is(errc::buffer_too_small), [&] {
    std::array<std::byte, 31> out{};
    const auto ec = err(good.encode_to(out));
    for (auto b : out) CHECK(b == std::byte{0}); // nothing written
    return ec;
  });
  t.add("remote_descriptor::encode_to", "empty buffer", is(errc::buffer_too_small),
        [&] { return err(good.encode_to({})); });

  // =============================================================================================
  t.handle = "ikey_descriptor";
  const std::array<remote_segment, 2> segs{{{0x1000, 100, 0x11}, {0x9000, 28, 0x22}}};
  const ikey_descriptor ikd = need(ikey_descriptor::make(segs, rw_rights), "make");
  std::array<std::byte, ikey_descriptor::encoded_size(2)> ikwire{};
  REQUIRE(need(ikd.encode(ikwire), "encode") == ikwire.size());
  using ikwire_t = decltype(ikwire);
  auto ikdecode_with = [ikwire](std::function<void(ikwire_t &)> f) {
    ikwire_t w = ikwire;
    f(w);
    return err(ikey_descriptor::decode(w));
  };
  t.add("ikey_descriptor::make", "no segments", is(errc::zero_length),
        [&] { return err(ikey_descriptor::make({}, rw_rights)); });
  t.add("ikey_descriptor::make", "an empty segment", is(errc::zero_length), [&] {
    const std::array<remote_segment, 2> s{{{0x1000, 100, 1}, {0x2000, 0, 2}}};
    return err(ikey_descriptor::make(s, rw_rights));
  });
  t.add("ikey_descriptor::make", "257 segments", is(errc::too_many_entries), [&] {
    std::vector<remote_segment> s(ikey_descriptor::max_segments + 1, remote_segment{0x1000, 1, 1});
    return err(ikey_descriptor::make(s, rw_rights));
  });
  t.add("ikey_descriptor::make", "local write as a right", is(errc::unknown_access_flag),
        [&] { return err(ikey_descriptor::make(segs, access::local_write | access::remote_read)); });
  t.add("ikey_descriptor::make", "MW_BIND as a right", is(errc::unknown_access_flag),
        [&] { return err(ikey_descriptor::make(segs, access::mw_bind)); });
  t.add("ikey_descriptor::make", "no rights", is(errc::missing_access),
        [&] { return err(ikey_descriptor::make(segs, access_flags{})); });
  t.add("ikey_descriptor::encode", "an empty descriptor", is(errc::zero_length), [&] {
    std::array<std::byte, 64> out{};
    return err(ikey_descriptor{}.encode(out));
  });
  t.add("ikey_descriptor::encode", "a buffer one byte short", is(errc::buffer_too_small), [&] {
    std::array<std::byte, ikey_descriptor::encoded_size(2) - 1> out{};
    const auto ec = err(ikd.encode(out));
    for (auto b : out) CHECK(b == std::byte{0}); // nothing written
    return ec;
  });
  t.add("ikey_descriptor::encode", "empty buffer", is(errc::buffer_too_small),
        [&] { return err(ikd.encode({})); });
  t.add("ikey_descriptor::decode", "no bytes", is(errc::malformed_input),
        [&] { return err(ikey_descriptor::decode({})); });
  t.add("ikey_descriptor::decode", "15 bytes (a partial body header)", is(errc::malformed_input),
        [&] { return err(ikey_descriptor::decode(std::span(ikwire).first(15))); });
  t.add("ikey_descriptor::decode", "wrong magic", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[1] = std::byte{0}; }); });
  t.add("ikey_descriptor::decode", "version 2", is(errc::wrong_version),
        [&] { return ikdecode_with([](ikwire_t &w) { w[4] = std::byte{2}; }); });
  t.add("ikey_descriptor::decode", "unknown rights bit", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[8] |= std::byte{0x10}; }); });
  t.add("ikey_descriptor::decode", "no rights", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[8] = std::byte{0}; }); });
  t.add("ikey_descriptor::decode", "kind 1 (a window descriptor's header)",
        descriptor_is(errc::wrong_type, "kind 1 (window) where kind 2 (indirect key) was expected"),
        [&] { return ikdecode_with([](ikwire_t &w) { w[5] = std::byte{1}; }); });
  t.add("ikey_descriptor::decode", "body length that disagrees with the count", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[7] ^= std::byte{1}; }); });
  t.add("ikey_descriptor::decode", "reserved byte set", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[9] = std::byte{1}; }); });
  t.add("ikey_descriptor::decode", "count 0", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[10] = w[11] = std::byte{0}; }); });
  t.add("ikey_descriptor::decode", "count 300", is(errc::too_many_entries), [&] {
    return ikdecode_with([](ikwire_t &w) {
      w[10] = std::byte{1};
      w[11] = std::byte{44};
    });
  });
  t.add("ikey_descriptor::decode", "count 3 with 2 segments' bytes", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[11] = std::byte{3}; }); });
  t.add("ikey_descriptor::decode", "truncated last segment", is(errc::malformed_input),
        [&] { return err(ikey_descriptor::decode(std::span(ikwire).first(ikwire.size() - 1))); });
  t.add("ikey_descriptor::decode", "a trailing byte",
        descriptor_is(errc::malformed_input, "1 byte(s) after the descriptor"), [&] {
    std::array<std::byte, ikey_descriptor::encoded_size(2) + 1> w{};
    std::memcpy(w.data(), ikwire.data(), ikwire.size());
    return err(ikey_descriptor::decode(w));
  });
  t.add("ikey_descriptor::decode", "an empty segment", is(errc::malformed_input), [&] {
    return ikdecode_with([](ikwire_t &w) {
      for (int i = 32; i < 36; ++i) w[i] = std::byte{0};
    });
  });
  t.add("ikey_descriptor::decode", "total length that does not add up", is(errc::malformed_input),
        [&] { return ikdecode_with([](ikwire_t &w) { w[23] = std::byte{1}; }); });

  // =============================================================================================
  t.handle = "layout / IndirectKey";
  // configure() through QP b in a batch that is then dropped (a refused configure adds nothing).
  auto configure_with = [&](IndirectKey &key, QueuePair &qp, const layout &l, access_flags acc) {
    auto b = qp.start_send();
    return err(key.configure(b, qp, l, acc));
  };
  t.add("IndirectKey::create", "moved-from PD", is(errc::null_handle),
        [&] { return err(IndirectKey::create(pd_moved, 4)); });
  t.add("IndirectKey::create", "max_entries 0", is(errc::zero_length),
        [&] { return err(IndirectKey::create(pd, 0)); });
  t.add("IndirectKey::create", "max_entries 70000", is(errc::out_of_range),
        [&] { return err(IndirectKey::create(pd, 70000)); });
  t.add("IndirectKey::create", "max_segments 257", is(errc::out_of_range),
        [&] { return err(IndirectKey::create(pd, 4, {.backend = umr_backend::none, .max_segments = 257})); });
  t.add("IndirectKey::create", "mlx5 backend forced on rxe", unsupported(),
        [&] { return err(IndirectKey::create(pd, 4, {.backend = umr_backend::mlx5, .max_segments = 0})); });
  t.add("layout + configure", "empty layout", layout_is(errc::zero_length, no_entry),
        [&] { return configure_with(k, lb.b, layout{}, remote_rw); });
  t.add("layout + configure", "an empty entry", layout_is(errc::zero_length, 1), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, 8}, {mt, 8, 0}}), remote_rw);
  });
  t.add("layout + configure", "entry past the end of its MR", layout_is(errc::out_of_range, 0), [&] {
    return configure_with(k, lb.b, layout::list({{mt, N - 8, 16}}), remote_rw);
  });
  t.add("layout + configure", "entry offset UINT64_MAX", layout_is(errc::out_of_range, 1), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, 8}, {mt, UINT64_MAX, 16}}), remote_rw);
  });
  t.add("layout + configure", "entry longer than 4 GiB", layout_is(errc::out_of_range, 0), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, std::uint64_t(1) << 33}}), remote_rw);
  });
  t.add("layout + configure", "entry of a moved-from MR", layout_is(errc::null_handle, 1), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, 8}, {mr_moved, 0, 8}}), access::local_write);
  });
  t.add("layout + configure", "entry of an unusable MR", layout_is(errc::unusable, 0), [&] {
    return configure_with(k, lb.b, layout::list({{mu, 0, 8}}), access::local_write);
  });
  t.add("layout + configure", "entry of an unconfigured key", layout_is(errc::wrong_state, 0), [&] {
    return configure_with(k, lb.b, layout::list({{k2, 0, 8}}), access::local_write);
  });
  t.add("layout + configure", "entry of a moved-from key", layout_is(errc::null_handle, 0), [&] {
    return configure_with(k, lb.b, layout::list({{k_moved, 0, 8}}), access::local_write);
  });
  t.add("layout + configure", "entry of an MR of another PD", layout_is(errc::pd_mismatch, 1), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, 8}, {mt2, 0, 8}}), remote_rw);
  });
  t.add("layout + configure", "entry of an MR of another context", layout_is(errc::pd_mismatch, 0), [&] {
    return configure_with(k, lb.b, layout::list({{mt_x, 0, 8}}), remote_rw);
  });
  t.add("layout + configure", "remote write over an MR without it", layout_is(errc::missing_access, 1), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, 8}, {m_nolw, 0, 8}}), remote_rw);
  });
  t.add("layout + configure", "remote rights over an MR without MW_BIND (type-2 software backend)",
        layout_is(errc::missing_access, 0), [&] {
          return configure_with(kt, lb.b, layout::list({{m_nobind, 0, 8}}), access::remote_read);
        });
  t.add("layout + configure", "remote rights over a raw region (no MR)",
        layout_is(errc::null_handle, no_entry), [&] {
          const region_ref raw =
              region_ref::raw(ms.iova(), 64, ms.lkey(), 0, target_access, pd.native_handle());
          return configure_with(k, lb.b, layout::list({{raw, 0, 8}}), access::remote_read);
        });
  t.add("layout + configure", "MW_BIND as a key right", layout_is(errc::unknown_access_flag, no_entry), [&] {
    return configure_with(k, lb.b, layout::list({{mt, 0, 8}}), remote_rw | access::mw_bind);
  });
  t.add("layout + configure", "remote write without local write",
        layout_is(errc::remote_write_needs_local_write, no_entry), [&] {
          return configure_with(k, lb.b, layout::list({{mt, 0, 8}}), access::remote_write);
        });
  t.add("layout + configure", "repeat count 0", layout_is(errc::zero_length, no_entry), [&] {
    return configure_with(k, lb.b, layout::repeat(0, {{mt, 0, 8, 8}}), remote_rw);
  });
  t.add("layout + configure", "repeat stride past the end of the MR", layout_is(errc::out_of_range, 0), [&] {
    return configure_with(k, lb.b, layout::repeat(3, {{mt, 0, 1024, 1024}}), remote_rw);
  });
  t.add("layout + configure", "repeat span that overflows 64 bits", layout_is(errc::out_of_range, 0), [&] {
    return configure_with(k, lb.b, layout::repeat(UINT32_MAX, {{mt, 0, UINT32_MAX, UINT32_MAX}}), remote_rw);
  });
  t.add("layout::add + configure", "a list entry in a repeat layout", layout_is(errc::wrong_type, 1), [&] {
    layout l = layout::repeat(2, {{mt, 0, 8, 8}});
    l.add(layout_entry{mt, 0, 8});
    return configure_with(k, lb.b, l, remote_rw);
  });
  t.add("layout::add + configure", "a repeat entry in a list layout", layout_is(errc::wrong_type, 1), [&] {
    layout l = layout::list({{mt, 0, 8}});
    l.add(repeat_entry{mt, 0, 8, 8});
    return configure_with(k, lb.b, l, remote_rw);
  });
  t.add("layout::add + configure", "33 entries (capacity 32)",
        layout_is(errc::too_many_entries, layout::capacity), [&] {
          layout l;
          for (std::uint64_t i = 0; i <= layout::capacity; ++i) l.add(layout_entry{mt, 16 * i, 8});
          return configure_with(k, lb.b, l, remote_rw);
        });
  t.add("layout + configure", "more entries than the key's max_entries (8)",
        layout_is(errc::too_many_entries, 8), [&] {
          layout l;
          for (std::uint64_t i = 0; i < 9; ++i) l.add(layout_entry{mt, 16 * i, 8});
          return configure_with(k, lb.b, l, remote_rw);
        });
  t.add("layout + configure", "more pieces than the key's max_segments",
        layout_is(errc::too_many_entries, no_entry), [&] {
          auto small = need(IndirectKey::create(pd, 4, {.backend = umr_backend::software, .max_segments = 2}),
                            "small key");
          return configure_with(small, lb.b, layout::list({{mt, 0, 8}, {mt, 16, 8}, {mt, 32, 8}}), remote_rw);
        });
  t.add("layout::expand", "output too small", layout_is(errc::too_many_entries, 1), [&] {
    std::array<key_segment, 1> out{};
    return err(layout::list({{mt, 0, 8}, {mt, 16, 8}}).expand(out));
  });
  t.add("layout::expand", "empty output", layout_is(errc::too_many_entries, 0), [&] {
    return err(layout::list({{mt, 0, 8}}).expand({}));
  });
  t.add("layout::validate", "rights the backend cannot grant (zero-based)",
        layout_is(errc::unknown_access_flag, no_entry), [&] {
          return layout::list({{mt, 0, 8}})
              .validate(layout_limits{}, remote_rw | access::zero_based, pd.native_handle());
        });
  t.add("IndirectKey::configure", "moved-from key", is(errc::null_handle), [&] {
    return configure_with(k_moved, lb.b, layout::list({{mt, 0, 8}}), remote_rw);
  });
  t.add("IndirectKey::configure", "moved-from QP", is(errc::null_handle), [&] {
    auto b = lb.b.start_send();
    return err(k.configure(b, qp_moved, layout::list({{mt, 0, 8}}), remote_rw));
  });
  t.add("IndirectKey::configure", "a configured key, again", is(errc::already_bound), [&] {
    return configure_with(kc, lb.b, layout::list({{mt, 0, 8}}), remote_rw);
  });
  t.add("IndirectKey::configure", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.b.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(k.configure(b, lb.b, layout::list({{mt, 0, 8}}), remote_rw));
  });
  t.add("IndirectKey::configure", "batch of another QP", is(errc::qp_mismatch), [&] {
    auto b = lb.a.start_send();
    return err(k.configure(b, lb.b, layout::list({{mt, 0, 8}}), remote_rw));
  });
  t.add("IndirectKey::configure", "QP of another PD", is(errc::pd_mismatch), [&] {
    return configure_with(k, p2.b, layout::list({{mt, 0, 8}}), remote_rw);
  });
  t.add("IndirectKey::configure", "a key of another PD over this PD's MR", layout_is(errc::pd_mismatch, 0),
        [&] {
          return configure_with(k2, p2.b, layout::list({{mt, 0, 8}}), remote_rw);
        });
  t.add("IndirectKey::invalidate", "unconfigured key", is(errc::not_bound),
        [&] { return err(k.invalidate()); });
  t.add("IndirectKey::invalidate (batch)", "unconfigured key", is(errc::not_bound), [&] {
    auto b = lb.b.start_send();
    return err(k.invalidate(b));
  });
  t.add("IndirectKey::invalidate", "moved-from key", is(errc::null_handle),
        [&] { return err(k_moved.invalidate()); });
  t.add("IndirectKey::invalidate (batch)", "moved-from key", is(errc::null_handle), [&] {
    auto b = lb.b.start_send();
    return err(k_moved.invalidate(b));
  });
  std::array<ibv_sge, 4> sg{};
  t.add("IndirectKey::sges", "moved-from key", is(errc::null_handle),
        [&] { return err(k_moved.sges(0, 8, sg)); });
  t.add("IndirectKey::sges", "unconfigured key", is(errc::wrong_state),
        [&] { return err(k.sges(0, 8, sg)); });
  t.add("IndirectKey::sges", "zero length", is(errc::zero_length), [&] { return err(kc.sges(0, 0, sg)); });
  t.add("IndirectKey::sges", "past the end of the layout", is(errc::out_of_range),
        [&] { return err(kc.sges(100, 51, sg)); });
  t.add("IndirectKey::sges", "offset + length wraps", is(errc::out_of_range),
        [&] { return err(kc.sges(1, UINT64_MAX, sg)); });
  t.add("IndirectKey::sges", "output of 1 for 2 segments", is(errc::buffer_too_small),
        [&] { return err(kc.sges(90, 20, std::span<ibv_sge>(sg).first(1))); });
  t.add("IndirectKey::sges", "empty output", is(errc::buffer_too_small),
        [&] { return err(kc.sges(0, 8, {})); });
  t.add("IndirectKey::descriptor", "moved-from key", is(errc::null_handle),
        [&] { return err(k_moved.descriptor()); });
  t.add("IndirectKey::descriptor", "unconfigured key", is(errc::wrong_state),
        [&] { return err(k.descriptor()); });
  t.add("IndirectKey::descriptor", "a key without remote rights", is(errc::missing_access),
        [&] { return err(kl.descriptor()); });
  // the initiator
  t.add("write_indirect", "submitted batch", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    need(b.submit(), "submit (empty batch)");
    return err(write_indirect(b, {1}, dk, 0, ms.sge(0, 8)));
  });
  t.add("write_indirect", "moved-from batch", is(errc::wrong_state), [&] {
    auto b = lb.a.start_send();
    move_away(b);
    return err(write_indirect(b, {1}, dk, 0, ms.sge(0, 8)));
  });
  auto indirect = [&](bool write, const ikey_descriptor &d, std::uint64_t off, std::uint32_t len) {
    auto b = lb.a.start_send(); // dropped: whatever a wrongly accepted call added is aborted
    return write ? err(write_indirect(b, {1, send_flag::signaled}, d, off, ms.sge(0, len)))
                 : err(read_indirect(b, {1, send_flag::signaled}, d, off, ms.sge(0, len)));
  };
  t.add("write_indirect", "zero length", is(errc::zero_length), [&] { return indirect(true, dk, 0, 0); });
  t.add("write_indirect", "past the end of the layout", is(errc::out_of_range),
        [&] { return indirect(true, dk, 100, 51); });
  t.add("write_indirect", "offset UINT64_MAX", is(errc::out_of_range),
        [&] { return indirect(true, dk, UINT64_MAX, 1); });
  t.add("write_indirect", "a read-only descriptor", is(errc::missing_access),
        [&] { return indirect(true, dk_ro, 0, 8); });
  t.add("write_indirect", "an empty descriptor", is(errc::missing_access),
        [&] { return indirect(true, ikey_descriptor{}, 0, 8); });
  t.add("read_indirect", "a write-only descriptor", is(errc::missing_access),
        [&] { return indirect(false, dk_wo, 0, 8); });
  t.add("read_indirect", "past the end of the layout", is(errc::out_of_range),
        [&] { return indirect(false, dk, 149, 2); });
  t.add("read_indirect", "zero length", is(errc::zero_length), [&] { return indirect(false, dk, 0, 0); });

  // =============================================================================================
  // Run the rows of `only`. Every handle named in the table must have its own test case, or its
  // rows would never run.
  std::map<std::string, std::size_t> by_handle;
  for (const row &r : t.rows) ++by_handle[r.handle];
  std::set<std::string> cases;
  for (const auto &tc : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) cases.insert(tc.name);
  for (const auto &[h, count] : by_handle) {
    INFO("the " << count << " rows of " << h << " have no test case \"" << case_prefix << h
                << "\": they would never run");
    CHECK(cases.count(case_prefix + h) == 1);
  }
  {
    INFO("the table has no row of " << only);
    REQUIRE(by_handle.count(only) == 1);
  }
  std::size_t ran = 0;
  for (const row &r : t.rows) {
    if (r.handle != only) continue;
    ++ran;
    const std::error_code ec = r.attempt();
    const bool ok = ec && r.expected.matches(ec) && clear_message(ec);
    INFO(r.call << " with " << r.input << " -> " << describe(ec) << "; expected " << r.expected.text);
    CHECK(ok);
  }
  totals().ran[only] = ran;
  totals().table = t.rows.size();

  // The checked destruction of a moved-from handle is a no-op that succeeds (not a bad input: it
  // mirrors the destructor), and it must not crash.
  CHECK(ctx_moved.close().has_value());
  CHECK(pd_moved.dealloc().has_value());
  CHECK(mr_moved.dereg().has_value());
  CHECK(cq_moved.destroy().has_value());
  CHECK(qp_moved.destroy().has_value());
  CHECK(w_moved.dealloc().has_value());
  CHECK(g_moved.destroy().has_value());
  CHECK(k_moved.destroy().has_value());

  // =============================================================================================
  // After the table: nothing a rejected call pointed at changed...
  CHECK(tgt == snap_tgt);
  CHECK(tgt2 == snap_tgt2);
  CHECK(tgt_x == snap_tgt_x);
  CHECK(src == snap_src);
  CHECK(dst == snap_dst);
  CHECK(rbuf == snap_rbuf);
  CHECK(aux == snap_aux);
  CHECK(std::memcmp(ma.data(), snap_ma.data(), N) == 0);
  expect_no_completion(lb.cq_a, 100ms);
  expect_no_completion(lb.cq_b, 100ms);
  expect_no_completion(cq_s, 100ms);

  // ... and every object the rows used still works.
  for (QueuePair *q : {&lb.a, &lb.b, &p2.a, &p2.b, &vp.a, &vp.b})
    CHECK(need(q->state(), "state") == IBV_QPS_RTS);
  auto want = snap_dst;
  REQUIRE(lb.write(ms.sge(0, 512), {md.iova() + 100, md.rkey()}) == IBV_WC_SUCCESS);
  std::memcpy(want.data() + 100, src.data(), 512);
  CHECK(dst == want);
  REQUIRE(vp.write(ms.sge(512, 64), {md.iova() + 700, md.rkey()}) == IBV_WC_SUCCESS);
  std::memcpy(want.data() + 700, src.data() + 512, 64);
  CHECK(dst == want);
  // The other PD's pair: a write within its own region.
  REQUIRE(p2.write(mt2.sge(0, 64), {mt2.iova() + 1000, mt2.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(tgt2.data() + 1000, snap_tgt2.data(), 64) == 0);
  // The rereg subject: same keys, still valid, reachable through its rkey.
  CHECK(mrr.state() == mr_state::valid);
  CHECK(mrr.lkey() == mrr_lkey);
  CHECK(mrr.rkey() == mrr_rkey);
  CHECK(mrr.access() == remote_rw);
  REQUIRE(lb.write(ms.sge(1000, 256), {mrr.iova() + 8, mrr.rkey()}) == IBV_WC_SUCCESS);
  CHECK(std::memcmp(rbuf.data() + 8, src.data() + 1000, 256) == 0);
  // Windows: the ones refused above bind and carry traffic; the bound one still works.
  auto want_tgt = snap_tgt;
  const auto d2 = bind_wait(w2, lb.b, lb.cq_b, mt, {0, 256}, rw_rights, 200);
  REQUIRE(lb.write(ms.sge(2000, 200), d2.at(16)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 16, src.data() + 2000, 200);
  CHECK(tgt == want_tgt);
  need(w2.invalidate(lb.b, {201, send_flag::signaled}), "invalidate w2");
  CHECK(w2.complete(wait_one(lb.cq_b)));
  const auto d1 = bind_wait(w1, lb.b, lb.cq_b, mt, {256, 256}, rw_rights, 202);
  REQUIRE(lb.write(ms.sge(2500, 100), d1.at(0)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 256, src.data() + 2500, 100);
  CHECK(tgt == want_tgt);
  need(w1.unbind(lb.b, {203, send_flag::signaled}), "unbind w1");
  CHECK(w1.complete(wait_one(lb.cq_b)));
  REQUIRE(lb.write(ms.sge(3000, 64), d2b.at(8)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 1024 + 8, src.data() + 3000, 64);
  CHECK(tgt == want_tgt);
  // The strict grant refused above binds and carries traffic.
  const auto dg = need(g.grant(lb.b, access::remote_write, {204, send_flag::signaled}), "grant bind");
  CHECK(g.window().complete(wait_one(lb.cq_b)));
  REQUIRE(lb.write(ms.sge(3100, 512), dg.at(0)) == IBV_WC_SUCCESS);
  std::memcpy(want_tgt.data() + 2048, src.data() + 3100, 512);
  CHECK(tgt == want_tgt);
  // The key refused above configures and carries traffic; the configured one still works.
  {
    auto b = lb.b.start_send();
    need(k.configure(b, lb.b, layout::list({{mt, 600, 30}, {mt, 700, 20}}), remote_rw,
                     {205, send_flag::signaled}),
         "configure k");
    need(b.submit(), "submit k");
    const ibv_wc wc = wait_one(lb.cq_b);
    CHECK(wc.wr_id == 205);
    CHECK(k.complete(wc));
    const auto dkk = need(k.descriptor(), "k descriptor");
    auto bw = lb.a.start_send();
    CHECK(need(write_indirect(bw, {206, send_flag::signaled}, dkk, 0, ms.sge(3700, 50)),
               "write_indirect k") == 2);
    need(bw.submit(), "submit write through k");
    CHECK(wait_one(lb.cq_a).wr_id == 206);
    std::memcpy(want_tgt.data() + 600, src.data() + 3700, 30);
    std::memcpy(want_tgt.data() + 700, src.data() + 3730, 20);
    CHECK(tgt == want_tgt);
    auto bc = lb.a.start_send();
    CHECK(need(write_indirect(bc, {207, send_flag::signaled}, dk, 95, ms.sge(3800, 10)),
               "write_indirect kc") == 2);
    need(bc.submit(), "submit write through kc");
    CHECK(wait_one(lb.cq_a).wr_id == 207);
    std::memcpy(want_tgt.data() + 3095, src.data() + 3800, 5);
    std::memcpy(want_tgt.data() + 100, src.data() + 3805, 5);
    CHECK(tgt == want_tgt);
    need(k.invalidate(), "invalidate k");
  }
  CHECK(need(lb.a.state(), "state a") == IBV_QPS_RTS);
  CHECK(need(lb.b.state(), "state b") == IBV_QPS_RTS);

  // Everything is destroyable through the checked calls, children first.
  for (MemoryWindow *w : {&w1, &w2, &w1b, &w2b, &w2i, &w2x}) destroyed(w->dealloc(), "window");
  destroyed(g.destroy(), "strict grant");
  for (IndirectKey *key : {&k, &kc, &kl, &k2, &kt}) destroyed(key->destroy(), "indirect key");
  for (MemoryRegion *m : {&mt, &mt2, &mt_x, &ms, &md, &mrr, &ma, &m_nobind, &m_nolw, &mu})
    destroyed(m->dereg(), "memory region");
  for (QueuePair *q : {&lb.a, &lb.b, &p2.a, &p2.b, &vp.a, &vp.b}) destroyed(q->destroy(), "queue pair");
  for (CompletionQueue *c :
       {&lb.cq_a, &lb.cq_b, &p2.cq_a, &p2.cq_b, &vp.cq_a, &vp.cq_b, &cq_ch, &cq_s, &cq_x})
    destroyed(c->destroy(), "completion queue");
  destroyed(ch.destroy(), "completion channel");
  destroyed(ch_x.destroy(), "completion channel of the other context");
  for (ProtectionDomain *p : {&pd, &pd2, &pd_x}) destroyed(p->dealloc(), "protection domain");
  destroyed(ctx.close(), "context");
  destroyed(ctx_x.close(), "other context");
}

// The end of the run: how many rows ran, per handle and in total, of the table's size.
struct bad_input_totals : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats &) override {
    const tally &t = totals();
    if (t.ran.empty()) return;
    std::size_t n = 0;
    for (const auto &[h, count] : t.ran) n += count;
    std::cout << "bad inputs tried: " << n << " of " << t.table << " rows";
    if (n == t.table) std::cout << " (every handle)";
    std::cout << "\n";
    for (const auto &[h, count] : t.ran) std::cout << "  " << h << ": " << count << "\n";
  }
};

} // namespace

CATCH_REGISTER_LISTENER(bad_input_totals)

// One test case per handle of the table; the name must be case_prefix + the table's handle name.
#define RDMAXX_BAD_INPUT_CASE(handle, tag)                                                          \
  TEST_CASE("bad inputs: " handle, "[bad-input]" tag) { bad_inputs(handle); }

RDMAXX_BAD_INPUT_CASE("Context", "[context]")
RDMAXX_BAD_INPUT_CASE("ProtectionDomain", "[pd]")
RDMAXX_BAD_INPUT_CASE("access", "[access]")
RDMAXX_BAD_INPUT_CASE("MemoryRegion", "[mr]")
RDMAXX_BAD_INPUT_CASE("CompletionQueue", "[cq]")
RDMAXX_BAD_INPUT_CASE("QueuePair", "[qp]")
RDMAXX_BAD_INPUT_CASE("SendBatch", "[send-batch]")
RDMAXX_BAD_INPUT_CASE("MemoryWindow", "[window]")
RDMAXX_BAD_INPUT_CASE("StrictGrant", "[strict-grant]")
RDMAXX_BAD_INPUT_CASE("remote_descriptor", "[remote-descriptor]")
RDMAXX_BAD_INPUT_CASE("ikey_descriptor", "[ikey-descriptor]")
RDMAXX_BAD_INPUT_CASE("layout / IndirectKey", "[indirect-key]")
