#include "common/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"

namespace packpipe {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PACKPIPE_CHECK(fd >= 0, "cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    PACKPIPE_THROW(Error, "cannot stat '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    PACKPIPE_THROW(Error, "'{}' is not a regular file", path);
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    PACKPIPE_CHECK(p != MAP_FAILED, "cannot map '{}' ({} bytes): {}", path, size_, std::strerror(err));
    data_ = static_cast<const std::uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::reset() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::advise(std::uint64_t offset, std::uint64_t length, bool sequential) const {
  if (data_ == nullptr || offset >= size_) return;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t begin = offset / page * page;
  const std::uint64_t end = std::min(size_, offset + length);
  ::madvise(const_cast<std::uint8_t*>(data_) + begin, end - begin,
            sequential ? MADV_SEQUENTIAL : MADV_RANDOM);
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  PACKPIPE_CHECK(::stat(path.c_str(), &st) == 0, "cannot stat '{}': {}", path, std::strerror(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace packpipe
