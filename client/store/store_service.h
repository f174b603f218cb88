// StoreGrpcService: the application-facing Store service (proto/mcstore/v1/store.proto) as thin
// handlers: resolve inline bytes and registered slices into memory, call BatchPutter /
// BatchGetter / the master, answer one result per item in order, count everything.
//
// Every handler first admits the caller (Admit): the transport check of StoreAuth (a token over
// TCP), then its owner key and its in-flight slot (CallerLimits). Buffers and prefix leases are
// the owner's: another caller's buffer id resolves as unknown, another caller's lease as none.
// A null ServerContext (in-process calls, unit tests) is the trusted owner "". The fast channel
// (client/fast/fast_channel.h) calls the same handlers through FastStoreCalls, its caller
// admitted as a gRPC call over the Unix socket with the same x-mc-owner would be.
// GPU memory (docs/gpu.md): BatchGet and BatchPut slices may name registered GPU buffers of the
// caller (any number per item, beside host slices); a get lands there through the cuda
// transport (BatchGetter, staged through pinned host memory when needed), a put source is
// staged into host memory and proved equal there first (GpuPutStager).
// Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "client/access/caller_limits.h"
#include "client/access/store_auth.h"
#include "client/batch/batch_get.h"
#include "client/batch/batch_put.h"
#include "client/batch/gpu_put_stager.h"
#include "client/batch/prefix_leases.h"
#include "client/buffers/buffer_registry.h"
#include "client/client_metrics.h"
#include "client/fast/fast_store_calls.h"
#include "client/gpu/gpu_buffers.h"
#include "client/session/master_client.h"
#include "mcstore/v1/store.grpc.pb.h"

namespace mc::client {

struct StoreServiceOptions {
  std::string client_id;
  uint64_t max_inline_bytes = 64ull << 20;  // per inline payload, put or get
  uint32_t default_replicas = 1;
  size_t max_batch_items = 65536;
  // Most slices one BatchPut/BatchGet may name, explicit plus block-layout runs x block items
  // (--store_max_request_slices): a layout of R runs makes each block item R slices, so this,
  // not the message size, bounds what one small request costs to resolve.
  uint64_t max_request_slices = 4ull << 20;
  uint32_t max_prefix_lease_ttl_ms = 600'000;  // --store_max_lease_ttl_ms
  // RegisterBuffer by shm_name opens the object with the daemon's rights: off unless
  // --store_allow_named_buffers (see docs/security.md).
  bool allow_named_buffers = false;
  uint32_t max_leases_per_caller = 4096;  // --store_max_leases_per_caller; 0 = unlimited
  // Requests and expanded slices in flight per caller, per uid and daemon-wide.
  CallerLimitsOptions limits = {};
  // MatchPrefix sends its keys to the master packed (GetReplicasRequest.packed_keys). A master
  // older than that answers keys_seen 0; the lookup is then sent again key by key, and packing
  // rests (BatchGetter::packed_keys(), shared with the daemon's gets; BatchGetOptions has the
  // rest's length).
  bool pack_master_keys = true;
};

class StoreGrpcService final : public mcstore::v1::Store::Service, public FastStoreCalls {
 public:
  StoreGrpcService(StoreServiceOptions options, BufferRegistry& buffers, BatchPutter& putter,
                   BatchGetter& getter, MasterClient& master, PrefixLeases& prefix_leases,
                   const Clock& clock, ClientMetrics& metrics);

  // Access control: `auth` checks the transport (null: every call passes), `sessions` says
  // which owner tokens are live (null: every caller is anonymous). Borrowed; call before
  // serving.
  void SetAccess(const StoreAuth* auth, const CallerSessions* sessions) {
    auth_ = auth;
    sessions_ = sessions;
  }
  // The GPU buffers BatchGet slices may name (borrowed; null, the default: none, and a GPU
  // buffer id is refused), and the stager that lets BatchPut take them as sources (borrowed;
  // null: GPU put sources are refused). Call before serving.
  void SetGpuBuffers(const GpuBufferRegistry* gpu_buffers, GpuPutStager* stager = nullptr) {
    gpu_buffers_ = gpu_buffers;
    gpu_stager_ = stager;
  }

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

  // The same calls for a caller of the fast channel (client/fast/fast_channel.h): the same
  // admission and bodies, counted in the same per-RPC metrics.
  grpc::Status BatchPut(const FastCaller&, const mcstore::v1::BatchPutRequest*,
                        mcstore::v1::BatchPutResponse*) override;
  grpc::Status BatchGet(const FastCaller&, const mcstore::v1::BatchGetRequest*,
                        mcstore::v1::BatchGetResponse*) override;
  grpc::Status BatchExist(const FastCaller&, const mcstore::v1::BatchExistRequest*,
                          mcstore::v1::BatchExistResponse*) override;
  grpc::Status MatchPrefix(const FastCaller&, const mcstore::v1::MatchPrefixRequest*,
                           mcstore::v1::MatchPrefixResponse*) override;
  grpc::Status ReleaseLease(const FastCaller&, const mcstore::v1::ReleaseLeaseRequest*,
                            mcstore::v1::ReleaseLeaseResponse*) override;
  grpc::Status BatchRemove(const FastCaller&, const mcstore::v1::BatchRemoveRequest*,
                           mcstore::v1::BatchRemoveResponse*) override;

