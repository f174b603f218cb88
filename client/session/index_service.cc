#include "client/session/index_service.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::client {

using transfer::IndexNoticeEntry;

IndexNotifier::IndexNotifier(std::string local_endpoint, ObjectIndex* local_index,
                             SegmentResolver resolve, transfer::TransferEngine& engine,
                             MetricsRegistry& metrics)
    : local_endpoint_(std::move(local_endpoint)),
      local_index_(local_index),
      resolve_(std::move(resolve)),
      engine_(engine),
      sent_(metrics.GetCounter("mc_client_index_notices_sent_total",
                               "index notices (INDEX frames) sent to replica owners")),
      failed_(metrics.GetCounter(
          "mc_client_index_notices_failed_total",
          "index notices (or own-index inserts) that failed: those objects would not survive "
          "a master restart")) {}

void IndexNotifier::Failed(size_t entries, std::string_view owner, std::string_view why) {
  failed_.Inc();
  MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
               "index notice of {} object(s) to {} failed ({}): their bytes are in place, but a "
               "master restart would forget them",
               entries, owner, why);
}

// One owner's entries and the positions in Notify's `replicas` they stand for.
struct IndexNotifier::OwnerEntries {
  std::vector<IndexNoticeEntry> entries;
  std::vector<size_t> positions;
};

// INDEX payloads, each with its owner and the positions in `replicas` it carries.
struct IndexNotifier::Notices {
  std::vector<std::string> payloads;
  std::vector<std::string_view> owners;
  std::vector<std::span<const size_t>> carried;
};

namespace {

IndexNoticeEntry EntryOf(const WrittenReplica& r) {
  IndexNoticeEntry e{.segment_id = r.segment_id,
                     .offset = r.offset,
                     .length = r.size,
                     .generation = r.generation,
                     .checksum = r.checksum,
                     .key = std::string(r.key)};
  if (r.capability.size() == e.capability.size()) {
    std::copy(r.capability.begin(), r.capability.end(), e.capability.begin());
  }
  return e;
}

// mc_client_index_entries_total{result}.
Counter& IndexEntriesCounter(MetricsRegistry& metrics, const char* result) {
  return metrics.GetCounter("mc_client_index_entries_total",
                            "index notice entries served, by result", {{"result", result}});
}

}  // namespace

IndexNotifier::Outcome IndexNotifier::RecordLocal(const WrittenReplica& r) {
  if (local_index_ == nullptr) return Outcome::kNoIndex;
  absl::Status s;
  std::optional<size_t> local = resolve_ ? resolve_(r.segment_id) : std::nullopt;
  if (!local.has_value()) {
    s = McError(Code::kNotFound, absl::StrCat("segment ", r.segment_id, " not published"));
  } else {
    s = local_index_->Insert(*local, r.offset,
                             {std::string(r.key), r.generation, r.size, r.checksum});
  }
  if (s.ok()) return Outcome::kRecorded;
  Failed(1, "this daemon", std::string(s.message()));
  return Outcome::kFailed;
}

IndexNotifier::Notices IndexNotifier::Encode(const std::map<std::string_view, OwnerEntries>& remote,
                                             std::vector<Outcome>& out) {
  // Payloads per owner, cut at the notice bounds.
  Notices notices;
  for (const auto& [endpoint, owned] : remote) {
    const auto& [entries, positions] = owned;
    size_t start = 0;
    while (start < entries.size()) {
      size_t bytes = 4, n = 0;
      while (start + n < entries.size() && n < transfer::kMaxIndexNoticeEntries &&
             bytes + transfer::IndexEntryBytes(entries[start + n]) <=
                 transfer::kMaxIndexNoticeBytes) {
        bytes += transfer::IndexEntryBytes(entries[start + n]);
        ++n;
      }
      n = std::max<size_t>(n, 1);  // an entry too large alone fails to encode below
      const std::span<const size_t> these(positions.data() + start, n);
      absl::StatusOr<std::string> payload =
          transfer::EncodeIndexNotice(std::span<const IndexNoticeEntry>(entries.data() + start, n));
      if (payload.ok()) {
        notices.payloads.push_back(*std::move(payload));
        notices.owners.push_back(endpoint);
        notices.carried.push_back(these);
      } else {
        for (size_t k : these) out[k] = Outcome::kFailed;
        Failed(n, endpoint, std::string(payload.status().message()));
      }
      start += n;
    }
  }
  return notices;
}

