/// \file
/// rdmaxx/layout.hpp: the layout of an indirect key (user-mode memory registration, UMR).
///
/// A layout maps a zero-based address space [0, total_length()) onto pieces of previously
/// registered memory, in order:
///   - a list layout: entries (region, offset, length), any offset, any length, no alignment
///     (mlx5dv_wr_set_mkey_layout_list; MLNX_OFED's IBV_EXP_UMR_MR_LIST);
///   - a repeat layout: repeat_count x a block of entries (region, offset, bytes_count,
///     bytes_skip): repetition r of entry j covers bytes_count bytes at
///     offset + r * (bytes_count + bytes_skip) of its region (mlx5dv_wr_set_mkey_layout_interleaved;
///     MLNX_OFED's IBV_EXP_UMR_REPEAT, one dimension).
/// A region is a MemoryRegion or a configured IndirectKey (nesting). A layout is a small value
/// (fixed capacity, no allocation); it BORROWS the keys it names: build it, then configure a key
/// with it while those MRs and keys are alive and unchanged.
///
/// Errors about one entry come in layout_category(): the code names the entry ("layout entry 3:
/// out of range ...") and layout_errc() / layout_error_entry() take it apart.
///
/// Allocation: none; a layout and its entries are fixed-capacity values, and validate() and
/// expand() allocate nothing (only layout_category()'s message() builds a std::string).
#pragma once

#include "access.hpp"
#include "detail/span.hpp"
#include "error.hpp"
#include "memory_region.hpp"

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <span>
#include <string>

