// The shared part of the [bad-input] suite (test_bad_inputs*.cpp): how a row says what it
// expects, the table a test case fills and runs, and the objects the rows use (bad_input_world).
//
// One test case per public type, in the file of its header's area, each with its own rows and
// tags ("bad inputs: MemoryRegion", [bad-input][mr]). A case that uses the common objects is a
// TEST_CASE_METHOD(bad_input_world, ...): the world builds the objects (one device, two PDs and
// another context, MRs of every kind, QP pairs, windows in every state, a strict grant, indirect
// keys, moved-from handles of every type), the case adds and runs its rows, then calls finish(),
// which checks that the memory the rows pointed at is byte-for-byte unchanged, that every object
// still works (RDMA writes through the same QPs, windows, grant and keys land the right bytes)
// and destroys every object through its checked call. Each case passes or fails on its own.
//
// Each row names the call and the bad input, makes one attempt that returns a std::error_code,
// and says which error the call's doc comment promises: an rdmaxx::errc, a layout / rereg /
// qp_transition / completion code, or a verb's errno where verbs is the one to answer. A row
// passes only with that exact code and a real message (never success, never a bare EINVAL where
// rdmaxx promises its own code). table::run() counts the rows; at the end of the run
// test_bad_inputs.cpp prints them per type and in all.
#pragma once

#include "fixture.hpp"

#include <rdmaxx/rdmaxx.hpp>

#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rxe::bad_input {

// ---------------------------------------------------------------------------------------------
// the table

struct expectation {
  std::string text;
  std::function<bool(const std::error_code &)> matches;
};

/// Exactly this rdmaxx::errc (category and value).
inline expectation is(errc e) {
  return {"rdmaxx: " + make_error_code(e).message(),
          [e](const std::error_code &ec) { return ec == make_error_code(e); }};
}
/// A descriptor_category() code holding `e` whose message contains `words`.
inline expectation descriptor_is(errc e, std::string words) {
  return {"descriptor: " + make_error_code(e).message() + " (\"" + words + "\")",
          [e, words](const std::error_code &ec) {
            return ec.category() == descriptor_category() && descriptor_errc(ec) == e &&
                   ec.message().find(words) != std::string::npos;
          }};
}
/// An errno, as a verb (or mmap) gave it (generic category).
inline expectation sys_errno(std::errc c) {
  return {"errno: " + std::make_error_code(c).message(), [c](const std::error_code &ec) {
            return ec.category() == std::generic_category() && ec.value() == int(c);
          }};
}
/// "Not supported by this device", from whichever source.
inline expectation unsupported() {
  return {"unsupported (condition)", [](const std::error_code &ec) { return is_unsupported(ec); }};
}
/// A layout_category() code naming `entry` (no_entry: the layout as a whole).
inline expectation layout_is(errc e, std::size_t entry) {
  return {"layout entry " + (entry == no_entry ? std::string("(none)") : std::to_string(entry)) + ": " +
              make_error_code(e).message(),
          [e, entry](const std::error_code &ec) {
            return ec.category() == layout_category() && layout_errc(ec) == e &&
                   layout_error_entry(ec) == entry;
          }};
}
/// A failed QP transition blaming the attribute IBV_QP_* == 1 << bit.
inline expectation transition(int bit) {
  return {"qp transition blaming " + std::string(detail::qp_attr_name(bit)),
          [bit](const std::error_code &ec) {
            return ec.category() == qp_transition_category() && qp_transition_attribute(ec) == bit;
          }};
}
/// A failed native re-registration that left the old MR valid, with this errno.
inline expectation rereg_old_valid(std::errc c) {
  return {"rereg, old MR valid: " + std::make_error_code(c).message(), [c](const std::error_code &ec) {
            return ec.category() == rereg_category() && rereg_state_of(ec) == rereg_state::old_valid &&
                   ec == c;
          }};
}
/// A work completion with this status (or, when given, that one: devices differ in which local
/// error they report).
inline expectation completion(ibv_wc_status s, ibv_wc_status or_s = IBV_WC_SUCCESS) {
  std::string text = std::string("completion: ") + ibv_wc_status_str(s);
  if (or_s != IBV_WC_SUCCESS) text += std::string(" or ") + ibv_wc_status_str(or_s);
  return {text, [s, or_s](const std::error_code &ec) {
            return ec == wc_error(s) || (or_s != IBV_WC_SUCCESS && ec == wc_error(or_s));
          }};
}

template <class T> std::error_code err(const result<T> &r) {
  return r.has_value() ? std::error_code{} : r.error();
}

inline std::string describe(const std::error_code &ec) {
  if (!ec) return "success";
  return std::string(ec.category().name()) + ":" + std::to_string(ec.value()) + " \"" + ec.message() + "\"";
}
/// A message that says something (not the "unknown error" of a category that did not know it).
inline bool clear_message(const std::error_code &ec) {
  const std::string m = ec.message();
  return !m.empty() && m.rfind("Unknown error", 0) != 0 && m != "unknown rdmaxx error" &&
         m.find("IBV_QP_?") == std::string::npos;
}

/// Leave `h` moved-from; what it held is destroyed with the sink.
template <class T> void move_away(T &h) {
  T sink(std::move(h));
}

// Every ibv_rereg_mr fails with -4/EIO: the MR is left unusable (fault injection).
inline int rereg_fails_unusable(ibv_mr *, int, ibv_pd *, void *, std::size_t, int) {
  errno = EIO;
  return IBV_REREG_MR_ERR_CMD;
}

