// examples/readme_snippets: runs README's snippets (examples/snippets/*.cpp) on rxe and checks
// what they did; the GrantPool one needs a server and is only compiled.
//
//   tools/rxe-vm build/examples/readme-snippets     (the peer connects to 192.0.2.1, rxe0's
//                                                    address in tools/rxe-vm)
#include <rdmaxx/connection.hpp>
#include <rdmaxx/rdmaxx.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

// The snippets (examples/snippets/*.cpp).
rdmaxx::result<void> loopback_write() noexcept;
rdmaxx::result<void> owner(std::span<unsigned char> mem) noexcept;
rdmaxx::result<void> peer(std::span<unsigned char> src) noexcept;
rdmaxx::result<void> grant_then_revoke(rdmaxx::MemoryRegion &mr,
                                       rdmaxx::result<void> (*send_to_peer)(std::uint64_t, std::uint32_t)) noexcept;
rdmaxx::result<void> window_grant(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp, rdmaxx::CompletionQueue &cq,
                                  rdmaxx::MemoryRegion &mr,
                                  std::array<std::byte, rdmaxx::remote_descriptor::encoded_size> &wire) noexcept;
rdmaxx::result<void> strict_grant(rdmaxx::ProtectionDomain &peer_pd, rdmaxx::QueuePair &qp,
                                  rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &mr) noexcept;
rdmaxx::result<rdmaxx::IndirectKey> indirect_key(rdmaxx::ProtectionDomain &pd, rdmaxx::QueuePair &qp,
                                                 rdmaxx::CompletionQueue &cq, rdmaxx::MemoryRegion &m1,
                                                 rdmaxx::MemoryRegion &m2, rdmaxx::MemoryRegion &m3,
                                                 std::span<std::byte, rdmaxx::ikey_descriptor::max_encoded_size> wire,
                                                 std::size_t &wire_len) noexcept;

namespace {
using namespace rdmaxx;

int failures = 0;
void report(const char *what, const std::error_code &ec) {
  std::printf("%s: %s\n", what, ec ? ec.message().c_str() : "ok");
  if (ec) ++failures;
}
void report(const char *what, bool ok, const char *saw) {
  std::printf("%s: %s (%s)\n", what, ok ? "ok" : "FAIL", saw);
  if (!ok) ++failures;
}

std::uint32_t sent_rkey = 0;
result<void> record(std::uint64_t, std::uint32_t rkey) noexcept {
  sent_rkey = rkey;
  return success();
}

// The snippets that take a PD, a QP and a CQ get them here, over two loopback-connected QPs.
result<void> local_snippets() noexcept {
  RDMAXX_TRY(ctx, Context::open_first());
  RDMAXX_TRY(pd, ProtectionDomain::alloc(ctx));
  RDMAXX_TRY(cq, CompletionQueue::create(ctx, 64));
  RDMAXX_TRY(a, QueuePair::create(pd, cq, cq));
  RDMAXX_TRY(b, create_indirect_key_qp(pd, cq, cq));
  RDMAXX_TRYV(connect_loopback(a, b));
  static unsigned char mem[16384];
  RDMAXX_TRY(mr, MemoryRegion::reg(pd, mem, sizeof mem, access::local_write | access::mw_bind));

  static unsigned char rmem[4096];
  RDMAXX_TRY(rr, MemoryRegion::reg(pd, rmem, sizeof rmem, access::local_write));
  auto r1 = grant_then_revoke(rr, &record);
  report("rereg.cpp", r1 ? std::error_code{} : r1.error());
  report("rereg.cpp: an rkey was handed out, and remote write is gone after", sent_rkey != 0 &&
         !rr.access().any(access::remote_write), "the rkey sent and the MR's access afterwards");

  std::array<std::byte, remote_descriptor::encoded_size> wire{};
  auto r2 = window_grant(pd, a, cq, mr, wire);
  report("memory_window.cpp", r2 ? std::error_code{} : r2.error());
  auto d = remote_descriptor::decode(wire);
  report("memory_window.cpp: descriptor of 256 bytes at offset 1024",
         d && d.value().length == 256 && d.value().addr == mr.iova() + 1024 &&
             d.value().rights.any(access::remote_write),
         d ? "decoded" : d.error().message().c_str());

  auto r3 = strict_grant(pd, a, cq, mr);
  report("strict_grant.cpp", r3 ? std::error_code{} : r3.error());

  std::memset(mem, '.', sizeof mem);
  RDMAXX_TRY(m1, MemoryRegion::reg(pd, mem, 100, access::local_write | access::remote_write | access::mw_bind));
  RDMAXX_TRY(m2, MemoryRegion::reg(pd, mem + 200, 64, access::local_write | access::remote_write | access::mw_bind));
  RDMAXX_TRY(m3, MemoryRegion::reg(pd, mem + 400, 200, access::local_write | access::remote_write | access::mw_bind));
  std::array<std::byte, ikey_descriptor::max_encoded_size> kw{};
  std::size_t kw_len = 0;
  auto r4 = indirect_key(pd, b, cq, m1, m2, m3, kw, kw_len);
  report("indirect_key.cpp", r4 ? std::error_code{} : r4.error());
  if (r4) {
    auto kd = ikey_descriptor::decode(std::span<const std::byte>(kw.data(), kw_len));
    report("indirect_key.cpp: descriptor of 20 bytes in 3 segments",
           kd && kd.value().length() == 20 && kd.value().segments().size() == 3,
           kd ? "decoded" : kd.error().message().c_str());
  }
  return success();
}
} // namespace

int main() {
  // The peer in a child forked before any verbs or rdma_cm call; it retries until the owner
  // listens (reject reason 8: nobody listens yet).
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) return 1;
  if (child == 0) {
    std::vector<unsigned char> src(256, 0xAB);
    for (int attempt = 0;; ++attempt) {
      auto r = peer(src);
      if (r || cm_reject_reason(r.error()) != 8 || attempt == 100) {
        std::printf("connect_peer.cpp: %s\n", r ? "ok" : r.error().message().c_str());
        std::fflush(stdout);
        ::_exit(r ? 0 : 1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  std::vector<unsigned char> mem(4096, '.');
  auto o = owner(mem);
  report("connect_owner.cpp", o ? std::error_code{} : o.error());
  bool landed = true;
  for (std::size_t i = 0; i < mem.size(); ++i)
    landed = landed && mem[i] == (i >= 1024 && i < 1280 ? 0xAB : '.');
  report("connect_owner.cpp: the peer's 256 bytes landed exactly at [1024, 1280)", landed, "owner memory checked");
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;

  report("loopback_write.cpp", [] { auto r = loopback_write(); return r ? std::error_code{} : r.error(); }());
  if (auto r = local_snippets(); !r) report("setup", r.error());
  std::printf("readme-snippets: %s\n", failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
