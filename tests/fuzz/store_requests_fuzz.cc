// libFuzzer target: the Store service's request validation, fed from the proto types. The first
// byte picks an RPC, the rest is parsed as its request and served by an in-process mc-client
// Store service (StoreGrpcService over BatchPutter/BatchGetter, the local transfer transport and
// the in-process master), with one registered 64 KiB memfd buffer (id 1) that slices and block
// layouts may name.
// Requests are untrusted: every one must get an answer, never a crash; a get that answers OK must
// carry exactly the bytes put under its key (each key's value is derived from the key).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "client/batch/batch_get.h"
#include "client/batch/batch_put.h"
#include "client/batch/prefix_leases.h"
#include "client/buffers/buffer_registry.h"
#include "client/client_metrics.h"
#include "client/store/store_service.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_master_client.h"
#include "transfer/transfer_engine.h"

namespace {

namespace v1 = mcstore::v1;
using mc::client::BatchGetOptions;
using mc::client::BatchPutOptions;

constexpr char kId[] = "fuzz-local";
constexpr char kEndpoint[] = "127.0.0.1:1";
constexpr uint64_t kBufferSize = 64 << 10;

struct Node {
  mc::FakeClock clock{mc::RealClock::Get().NowMs()};
  mc::client::FakeMasterClient master{clock};
  mc::transfer::SegmentTable table;
  std::unique_ptr<mc::transfer::TransferEngine> engine;
  mc::MetricsRegistry registry;
  mc::client::ClientMetrics metrics{registry};
  mc::client::PrefixLeases leases{clock};
  std::unique_ptr<mc::client::BatchPutter> putter;
  std::unique_ptr<mc::client::BatchGetter> getter;
  mc::client::BufferRegistry buffers{16};
  std::unique_ptr<mc::client::StoreGrpcService> service;
  std::string segment = std::string(4 << 20, '\0');
  std::set<std::string> slice_keys;  // keys ever put from a buffer slice

  Node() {
    mc::transfer::TransferEngineOptions eo;
    eo.local_endpoint = kEndpoint;
    eo.local.copy_threads = 1;
    eo.tcp.connections_per_peer = 1;
    engine = std::make_unique<mc::transfer::TransferEngine>(eo, table);
    putter = std::make_unique<mc::client::BatchPutter>(
        BatchPutOptions{.client_id = kId, .max_replicas = 8, .no_space_wait_ms = 0}, master,
        *engine, clock, metrics);
    getter = std::make_unique<mc::client::BatchGetter>(BatchGetOptions{kId, kEndpoint, 0, 8},
                                                       master, *engine, leases, clock, metrics);
    service = std::make_unique<mc::client::StoreGrpcService>(
        mc::client::StoreServiceOptions{.client_id = kId,
                                        .max_inline_bytes = 1 << 20,
                                        .max_batch_items = 256,
                                        .max_request_slices = 4096},
        buffers, *putter, *getter, master, leases, clock, metrics);
    v1::RegisterClientRequest req;
    req.set_client_id(kId);
    req.set_host("h");
    req.set_data_endpoint(kEndpoint);
    auto* s = req.add_segments();
    s->set_size(segment.size());
    v1::RegisterClientResponse resp;
    if (!master.RegisterClient(req, &resp).ok() || resp.segment_ids_size() != 1) abort();
    table.Add(resp.segment_ids(0), segment.data(), segment.size());
    // Buffer id 1: a memfd, as an application passes over the fd channel.
    int fd = memfd_create("fuzz-buffer", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, kBufferSize) != 0) abort();
    auto ref = mc::client::BufferRegistry::MapFd(fd, kBufferSize, "fuzz");
    if (!ref.ok()) abort();
    auto handle = buffers.Stage(*std::move(ref), "");
    if (!handle.ok() || !buffers.Claim(*handle).ok()) abort();
  }
};

template <typename Req>
bool Parse(const uint8_t* data, size_t size, Req* req) {
  return req->ParseFromArray(data, static_cast<int>(size));
}

// Puts carry inline data derived from their key, so that any OK get can be checked.
std::string ValueFor(const std::string& key) {
  std::string v = "v:" + key;
  v.resize(64 + mc::Checksum(key) % 512, '#');
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Node* node = [] {
    mc::SetLogLevel("off");
    return new Node();
  }();
  if (size == 0) return 0;
  const uint8_t op = data[0] % 7;
  ++data;
  --size;
  node->clock.AdvanceMs(1);
  auto& svc = *node->service;
  switch (op) {
    case 0: {
      v1::BatchPutRequest req;
      if (!Parse(data, size, &req)) return 0;
      for (auto& item : *req.mutable_items()) {
        if (item.slices_size() == 0 && !item.has_block()) {
          item.set_data(ValueFor(item.key()));
        } else {
          node->slice_keys.insert(item.key());  // holds whatever the buffer held
        }
      }
      v1::BatchPutResponse resp;
      (void)svc.BatchPut(nullptr, &req, &resp);
      break;
    }
    case 1: {
      v1::BatchGetRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::BatchGetResponse resp;
      if (!svc.BatchGet(nullptr, &req, &resp).ok()) break;
      if (resp.results_size() != req.items_size()) abort();  // one answer per item
      for (int i = 0; i < resp.results_size(); ++i) {
        const auto& r = resp.results(i);
        const auto& item = req.items(i);
        // An inline OK answer of a key only ever put inline carries exactly its value.
        if (r.code() == v1::OK && item.slices_size() == 0 && !item.has_block() &&
            !node->slice_keys.contains(item.key()) && r.data() != ValueFor(item.key())) {
          abort();
        }
      }
      break;
    }
    case 2: {
      v1::BatchExistRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::BatchExistResponse resp;
      (void)svc.BatchExist(nullptr, &req, &resp);
      break;
    }
    case 3: {
      v1::MatchPrefixRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::MatchPrefixResponse resp;
      (void)svc.MatchPrefix(nullptr, &req, &resp);
      break;
    }
    case 4: {
      v1::ReleaseLeaseRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::ReleaseLeaseResponse resp;
      (void)svc.ReleaseLease(nullptr, &req, &resp);
      break;
    }
    case 5: {
      v1::BatchRemoveRequest req;
      if (!Parse(data, size, &req)) return 0;
      v1::BatchRemoveResponse resp;
      (void)svc.BatchRemove(nullptr, &req, &resp);
      break;
    }
    case 6: {
      v1::RegisterBufferRequest req;  // named buffers are off: refused, never opened
      if (!Parse(data, size, &req)) return 0;
      v1::RegisterBufferResponse resp;
      (void)svc.RegisterBuffer(nullptr, &req, &resp);
      break;
    }
  }
  return 0;
}