/// Bind `w` through `qp` and hand its completion to the window.
inline remote_descriptor bind_wait(MemoryWindow &w, QueuePair &qp, CompletionQueue &cq, const MemoryRegion &mr,
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


// ---------------------------------------------------------------------------------------------
// the rows of one test case

/// Rows run per type (test case), printed at the end of the run (test_bad_inputs.cpp).
std::map<std::string, std::size_t> &rows_run();

/// REQUIRE that each of `types` (name, "[tag]") has its case, case_prefix + name, tagged
/// [bad-input] and its tag (test_bad_inputs.cpp).
void check_cases_registered(std::span<const std::pair<const char *, const char *>> types);

/// The name every [bad-input] case has: "bad inputs: " + the type's name.
inline const std::string case_prefix = "bad inputs: ";

struct row {
  const char *call;
  const char *input;
  std::function<std::error_code()> attempt;
  expectation expected;
};

/// The rows of one type (`handle`: the name after case_prefix).
struct table {
  explicit table(const char *h) : handle(h) {}
  const char *handle;
  std::vector<row> rows;
  void add(const char *call, const char *input, expectation e, std::function<std::error_code()> f) {
    rows.push_back({call, input, std::move(f), std::move(e)});
  }
  /// Run every row: each must fail with its expected code and a real message.
  void run() {
    REQUIRE(!rows.empty());
    for (const row &r : rows) {
      const std::error_code ec = r.attempt();
      const bool ok = ec && r.expected.matches(ec) && clear_message(ec);
      INFO(handle << ": " << r.call << " with " << r.input << " -> " << describe(ec) << "; expected "
                  << r.expected.text);
      CHECK(ok);
    }
    rows_run()[handle] = rows.size();
  }
};

// ---------------------------------------------------------------------------------------------
// the objects the rows use

inline constexpr std::size_t N = 4096;
inline constexpr access_flags target_access = remote_rw | access::mw_bind;
inline constexpr access_flags rw_rights = access::remote_read | access::remote_write; // window rights
inline constexpr std::size_t big = SIZE_MAX;
inline constexpr access_flags unknown_bit = access_flags(1u << 28);
inline constexpr access_flags lw = access::local_write;

/// Built before a case's rows, checked and destroyed by finish() after them (test_bad_inputs.cpp).
struct bad_input_world {
  bad_input_world();
  /// After the rows: untouched memory unchanged, every object still works, checked destruction.
  void finish();

  Context ctx = open_device();
  std::string dev_name{ctx.name()};
  ProtectionDomain pd = need(ProtectionDomain::alloc(ctx), "pd");
  ProtectionDomain pd2 = need(ProtectionDomain::alloc(ctx), "pd2");
  Context ctx_x = open_device(); // the same device opened again: another context ("another device")
  ProtectionDomain pd_x = need(ProtectionDomain::alloc(ctx_x), "pd of the other context");
  CompletionQueue cq_x = need(CompletionQueue::create(ctx_x, 4), "cq of the other context");
  CompletionChannel ch = need(CompletionChannel::create(ctx), "channel");
  CompletionChannel ch_x = need(CompletionChannel::create(ctx_x), "channel of the other context");
  CompletionQueue cq_ch = need(CompletionQueue::create(ctx, 8, &ch), "cq with channel");
  CompletionQueue cq_s = need(CompletionQueue::create(ctx, 64), "scratch cq for fresh QPs");
  qp_pair lb{ctx, pd};  // a initiates, b is the target and binds the windows
  qp_pair p2{ctx, pd2}; // the other PD's pair
  qp_pair vp{ctx, pd};  // the victim: rows that put a QP into ERR use it, then recover it

  std::vector<unsigned char> tgt = std::vector<unsigned char>(N), tgt2 = tgt, tgt_x = tgt, src = tgt,
                             dst = tgt, rbuf = tgt, aux = tgt;
  MemoryRegion mt, mt2, mt_x, ms, md, mrr, ma, m_nobind, m_nolw, mu; // see the constructor
  std::uint32_t mrr_lkey = 0, mrr_rkey = 0;

  // Windows: unbound of each type, bound of each type, an invalidated one, one of pd2.
  MemoryWindow w1, w2, w1b, w2b, w2i, w2x;
  remote_descriptor d2b;
  StrictGrant g;
  // Indirect keys: unconfigured, configured with remote rights, configured local-only, of pd2,
  // a type-2 software key.
  IndirectKey k, kc, kl, k2, kt;
  ikey_descriptor dk, dk_ro, dk_wo;

  // Moved-from handles of every type.
  Context ctx_moved;
  ProtectionDomain pd_moved;
  MemoryRegion mr_moved;
  CompletionChannel ch_moved;
  CompletionQueue cq_moved;
  QueuePair qp_moved;
  MemoryWindow w_moved;
  StrictGrant g_moved;
  IndirectKey k_moved;

  // What the rejected calls point at, to compare after the rows.
  std::vector<unsigned char> snap_tgt, snap_tgt2, snap_tgt_x, snap_src, snap_dst, snap_rbuf, snap_aux,
      snap_ma;

  /// A fresh RC QP (RESET) on the scratch CQ.
  QueuePair fresh();
  /// A fresh QP connected to itself.
  QueuePair fresh_rts();
  /// The victim's work: post on vp.a, return the completion's code, recover the pair.
  std::error_code on_victim(const std::function<void(SendBatch &)> &add);
  /// Before RTS rxe fails ibv_wr_complete but keeps the work requests queued; they ran once the
  /// QP was connected. Rows that post on a QP before RTS run `post` through this: it then
  /// connects the QP and checks that only a follow-up runs.
  std::error_code refused_then_follow_up(QueuePair &q, const std::function<std::error_code()> &post);
  /// One signalled write to md on `q`, submitted.
  std::error_code write_md(QueuePair &q);
};

} // namespace rxe::bad_input
