#include "client/store/store_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/access/grpc_caller.h"
#include "client/session/packed_keys_gate.h"
#include "common/auth.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/rpc_scope.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "proto/packed_lookups.h"
#include "proto/status_convert.h"

namespace mc::client {

namespace sv1 = mcstore::v1;

namespace {

// Inline get results are written straight into the response's `data` fields.
class ResponseSink final : public InlineSink {
 public:
  ResponseSink(sv1::BatchGetResponse* resp, uint64_t max_bytes)
      : resp_(resp), max_bytes_(max_bytes) {}
  char* Allocate(size_t item, uint64_t size) override {
    if (size > max_bytes_ || total_ + size > max_bytes_) return nullptr;
    total_ += size;
    std::string* data = resp_->mutable_results(static_cast<int>(item))->mutable_data();
    data->resize(size);
    return data->data();
  }

 private:
  sv1::BatchGetResponse* resp_;
  const uint64_t max_bytes_;
  uint64_t total_ = 0;
};

}  // namespace

StoreGrpcService::StoreGrpcService(StoreServiceOptions options, BufferRegistry& buffers,
                                   BatchPutter& putter, BatchGetter& getter, MasterClient& master,
                                   PrefixLeases& prefix_leases, const Clock& clock,
                                   ClientMetrics& metrics)
    : options_(std::move(options)),
      buffers_(buffers),
      putter_(putter),
      getter_(getter),
      master_(master),
      prefix_leases_(prefix_leases),
      clock_(clock),
      metrics_(metrics),
      limits_(options_.limits, &metrics.registry()) {}

absl::StatusOr<StoreGrpcService::Caller> StoreGrpcService::Admit(CallerId who) {
  Caller caller;
  if (who.context != nullptr) {
    MC_ASSIGN_OR_RETURN(caller.owner, AdmitCaller(*who.context, auth_, sessions_));
  } else if (who.fast != nullptr) {
    // The fast channel is a Unix socket (its file's mode and group let the caller in, as the
    // gRPC Unix socket's do): the owner is derived exactly as for a gRPC call over that socket.
    MC_ASSIGN_OR_RETURN(caller.owner, StoreAuth::OwnerOf("unix:", who.fast->token, sessions_));
  }
  caller.account = sessions_ != nullptr ? sessions_->AccountOf(caller.owner) : caller.owner;
  MC_ASSIGN_OR_RETURN(caller.admission, limits_.Enter(caller.owner, caller.account));
  return caller;
}

namespace {

// Whether an item may name a GPU buffer: on a daemon serving GPU buffers (docs/gpu.md).
absl::Status CheckGpuServed(bool served) {
  if (served) return absl::OkStatus();
  return McError(Code::kInvalidArgument,
                 "this mc-client serves no GPU buffers (no --cuda_device, or its device could "
                 "not be opened: see its log)");
}

}  // namespace

absl::Status StoreGrpcService::ResolveSlice(uint64_t buffer_id, uint64_t offset, uint64_t length,
                                            std::string_view owner, ResolvedBuffers& seen,
                                            std::vector<LocalBuffer>* out,
                                            std::vector<BufferRef>* refs, GpuSlices* gpu,
                                            bool is_get) const {
  if (IsGpuBufferId(buffer_id)) {
    const bool served = gpu_buffers_ != nullptr && (is_get || gpu_stager_ != nullptr);
    MC_RETURN_IF_ERROR(CheckGpuServed(served));
    GpuBufferRef ref;
    MC_ASSIGN_OR_RETURN(const uint64_t addr,
                        gpu_buffers_->Resolve(buffer_id, offset, length, &ref, owner));
    gpu->Add(out->size(), std::move(ref));
    out->push_back({reinterpret_cast<char*>(addr), length});
    return absl::OkStatus();
  }
  gpu->Add(out->size(), nullptr);
  auto it = seen.find(buffer_id);
  if (it == seen.end()) {
    MC_ASSIGN_OR_RETURN(ResolvedBuffer b, buffers_.ResolveBuffer(buffer_id, owner));
    it = seen.emplace(buffer_id, SeenBuffer{.buffer = std::move(b)}).first;
  }
  SeenBuffer& b = it->second;
  MC_ASSIGN_OR_RETURN(char* mem, b.buffer.Slice(offset, length));
  out->push_back({mem, length});
  // One reference per distinct buffer of the item (a vLLM block names one buffer ~9 times).
  if (b.held_by != refs) {
    refs->push_back(b.buffer.ref);
    b.held_by = refs;
  }
  return absl::OkStatus();
}

absl::Status StoreGrpcService::ResolveSlices(
    const google::protobuf::RepeatedPtrField<sv1::Slice>& slices, std::string_view owner,
    ResolvedBuffers& seen, std::vector<LocalBuffer>* out, std::vector<BufferRef>* refs,
    GpuSlices* gpu, bool is_get) const {
  CheckedSum total;
  out->reserve(slices.size());
  for (const sv1::Slice& slice : slices) {
    if (!total.Add(slice.length()).ok()) {
      return McError(Code::kInvalidArgument, "the slices' lengths overflow 64 bits");
    }
    MC_RETURN_IF_ERROR(ResolveSlice(slice.buffer_id(), slice.offset(), slice.length(), owner, seen,
                                    out, refs, gpu, is_get));
  }
  return absl::OkStatus();
}

absl::Status StoreGrpcService::ResolveBlock(
    const google::protobuf::RepeatedPtrField<sv1::StridedSlice>& layout, uint64_t block,
    std::string_view owner, ResolvedBuffers& seen, std::vector<LocalBuffer>* out,
    std::vector<BufferRef>* refs, GpuSlices* gpu, bool is_get) const {
  if (layout.empty()) {
    return McError(Code::kInvalidArgument, absl::StrCat("the item names block ", block,
                                                        " but the request has no block_layout"));
  }
  CheckedSum total;
  out->reserve(layout.size());
  for (const sv1::StridedSlice& run : layout) {
    if (!total.Add(run.length()).ok()) {
      return McError(Code::kInvalidArgument, "the layout's run lengths overflow 64 bits");
    }
    uint64_t shift = 0;
    uint64_t offset = 0;
    if (__builtin_mul_overflow(block, run.stride(), &shift) ||
        __builtin_add_overflow(run.offset(), shift, &offset)) {
      return McError(Code::kInvalidArgument,
                     absl::StrCat("block ", block, " of the layout (offset ", run.offset(),
                                  ", stride ", run.stride(), ") overflows 64 bits"));
    }
    MC_RETURN_IF_ERROR(
        ResolveSlice(run.buffer_id(), offset, run.length(), owner, seen, out, refs, gpu, is_get));
  }
  return absl::OkStatus();
}

template <typename Item>
absl::Status StoreGrpcService::CheckSliceCount(
    const google::protobuf::RepeatedPtrField<Item>& items, int layout_runs, Caller& caller) const {
  uint64_t explicit_slices = 0;
  uint64_t block_items = 0;
  for (const Item& in : items) {
    explicit_slices += static_cast<uint64_t>(in.slices_size());
    block_items += in.has_block() ? 1 : 0;
  }
  // Each factor is below 2^31 (a repeated field's size): the product fits in 64 bits.
  const uint64_t total = explicit_slices + static_cast<uint64_t>(layout_runs) * block_items;
  if (total > options_.max_request_slices) {
    return McError(
        Code::kInvalidArgument,
        absl::StrCat("the request names ", total, " slices (", block_items, " block items x ",
                     layout_runs, " layout runs + ", explicit_slices,
                     " explicit), over --store_max_request_slices=", options_.max_request_slices));
  }
  return caller.admission.ReserveSlices(total + static_cast<uint64_t>(items.size()));
}

#define MC_ADMIT(caller, context)                 \
  absl::StatusOr<Caller> caller = Admit(context); \
  if (!caller.ok()) return ToGrpcStatus(caller.status())

grpc::Status StoreGrpcService::RegisterBuffer(grpc::ServerContext* context,
                                              const sv1::RegisterBufferRequest* req,
                                              sv1::RegisterBufferResponse* resp) {
  RpcScope scope(metrics_.For("RegisterBuffer"));
  MC_ADMIT(caller, CallerId{.context = context});
  absl::StatusOr<uint64_t> id;
  if (!req->handle().empty()) {
    if (!req->shm_name().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "give handle or shm_name, not both");
    }
    id = buffers_.Claim(req->handle());
  } else if (!options_.allow_named_buffers) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        "registering a buffer by shm name is off (--store_allow_named_buffers=false): pass its "
        "file descriptor over the fd socket and register the handle it answers");
  } else {
    id = buffers_.Register(req->shm_name(), req->size(), caller->owner, caller->account);
  }
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_buffer_id(*id);
  return grpc::Status::OK;
}

