// libFuzzer entry point for the window-descriptor decoder and the request-grant decoders
// (grant_list, grant_offer): bytes from an untrusted peer. Any input must be either rejected with
// an error code or decoded into a value that encodes back to exactly the same bytes (the
// encodings are canonical; a grant offer is read from the front of padded private data).
#include <rdmaxx/grant_list.hpp>
#include <rdmaxx/grant_pool.hpp>
#include <rdmaxx/remote_descriptor.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte *>(data), size);
  if (auto d = rdmaxx::remote_descriptor::decode(in)) {
    const auto out = d.value().encode();
    if (out.size() != size || std::memcmp(out.data(), data, size) != 0) std::abort();
    auto again = rdmaxx::remote_descriptor::decode(out);
    if (!again || again.value().encode() != out) std::abort();
  }
  if (auto l = rdmaxx::grant_list::decode(in)) {
    std::vector<std::byte> out(rdmaxx::grant_list::encoded_size(l.value().size()));
    auto n = l.value().encode_to(out);
    if (!n || n.value() != size || std::memcmp(out.data(), data, size) != 0) std::abort();
    auto again = rdmaxx::grant_list::decode(out);
    if (!again || !(again.value() == l.value())) std::abort();
  }
  if (auto o = rdmaxx::grant_offer::decode(in)) {
    const auto out = o.value().encode();
    if (size < out.size() || std::memcmp(out.data(), data, out.size()) != 0) std::abort();
  }
  return 0;
}
