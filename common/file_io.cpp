#include "common/file_io.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <utility>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe {

namespace {

std::string os_error(int err) { return std::strerror(err); }

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

// ---- OutputLock ------------------------------------------------------------------------------

OutputLock::OutputLock(const std::string& path) : lock_path_(path + ".lock") {
  // A lock file that another holder unlinked between our open and our flock is retried, so two
  // holders can never each lock a different inode of the same name.
  for (int attempt = 0; attempt < 16; ++attempt) {
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    PACKPIPE_CHECK(fd_ >= 0, "'{}': cannot create the lock file '{}': {}", path, lock_path_,
                   os_error(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      PACKPIPE_CHECK(err == EWOULDBLOCK, "'{}': cannot lock '{}': {}", path, lock_path_, os_error(err));
      PACKPIPE_THROW(Error,
                     "'{}': another process is writing this output (lock '{}' is held); wait for it "
                     "or choose another output path",
                     path, lock_path_);
    }
    struct stat held {}, now {};
    if (::fstat(fd_, &held) == 0 && ::stat(lock_path_.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino) {
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  PACKPIPE_THROW(Error, "'{}': cannot lock '{}': it keeps being replaced", path, lock_path_);
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still locked: a waiter re-checks the inode and retries
  ::close(fd_);
}

// ---- AtomicFile ------------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  PACKPIPE_CHECK_ARG(!path_.empty(), "output path is empty");
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // A stream (/dev/stdout, /dev/null, a pipe) is written directly: there is no file to replace.
    PACKPIPE_CHECK(S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode),
                   "output '{}' is {}; expected a regular file, a new path or a stream", path_, file_kind(st.st_mode));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    PACKPIPE_CHECK(fd_ >= 0, "cannot open output '{}': {}", path_, os_error(errno));
    return;  // tmp_ stays empty: commit() only closes
  }
  lock_ = std::make_unique<OutputLock>(path_);  // held through the write and the rename
  std::string templ = path_ + ".tmp-XXXXXX";
  fd_ = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    lock_.reset();
    PACKPIPE_THROW(Error, "'{}': cannot create a temporary file beside it: {}", path_, os_error(err));
  }
  tmp_ = templ;
  ::fchmod(fd_, 0644);
}

AtomicFile::~AtomicFile() {
  if (!done_) discard();
}

void AtomicFile::write(const void* data, std::size_t n) {
  PACKPIPE_CHECK_ARG(!done_, "'{}': write after commit or discard", path_);
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    PACKPIPE_CHECK(w > 0, "'{}': write of {} bytes failed: {}", path_, n, os_error(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
    written_ += static_cast<std::uint64_t>(w);
  }
}

void AtomicFile::commit() {
  PACKPIPE_CHECK_ARG(!done_, "'{}': commit after commit or discard", path_);
  if (tmp_.empty()) {  // a stream: nothing to sync or rename
    const int fd = fd_;
    fd_ = -1;
    done_ = true;
    PACKPIPE_CHECK(::close(fd) == 0, "'{}': close failed: {}", path_, os_error(errno));
    return;
  }
  if (::fsync(fd_) != 0) {
    const int err = errno;
    discard();
    PACKPIPE_THROW(Error, "'{}': sync failed: {}", path_, os_error(err));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    discard();
    PACKPIPE_THROW(Error, "'{}': close failed: {}", path_, os_error(err));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    PACKPIPE_THROW(Error, "cannot rename '{}' to '{}': {}", tmp_, path_, os_error(err));
  }
  done_ = true;
  lock_.reset();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty() && !done_) ::unlink(tmp_.c_str());
  done_ = true;
  lock_.reset();
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

// ---- identity and regular files ----------------------------------------------------------------

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void check_output_is_not_input(const std::string& output, const std::vector<std::string>& inputs,
                               std::string_view what) {
  for (const auto& in : inputs) {
    PACKPIPE_CHECK_ARG(!same_file(output, in),
                       "{} '{}' is the input '{}' (the same file); writing it would destroy the input: "
                       "choose another output path",
                       what, output, in);
  }
}

namespace {

// `p` made absolute, with links, "." and ".." resolved as far as the path exists (the rest kept as
// written): two spellings of one file, existing or not, compare equal.
std::string resolved_path(const std::string& p) {
  std::error_code ec;
  const auto abs = std::filesystem::absolute(p, ec);
  if (ec) return p;
  const auto r = std::filesystem::weakly_canonical(abs, ec);
  return ec ? abs.lexically_normal().string() : r.string();
}

// True for an existing character device or FIFO: written in place by AtomicFile, nothing replaced.
bool is_stream(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode));
}

}  // namespace