grpc::Status StoreGrpcService::UnregisterBuffer(grpc::ServerContext* context,
                                                const sv1::UnregisterBufferRequest* req,
                                                sv1::UnregisterBufferResponse*) {
  RpcScope scope(metrics_.For("UnregisterBuffer"));
  MC_ADMIT(caller, CallerId{.context = context});
  return ToGrpcStatus(buffers_.Unregister(req->buffer_id(), caller->owner));
}

grpc::Status StoreGrpcService::ServeBatchPut(CallerId who, const sv1::BatchPutRequest* req,
                                             sv1::BatchPutResponse* resp) {
  RpcScope scope(metrics_.For("BatchPut"));
  MC_ADMIT(caller, who);
  if (static_cast<size_t>(req->items_size()) > options_.max_batch_items) {
    return ToGrpcStatus(TooManyItems(req->items_size(), options_.max_batch_items));
  }
  if (absl::Status s = CheckSliceCount(req->items(), req->block_layout_size(), *caller); !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::vector<PutRequestItem> items(req->items_size());
  ResolvedBuffers seen;
  for (int i = 0; i < req->items_size(); ++i) {
    const sv1::PutItem& in = req->items(i);
    PutRequestItem& item = items[i];
    item.key = in.key();
    if (in.has_block()) {
      item.input_error =
          !in.data().empty() || in.slices_size() > 0
              ? McError(Code::kInvalidArgument, "give a block, data or slices, not two")
              : ResolveBlock(req->block_layout(), in.block().index(), caller->owner, seen,
                             &item.pieces, &item.buffers, &item.gpu, /*is_get=*/false);
    } else if (!in.data().empty() && in.slices_size() > 0) {
      item.input_error = McError(Code::kInvalidArgument, "give data or slices, not both");
    } else if (in.data().size() > options_.max_inline_bytes) {
      item.input_error =
          McError(Code::kInvalidArgument, absl::StrCat("inline payload of ", in.data().size(),
                                                       " bytes exceeds --max_inline_bytes=",
                                                       options_.max_inline_bytes, "; use slices"));
    } else if (in.slices_size() > 0) {
      item.input_error =
          ResolveSlices(in.slices(), caller->owner, seen, &item.pieces, &item.buffers, &item.gpu,
                        /*is_get=*/false);
    } else if (!in.data().empty()) {
      // The putter only reads from the pieces.
      item.pieces.push_back({const_cast<char*>(in.data().data()), in.data().size()});
    }
  }
  // GPU sources are copied into host memory and proved equal there first (held until the put
  // ends); an item whose staging failed fails alone.
  const GpuPutStager::Staged staged =
      gpu_stager_ != nullptr ? gpu_stager_->Stage(items) : GpuPutStager::Staged();
  uint32_t replicas = req->replicas() == 0 ? options_.default_replicas : req->replicas();
  for (const absl::Status& s : putter_.Put(items, replicas)) {
    SetResult(s, resp->add_results());
    scope.metrics().CountItem(ToCode(s));
  }
  return grpc::Status::OK;
}

grpc::Status StoreGrpcService::ServeBatchGet(CallerId who, const sv1::BatchGetRequest* req,
                                             sv1::BatchGetResponse* resp) {
  RpcScope scope(metrics_.For("BatchGet"));
  MC_ADMIT(caller, who);
  if (static_cast<size_t>(req->items_size()) > options_.max_batch_items) {
    return ToGrpcStatus(TooManyItems(req->items_size(), options_.max_batch_items));
  }
  if (absl::Status s = CheckSliceCount(req->items(), req->block_layout_size(), *caller); !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::vector<GetRequestItem> items(req->items_size());
  ResolvedBuffers seen;
  resp->mutable_results()->Reserve(req->items_size());
  for (int i = 0; i < req->items_size(); ++i) {
    const sv1::GetItem& in = req->items(i);
    items[i].key = in.key();
    items[i].inline_data = in.slices_size() == 0 && !in.has_block();
    if (in.has_block()) {
      items[i].input_error =
          in.slices_size() > 0
              ? McError(Code::kInvalidArgument, "give a block or slices, not both")
              : ResolveBlock(req->block_layout(), in.block().index(), caller->owner, seen,
                             &items[i].slices, &items[i].buffers, &items[i].gpu, /*is_get=*/true);
    } else if (!items[i].inline_data) {
      items[i].input_error = ResolveSlices(in.slices(), caller->owner, seen, &items[i].slices,
                                           &items[i].buffers, &items[i].gpu, /*is_get=*/true);
    }
    resp->add_results();
  }
  ResponseSink sink(resp, options_.max_inline_bytes);
  // Another caller's lease is no lease (its keys are looked up afresh), unless the request
  // presents the lease's capability: another process of the engine that took it.
  uint64_t lease_id = req->lease_id();
  if (lease_id != 0 && !prefix_leases_.Authorizes(lease_id, caller->owner, req->lease_token())) {
    lease_id = 0;
  }
  std::vector<GetItemResult> results = getter_.Get(items, lease_id, &sink);
  for (size_t i = 0; i < results.size(); ++i) {
    sv1::GetResult* r = resp->mutable_results(static_cast<int>(i));
    GetItemResult& g = results[i];
    if (g.status.ok()) {
      // A destination buffer truncated while the bytes landed holds nothing the caller sees.
      g.status = CheckBuffersIntact(items[i].buffers);
      if (!g.status.ok()) g.bytes_written = 0;
    }
    r->set_code(ToProtoCode(ToCode(g.status)));
    if (!g.status.ok()) r->set_message(std::string(g.status.message()));
    r->set_size(g.size);
    r->set_bytes_written(g.bytes_written);
    if (!g.status.ok()) r->clear_data();  // never hand out bytes that were not verified
    scope.metrics().CountItem(ToCode(g.status));
  }
  return grpc::Status::OK;
}

grpc::Status StoreGrpcService::ServeBatchExist(CallerId who, const sv1::BatchExistRequest* req,
                                               sv1::BatchExistResponse* resp) {
  RpcScope scope(metrics_.For("BatchExist"));
  MC_ADMIT(caller, who);
  if (static_cast<size_t>(req->keys_size()) > options_.max_batch_items) {
    return ToGrpcStatus(TooManyItems(req->keys_size(), options_.max_batch_items));
  }
  v1::ExistRequest mreq;
  *mreq.mutable_keys() = req->keys();
  v1::ExistResponse mresp;
  absl::Status s = master_.Exist(mreq, &mresp);
  if (!s.ok()) return ToGrpcStatus(s);
  *resp->mutable_exists() = mresp.exists();
  return grpc::Status::OK;
}

namespace {

// Names `keys` (those of `req`) in `mreq`: packed, or one by one. Keys the application sent
// packed are passed on as they came.
void SetLookupKeys(const sv1::MatchPrefixRequest& req, const std::vector<std::string_view>& keys,
                   bool packed, v1::GetReplicasRequest* mreq) {
  if (packed && req.keys_size() == 0) {
    mreq->clear_keys();
    *mreq->mutable_packed_keys() = req.packed_keys();
    *mreq->mutable_packed_key_sizes() = req.packed_key_sizes();
    return;
  }
  SetRequestKeys(keys, packed, mreq);
}

// The rows of a leased prefix answer (columns, or the records of a master older than `packed`,
// converted onto `arena`), checked: whole columns, and `matched` leading rows all OK.
absl::StatusOr<PackedLookupsReader> MatchedRows(const v1::GetReplicasResponse& resp,
                                                google::protobuf::Arena* arena) {
  const v1::PackedLookups* rows = &resp.packed();
  if (!resp.has_packed()) {
    auto* converted = google::protobuf::Arena::CreateMessage<v1::PackedLookups>(arena);
    PackedLookupsWriter writer(converted, static_cast<size_t>(resp.results_size()));
    for (const v1::KeyReplicas& record : resp.results()) writer.AddRow(record);
    rows = converted;
  }
  MC_ASSIGN_OR_RETURN(PackedLookupsReader reader, PackedLookupsReader::Open(*rows));
  bool found = resp.matched() <= reader.rows();
  for (uint32_t i = 0; found && i < resp.matched(); ++i) found = reader.code(i) == v1::OK;
  if (!found) {
    return McError(Code::kInternal,
                   absl::StrCat("master answered an inconsistent prefix: ", resp.matched(),
                                " matched, but ", reader.rows(), " rows of which not all found"));
  }
  return reader;
}

}  // namespace

absl::Status StoreGrpcService::LookUpPrefix(const sv1::MatchPrefixRequest& req,
                                            const std::vector<std::string_view>& keys,
                                            v1::GetReplicasRequest* mreq,
                                            v1::GetReplicasResponse* mresp, int64_t* sent_ms,
                                            int64_t* wall_ms) {
  PackedKeysGate& gate = getter_.packed_keys();  // shared with the daemon's gets
  bool packed = options_.pack_master_keys && !gate.Resting();
  for (int attempt = 0;; ++attempt) {
    SetLookupKeys(req, keys, packed, mreq);
    *sent_ms = clock_.NowMs();
    *wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    MC_RETURN_IF_ERROR(master_.GetReplicas(*mreq, mresp));
    // Only a master older than packed_keys sees none of them (and so leased nothing): asked
    // again key by key. Any other count is not that master's, and ServeMatchPrefix refuses it.
    if (!packed || attempt > 0 ||
        PackedKeysGate::Classify(mresp->keys_seen(), keys.size()) != PackedKeysGate::Seen::kNone) {
      return absl::OkStatus();
    }
    gate.OlderMaster(mresp->keys_seen(), keys.size(), "MatchPrefix");
    packed = false;
    mresp->Clear();
  }
}

grpc::Status StoreGrpcService::ServeMatchPrefix(CallerId who, const sv1::MatchPrefixRequest* req,
                                                sv1::MatchPrefixResponse* resp) {
  RpcScope scope(metrics_.For("MatchPrefix"));
  MC_ADMIT(caller, who);
  absl::StatusOr<std::vector<std::string_view>> asked = RequestKeys(*req);
  if (!asked.ok()) return ToGrpcStatus(asked.status());
  if (asked->size() > options_.max_batch_items) {
    return ToGrpcStatus(TooManyItems(asked->size(), options_.max_batch_items));
  }
  resp->set_keys_seen(static_cast<uint32_t>(asked->size()));
  uint32_t ttl = std::min(req->lease_ttl_ms(), options_.max_prefix_lease_ttl_ms);
  if (ttl != 0 && options_.max_leases_per_caller != 0 &&
      prefix_leases_.CountOwned(caller->owner) >= options_.max_leases_per_caller) {
    prefix_leases_.PruneExpired();
    if (prefix_leases_.CountOwned(caller->owner) >= options_.max_leases_per_caller) {
      CountLimitRefusal(&metrics_.registry(), "leases");
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("this caller already holds ", options_.max_leases_per_caller,
                                       " prefix leases, the limit "
                                       "(--store_max_leases_per_caller); release some"));
    }
  }
  // The request and the answer live on the lease's arena: a leased match keeps them as its
  // pinned lookups, without copying a key or a replica record.
  PrefixLease lease;
  auto& mreq = *google::protobuf::Arena::CreateMessage<v1::GetReplicasRequest>(lease.arena.get());
  mreq.set_client_id(options_.client_id);
  mreq.set_stop_at_first_miss(true);
  mreq.set_no_lease(ttl == 0);
  mreq.set_count_only(ttl == 0);  // a plain match needs the count alone
  mreq.set_packed(ttl != 0);      // a leased one keeps the replicas, as columns
  mreq.set_lease_ttl_ms(ttl);
  auto& mresp = *google::protobuf::Arena::CreateMessage<v1::GetReplicasResponse>(lease.arena.get());
  int64_t sent_ms = 0;
  int64_t wall_ms = 0;
  absl::Status s = LookUpPrefix(*req, *asked, &mreq, &mresp, &sent_ms, &wall_ms);
  if (!s.ok()) return ToGrpcStatus(s);
  const uint32_t matched = mresp.matched();
  // An answer that contradicts itself is refused. The master leased what it found: give those
  // leases back rather than let them pin the keys for the whole TTL (it ignores keys it did not
  // lease under this id).
  auto refuse = [&](grpc::Status refused) {
    return RefusePrefixAnswer(std::move(refused), *asked, matched,
                              ttl == 0 ? std::nullopt : std::optional<uint64_t>(mresp.lease_id()));
  };
  if (matched > asked->size()) {
    return refuse(grpc::Status(grpc::StatusCode::INTERNAL,
                               "master answered an inconsistent prefix: more matched than asked"));
  }
  // Keys sent packed that the master saw only in part: it may have leased what it saw, and the
  // lookup is not asked again (that would leave those leases to their TTL); it is refused.
  if (mreq.packed_key_sizes_size() != 0 &&
      PackedKeysGate::Classify(mresp.keys_seen(), asked->size()) != PackedKeysGate::Seen::kAll) {
    return refuse(grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat("master saw ", mresp.keys_seen(), " of ", asked->size(), " packed keys")));
  }
  resp->set_matched(matched);
  if (ttl == 0 || matched == 0) return grpc::Status::OK;
  absl::StatusOr<PackedLookupsReader> reader = MatchedRows(mresp, lease.arena.get());
  if (!reader.ok()) return refuse(ToGrpcStatus(reader.status()));
  lease.lookups = *std::move(reader);
  lease.master_lease_id = mresp.lease_id();
  lease.deadline_ms = sent_ms + static_cast<int64_t>(mresp.lease_ttl_ms());
  lease.owner = caller->owner;
  lease.token = auth::RandomBytes(PrefixLeases::kTokenBytes);
  resp->set_lease_token(lease.token);
  // The keys as sent (views into mreq, on the lease's arena): the match is their first `matched`.
  absl::StatusOr<std::vector<std::string_view>> sent = RequestKeys(mreq);
  MC_CHECK(sent.ok() && sent->size() >= matched);  // built above, checked against `asked`
  sent->resize(matched);
  lease.IndexRows(*sent);
  // Read before Add: from then on a ReleaseLease may free the lease (and mresp with it).
  resp->set_lease_expiry_ms(static_cast<uint64_t>(wall_ms) + mresp.lease_ttl_ms());
  prefix_leases_.PruneExpired();
  resp->set_lease_id(prefix_leases_.Add(std::move(lease)));
  return grpc::Status::OK;
}

