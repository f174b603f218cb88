// A heap buffer aligned to 4 KiB with a size rounded up to 4 KiB, for O_DIRECT I/O.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "offload/extent_allocator.h"

namespace mc::offload::internal {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(uint64_t size)
      : size_(RoundUpToPage(size == 0 ? 1 : size)),
        data_(static_cast<char*>(std::aligned_alloc(kPageSize, size_))) {
    if (data_ == nullptr) size_ = 0;
  }
  bool ok() const { return data_ != nullptr; }
  char* data() const { return data_.get(); }
  uint64_t size() const { return size_; }
  std::string_view view(uint64_t offset, uint64_t length) const {
    return std::string_view(data_.get() + offset, length);
  }
  void Zero() { std::memset(data_.get(), 0, size_); }

 private:
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  uint64_t size_ = 0;
  std::unique_ptr<char, FreeDeleter> data_;
};

}  // namespace mc::offload::internal