std::vector<IndexNotifier::Outcome> IndexNotifier::Notify(std::span<const WrittenReplica> replicas,
                                                          int64_t deadline_ms) {
  std::vector<Outcome> out(replicas.size(), Outcome::kRecorded);
  std::map<std::string_view, OwnerEntries> remote;
  for (size_t k = 0; k < replicas.size(); ++k) {
    const WrittenReplica& r = replicas[k];
    if (r.endpoint == local_endpoint_) {
      out[k] = RecordLocal(r);
      continue;
    }
    OwnerEntries& owned = remote[r.endpoint];
    owned.entries.push_back(EntryOf(r));
    owned.positions.push_back(k);
  }
  Notices notices = Encode(remote, out);
  if (notices.payloads.empty()) return out;
  std::vector<transfer::TransferRequest> requests;
  requests.reserve(notices.payloads.size());
  for (size_t k = 0; k < notices.payloads.size(); ++k) {
    requests.push_back(
        {transfer::Direction::kWrite,
         {transfer::LocalBuffer{notices.payloads[k].data(), notices.payloads[k].size()}},
         std::string(notices.owners[k]),
         transfer::IndexNotice{}});
  }
  std::vector<transfer::TransferResult> results = engine_.Submit(requests, deadline_ms);
  for (size_t k = 0; k < requests.size(); ++k) {
    sent_.Inc();
    if (results[k].status.ok()) continue;
    if (ToCode(results[k].status) == Code::kNotReady) {
      // The owner runs with --object_index=false: its objects are not restart-safe by the
      // operator's choice, which is not this put's failure.
      for (size_t i : notices.carried[k]) out[i] = Outcome::kNoIndex;
      continue;
    }
    for (size_t i : notices.carried[k]) out[i] = Outcome::kFailed;
    Failed(notices.carried[k].size(), notices.owners[k], std::string(results[k].status.message()));
  }
  return out;
}

IndexNoticeHandler::IndexNoticeHandler(ObjectIndex& index, SegmentResolver resolve,
                                       const auth::CapabilityVerifier* verifier,
                                       MetricsRegistry& metrics)
    : index_(index),
      resolve_(std::move(resolve)),
      verifier_(verifier),
      recorded_(IndexEntriesCounter(metrics, "recorded")),
      refused_(IndexEntriesCounter(metrics, "refused")),
      unknown_segment_(metrics.GetCounter(transfer::kUnknownSegmentMetric,
                                          transfer::kUnknownSegmentHelp, {{"op", "index"}})) {
  for (size_t r = 0; r < denials_.size(); ++r) {
    denials_[r] = &metrics.GetCounter(
        transfer::kCapabilityDeniedMetric, transfer::kCapabilityDeniedHelp,
        {{"reason", std::string(auth::DenialName(static_cast<auth::Denial>(r)))}});
  }
}

absl::Status IndexNoticeHandler::Serve(const transfer::DataRequest& request,
                                       transfer::RequestStream& stream) {
  if (request.length > transfer::kMaxIndexNoticeBytes) {
    // Not a notice any writer sends: the peer is not trusted further (closes the connection).
    refused_.Inc();
    return McError(Code::kInvalidArgument,
                   absl::StrCat("index notice of ", request.length, " bytes above the limit"));
  }
  std::string payload(request.length, '\0');
  MC_RETURN_IF_ERROR(stream.ReadExact(payload.data(), payload.size()));
  absl::StatusOr<std::vector<IndexNoticeEntry>> entries =
      transfer::DecodeIndexNotice(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  if (!entries.ok()) {
    refused_.Inc();
    MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn, "index notice refused: {}",
                 std::string(entries.status().message()));
    return stream.Respond(Code::kInvalidArgument);
  }
  const absl::Status s = Apply(*entries);
  return stream.Respond(s.ok() ? Code::kOk : ToCode(s));
}

absl::Status IndexNoticeHandler::ServeWithoutIndex(const transfer::DataRequest& request,
                                                   transfer::RequestStream& stream) {
  if (request.length > transfer::kMaxIndexNoticeBytes) {
    return McError(Code::kInvalidArgument, "index notice above the limit");
  }
  MC_RETURN_IF_ERROR(stream.Skip(request.length));
  return stream.Respond(Code::kNotReady);
}

absl::Status IndexNoticeHandler::Apply(std::span<const IndexNoticeEntry> entries) {
  absl::Status first;
  for (const IndexNoticeEntry& e : entries) {
    absl::Status s = ApplyOne(e);
    if (s.ok()) {
      recorded_.Inc();
      continue;
    }
    refused_.Inc();
    MC_LOG_EVERY(std::chrono::seconds(10), Logger("client"), warn,
                 "index entry for segment {} offset {} generation {} refused: {}", e.segment_id,
                 e.offset, e.generation, std::string(s.message()));
    if (first.ok()) first = s;
  }
  return first;
}

absl::Status IndexNoticeHandler::ApplyOne(const IndexNoticeEntry& e) {
  if (verifier_ != nullptr) {
    // Exactly as a WRITE frame of the whole replica would be checked, its generation, and the
    // key the master granted the write for (a member cannot file the bytes it wrote under its
    // own key as another key's).
    const auth::Denial denial = verifier_->CheckIndexEntry(e.capability.data(), e.segment_id,
                                                           e.offset, e.length, e.generation, e.key);
    if (denial != auth::Denial::kNone) {
      denials_[static_cast<size_t>(denial)]->Inc();
      return McError(Code::kPermissionDenied,
                     absl::StrCat("capability refused: ", std::string(auth::DenialName(denial))));
    }
  }
  std::optional<size_t> local = resolve_ ? resolve_(e.segment_id) : std::nullopt;
  if (!local.has_value()) {
    unknown_segment_.Inc();
    return McError(Code::kNotFound, absl::StrCat("segment ", e.segment_id, " not published"));
  }
  return index_.Insert(*local, e.offset, {e.key, e.generation, e.length, e.checksum});
}

}  // namespace mc::client
