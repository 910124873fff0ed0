// [bad-input] The rows of layout and IndirectKey (bad_inputs.hpp).
#include "bad_inputs.hpp"

using namespace rxe;
using namespace rxe::bad_input;

TEST_CASE_METHOD(bad_input_world, "bad inputs: layout / IndirectKey", "[bad-input][indirect-key]") {
  table t("layout / IndirectKey");
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
  t.add("layout + configure", "remote rights over a raw region (no MR), type-2 windows",
        layout_is(errc::null_handle, no_entry), [&] {
          const region_ref raw =
              region_ref::raw(ms.iova(), 64, ms.lkey(), 0, target_access, pd.native_handle());
          return configure_with(kt, lb.b, layout::list({{raw, 0, 8}}), access::remote_read);
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
  t.add("IndirectKey::destroy_kept_regions", "moved-from key", is(errc::null_handle),
        [&] { return err(k_moved.destroy_kept_regions()); });
  t.add("IndirectKey::destroy_kept_regions", "a configured key (its layout uses them)", is(errc::already_bound),
        [&] { return err(kc.destroy_kept_regions()); });
  t.add("IndirectKey::revoke", "unconfigured key", is(errc::not_bound),
        [&] { return err(k.revoke()); });
  t.add("IndirectKey::revoke (batch)", "unconfigured key", is(errc::not_bound), [&] {
    auto b = lb.b.start_send();
    return err(k.revoke(b));
  });
  t.add("IndirectKey::revoke", "moved-from key", is(errc::null_handle),
        [&] { return err(k_moved.revoke()); });
  t.add("IndirectKey::revoke (batch)", "moved-from key", is(errc::null_handle), [&] {
    auto b = lb.b.start_send();
    return err(k_moved.revoke(b));
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
  t.run();
  finish();
}
