// libFuzzer target: the master's request validation, fed from the proto types. The first byte
// picks an RPC, the rest is parsed as its request and served by an in-process master (the gRPC
// service layer and MetadataService, as mc-master runs them). Requests are untrusted: every one
// must get an answer, never a crash, and the master's accounting must stay consistent.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/logging.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_master_client.h"

namespace {

namespace v1 = mcstore::v1;

template <typename Req>
bool Parse(const uint8_t* data, size_t size, Req* req) {
  return req->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mc::FakeClock* clock = new mc::FakeClock();
  static mc::client::FakeMasterClient* master = [] {
    mc::SetLogLevel("off");
    auto* m = new mc::client::FakeMasterClient(*clock);
    v1::RegisterClientRequest req;  // one known client with memory, for puts to land on
    req.set_client_id("fuzz-holder");
    req.set_host("h");
    req.set_data_endpoint("127.0.0.1:1");
    req.set_disk_capacity(1 << 30);
    auto* s = req.add_segments();
    s->set_size(1 << 20);
    v1::RegisterClientResponse resp;
    if (!m->RegisterClient(req, &resp).ok()) abort();
    return m;
  }();
  if (size == 0) return 0;
  const uint8_t op = data[0] % 10;
  ++data;
  --size;
  clock->AdvanceMs(1);
  switch (op) {
    case 0: {
      v1::RegisterClientRequest req;
      if (!Parse(data, size, &req)) return 0;
      if (req.client_id() == "fuzz-holder") return 0;
      v1::RegisterClientResponse resp;
      (void)master->RegisterClient(req, &resp);
      break;
    }
    case 1: {
      v1::PutStartRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::PutStartResponse resp;
      (void)master->PutStart(req, &resp);
      break;
    }
    case 2: {
      v1::PutEndRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::PutEndResponse resp;
      (void)master->PutEnd(req, &resp);
      break;
    }
    case 3: {
      v1::PutRevokeRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::PutRevokeResponse resp;
      (void)master->PutRevoke(req, &resp);
      break;
    }
    case 4: {
      v1::GetReplicasRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::GetReplicasResponse resp;
      (void)master->GetReplicas(req, &resp);
      break;
    }
    case 5: {
      v1::RemoveRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::RemoveResponse resp;
      (void)master->Remove(req, &resp);
      break;
    }
    case 6: {
      v1::AddDiskReplicasRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::AddDiskReplicasResponse resp;
      (void)master->AddDiskReplicas(req, &resp);
      break;
    }
    case 7: {
      v1::ExistRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::ExistResponse resp;
      (void)master->Exist(req, &resp);
      break;
    }
    case 8: {
      v1::ReleaseLeasesRequest req;
      if (!Parse(data, size, &req)) return 0;
      (void)master->ReleaseLeases(req);
      break;
    }
    default: {
      v1::PromoteStartRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::PromoteStartResponse resp;
      (void)master->PromoteStart(req, &resp);
      break;
    }
  }
  const auto snap = master->service().Snapshot();
  if (snap.mem_used > snap.mem_capacity) abort();  // accounting never wraps
  return 0;
}
