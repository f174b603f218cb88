#include "offload/internal/data_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc::offload::internal {
namespace {

absl::Status FileError(const std::string& what, const std::string& path, int err) {
  return McError(Code::kInternal, absl::StrFormat("%s %s: %s", what, path, std::strerror(err)));
}

// Opens `path` read-write (creating it); O_DIRECT when *direct, cleared on EINVAL.
absl::StatusOr<int> OpenFile(const std::string& path, bool* direct) {
  static auto& log = Logger("offload");
  int fd = -1;
  if (*direct) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) {
      log.warn("disk tier: O_DIRECT refused on {}, using buffered I/O", path);
      *direct = false;
    } else if (fd < 0) {
      return FileError("open", path, errno);
    }
  }
  if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("open", path, errno);
  return fd;
}

// Extends the file to `size` (allocating blocks where the filesystem can).
absl::Status Extend(int fd, const std::string& path, uint64_t size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return FileError("stat", path, errno);
  if (static_cast<uint64_t>(st.st_size) >= size) return absl::OkStatus();
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (rc == 0) return absl::OkStatus();
  if (rc != EOPNOTSUPP && rc != EINVAL) return FileError("fallocate", path, rc);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return FileError("ftruncate", path, errno);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataFiles>> DataFiles::Open(const std::string& dir, int num_files,
                                                           uint64_t file_size, bool direct_io) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return McError(Code::kInternal, "create " + dir + ": " + ec.message());
  std::unique_ptr<DataFiles> files(new DataFiles(file_size, direct_io));
  for (int i = 0; i < num_files; ++i) {
    const std::string path = absl::StrFormat("%s/data-%03d.mcs", dir, i);
    bool direct = files->direct_;
    auto fd = OpenFile(path, &direct);
    if (!fd.ok()) return fd.status();
    files->fds_.push_back(*fd);
    // Once one file falls back to buffered I/O, all do (one mode per tier).
    files->direct_ = direct;
    if (absl::Status s = Extend(*fd, path, file_size); !s.ok()) return s;
  }
  return files;
}

DataFiles::~DataFiles() {
  for (int fd : fds_) ::close(fd);
}

absl::Status DataFiles::Sync(uint32_t file) const {
  if (::fdatasync(fds_[file]) != 0) {
    return McError(Code::kTransferFailed, std::string("fdatasync: ") + std::strerror(errno));
  }
  return absl::OkStatus();
}

}  // namespace mc::offload::internal
