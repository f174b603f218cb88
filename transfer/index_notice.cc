#include "transfer/index_notice.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_order.h"
#include "common/status.h"

namespace mc::transfer {
namespace {

// Reads little-endian integers and byte runs from a bounded buffer; every read checks room.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  template <typename T>
  bool Get(T* v) {
    if (left_ < sizeof(T)) return false;
    *v = LoadLe<T>(p_);
    p_ += sizeof(T);
    left_ -= sizeof(T);
    return true;
  }
  bool Bytes(void* out, size_t n) {
    if (left_ < n) return false;
    std::memcpy(out, p_, n);
    p_ += n;
    left_ -= n;
    return true;
  }
  size_t left() const { return left_; }

 private:
  const uint8_t* p_;
  size_t left_;
};

absl::Status Malformed(const std::string& what) {
  return McError(Code::kInvalidArgument, absl::StrCat("malformed index notice: ", what));
}

}  // namespace

absl::StatusOr<std::string> EncodeIndexNotice(std::span<const IndexNoticeEntry> entries) {
  if (entries.empty() || entries.size() > kMaxIndexNoticeEntries) {
    return Malformed(absl::StrCat(entries.size(), " entries"));
  }
  size_t total = 4;
  for (const IndexNoticeEntry& e : entries) {
    if (e.key.empty() || e.key.size() > kMaxKeyBytes) {
      return Malformed(absl::StrCat("key of ", e.key.size(), " bytes"));
    }
    total += IndexEntryBytes(e);
  }
  if (total > kMaxIndexNoticeBytes) return Malformed(absl::StrCat(total, " bytes"));
  std::string out;
  out.reserve(total);
  AppendLe<uint32_t>(out, static_cast<uint32_t>(entries.size()));
  for (const IndexNoticeEntry& e : entries) {
    AppendLe(out, e.segment_id);
    AppendLe(out, e.offset);
    AppendLe(out, e.length);
    AppendLe(out, e.generation);
    AppendLe(out, e.checksum);
    AppendLe<uint32_t>(out, static_cast<uint32_t>(e.key.size()));
    out.append(e.key);
    out.append(reinterpret_cast<const char*>(e.capability.data()), e.capability.size());
  }
  return out;
}

absl::StatusOr<std::vector<IndexNoticeEntry>> DecodeIndexNotice(const uint8_t* data, size_t size) {
  if (data == nullptr && size != 0) return Malformed("no data");
  if (size > kMaxIndexNoticeBytes) return Malformed(absl::StrCat(size, " bytes"));
  Reader r(data, size);
  uint32_t count = 0;
  if (!r.Get(&count)) return Malformed("truncated count");
  if (count == 0 || count > kMaxIndexNoticeEntries) {
    return Malformed(absl::StrCat(count, " entries"));
  }
  // Each entry needs at least its fixed part and one key byte: a count the payload cannot hold
  // is refused before anything is allocated for it.
  if (r.left() / (kIndexEntryFixedBytes + 1) < count) {
    return Malformed(absl::StrCat(count, " entries in ", size, " bytes"));
  }
  std::vector<IndexNoticeEntry> entries(count);
  for (uint32_t i = 0; i < count; ++i) {
    IndexNoticeEntry& e = entries[i];
    uint32_t key_len = 0;
    if (!r.Get(&e.segment_id) || !r.Get(&e.offset) || !r.Get(&e.length) || !r.Get(&e.generation) ||
        !r.Get(&e.checksum) || !r.Get(&key_len)) {
      return Malformed(absl::StrCat("entry ", i, " truncated"));
    }
    if (key_len == 0 || key_len > kMaxKeyBytes) {
      return Malformed(absl::StrCat("entry ", i, " key of ", key_len, " bytes"));
    }
    if (r.left() < key_len + auth::kCapabilitySize) {
      return Malformed(absl::StrCat("entry ", i, " truncated"));
    }
    e.key.resize(key_len);
    r.Bytes(e.key.data(), key_len);
    r.Bytes(e.capability.data(), e.capability.size());
  }
  if (r.left() != 0) return Malformed(absl::StrCat(r.left(), " trailing bytes"));
  return entries;
}

}  // namespace mc::transfer
