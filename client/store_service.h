// StoreGrpcService: the application-facing Store service (proto/mcstore/v1/store.proto) as thin
// handlers: resolve inline bytes and registered slices into memory, call BatchPutter /
// BatchGetter / the master, answer one result per item in order, count everything.
// Thread-safe.
#pragma once

#include <string>

#include "client/batch_get.h"
#include "client/batch_put.h"
#include "client/buffer_registry.h"
#include "client/client_metrics.h"
#include "client/master_client.h"
#include "client/prefix_leases.h"
#include "mcstore/v1/store.grpc.pb.h"

namespace mc::client {

struct StoreServiceOptions {
  std::string client_id;
  uint64_t max_inline_bytes = 64ull << 20;  // per inline payload, put or get
  uint32_t default_replicas = 1;
  size_t max_batch_items = 65536;
  uint32_t max_prefix_lease_ttl_ms = 600'000;
};

class StoreGrpcService final : public mcstore::v1::Store::Service {
 public:
  StoreGrpcService(StoreServiceOptions options, BufferRegistry& buffers, BatchPutter& putter,
                   BatchGetter& getter, MasterClient& master, PrefixLeases& prefix_leases,
                   const Clock& clock, ClientMetrics& metrics);

  grpc::Status RegisterBuffer(grpc::ServerContext*, const mcstore::v1::RegisterBufferRequest*,
                              mcstore::v1::RegisterBufferResponse*) override;
  grpc::Status UnregisterBuffer(grpc::ServerContext*, const mcstore::v1::UnregisterBufferRequest*,
                                mcstore::v1::UnregisterBufferResponse*) override;
  grpc::Status BatchPut(grpc::ServerContext*, const mcstore::v1::BatchPutRequest*,
                        mcstore::v1::BatchPutResponse*) override;
  grpc::Status BatchGet(grpc::ServerContext*, const mcstore::v1::BatchGetRequest*,
                        mcstore::v1::BatchGetResponse*) override;
  grpc::Status BatchExist(grpc::ServerContext*, const mcstore::v1::BatchExistRequest*,
                          mcstore::v1::BatchExistResponse*) override;
  grpc::Status MatchPrefix(grpc::ServerContext*, const mcstore::v1::MatchPrefixRequest*,
                           mcstore::v1::MatchPrefixResponse*) override;
  grpc::Status ReleaseLease(grpc::ServerContext*, const mcstore::v1::ReleaseLeaseRequest*,
                            mcstore::v1::ReleaseLeaseResponse*) override;
  grpc::Status BatchRemove(grpc::ServerContext*, const mcstore::v1::BatchRemoveRequest*,
                           mcstore::v1::BatchRemoveResponse*) override;

 private:
  class Scope;
  // Resolves slices into memory (holding the buffers in `refs`); an error names the bad slice.
  absl::Status ResolveSlices(const google::protobuf::RepeatedPtrField<mcstore::v1::Slice>& slices,
                             std::vector<LocalBuffer>* out, std::vector<BufferRef>* refs) const;

  const StoreServiceOptions options_;
  BufferRegistry& buffers_;
  BatchPutter& putter_;
  BatchGetter& getter_;
  MasterClient& master_;
  PrefixLeases& prefix_leases_;
  const Clock& clock_;
  ClientMetrics& metrics_;
};

}  // namespace mc::client
