// test/consumers/consumer_cm.cpp: the rdma_cm program every consumer project builds next to
// consumer.cpp (run.sh copies it as cm.cpp), through the separate rdmaxx-cm dependency
// (Meson dependency('rdmaxx-cm'), pkg-config rdmaxx-cm, CMake rdmaxx::cm). It needs no device:
// it parses addresses and checks the cm error category; run.sh also checks that this program
// links librdmacm and that the plain consumer does not.
#include <rdmaxx/connection.hpp>

#include <cstdio>

int main() {
  using namespace rdmaxx;
  int failures = 0;
  auto a = address::parse("192.0.2.1:7471");
  failures += !(a && a.value().port() == 7471);
  failures += !(address::parse("nope").error() == errc::bad_address);
  const auto ec = cm_error(RDMA_CM_EVENT_REJECTED, 28);
  failures += !(ec == std::errc::connection_refused && cm_reject_reason(ec) == 28);
  failures += ec.message().find("RDMA_CM_EVENT_REJECTED") == std::string::npos;
  // Without rdma_ucm (a host without RDMA) this fails cleanly; with it, it succeeds.
  auto ch = EventChannel::create();
  std::printf("rdmaxx-cm consumer (%s): event channel %s; %s\n", RDMAXX_CONSUMER_KIND,
              ch ? "created" : ch.error().message().c_str(), failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