namespace rdmaxx {

// ---------------------------------------------------------------------------------------------
// errors that name an entry

namespace detail {
// value layout: bits 0..7 rdmaxx::errc, bits 8..30 entry index + 1 (0 = the layout as a whole)
class layout_category_impl final : public std::error_category {
public:
  const char *name() const noexcept override { return "rdmaxx.layout"; }
  std::string message(int v) const override {
    // snprintf, not std::to_string: to_string's templates cost every TU that includes this.
    char head[32] = "layout";
    if (const int e = (v >> 8) & 0x7fffff) std::snprintf(head, sizeof head, "layout entry %d", e - 1);
    return join_text(head, ": ", errc_text(v & 0xff));
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    return rdmaxx::error_category().default_error_condition(v & 0xff);
  }
};
} // namespace detail

/// The category of errors that name the offending layout entry.
inline const std::error_category &layout_category() noexcept {
  static const detail::layout_category_impl c;
  return c;
}
/// Sentinel for "the layout as a whole" (no single entry is to blame).
inline constexpr std::size_t no_entry = std::size_t(-1);
/// An rdmaxx::errc about entry `entry` of a layout (no_entry: the layout as a whole).
[[nodiscard]] inline std::error_code layout_error(errc e, std::size_t entry) noexcept {
  const int idx = entry == no_entry ? 0 : int((entry + 1) & 0x7fffff);
  return {(int(e) & 0xff) | (idx << 8), layout_category()};
}
/// The entry a layout error names, or no_entry (also for codes of other categories).
[[nodiscard]] inline std::size_t layout_error_entry(const std::error_code &ec) noexcept {
  if (ec.category() != layout_category()) return no_entry;
  const int idx = (ec.value() >> 8) & 0x7fffff;
  return idx == 0 ? no_entry : std::size_t(idx - 1);
}
/// The rdmaxx::errc inside a layout error, or of a plain rdmaxx error; errc{} otherwise.
[[nodiscard]] inline errc layout_errc(const std::error_code &ec) noexcept {
  if (ec.category() == layout_category()) return errc(ec.value() & 0xff);
  if (ec.category() == error_category()) return errc(ec.value());
  return errc{};
}

// ---------------------------------------------------------------------------------------------
// regions and segments

/// One flat piece of a configured key: `length` bytes at device address `addr` of one MR.
struct key_segment {
  /// Device address (IOVA) of the first byte.
  std::uint64_t addr = 0;
  /// Bytes in the segment.
  std::uint32_t length = 0;
  /// The MR's lkey.
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;    ///< the MR's rkey (the software backend hands peers window rkeys)
  ibv_mr *mr = nullptr;      ///< the MR (null for raw regions, e.g. in unit tests)
  /// The first byte in this process (null for raw regions): the software backend registers the
  /// segment's exact bytes from it.
  std::byte *data = nullptr;
  /// The MemoryRegion's child counter (null for raw regions): a configured key counts as a child
  /// of each region it grants, so that the region cannot be deregistered under it.
  detail::parent_node *node = nullptr;
};

/// What a layout entry points into: a snapshot of a MemoryRegion, or a view of a configured
/// IndirectKey (IndirectKey converts to it). Non-owning.
struct region_ref {
  /// The PD of the region or key (nullptr: the PD is not checked).
  ibv_pd *pd = nullptr;
  std::uint64_t iova = 0;      ///< device address of byte 0 (0 for an indirect key: zero-based)
  /// Bytes of the region (for a key: its configured length).
  std::uint64_t length = 0;
  std::uint32_t lkey = 0;      ///< MR lkey, or a hardware indirect key's lkey (nesting on mlx5)
  /// MR rkey, or a hardware indirect key's rkey.
  std::uint32_t rkey = 0;
  access_flags access{};       ///< rights of the region (for a key: configured rights)
  /// The MR (nullptr for a key or a raw region).
  ibv_mr *mr = nullptr;
  const key_segment *segments = nullptr; ///< a software key's flat segments (nesting)
  /// Entries in segments.
  std::uint32_t nsegments = 0;
  bool indirect = false;       ///< an IndirectKey rather than a MemoryRegion
  std::byte *data = nullptr;   ///< a MemoryRegion's first byte in this process (null otherwise)
  detail::parent_node *node = nullptr; ///< a MemoryRegion's child counter (null otherwise)
  errc problem{};              ///< non-zero: the source cannot be used (null_handle, unusable, ...)
  /// A hardware key's levels of indirection (1: over regions only; a key nesting such a key: 2);
  /// 0 for a region and a software key.
  std::uint8_t depth = 0;
  /// A hardware (mlx5) key's state, so that a key configured over it can tell when it was
  /// re-tagged or invalidated (mlx5::stale); null otherwise.
  const void *hw_key = nullptr;

