#include "transfer/tcp/sealed_records.h"

#include <errno.h>
#include <openssl/evp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/byte_order.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/tcp/socket_util.h"

namespace mc::transfer::tcp {
namespace {

constexpr size_t kNonceSize = 12;

absl::Status Failed(std::string_view what) {
  return McError(Code::kTransferFailed, absl::StrCat("encrypted data plane: ", std::string(what)));
}

EVP_CIPHER_CTX* NewContext(const DirectionKey& key, bool encrypt) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) return nullptr;
  const int ok = encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, nullptr, nullptr)
                         : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, nullptr, nullptr);
  // The key schedule is computed once here; each record only sets its nonce.
  if (ok != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(kNonceSize), nullptr) !=
          1 ||
      (encrypt ? EVP_EncryptInit_ex(ctx, nullptr, nullptr, key.key.data(), nullptr)
               : EVP_DecryptInit_ex(ctx, nullptr, nullptr, key.key.data(), nullptr)) != 1) {
    EVP_CIPHER_CTX_free(ctx);
    return nullptr;
  }
  return ctx;
}

std::array<uint8_t, kNonceSize> Nonce(const DirectionKey& key, uint64_t counter) {
  std::array<uint8_t, kNonceSize> nonce{};
  std::memcpy(nonce.data(), key.nonce_prefix.data(), key.nonce_prefix.size());
  uint8_t* p = nonce.data() + key.nonce_prefix.size();
  PutLe(p, counter);
  return nonce;
}

DirectionKey Expand(const auth::Mac& base, std::string_view label, size_t prefix_at,
                    const auth::Mac& prefixes) {
  const std::string_view base_key(reinterpret_cast<const char*>(base.data()), base.size());
  DirectionKey out;
  const auth::Mac key = auth::HmacSha256(base_key, label);
  std::memcpy(out.key.data(), key.data(), out.key.size());
  std::memcpy(out.nonce_prefix.data(), prefixes.data() + prefix_at, out.nonce_prefix.size());
  return out;
}

}  // namespace

SessionKeys DeriveSessionKeys(const auth::Mac& base) {
  const std::string_view base_key(reinterpret_cast<const char*>(base.data()), base.size());
  const auth::Mac prefixes = auth::HmacSha256(base_key, "mcstore/v1/dp-nonce-prefixes");
  SessionKeys keys;
  keys.to_server = Expand(base, "mcstore/v1/dp-key-to-server", 0, prefixes);
  keys.to_requester = Expand(base, "mcstore/v1/dp-key-to-requester", 4, prefixes);
  return keys;
}

std::vector<iovec> SliceIov(const iovec* iov, size_t count, size_t first, uint64_t n) {
  std::vector<iovec> out;
  for (size_t i = first; i < count && n > 0; ++i) {
    const uint64_t take = std::min<uint64_t>(iov[i].iov_len, n);
    if (take == 0) continue;
    out.push_back({iov[i].iov_base, take});
    n -= take;
  }
  return out;
}

RecordSealer::RecordSealer(const DirectionKey& key) : ctx_(NewContext(key, true)), key_(key) {}
RecordSealer::~RecordSealer() { EVP_CIPHER_CTX_free(ctx_); }

absl::Status RecordSealer::Seal(const iovec* iov, size_t count, size_t n, uint8_t* out) {
  if (ctx_ == nullptr) return Failed("cipher unavailable");
  if (n == 0 || n > kMaxRecordBytes) return Failed(absl::StrCat("record of ", n, " bytes"));
  if (counter_ == UINT64_MAX) return Failed("record counter spent: connection closed");
  const std::array<uint8_t, kNonceSize> nonce = Nonce(key_, counter_);
  uint8_t* p = out;
  PutLe(p, static_cast<uint32_t>(n));
  int len = 0;
  if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce.data()) != 1 ||
      EVP_EncryptUpdate(ctx_, nullptr, &len, out, static_cast<int>(kRecordPrefixSize)) != 1) {
    return Failed("seal");
  }
  size_t left = n;
  for (size_t i = 0; i < count && left > 0; ++i) {
    const size_t take = std::min(left, iov[i].iov_len);
    if (take == 0) continue;
    if (EVP_EncryptUpdate(ctx_, p, &len, static_cast<const uint8_t*>(iov[i].iov_base),
                          static_cast<int>(take)) != 1) {
      return Failed("seal");
    }
    p += len;
    left -= take;
  }
  if (left != 0) return Failed("record shorter than announced");
  if (EVP_EncryptFinal_ex(ctx_, p, &len) != 1) return Failed("seal");
  p += len;
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kRecordTagSize), p) != 1) {
    return Failed("seal");
  }
  ++counter_;
  return absl::OkStatus();
}

RecordOpener::RecordOpener(const DirectionKey& key) : ctx_(NewContext(key, false)), key_(key) {}
RecordOpener::~RecordOpener() { EVP_CIPHER_CTX_free(ctx_); }

absl::Status RecordOpener::BodyLength(const uint8_t* prefix, size_t max_length, size_t* length) {
  const uint8_t* p = prefix;
  const uint32_t n = GetLe<uint32_t>(p);
  if (n == 0 || n > max_length) {
    return Failed(absl::StrCat("record of ", n, " bytes where 1..", max_length, " fit"));
  }
  *length = n;
  return absl::OkStatus();
}