grpc::Status StoreGrpcService::RefusePrefixAnswer(grpc::Status refused,
                                                  const std::vector<std::string_view>& asked,
                                                  uint32_t matched,
                                                  std::optional<uint64_t> master_lease_id) {
  MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), err,
               "MatchPrefix refused the master's answer ({} keys, {} matched): {}", asked.size(),
               matched, refused.error_message());
  if (!master_lease_id.has_value()) return refused;
  v1::ReleaseLeasesRequest release;
  release.set_lease_id(*master_lease_id);
  for (std::string_view k : asked) release.add_keys(k.data(), k.size());
  master_.ReleaseLeasesAsync(std::move(release), [](const absl::Status& released) {
    if (released.ok()) return;
    MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                 "releasing the leases of a refused prefix answer failed: {}", released.ToString());
  });
  return refused;
}

grpc::Status StoreGrpcService::ServeReleaseLease(CallerId who, const sv1::ReleaseLeaseRequest* req,
                                                 sv1::ReleaseLeaseResponse*) {
  RpcScope scope(metrics_.For("ReleaseLease"));
  MC_ADMIT(caller, who);
  std::optional<PrefixLease> lease =
      prefix_leases_.Take(req->lease_id(), caller->owner, req->lease_token());
  if (!lease) {
    metrics_.lease_release_refusals.Inc();
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("lease ", req->lease_id(),
                     " is unknown, expired, or another caller's (present its lease_token)"));
  }
  (lease->owner == caller->owner ? metrics_.lease_releases_by_owner
                                 : metrics_.lease_releases_by_token)
      .Inc();
  // In the master's grant order: it matches that against its grant records without finding
  // the objects; in the key map's order every key was a table find. Packed: one string, not
  // one allocation per key here and at the master (the master client names them one by one
  // for a master that does not read packed keys).
  v1::ReleaseLeasesRequest mreq;
  mreq.set_lease_id(lease->master_lease_id);
  SetRequestKeys(lease->KeysInMatchOrder(), /*packed=*/true, &mreq);
  return ToGrpcStatus(master_.ReleaseLeases(mreq));
}

