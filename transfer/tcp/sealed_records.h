// The encrypted data plane (docs/security.md, "The data plane"): after the AUTH handshake
// (handshake.h) agreed on encryption, every byte of a data-plane connection, both directions,
// travels in sealed records:
//
//   u32 length (little-endian, 1..kMaxRecordBytes: plaintext bytes)
//   length bytes of AES-256-GCM ciphertext
//   16 bytes of GCM tag
//
// The 4 length bytes are the record's additional authenticated data. The 96-bit nonce is the
// direction's 4-byte prefix || the direction's record counter (u64 little-endian, from 0, +1 per
// record); it never travels, so a replayed, reordered, dropped or inserted record fails its tag.
// A counter that would wrap closes the connection. The keys (one per direction) and the prefixes
// come from the handshake's fresh nonces (DeriveSessionKeys). Senders cut records at frame-part
// boundaries (a request's header + capability block in one record, a response header in one,
// payloads in records of at most kMaxRecordBytes), so a receiver decrypts payloads in place in
// their destination and checks each record's tag before any of its bytes is used, hashed or
// acknowledged.
// Not thread-safe: one sealer and one opener per connection direction, owned with it.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/auth.h"

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace mc::transfer::tcp {

inline constexpr size_t kRecordPrefixSize = 4;
inline constexpr size_t kRecordTagSize = 16;
inline constexpr size_t kRecordOverhead = kRecordPrefixSize + kRecordTagSize;
inline constexpr size_t kMaxRecordBytes = 256 << 10;

// One direction's AES-256-GCM key and nonce prefix.
struct DirectionKey {
  std::array<uint8_t, 32> key{};
  std::array<uint8_t, 4> nonce_prefix{};
};

// The two directions of one connection.
struct SessionKeys {
  DirectionKey to_server;     // requester -> server
  DirectionKey to_requester;  // server -> requester
};

// Expands a connection's base secret (the handshake's HMAC over both nonces) into its keys.
SessionKeys DeriveSessionKeys(const auth::Mac& base);

// Seals records of one direction.
class RecordSealer {
 public:
  explicit RecordSealer(const DirectionKey& key);
  ~RecordSealer();
  RecordSealer(const RecordSealer&) = delete;
  RecordSealer& operator=(const RecordSealer&) = delete;

  // Seals the first `n` bytes (1..kMaxRecordBytes) gathered from iov[0..count) into `out`
  // (n + kRecordOverhead bytes). kTransferFailed when the counter is spent or OpenSSL fails.
  absl::Status Seal(const iovec* iov, size_t count, size_t n, uint8_t* out);
  uint64_t counter() const { return counter_; }
  void set_counter_for_test(uint64_t counter) { counter_ = counter; }

 private:
  EVP_CIPHER_CTX* ctx_;
  DirectionKey key_;
  uint64_t counter_ = 0;
};

// Opens records of one direction.
class RecordOpener {
 public:
  explicit RecordOpener(const DirectionKey& key);
  ~RecordOpener();
  RecordOpener(const RecordOpener&) = delete;
  RecordOpener& operator=(const RecordOpener&) = delete;

  // The plaintext length a record prefix announces; kTransferFailed unless 1..max_length.
  static absl::Status BodyLength(const uint8_t* prefix, size_t max_length, size_t* length);
  // Decrypts the record body in place (iov[0..count) hold exactly its `length` ciphertext
  // bytes) and checks `tag` over it and `prefix`. kTransferFailed "record failed
  // authentication" on a bad tag: the bytes are then garbage and the connection must close.
  absl::Status Open(const uint8_t* prefix, const iovec* iov, size_t count, const uint8_t* tag);
  uint64_t counter() const { return counter_; }
  void set_counter_for_test(uint64_t counter) { counter_ = counter; }

 private:
  EVP_CIPHER_CTX* ctx_;
  DirectionKey key_;
  uint64_t counter_ = 0;
};

// The first `n` bytes of iov[first..count) as slices (the iovecs are not modified).
std::vector<iovec> SliceIov(const iovec* iov, size_t count, size_t first, uint64_t n);

// A blocking connection endpoint that either passes bytes through (plaintext) or seals and opens
// records. ReadExact decrypts in place into `data` when a record fits it whole; otherwise through
// a bounded buffer (kMaxRecordBytes). The server's connection threads and setup exchanges use it.
class BlockingChannel {
 public:
  // `keys` null: plaintext. `server_side` picks which direction keys seal and which open.
  BlockingChannel(int fd, const SessionKeys* keys, bool server_side);
  bool encrypted() const { return sealer_ != nullptr; }
  // Opened plaintext bytes not yet consumed by ReadExact (a record larger than one read).
  size_t buffered() const { return buffer_.size() - buffer_pos_; }

  absl::Status ReadExact(void* data, uint64_t length);
  // True once a record failed its tag (or announced a bad length): the channel is dead.
  bool tampered() const { return tampered_; }
  absl::Status Skip(uint64_t length);
  // Sends `head` (at most kMaxRecordBytes; one record) then `body` (records of at most
  // kMaxRecordBytes). Plaintext: everything in sendmsg calls.
  absl::Status Send(const iovec* head, size_t head_count, const iovec* body, size_t body_count);

 private:
  // Seals iov[0..count) as records of at most kMaxRecordBytes into out_ (sent when it fills).
  absl::Status SealAppend(const iovec* iov, size_t count);
  absl::Status Flush();
  // Reads one record; its plaintext lands in `dst` when it fits in `room` bytes (set *got),
  // else in buffer_.
  absl::Status ReadRecord(uint8_t* dst, uint64_t room, size_t* got);

  const int fd_;
  std::unique_ptr<RecordSealer> sealer_;
  std::unique_ptr<RecordOpener> opener_;
  std::vector<uint8_t> buffer_;
  size_t buffer_pos_ = 0;
  bool tampered_ = false;
  std::vector<uint8_t> out_;
  size_t out_used_ = 0;
};

}  // namespace mc::transfer::tcp
