// libFuzzer entry point for the indirect-key layout builder and the descriptor decoder.
// Byte 0 picks the target:
//   even: ikey_descriptor::decode; anything it accepts must re-encode to the same bytes, and any
//         window of it must split into pieces that cover it exactly;
//   odd:  a layout built from the bytes (list or repeat, raw regions, optionally nested in a
//         second layout); if it validates, expansion must preserve the total length and map every
//         sampled byte where the layout's definition says.
// Invariant failures trap (a crash for libFuzzer).
#include <rdmaxx/indirect_key.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

using namespace rdmaxx;

namespace {

struct input {
  const std::uint8_t *p;
  std::size_t n;
  std::uint64_t take(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v <<= 8;
      if (n) {
        v |= *p++;
        --n;
      }
    }
    return v;
  }
};

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const region_ref regs[4] = {
    region_ref::raw(0x10000, 4096, 1, 101, access::local_write | access::remote_read | access::remote_write),
    region_ref::raw(0x30000, 333, 2, 102, access::local_write | access::remote_read),
    region_ref::raw(0x50000, 70000, 3, 103, access::local_write | access::remote_read | access::remote_write),
    region_ref::raw(0x90000, 17, 4, 104, access::local_write | access::remote_read | access::remote_write),
};

struct located {
  std::uint32_t key;
  std::uint64_t addr;
};
// The definition: byte x of the layout (repeat r, entry j), resolving nested sources.
located ref_locate(const layout &l, std::uint64_t x);
located ref_source(const region_ref &s, std::uint64_t off) {
  if (!s.segments) return {s.lkey, s.iova + off};
  for (std::uint32_t i = 0; i < s.nsegments; ++i) {
    if (off < s.segments[i].length) return {s.segments[i].lkey, s.segments[i].addr + off};
    off -= s.segments[i].length;
  }
  check(false);
  return {};
}
located ref_locate(const layout &l, std::uint64_t x) {
  for (std::uint32_t r = 0; r < l.repeat_count(); ++r)
    for (const auto &e : l.entries()) {
      if (x < e.length) return ref_source(e.source, e.offset + std::uint64_t(r) * (e.length + e.skip) + x);
      x -= e.length;
    }
  check(false);
  return {};
}

layout build(input &in, const region_ref *srcs, int nsrcs) {
  const bool repeat = in.take(1) & 1;
  layout l;
  if (repeat) l = layout::repeat(std::uint32_t(in.take(1)), std::span<const repeat_entry>{});
  const int n = int(in.take(1) % 40); // may exceed the capacity: the builder must say so
  for (int i = 0; i < n; ++i) {
    const region_ref &s = srcs[in.take(1) % unsigned(nsrcs)];
    const std::uint64_t off = in.take(2);
    if (repeat) {
      const auto bc = std::uint32_t(in.take(2));
      const auto skip = std::uint32_t(in.take(1));
      l.add(repeat_entry{s, off, bc, skip});
    } else {
      l.add(layout_entry{s, off, in.take(2)});
    }
  }
  return l;
}

void check_expansion(const layout &l, std::span<const key_segment> segs, input &in) {
  std::uint64_t sum = 0;
  for (const auto &g : segs) {
    check(g.length > 0);
    sum += g.length;
  }
  check(sum == l.total_length());
  auto len_of = [&](std::size_t i) { return std::uint64_t(segs[i].length); };
  for (int k = 0; k < 8 && sum > 0; ++k) {
    const std::uint64_t x = in.take(3) % sum;
    std::uint64_t y = x;
    located got{};
    for (const auto &g : segs) {
      if (y < g.length) {
        got = {g.lkey, g.addr + y};
        break;
      }
      y -= g.length;
    }
    const located want = ref_locate(l, x);
    check(got.key == want.key && got.addr == want.addr);
  }
  if (sum == 0) return;
  const std::uint64_t off = in.take(3) % sum;
  const std::uint64_t len = 1 + in.take(3) % (sum - off);
  std::uint64_t done = 0;
  check(for_each_piece(segs.size(), len_of, off, len, [&](const window_piece &p) {
    check(p.done == done);
    check(p.length > 0 && p.segment_offset + p.length <= segs[p.segment].length);
    done += p.length;
  }));
  check(done == len);
}

void fuzz_layout(input &in) {
  const access_flags acc = (in.take(1) & 1) ? access_flags(access::local_write)
                                            : access::local_write | access::remote_read;
  layout_limits lim;
  lim.max_segments = 256;
  lim.interleave_16bit = in.take(1) & 1;
  const layout l = build(in, regs, 4);
  if (l.validate(lim, acc)) return;
  std::array<key_segment, 256> segs{};
  auto n = l.expand(segs);
  if (!n) return; // too many pieces before merging: a valid answer
  check_expansion(l, std::span<const key_segment>(segs.data(), n.value()), in);
  // nest it in a second layout
  region_ref nested;
  nested.indirect = true;
  nested.length = l.total_length();
  nested.access = acc;
  nested.segments = segs.data();
  nested.nsegments = std::uint32_t(n.value());
  const region_ref srcs[5] = {regs[0], regs[1], regs[2], regs[3], nested};
  const layout outer = build(in, srcs, 5);
  if (outer.validate(lim, acc)) return;
  std::array<key_segment, 256> out{};
  auto m = outer.expand(out);
  if (!m) return;
  check_expansion(outer, std::span<const key_segment>(out.data(), m.value()), in);
}

void fuzz_descriptor(const std::uint8_t *p, std::size_t n) {
  auto d = ikey_descriptor::decode(std::span<const std::byte>(reinterpret_cast<const std::byte *>(p), n));
  if (!d) return;
  std::array<std::byte, ikey_descriptor::max_encoded_size> re{};
  auto m = d.value().encode(re);
  check(m.has_value() && m.value() == n && std::memcmp(re.data(), p, n) == 0);
  const auto segs = d.value().segments();
  auto remade = ikey_descriptor::make(segs, d.value().rights());
  check(remade.has_value() && remade.value() == d.value());
  std::uint64_t covered = 0;
  const std::uint64_t total = d.value().length();
  check(for_each_piece(segs.size(), [&](std::size_t i) { return std::uint64_t(segs[i].length); }, 0,
                       total, [&](const window_piece &w) { covered += w.length; }));
  check(covered == total);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  if (size == 0) return 0;
  if ((data[0] & 1) == 0) {
    fuzz_descriptor(data + 1, size - 1);
  } else {
    input in{data + 1, size - 1};
    fuzz_layout(in);
  }
  return 0;
}