 private:
  struct Caller {
    std::string owner;
    std::string account;  // the owner's uid account (CallerSessions::AccountOf)
    CallerLimits::Admission admission;
  };
  // Who calls: a gRPC call's context, or a fast-channel caller (neither: the trusted owner "").
  struct CallerId {
    grpc::ServerContext* context = nullptr;
    const FastCaller* fast = nullptr;
  };
  // Authenticates the call and takes an in-flight slot of its owner and account.
  absl::StatusOr<Caller> Admit(CallerId who);
  // The bodies of the calls both transports serve.
  grpc::Status ServeBatchPut(CallerId who, const mcstore::v1::BatchPutRequest* req,
                             mcstore::v1::BatchPutResponse* resp);
  grpc::Status ServeBatchGet(CallerId who, const mcstore::v1::BatchGetRequest* req,
                             mcstore::v1::BatchGetResponse* resp);
  grpc::Status ServeBatchExist(CallerId who, const mcstore::v1::BatchExistRequest* req,
                               mcstore::v1::BatchExistResponse* resp);
  grpc::Status ServeMatchPrefix(CallerId who, const mcstore::v1::MatchPrefixRequest* req,
                                mcstore::v1::MatchPrefixResponse* resp);
  grpc::Status ServeReleaseLease(CallerId who, const mcstore::v1::ReleaseLeaseRequest* req,
                                 mcstore::v1::ReleaseLeaseResponse* resp);
  grpc::Status ServeBatchRemove(CallerId who, const mcstore::v1::BatchRemoveRequest* req,
                                mcstore::v1::BatchRemoveResponse* resp);
  // MatchPrefix's lookup at the master (`mreq` prepared but for its keys, which are `keys`, those
  // of `req`): keys packed unless packing rests (getter_.packed_keys()); a master that saw none
  // of the packed keys gets them again one by one. `sent_ms` (steady) and
  // `wall_ms` (Unix): when the lookup that answered was sent.
  absl::Status LookUpPrefix(const mcstore::v1::MatchPrefixRequest& req,
                            const std::vector<std::string_view>& keys,
                            mcstore::v1::GetReplicasRequest* mreq,
                            mcstore::v1::GetReplicasResponse* mresp, int64_t* sent_ms,
                            int64_t* wall_ms);
  // MatchPrefix's answer when the master's contradicts itself: logs it and returns `refused`;
  // with the master's lease id of a leased match (none for a plain one), first gives back the
  // leases the master took for `asked` (asynchronously; they would otherwise pin the keys for
  // the whole TTL).
  grpc::Status RefusePrefixAnswer(grpc::Status refused, const std::vector<std::string_view>& asked,
                                  uint32_t matched, std::optional<uint64_t> master_lease_id);
  // The buffers one request's slices named so far, each looked up and fstat()ed once per
  // request; `held_by`: the item's refs that last took a reference to it.
  struct SeenBuffer {
    ResolvedBuffer buffer;
    const std::vector<BufferRef>* held_by = nullptr;
  };
  using ResolvedBuffers = absl::flat_hash_map<uint64_t, SeenBuffer>;
  // Resolves slices into memory (holding each distinct buffer once in `refs`). A GPU buffer id
  // (IsGpuBufferId) resolves through the GpuBufferRegistry into a device address, recorded and
  // held in `*gpu`; a put source (`is_get` false) needs the GPU put stager.
  absl::Status ResolveSlices(const google::protobuf::RepeatedPtrField<mcstore::v1::Slice>& slices,
                             std::string_view owner, ResolvedBuffers& seen,
                             std::vector<LocalBuffer>* out, std::vector<BufferRef>* refs,
                             GpuSlices* gpu, bool is_get) const;
  // Block `block` of a request's block layout: its runs at offset + block * stride, resolved
  // exactly like the explicit slices they stand for (an offset that overflows is refused).
  absl::Status ResolveBlock(
      const google::protobuf::RepeatedPtrField<mcstore::v1::StridedSlice>& layout, uint64_t block,
      std::string_view owner, ResolvedBuffers& seen, std::vector<LocalBuffer>* out,
      std::vector<BufferRef>* refs, GpuSlices* gpu, bool is_get) const;
  // One slice of an item, appended to `out` (and recorded in `*gpu`).
  absl::Status ResolveSlice(uint64_t buffer_id, uint64_t offset, uint64_t length,
                            std::string_view owner, ResolvedBuffers& seen,
                            std::vector<LocalBuffer>* out, std::vector<BufferRef>* refs,
                            GpuSlices* gpu, bool is_get) const;
  // A request's slices once expanded (its items' own plus layout_runs per block item), against
  // max_request_slices; then reserved (with one per item) in the caller's in-flight slice
  // budgets until the request ends. Item: PutItem or GetItem.
  template <typename Item>
  absl::Status CheckSliceCount(const google::protobuf::RepeatedPtrField<Item>& items,
                               int layout_runs, Caller& caller) const;

  const StoreServiceOptions options_;
  BufferRegistry& buffers_;
  BatchPutter& putter_;
  BatchGetter& getter_;
  MasterClient& master_;
  PrefixLeases& prefix_leases_;
  const Clock& clock_;
  ClientMetrics& metrics_;
  CallerLimits limits_;
  const StoreAuth* auth_ = nullptr;
  const CallerSessions* sessions_ = nullptr;
  const GpuBufferRegistry* gpu_buffers_ = nullptr;
  GpuPutStager* gpu_stager_ = nullptr;
};

}  // namespace mc::client
