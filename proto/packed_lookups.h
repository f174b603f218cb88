// Packed forms of lookups: the keys of a request back to back, and the answer by columns.
//
// Keys (`packed_keys` + `packed_key_sizes` in MatchPrefixRequest and GetReplicasRequest): one
// string holding every key and one packed field of lengths, instead of one string per key.
// RequestKeys() reads a request's keys whichever way it names them; AppendPackedKey() writes.
//
// The answer (master.proto PackedLookups): one row per answered key,
// the rows' replicas flattened in row order, each distinct owner (client id, data endpoint) once.
// A leased prefix match answers 1,000 keys; as columns that is a dozen packed fields to build and
// parse instead of 2,000 nested messages and 2,000 strings.
//
// PackedLookupsWriter appends rows (mc-master answering; mc-client converting an older master's
// per-key records). PackedLookupsReader checks that an answer's columns agree once, then unpacks
// any row into the KeyReplicas every reader of lookups takes. The answer comes from the network:
// columns that disagree are an error, never an out-of-bounds read. Neither class is thread-safe;
// a reader only reads its message, which must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/status.h"
#include "mcstore/v1/master.pb.h"

namespace mc {

// Views of the keys in `packed` cut at `sizes` (they point into `packed`); INVALID_ARGUMENT when
// the sizes do not add up to its length.
absl::StatusOr<std::vector<std::string_view>> PackedKeyViews(
    const std::string& packed, const google::protobuf::RepeatedField<uint32_t>& sizes);

// Appends `key` to a packed key list.
void AppendPackedKey(std::string_view key, std::string* packed,
                     google::protobuf::RepeatedField<uint32_t>* sizes);

// Names `keys` in `req` (a MatchPrefixRequest, GetReplicasRequest or ReleaseLeasesRequest) packed,
// or one by one when `packed` is false, clearing the other form.
template <typename Request>
void SetRequestKeys(const std::vector<std::string_view>& keys, bool packed, Request* req) {
  req->clear_keys();
  req->clear_packed_keys();
  req->clear_packed_key_sizes();
  if (!packed) {
    req->mutable_keys()->Reserve(static_cast<int>(keys.size()));
    for (std::string_view k : keys) req->add_keys(k.data(), k.size());
    return;
  }
  size_t total = 0;
  for (std::string_view k : keys) total += k.size();
  req->mutable_packed_keys()->reserve(total);
  req->mutable_packed_key_sizes()->Reserve(static_cast<int>(keys.size()));
  for (std::string_view k : keys) {
    AppendPackedKey(k, req->mutable_packed_keys(), req->mutable_packed_key_sizes());
  }
}

// Moves the keys `req` names one by one into packed_keys (a request already packed, or without
// keys, is left as is).
template <typename Request>
void PackRequestKeys(Request* req) {
  if (req->keys_size() == 0) return;
  std::string packed;
  google::protobuf::RepeatedField<uint32_t> sizes;
  sizes.Reserve(req->keys_size());
  for (const std::string& k : req->keys()) AppendPackedKey(k, &packed, &sizes);
  req->clear_keys();
  *req->mutable_packed_keys() = std::move(packed);
  req->mutable_packed_key_sizes()->Swap(&sizes);
}

// The keys a request names (views into it): `keys`, or `packed_keys` cut at `packed_key_sizes`.
// INVALID_ARGUMENT when it uses both, or when the sizes do not fit the packed keys.
template <typename Request>
absl::StatusOr<std::vector<std::string_view>> RequestKeys(const Request& req) {
  if (req.packed_key_sizes_size() == 0 && req.packed_keys().empty()) {
    return std::vector<std::string_view>(req.keys().begin(), req.keys().end());
  }
  if (req.keys_size() != 0) {
    return McError(Code::kInvalidArgument,
                   "keys and packed_keys both set: a request names its keys one way");
  }
  return PackedKeyViews(req.packed_keys(), req.packed_key_sizes());
}

// The reverse of PackRequestKeys: packed keys named one by one again (for a peer that does not
// read packed keys). INVALID_ARGUMENT, and `req` unchanged, when they are not well formed.
template <typename Request>
absl::Status NameRequestKeysOneByOne(Request* req) {
  if (req->packed_key_sizes_size() == 0 && req->packed_keys().empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<std::string_view>> keys = RequestKeys(*req);
  if (!keys.ok()) return keys.status();
  req->mutable_keys()->Reserve(static_cast<int>(keys->size()));
  for (std::string_view k : *keys) req->add_keys(k.data(), k.size());  // views stay valid
  req->clear_packed_keys();
  req->clear_packed_key_sizes();
  return absl::OkStatus();
}

// Bytes of one capability in PackedLookups.capabilities (common/capability.h kCapabilitySize).
inline constexpr size_t kPackedCapabilitySize = 64;

class PackedLookupsWriter {
 public:
  // Appends to `out` (borrowed, must outlive the writer); `rows` only reserves.
  explicit PackedLookupsWriter(mcstore::v1::PackedLookups* out, size_t rows = 0);

  // A new row; `message` is kept only when `code` is not OK.
  void AddRow(mcstore::v1::Code code, std::string_view message, uint64_t size, uint64_t checksum,
              uint64_t generation);
  // A replica of the row added last.
  void AddReplica(mcstore::v1::Tier tier, std::string_view client_id, std::string_view endpoint,
                  uint64_t segment_id, uint64_t offset, uint64_t length,
                  std::string_view capability = {});
  // The same with its owner's index (from Owner() or AddOwner()).
  void AddReplica(mcstore::v1::Tier tier, uint32_t owner, uint64_t segment_id, uint64_t offset,
                  uint64_t length, std::string_view capability = {});
  // A whole per-key record: AddRow and its AddReplicas.
  void AddRow(const mcstore::v1::KeyReplicas& record);
  // The index of owner (client_id, endpoint) in the answer, added if new.
  uint32_t Owner(std::string_view client_id, std::string_view endpoint);
  // The index of a new owner column for (client_id, endpoint), without looking for it among the
  // columns there: for a caller that keeps each owner's index itself (no hashing of the names).
  // A repeat is harmless (a second column with the same names), and Owner() does not see the
  // columns added this way (it may add them again).
  uint32_t AddOwner(std::string_view client_id, std::string_view endpoint);

 private:
  mcstore::v1::PackedLookups* out_;
  // Owners already in `out_` (the views point into its strings, which do not move).
  absl::flat_hash_map<std::pair<std::string_view, std::string_view>, uint32_t> owners_;
  uint32_t last_owner_ = UINT32_MAX;  // the owner Owner() answered last
};

class PackedLookupsReader {
 public:
  PackedLookupsReader() = default;
  // Checks the columns of `packed` (borrowed; must outlive the reader): INTERNAL, naming the
  // first disagreement, when they do not describe whole rows and replicas.
  static absl::StatusOr<PackedLookupsReader> Open(const mcstore::v1::PackedLookups& packed);

  size_t rows() const { return first_replica_.empty() ? 0 : first_replica_.size() - 1; }
  // The code of row `row` (< rows()).
  mcstore::v1::Code code(size_t row) const { return packed_->codes(static_cast<int>(row)); }
  // Row `row` (< rows()) as a per-key record.
  void Unpack(size_t row, mcstore::v1::KeyReplicas* out) const;

 private:
  const mcstore::v1::PackedLookups* packed_ = nullptr;
  std::vector<size_t> first_replica_;  // rows() + 1 entries: where each row's replicas begin
};

}  // namespace mc