  /// An empty ref (validation refuses it with errc::null_handle).
  region_ref() noexcept = default;
  /// A snapshot of a MemoryRegion (an empty or unusable MR gives a ref that validation refuses).
  region_ref(const MemoryRegion &m) noexcept // NOLINT: implicit on purpose ({mr, off, len})
      : pd(m.pd()), iova(m.iova()), length(m.length()), lkey(m.lkey()), rkey(m.rkey()),
        access(m.access()), mr(m.native_handle()), data(m.data()), node(detail::handle_access::node(m)) {
    if (auto ec = m.usable()) problem = errc(ec.value());
  }
  /// A region given by its raw values (tests, fuzzing, regions registered outside rdmaxx).
  [[nodiscard]] static region_ref raw(std::uint64_t iova, std::uint64_t length, std::uint32_t lkey,
                                      std::uint32_t rkey, access_flags acc,
                                      ibv_pd *pd = nullptr) noexcept {
    region_ref r;
    r.pd = pd;
    r.iova = iova;
    r.length = length;
    r.lkey = lkey;
    r.rkey = rkey;
    r.access = acc;
    return r;
  }
};

/// A list-layout entry: `length` bytes from `offset` of `source`.
struct layout_entry {
  /// The region or key the bytes come from.
  region_ref source;
  /// Offset of the first byte within the source.
  std::uint64_t offset = 0;
  /// Bytes taken (> 0, at most UINT32_MAX).
  std::uint64_t length = 0;
};
/// A repeat-layout block entry: `bytes_count` bytes, then `bytes_skip` bytes skipped, per repetition.
struct repeat_entry {
  /// The region or key the bytes come from.
  region_ref source;
  /// Offset of the first byte of repetition 0 within the source.
  std::uint64_t offset = 0;
  /// Bytes taken per repetition (> 0).
  std::uint32_t bytes_count = 0;
  /// Bytes of the source skipped after each repetition's bytes_count.
  std::uint32_t bytes_skip = 0;
};

/// Limits a backend puts on layouts (see IndirectKey::limits()).
struct layout_limits {
  std::uint32_t max_entries = 32;         ///< list entries
  std::uint32_t max_repeat_entries = 32;  ///< entries of a repeat block
  std::uint32_t max_segments = 256;       ///< flat segments after expansion (software)
  bool interleave_16bit = false;          ///< mlx5: bytes_count and bytes_count+bytes_skip < 2^16
  bool nested_hardware_only = false;      ///< mlx5: nested keys must be hardware keys
  bool nested_software_only = false;      ///< software: nested keys must be software keys
  bool remote_needs_mw_bind = false;      ///< software: remote rights need MRs with mw_bind
  /// Software (type-1 or type-2 windows, both over exact regions): the key registers its own
  /// region per segment, so the sources need no remote rights and no mw_bind (and their own
  /// rkeys, which reach the whole region, need not exist); remote write or atomic rights need
  /// LOCAL_WRITE on the source.
  bool remote_rights_own = false;
  /// Rights a key of this backend can be configured with.
  access_flags allowed_access = access::local_write | access::remote_read | access::remote_write |
                                access::remote_atomic;
  /// mlx5: the most levels of indirection a key may have (the HCA's max_indirection): a nested
  /// hardware key of region_ref::depth d makes the new key d + 1 levels deep.
  std::uint32_t max_depth = UINT32_MAX;
  /// mlx5: false where the HCA reports repeated_block_disabled (no repeat layouts).
  bool repeat_layouts = true;
};

// ---------------------------------------------------------------------------------------------
// the layout

/// The layout of an indirect key: a list of entries, or a block of entries repeated, over
/// registered regions and configured keys (see the top of this header). A fixed-capacity value
/// that borrows the regions and keys it names. Building never fails: errors are remembered and
/// reported by validate(), naming the entry. Allocation-free.
class layout {
public:
  /// Entries a layout holds (list entries, or entries of a repeat block).
  static constexpr std::size_t capacity = 32;
  /// The shape of a layout. list: the entries once, in order; repeat: the block of entries
  /// repeated repeat_count() times.
  enum class kind : std::uint8_t { list, repeat };

  /// An empty list layout (add entries with add()).
  layout() noexcept = default;

  /// A list layout. More than `capacity` entries is remembered and reported by validate().
  [[nodiscard]] static layout list(std::span<const layout_entry> entries) noexcept {
    return list_of(entries.data(), entries.size());
  }
  /// A list layout from a braced list of entries (as the span form).
  [[nodiscard]] static layout list(std::initializer_list<layout_entry> entries) noexcept {
    return list_of(entries.begin(), entries.size());
  }
  /// A repeat layout: `repeat_count` repetitions of the block `entries`.
  [[nodiscard]] static layout repeat(std::uint32_t repeat_count,
                                     std::span<const repeat_entry> entries) noexcept {
    return repeat_of(repeat_count, entries.data(), entries.size());
  }
  /// A repeat layout from a braced list of block entries (as the span form).
  [[nodiscard]] static layout repeat(std::uint32_t repeat_count,
                                     std::initializer_list<repeat_entry> entries) noexcept {
    return repeat_of(repeat_count, entries.begin(), entries.size());
  }

