#include "common/mapped_file.h"

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/file_io.h"

namespace packpipe {

// ---- SIGBUS: a mapped file truncated underneath us -------------------------------------------
//
// Reading a page of a MAP_SHARED mapping past the end of its (since truncated) file raises
// SIGBUS. One process-wide handler, installed on first use, turns it into:
//  - inside guarded_copy(): a jump back to the copy, which then reports failure (and the caller
//    an Error naming the file);
//  - elsewhere, inside a packpipe mapping: a message naming the file on stderr, then the default
//    action (the process ends; no code can safely continue from an arbitrary faulting access);
//  - outside packpipe's mappings: the handler that was installed before ours, or the default.
namespace {

constexpr int kSlots = 256;
struct Slot {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};
  char path[240] = {};
};
Slot g_slots[kSlots];
struct sigaction g_previous {};
std::once_flag g_install_once;
std::atomic<bool> g_installed{false};  // fast path of install_handler: every guarded copy asks
thread_local sigjmp_buf* t_guard = nullptr;

void write_stderr(const char* s) {
  const std::size_t n = std::strlen(s);
  [[maybe_unused]] ssize_t w = ::write(2, s, n);
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (sigjmp_buf* g = t_guard; g != nullptr) {
    t_guard = nullptr;
    siglongjmp(*g, 1);
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(info != nullptr ? info->si_addr : nullptr);
  for (auto& s : g_slots) {
    const std::uintptr_t b = s.begin.load(std::memory_order_acquire);
    if (b != 0 && addr >= b && addr < s.end.load(std::memory_order_relaxed)) {
      write_stderr("packpipe: fatal: SIGBUS reading '");
      write_stderr(s.path);
      write_stderr("': the file was truncated or overwritten by another process while packpipe had it "
                   "mapped. Do not modify a dataset or plan file while it is being read.\n");
      break;
    }
  }
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, ctx);
    return;
  }
  if ((g_previous.sa_flags & SA_SIGINFO) == 0 && g_previous.sa_handler != SIG_DFL &&
      g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // returning re-executes the access, which now ends the process
}

void install_handler() {
  if (g_installed.load(std::memory_order_acquire)) return;
  std::call_once(g_install_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // NODEFER: no mask to restore after the long jump
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
  g_installed.store(true, std::memory_order_release);
}

void register_mapping(const std::uint8_t* data, std::uint64_t size, const std::string& path) {
  if (data == nullptr) return;
  for (auto& s : g_slots) {
    std::uintptr_t expected = 0;
    // Claim with a placeholder so the path is written before the range becomes visible.
    if (s.begin.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
      std::snprintf(s.path, sizeof(s.path), "%s", path.c_str());
      s.end.store(reinterpret_cast<std::uintptr_t>(data) + size, std::memory_order_relaxed);
      s.begin.store(reinterpret_cast<std::uintptr_t>(data), std::memory_order_release);
      return;
    }
  }  // all slots taken: the fault is still reported, without the file's name
}

void unregister_mapping(const std::uint8_t* data) {
  if (data == nullptr) return;
  const auto b = reinterpret_cast<std::uintptr_t>(data);
  for (auto& s : g_slots) {
    std::uintptr_t expected = b;
    if (s.begin.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return;
  }
}

}  // namespace

bool guarded_copy(void* dst, const void* src, std::size_t n) noexcept {
  if (n == 0) return true;
  install_handler();
  sigjmp_buf jb;
  if (sigsetjmp(jb, 0) != 0) return false;  // t_guard was cleared by the handler
  t_guard = &jb;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the handler must see the guard set
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = open_regular_file(path, "file");  // a FIFO is refused, not waited on
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    PACKPIPE_THROW(Error, "cannot stat '{}': {}", path, std::strerror(err));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    PACKPIPE_CHECK(p != MAP_FAILED, "cannot map '{}' ({} bytes): {}", path, size_, std::strerror(err));
    data_ = static_cast<const std::uint8_t*>(p);
    install_handler();
    register_mapping(data_, size_, path_);
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
  if (data_ != nullptr) {
    unregister_mapping(data_);
    ::munmap(const_cast<std::uint8_t*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::read(std::uint64_t offset, std::uint64_t n, void* out) const {
  PACKPIPE_CHECK_RANGE(offset <= size_ && n <= size_ - offset,
                       "{}: read of {} bytes at offset {} is past the end ({} bytes)", path_, n, offset,
                       size_);
  if (n == 0) return;
  if (!guarded_copy(out, data_ + offset, static_cast<std::size_t>(n))) {
    struct stat st {};
    const bool known = ::stat(path_.c_str(), &st) == 0;
    PACKPIPE_THROW(Error,
                   "'{}': reading {} bytes at offset {} failed (SIGBUS): the file was {} bytes when "
                   "opened and is {} now; another process truncated or overwrote it while it was in use",
                   path_, n, offset, size_, known ? std::to_string(st.st_size) : std::string("gone"));
  }
}

void MappedFile::check_unchanged() const {
  struct stat st {};
  PACKPIPE_CHECK(::stat(path_.c_str(), &st) == 0, "'{}': the file is gone since it was opened: {}", path_,
                 std::strerror(errno));
  PACKPIPE_CHECK(static_cast<std::uint64_t>(st.st_size) == size_,
                 "'{}': the file was {} bytes when opened and is {} bytes now; another process truncated "
                 "or overwrote it while it was in use",
                 path_, size_, st.st_size);
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
