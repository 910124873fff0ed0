// libFuzzer entry point for the memory-window descriptor decoder: bytes from an untrusted peer.
// Any input must be either rejected with an error code or decoded into a descriptor that encodes
// back to exactly the same bytes (the encoding is canonical).
#include <rdmaxx/remote_descriptor.hpp>

#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte *>(data), size);
  auto d = rdmaxx::remote_descriptor::decode(in);
  if (!d) return 0;
  const auto out = d.value().encode();
  if (out.size() != size || std::memcmp(out.data(), data, size) != 0) std::abort();
  auto again = rdmaxx::remote_descriptor::decode(out);
  if (!again || again.value().encode() != out) std::abort();
  return 0;
}
