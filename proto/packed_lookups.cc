#include "proto/packed_lookups.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace mc {

namespace v1 = mcstore::v1;

absl::StatusOr<std::vector<std::string_view>> PackedKeyViews(
    const std::string& packed, const google::protobuf::RepeatedField<uint32_t>& sizes) {
  std::vector<std::string_view> keys;
  keys.reserve(static_cast<size_t>(sizes.size()));
  size_t at = 0;
  for (uint32_t size : sizes) {
    if (size > packed.size() - at) {
      return McError(Code::kInvalidArgument,
                     absl::StrCat("packed_key_sizes name more than the ", packed.size(),
                                  " bytes of packed_keys (key ", keys.size(), ")"));
    }
    keys.emplace_back(packed.data() + at, size);
    at += size;
  }
  if (at != packed.size()) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("packed_key_sizes add up to ", at, " of the ", packed.size(),
                                " bytes of packed_keys"));
  }
  return keys;
}

void AppendPackedKey(std::string_view key, std::string* packed,
                     google::protobuf::RepeatedField<uint32_t>* sizes) {
  packed->append(key);
  sizes->Add(static_cast<uint32_t>(key.size()));
}

PackedLookupsWriter::PackedLookupsWriter(v1::PackedLookups* out, size_t rows) : out_(out) {
  const int n = static_cast<int>(rows);
  out_->mutable_codes()->Reserve(n);
  out_->mutable_sizes()->Reserve(n);
  out_->mutable_checksums()->Reserve(n);
  out_->mutable_generations()->Reserve(n);
  out_->mutable_replica_counts()->Reserve(n);
  out_->mutable_tiers()->Reserve(n);
  out_->mutable_owners()->Reserve(n);
  out_->mutable_segment_ids()->Reserve(n);
  out_->mutable_offsets()->Reserve(n);
  out_->mutable_lengths()->Reserve(n);
  for (int i = 0; i < out_->client_ids_size() && i < out_->data_endpoints_size(); ++i) {
    owners_.emplace(
        std::pair<std::string_view, std::string_view>(out_->client_ids(i), out_->data_endpoints(i)),
        static_cast<uint32_t>(i));
  }
}

void PackedLookupsWriter::AddRow(v1::Code code, std::string_view message, uint64_t size,
                                 uint64_t checksum, uint64_t generation) {
  if (code != v1::OK) {
    (*out_->mutable_messages())[static_cast<uint32_t>(out_->codes_size())] = std::string(message);
  }
  out_->add_codes(code);
  out_->add_sizes(size);
  out_->add_checksums(checksum);
  out_->add_generations(generation);
  out_->add_replica_counts(0);
}

void PackedLookupsWriter::AddReplica(v1::Tier tier, std::string_view client_id,
                                     std::string_view endpoint, uint64_t segment_id,
                                     uint64_t offset, uint64_t length,
                                     std::string_view capability) {
  AddReplica(tier, Owner(client_id, endpoint), segment_id, offset, length, capability);
}

void PackedLookupsWriter::AddReplica(v1::Tier tier, uint32_t owner, uint64_t segment_id,
                                     uint64_t offset, uint64_t length,
                                     std::string_view capability) {
  auto* counts = out_->mutable_replica_counts();
  counts->Set(counts->size() - 1, counts->Get(counts->size() - 1) + 1);
  out_->add_tiers(tier);
  out_->add_owners(owner);
  out_->add_segment_ids(segment_id);
  out_->add_offsets(offset);
  out_->add_lengths(length);
  // The capabilities column is empty until a replica has one, then has an entry per replica.
  std::string* caps = out_->mutable_capabilities();
  if (!capability.empty() && caps->empty()) {
    caps->reserve(kPackedCapabilitySize * static_cast<size_t>(out_->lengths_size()));
    caps->resize(kPackedCapabilitySize * static_cast<size_t>(out_->lengths_size() - 1), '\0');
  }
  if (!caps->empty() || !capability.empty()) {
    if (capability.size() == kPackedCapabilitySize) {
      caps->append(capability.data(), capability.size());
    } else {
      caps->append(kPackedCapabilitySize, '\0');  // none (or not ours to pass on)
    }
  }
}

void PackedLookupsWriter::AddRow(const v1::KeyReplicas& record) {
  AddRow(record.code(), record.message(), record.size(), record.checksum(), record.generation());
  for (const v1::Replica& r : record.replicas()) {
    AddReplica(r.tier(), r.client_id(), r.data_endpoint(), r.segment_id(), r.offset(), r.length(),
               r.capability());
  }
}

uint32_t PackedLookupsWriter::Owner(std::string_view client_id, std::string_view endpoint) {
  // Most replicas of a batch belong to the owner of the one before.
  if (last_owner_ < static_cast<uint32_t>(out_->client_ids_size()) &&
      out_->client_ids(static_cast<int>(last_owner_)) == client_id &&
      out_->data_endpoints(static_cast<int>(last_owner_)) == endpoint) {
    return last_owner_;
  }
  auto it = owners_.find(std::pair(client_id, endpoint));
  if (it != owners_.end()) return last_owner_ = it->second;
  const auto index = last_owner_ = AddOwner(client_id, endpoint);
  owners_.emplace(
      std::pair<std::string_view, std::string_view>(out_->client_ids(static_cast<int>(index)),
                                                    out_->data_endpoints(static_cast<int>(index))),
      index);
  return index;
}

