// libFuzzer entry point for the endpoint decoder: bytes from an untrusted peer. Any input must be
// either rejected with an error code or decoded into an endpoint that encodes back to exactly the
// same bytes (the encoding is canonical).
#include <rdmaxx/queue_pair.hpp>

#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte *>(data), size);
  auto e = rdmaxx::endpoint::decode(in);
  if (!e) return 0;
  const auto out = e.value().encode();
  if (out.size() != size || std::memcmp(out.data(), data, size) != 0) std::abort();
  auto again = rdmaxx::endpoint::decode(out);
  if (!again || !(again.value() == e.value())) std::abort();
  return 0;
}