  /// Append a list entry.
  /// \errors Remembered (validate() reports them, naming the entry):
  /// - errc::too_many_entries: beyond capacity.
  /// - errc::wrong_type: on a repeat layout.
  /// \mallocs None.
  layout &add(const layout_entry &e) noexcept {
    if (kind_ != kind::list) return fail(errc::wrong_type);
    if (n_ == capacity) return fail(errc::too_many_entries);
    e_[n_++] = {e.source, e.offset, e.length, 0};
    return *this;
  }
  /// Append an entry to a repeat block.
  /// \errors Remembered (validate() reports them, naming the entry):
  /// - errc::wrong_type: on a list layout.
  /// \mallocs None.
  layout &add(const repeat_entry &e) noexcept {
    if (kind_ != kind::repeat) return fail(errc::wrong_type);
    if (n_ == capacity) return fail(errc::too_many_entries);
    e_[n_++] = {e.source, e.offset, e.bytes_count, e.bytes_skip};
    return *this;
  }

  /// List or repeat.
  [[nodiscard]] kind type() const noexcept { return kind_; }
  /// Entries held (list entries, or entries of the repeat block; refused entries not counted).
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// Repetitions of the block (1 for a list layout).
  [[nodiscard]] std::uint32_t repeat_count() const noexcept { return kind_ == kind::repeat ? repeat_ : 1; }
  /// Entry i: for a repeat layout, length is bytes_count and skip is bytes_skip.
  struct entry {
    /// The region or key the bytes come from.
    region_ref source;
    /// Offset of the first byte within the source.
    std::uint64_t offset = 0;
    /// Bytes (bytes_count for a repeat layout).
    std::uint64_t length = 0;
    /// bytes_skip of a repeat entry (0 for a list entry).
    std::uint32_t skip = 0;
  };
  /// Entry `i` (unchecked: i < size()).
  [[nodiscard]] const entry &operator[](std::size_t i) const noexcept { return e_[i]; }
  /// The entries held, in order.
  [[nodiscard]] std::span<const entry> entries() const noexcept { return detail::span_of(e_.data(), n_); }

  /// Bytes of the zero-based address space (0 when it would overflow; validate() refuses that).
  [[nodiscard]] std::uint64_t total_length() const noexcept {
    std::uint64_t block = 0;
    for (const auto &e : entries())
      if (__builtin_add_overflow(block, e.length, &block)) return 0;
    std::uint64_t t = 0;
    if (__builtin_mul_overflow(block, std::uint64_t(repeat_count()), &t)) return 0;
    return t;
  }
  /// Flat segments expansion produces before merging (bounded by the limits' max_segments).
  [[nodiscard]] std::uint64_t piece_count() const noexcept {
    std::uint64_t per = 0;
    for (const auto &e : entries()) per += e.source.segments ? e.source.nsegments : 1;
    return per * repeat_count();
  }

  /// The levels of indirection of a hardware key configured with this layout: one more than the
  /// deepest nested key's region_ref::depth (1 over regions only).
  [[nodiscard]] std::uint32_t depth() const noexcept {
    std::uint32_t d = 1;
    for (const auto &e : entries())
      if (e.source.indirect && std::uint32_t(e.source.depth) + 1 > d) d = std::uint32_t(e.source.depth) + 1;
    return d;
  }

  /// Check the layout against a backend's limits, the access rights `acc` the key is to grant
  /// and the key's protection domain `pd` (nullptr: not checked). Returns an empty code or a
  /// layout_category() code naming the entry.
  /// \errors
  /// - errc::too_many_entries: capacity, max_entries, max_repeat_entries, max_segments.
  /// - errc::wrong_type: add() of the other kind, or a nested key of another backend.
  /// - errc::zero_length: empty layout, empty entry, repeat count 0.
  /// - errc::null_handle / errc::unusable / errc::wrong_state: source not usable or key not
  ///   configured.
  /// - errc::out_of_range: entry outside its region, entry or total too long, 16-bit
  ///   interleave fields, a nested key too deep for max_depth (naming its entry).
  /// - errc::unsupported: a repeat layout where the backend has none (repeat_layouts false).
  /// - errc::pd_mismatch: a source on another PD than `pd`.
  /// - errc::missing_access: a right not granted by the region, or mw_bind missing.
  /// - errc::unknown_access_flag: a right the backend cannot grant.
  /// \mallocs None.
  [[nodiscard]] std::error_code validate(const layout_limits &lim, access_flags acc,
                                         ibv_pd *pd = nullptr) const noexcept;