uint32_t PackedLookupsWriter::AddOwner(std::string_view client_id, std::string_view endpoint) {
  const auto index = static_cast<uint32_t>(out_->client_ids_size());
  out_->add_client_ids()->assign(client_id);
  out_->add_data_endpoints()->assign(endpoint);
  return index;
}

absl::StatusOr<PackedLookupsReader> PackedLookupsReader::Open(const v1::PackedLookups& packed) {
  auto bad = [](const std::string& what) {
    return McError(Code::kInternal, absl::StrCat("malformed packed lookups: ", what));
  };
  const int rows = packed.codes_size();
  if (packed.sizes_size() != rows || packed.checksums_size() != rows ||
      packed.generations_size() != rows || packed.replica_counts_size() != rows) {
    return bad(absl::StrCat(rows, " codes but ", packed.sizes_size(), " sizes, ",
                            packed.checksums_size(), " checksums, ", packed.generations_size(),
                            " generations, ", packed.replica_counts_size(), " replica counts"));
  }
  PackedLookupsReader reader;
  reader.packed_ = &packed;
  reader.first_replica_.reserve(static_cast<size_t>(rows) + 1);
  size_t replicas = 0;
  reader.first_replica_.push_back(0);
  for (uint32_t count : packed.replica_counts()) {
    replicas += count;  // at most 2^32 rows of 2^32 each: no overflow in size_t
    reader.first_replica_.push_back(replicas);
  }
  const auto n = static_cast<size_t>(packed.tiers_size());
  if (replicas != n || static_cast<size_t>(packed.owners_size()) != n ||
      static_cast<size_t>(packed.segment_ids_size()) != n ||
      static_cast<size_t>(packed.offsets_size()) != n ||
      static_cast<size_t>(packed.lengths_size()) != n) {
    return bad(absl::StrCat("rows count ", replicas, " replicas but columns hold ", n, " tiers, ",
                            packed.owners_size(), " owners, ", packed.segment_ids_size(),
                            " segment ids, ", packed.offsets_size(), " offsets, ",
                            packed.lengths_size(), " lengths"));
  }
  if (packed.client_ids_size() != packed.data_endpoints_size()) {
    return bad(absl::StrCat(packed.client_ids_size(), " client ids but ",
                            packed.data_endpoints_size(), " data endpoints"));
  }
  if (!packed.capabilities().empty() && packed.capabilities().size() != n * kPackedCapabilitySize) {
    return bad(
        absl::StrCat(n, " replicas but ", packed.capabilities().size(), " bytes of capabilities"));
  }
  for (uint32_t owner : packed.owners()) {
    if (owner >= static_cast<uint32_t>(packed.client_ids_size())) {
      return bad(absl::StrCat("owner ", owner, " of ", packed.client_ids_size(), " clients"));
    }
  }
  for (const auto& [row, message] : packed.messages()) {
    if (row >= static_cast<uint32_t>(rows)) {
      return bad(absl::StrCat("message for row ", row, " of ", rows));
    }
  }
  return reader;
}

void PackedLookupsReader::Unpack(size_t row, v1::KeyReplicas* out) const {
  const v1::PackedLookups& p = *packed_;
  const int r = static_cast<int>(row);
  out->set_code(p.codes(r));
  if (p.codes(r) != v1::OK) {
    auto it = p.messages().find(static_cast<uint32_t>(row));
    if (it != p.messages().end()) out->set_message(it->second);
  }
  out->set_size(p.sizes(r));
  out->set_checksum(p.checksums(r));
  out->set_generation(p.generations(r));
  out->mutable_replicas()->Reserve(static_cast<int>(first_replica_[row + 1] - first_replica_[row]));
  for (size_t i = first_replica_[row]; i < first_replica_[row + 1]; ++i) {
    const int j = static_cast<int>(i);
    v1::Replica* replica = out->add_replicas();
    replica->set_tier(p.tiers(j));
    const int owner = static_cast<int>(p.owners(j));
    replica->set_client_id(p.client_ids(owner));
    replica->set_data_endpoint(p.data_endpoints(owner));
    replica->set_segment_id(p.segment_ids(j));
    replica->set_offset(p.offsets(j));
    if (!p.capabilities().empty()) {
      const std::string_view cap = std::string_view(p.capabilities())
                                       .substr(i * kPackedCapabilitySize, kPackedCapabilitySize);
      if (cap.find_first_not_of('\0') != std::string_view::npos) {
        replica->set_capability(cap.data(), cap.size());
      }
    }
    replica->set_length(p.lengths(j));
  }
}

}  // namespace mc
