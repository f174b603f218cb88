// libFuzzer target: the credentials mc-master parses before anything is authenticated (the
// x-mc-auth proof of a registration or admin call, v2 and v3 member proofs, and the x-mc-session
// credential), checked end to end by an RpcAuthenticator as the gRPC edge does, and the member
// credential file mc-client reads at start. The first byte picks the parser. Every input must
// get an answer (OK or a clear error), never a crash; nothing but a proof whose MAC verified may
// enter the replay cache.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/auth.h"
#include "common/logging.h"
#include "common/master_credentials.h"
#include "common/metrics.h"
#include "master/rpc_auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mc::master::RpcAuthenticator* auth = [] {
    mc::SetLogLevel("off");
    auto keys = mc::auth::ClusterKeys::FromSecrets({std::string(64, 'f')});
    if (!keys.ok()) abort();
    static mc::MetricsRegistry metrics;
    mc::master::RpcAuthOptions options;
    options.unix_now_ms = [] { return int64_t{1'700'000'000'000}; };
    return new mc::master::RpcAuthenticator(*keys, options, metrics);
  }();
  if (size == 0) return 0;
  const uint8_t op = data[0] % 4;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (op) {
    case 0:
      (void)mc::auth::ParseProof(in);
      break;
    case 1:
      (void)mc::auth::ParseSessionCredential(in);
      break;
    case 2: {
      auto keys = mc::auth::ParseMemberCredential(in);
      // A parsed credential must name who it is for.
      if (keys.ok() && ((*keys)->member() == std::nullopt || (*keys)->member()->client_id.empty()))
        abort();
      break;
    }
    case 3: {
      mc::master::AuthFailure reason = mc::master::AuthFailure::kCount;
      mc::master::Caller caller;
      const size_t before = auth->ReplayCacheSizeForTest();
      const absl::Status s = auth->CheckProof(in, mc::auth::ProofRole::kRegister, "c1",
                                              "10.0.0.1:7000", &reason, &caller);
      // Nobody can make a proof under the fuzzer's secret: every input is refused, with a reason,
      // and leaves the replay cache as it was.
      if (s.ok() || reason == mc::master::AuthFailure::kCount) abort();
      if (auth->ReplayCacheSizeForTest() != before) abort();
      break;
    }
  }
  return 0;
}