grpc::Status StoreGrpcService::ServeBatchRemove(CallerId who, const sv1::BatchRemoveRequest* req,
                                                sv1::BatchRemoveResponse* resp) {
  RpcScope scope(metrics_.For("BatchRemove"));
  MC_ADMIT(caller, who);
  if (static_cast<size_t>(req->keys_size()) > options_.max_batch_items) {
    return ToGrpcStatus(TooManyItems(req->keys_size(), options_.max_batch_items));
  }
  v1::RemoveRequest mreq;
  *mreq.mutable_keys() = req->keys();
  v1::RemoveResponse mresp;
  absl::Status s = master_.Remove(mreq, &mresp);
  if (!s.ok()) return ToGrpcStatus(s);
  *resp->mutable_results() = mresp.results();
  for (const auto& r : resp->results()) scope.metrics().CountItem(ToCode(FromResult(r)));
  return grpc::Status::OK;
}

// The gRPC methods and the fast channel's calls share each handler body (Serve*).
#define MC_FORWARD(Rpc)                                                                          \
  grpc::Status StoreGrpcService::Rpc(grpc::ServerContext* context, const sv1::Rpc##Request* req, \
                                     sv1::Rpc##Response* resp) {                                 \
    return Serve##Rpc(CallerId{.context = context}, req, resp);                                  \
  }                                                                                              \
  grpc::Status StoreGrpcService::Rpc(const FastCaller& caller, const sv1::Rpc##Request* req,     \
                                     sv1::Rpc##Response* resp) {                                 \
    return Serve##Rpc(CallerId{.fast = &caller}, req, resp);                                     \
  }
MC_FORWARD(BatchPut)
MC_FORWARD(BatchGet)
MC_FORWARD(BatchExist)
MC_FORWARD(MatchPrefix)
MC_FORWARD(ReleaseLease)
MC_FORWARD(BatchRemove)
#undef MC_FORWARD

}  // namespace mc::client