absl::Status RecordOpener::Open(const uint8_t* prefix, const iovec* iov, size_t count,
                                const uint8_t* tag) {
  if (ctx_ == nullptr) return Failed("cipher unavailable");
  if (counter_ == UINT64_MAX) return Failed("record counter spent: connection closed");
  const std::array<uint8_t, kNonceSize> nonce = Nonce(key_, counter_);
  int len = 0;
  if (EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce.data()) != 1 ||
      EVP_DecryptUpdate(ctx_, nullptr, &len, prefix, static_cast<int>(kRecordPrefixSize)) != 1) {
    return Failed("open");
  }
  for (size_t i = 0; i < count; ++i) {
    if (iov[i].iov_len == 0) continue;
    auto* data = static_cast<uint8_t*>(iov[i].iov_base);
    if (EVP_DecryptUpdate(ctx_, data, &len, data, static_cast<int>(iov[i].iov_len)) != 1) {
      return Failed("open");
    }
  }
  uint8_t tag_copy[kRecordTagSize];
  std::memcpy(tag_copy, tag, sizeof(tag_copy));
  uint8_t tail[16];
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kRecordTagSize), tag_copy) !=
          1 ||
      EVP_DecryptFinal_ex(ctx_, tail, &len) != 1) {
    return Failed(absl::StrCat("record ", counter_, " failed authentication"));
  }
  ++counter_;
  return absl::OkStatus();
}

BlockingChannel::BlockingChannel(int fd, const SessionKeys* keys, bool server_side) : fd_(fd) {
  if (keys == nullptr) return;
  sealer_ = std::make_unique<RecordSealer>(server_side ? keys->to_requester : keys->to_server);
  opener_ = std::make_unique<RecordOpener>(server_side ? keys->to_server : keys->to_requester);
}

absl::Status BlockingChannel::ReadRecord(uint8_t* dst, uint64_t room, size_t* got) {
  uint8_t prefix[kRecordPrefixSize];
  MC_RETURN_IF_ERROR(RecvAll(fd_, prefix, sizeof(prefix)));
  size_t n = 0;
  if (absl::Status s = RecordOpener::BodyLength(prefix, kMaxRecordBytes, &n); !s.ok()) {
    tampered_ = true;
    return s;
  }
  uint8_t* body = dst;
  if (n > room) {  // does not fit the caller's bytes: through our (bounded) buffer
    buffer_.resize(n);
    buffer_pos_ = 0;
    body = buffer_.data();
  }
  uint8_t tag[kRecordTagSize];
  MC_RETURN_IF_ERROR(RecvAll(fd_, body, n));
  MC_RETURN_IF_ERROR(RecvAll(fd_, tag, sizeof(tag)));
  const iovec v{body, n};
  if (absl::Status s = opener_->Open(prefix, &v, 1, tag); !s.ok()) {
    tampered_ = true;
    buffer_.clear();
    buffer_pos_ = 0;
    return s;
  }
  *got = body == dst ? n : 0;
  return absl::OkStatus();
}

absl::Status BlockingChannel::ReadExact(void* data, uint64_t length) {
  if (!encrypted()) return RecvAll(fd_, data, length);
  auto* p = static_cast<uint8_t*>(data);
  while (length > 0) {
    if (buffered() > 0) {
      const size_t n = std::min<uint64_t>(buffered(), length);
      std::memcpy(p, buffer_.data() + buffer_pos_, n);
      buffer_pos_ += n;
      if (buffer_pos_ == buffer_.size()) {
        buffer_.clear();
        buffer_pos_ = 0;
      }
      p += n;
      length -= n;
      continue;
    }
    size_t got = 0;
    MC_RETURN_IF_ERROR(ReadRecord(p, length, &got));
    p += got;
    length -= got;
  }
  return absl::OkStatus();
}

absl::Status BlockingChannel::Skip(uint64_t length) {
  if (!encrypted()) return SkipBytes(fd_, length);
  std::vector<uint8_t> scratch(std::min<uint64_t>(length, kMaxRecordBytes));
  while (length > 0) {  // every skipped record is still authenticated
    const uint64_t n = std::min<uint64_t>(length, scratch.size());
    MC_RETURN_IF_ERROR(ReadExact(scratch.data(), n));
    length -= n;
  }
  return absl::OkStatus();
}

absl::Status BlockingChannel::SealAppend(const iovec* iov, size_t count) {
  constexpr size_t kFlushAt = 4 * (kMaxRecordBytes + kRecordOverhead);  // bytes per sendmsg
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += iov[i].iov_len;
  std::vector<iovec> rest(iov, iov + count);
  size_t first = 0;
  while (total > 0) {
    const size_t n = std::min<uint64_t>(total, kMaxRecordBytes);
    if (out_used_ + n + kRecordOverhead > kFlushAt) MC_RETURN_IF_ERROR(Flush());
    if (out_.size() < kFlushAt) out_.resize(kFlushAt);
    MC_RETURN_IF_ERROR(
        sealer_->Seal(rest.data() + first, rest.size() - first, n, out_.data() + out_used_));
    first = ConsumeIov(rest.data(), rest.size(), first, n);
    out_used_ += n + kRecordOverhead;
    total -= n;
  }
  return absl::OkStatus();
}

absl::Status BlockingChannel::Flush() {
  if (out_used_ == 0) return absl::OkStatus();
  iovec v{out_.data(), out_used_};
  out_used_ = 0;
  return SendAll(fd_, &v, 1);
}

absl::Status BlockingChannel::Send(const iovec* head, size_t head_count, const iovec* body,
                                   size_t body_count) {
  if (!encrypted()) {
    std::vector<iovec> all(head, head + head_count);
    all.insert(all.end(), body, body + body_count);
    return SendAll(fd_, all.data(), static_cast<int>(all.size()));
  }
  // The head alone in its record (the receiver decodes it before it knows where the body goes).
  MC_RETURN_IF_ERROR(SealAppend(head, head_count));
  MC_RETURN_IF_ERROR(SealAppend(body, body_count));
  return Flush();
}

}  // namespace mc::transfer::tcp
