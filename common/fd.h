// Owning file descriptor, page-aligned buffers and a few POSIX helpers.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "common/result.h"

namespace expertd {

inline constexpr size_t kDirectAlign = 4096;  // the O_DIRECT contract: offsets, lengths, buffers

inline constexpr uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// A buffer aligned for O_DIRECT, allocated once and reused.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) : size_(round_up(bytes, kDirectAlign)) {
    if (size_ && posix_memalign(&ptr_, kDirectAlign, size_) != 0) {
      ptr_ = nullptr;
      size_ = 0;
    }
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~AlignedBuffer() { std::free(ptr_); }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }
  size_t size() const { return size_; }
  bool valid() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// pread until `bytes` are read; a short file is an error naming the path.
inline Status pread_full(int fd, void* buf, size_t bytes, uint64_t offset,
                         const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("read " + what);
    }
    if (n == 0)
      return make_error("read " + what + ": unexpected end of file at offset " +
                        std::to_string(offset));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

inline Status pwrite_full(int fd, const void* buf, size_t bytes, uint64_t offset,
                          const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("write " + what);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return {};
}

inline Result<UniqueFd> open_file(const std::string& path, int flags, mode_t mode = 0644) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return errno_error("open " + path);
  return UniqueFd(fd);
}

inline Result<uint64_t> file_size(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_error("stat " + what);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace expertd