  /// Flatten into `out`, in address-space order, nested keys resolved to their MRs' segments and
  /// contiguous pieces of one MR merged. Call validate() first (expand() trusts the entries).
  /// \errors
  /// - errc::too_many_entries (layout_category(), naming the entry that did not fit): `out` is
  ///   too short.
  /// \mallocs None.
  [[nodiscard]] result<std::size_t> expand(std::span<key_segment> out) const noexcept;

private:
  // list() and repeat() by pointer and count: constructing a std::span of a new element type
  // costs every TU that includes this header (libstdc++'s contiguous_iterator check).
  [[nodiscard]] static layout list_of(const layout_entry *e, std::size_t n) noexcept {
    layout l;
    for (std::size_t i = 0; i < n; ++i) l.add(e[i]);
    return l;
  }
  [[nodiscard]] static layout repeat_of(std::uint32_t repeat_count, const repeat_entry *e, std::size_t n) noexcept {
    layout l;
    l.kind_ = kind::repeat;
    l.repeat_ = repeat_count;
    for (std::size_t i = 0; i < n; ++i) l.add(e[i]);
    return l;
  }
  layout &fail(errc e) noexcept {
    if (error_ == errc{}) {
      error_ = e;
      error_entry_ = n_;
    }
    return *this;
  }
  // The flat pieces of [off, off+len) of a source.
  template <class F>
  static void emit(const region_ref &s, std::uint64_t off, std::uint64_t len, F &&f) noexcept;

  std::array<entry, capacity> e_{};
  std::uint32_t n_ = 0;
  std::uint32_t repeat_ = 1;
  kind kind_ = kind::list;
  errc error_{};
  std::size_t error_entry_ = 0;
};

// ---------------------------------------------------------------------------------------------
// splitting a window of a flat address space

/// One piece of a window [offset, offset+length) of a segmented address space: `length` bytes at
/// `segment_offset` of segment `segment`, which are bytes [done, done+length) of the window.
struct window_piece {
  /// Index of the segment.
  std::size_t segment = 0;
  /// Offset of the piece within its segment.
  std::uint64_t segment_offset = 0;
  /// Bytes in the piece.
  std::uint32_t length = 0;
  /// Offset of the piece within the window (the window's bytes before it).
  std::uint64_t done = 0;
};

/// Call f(window_piece) for every segment the window touches, in order. Segments are given by
/// their lengths through `len_of(i)` for i < n. Returns false (calling f for nothing) when the
/// window is empty or does not lie inside the address space. Allocation-free.
template <class LenOf, class F>
[[nodiscard]] bool for_each_piece(std::size_t n, LenOf &&len_of, std::uint64_t offset,
                                  std::uint64_t length, F &&f) noexcept {
  if (length == 0) return false;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) total += len_of(i);
  if (offset > total || length > total - offset) return false;
  std::uint64_t base = 0;
  std::uint64_t done = 0;
  for (std::size_t i = 0; i < n && done < length; ++i) {
    const std::uint64_t sl = len_of(i);
    const std::uint64_t end = base + sl;
    const std::uint64_t at = offset + done;
    if (at < end) {
      const std::uint64_t in = at - base;
      const std::uint64_t rest = length - done;
      const std::uint64_t take = sl - in < rest ? sl - in : rest;
      f(window_piece{i, in, std::uint32_t(take), done});
      done += take;
    }
    base = end;
  }
  return true;
}

} // namespace rdmaxx

// The longer bodies, out of the class declarations.
#include "impl/layout.ipp"