void check_command_files(const std::vector<std::string>& inputs, const std::vector<OutputFile>& outputs) {
  struct Written {
    std::string path, what;
  };
  std::vector<Written> written;  // every output, then every output's lock file
  for (const auto& o : outputs) {
    if (o.path.empty()) continue;
    check_output_is_not_input(o.path, inputs, o.what);
    if (is_stream(o.path)) continue;
    written.push_back({o.path, o.what});
  }
  const std::size_t files = written.size();
  for (std::size_t k = 0; k < files; ++k) {
    const std::string lock = written[k].path + ".lock";
    for (const auto& in : inputs) {
      PACKPIPE_CHECK_ARG(!same_file(lock, in),
                         "{} '{}' would be written under the lock file '{}', which is the input '{}' (the same file); "
                         "writing it would destroy the input: choose another output path",
                         written[k].what, written[k].path, lock, in);
    }
    written.push_back({lock, fmt::format("the lock file of {}", written[k].what)});
  }
  // One pass, O(n log n): by resolved path (existing or not), and by inode for what exists. Two lock
  // files can only collide when their outputs do, which is found first.
  std::map<std::string, std::size_t> by_path;
  std::map<std::pair<dev_t, ino_t>, std::size_t> by_inode;
  for (std::size_t k = 0; k < written.size(); ++k) {
    std::size_t other = k;
    const auto [at, fresh] = by_path.emplace(resolved_path(written[k].path), k);
    if (!fresh) other = at->second;
    struct stat st {};
    if (other == k && ::stat(written[k].path.c_str(), &st) == 0) {
      const auto [it, new_inode] = by_inode.emplace(std::make_pair(st.st_dev, st.st_ino), k);
      if (!new_inode) other = it->second;
    }
    if (other == k || (other >= files && k >= files)) continue;
    PACKPIPE_CHECK_ARG(false,
                       "{} '{}' and {} '{}' are the same file: the second would overwrite the first; give each output "
                       "its own path",
                       written[other].what, written[other].path, written[k].what, written[k].path);
  }
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  std::vector<OutputFile> files;
  files.reserve(outputs.size());
  for (const auto& [path, what] : outputs) files.push_back({path, what});
  check_command_files({}, files);
}

void probe_output(const std::string& path, std::string_view what) {
  struct stat st {};
  // A stream is written directly (a FIFO's open would wait for its reader): nothing to probe.
  if (::stat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) return;
  try {
    AtomicFile probe(path);  // the destructor removes the temporary and releases the lock
  } catch (const std::exception& e) {
    PACKPIPE_THROW(InvalidArgument, "{}: cannot write '{}': {}", what, path, e.what());
  }
}

int open_regular_file(const std::string& path, std::string_view what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  PACKPIPE_CHECK(fd >= 0, "cannot open {} '{}': {}", what, path, os_error(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    PACKPIPE_THROW(Error, "cannot stat {} '{}': {}", what, path, os_error(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    PACKPIPE_THROW(Error, "{} '{}' is {}; expected a regular file", what, path, file_kind(st.st_mode));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, std::string_view what) {
  const int fd = open_regular_file(path, what);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      PACKPIPE_THROW(Error, "cannot read {} '{}': {}", what, path, os_error(err));
    }
    if (r == 0) break;
    out.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fd);
  return out;
}

}  // namespace packpipe
