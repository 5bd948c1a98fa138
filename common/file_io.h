// Safe file writing and opening: atomic outputs, outputs that must not be inputs, regular files only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace packpipe {

/// Exclusive advisory lock on `<path>.lock` (flock), released and the lock file removed on
/// destruction. Throws Error naming `path` if another process or object holds it.
class OutputLock {
 public:
  explicit OutputLock(const std::string& path);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string lock_path_;
  int fd_ = -1;
};

/// Output file written through a temporary beside it and renamed into place by commit().
///
/// The temporary is `<path>.tmp-XXXXXX` (same directory, so the rename is atomic). While the
/// object lives it holds an exclusive advisory lock on `<path>.lock`, so a second writer of the
/// same path fails at once instead of both "succeeding". Without commit() the destructor removes
/// the temporary: a failed run never leaves a truncated or half-written output at `path`. An
/// existing character device or FIFO (/dev/stdout, /dev/null, a pipe) is written directly.
class AtomicFile {
 public:
  /// Creates the temporary and takes the lock; throws Error naming `path` if either fails.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends n bytes; throws Error naming the output on a short or failed write.
  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// File descriptor of the temporary (for writers that use their own buffered I/O).
  int fd() const { return fd_; }
  /// Final path and temporary path.
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  /// Bytes written so far.
  std::uint64_t written() const { return written_; }
  /// Syncs, closes and renames the temporary onto path(); throws Error on failure.
  void commit();
  /// Removes the temporary without touching path(); never throws.
  void discard() noexcept;

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
  std::unique_ptr<OutputLock> lock_;
  bool done_ = false;
};

/// Writes `contents` to `path` atomically (AtomicFile); throws Error naming the path on failure.
void write_file_atomic(const std::string& path, std::string_view contents);

/// True if both paths exist and name the same file (same device and inode: through symbolic
/// links, hard links and relative paths).
bool same_file(const std::string& a, const std::string& b);

/// Throws InvalidArgument if the output `output` (`what`, e.g. "--out") resolves to any of
/// `inputs`: writing it would destroy the input it reads.
void check_output_is_not_input(const std::string& output, const std::vector<std::string>& inputs,
                               std::string_view what);

/// One file a command writes, and the option or role that names it in messages ("--out",
/// "output dataset file of task 'qa'").
struct OutputFile {
  std::string path;
  std::string what;
};

/// The one check of a command's files, before anything is opened for writing. Throws
/// InvalidArgument naming both files and their roles when
/// - an output, or the lock file `<output>.lock` its writer creates and removes (AtomicFile), is one
///   of `inputs` (same device and inode: through links and relative paths), or
/// - two outputs, or an output and another's lock file, are the same file (the same path once
///   links, "." and ".." are resolved, existing or not, or the same inode): the later would
///   overwrite the earlier.
/// Outputs with an empty path are skipped; an existing stream (character device, FIFO) is written
/// in place, loses nothing, and may appear more than once.
void check_command_files(const std::vector<std::string>& inputs, const std::vector<OutputFile>& outputs);

/// check_command_files without inputs, for (path, what) pairs: throws InvalidArgument when two
/// of the non-empty `outputs` name the same file (or one another's lock file).
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

/// Refuses, before any work, an output `path` (`what`, e.g. "--out") that AtomicFile could not
/// write: a directory, a missing or read-only folder, an output another writer holds. Creates and
/// removes the temporary and the lock; never touches `path`. Throws InvalidArgument naming `what` and
/// the path.
void probe_output(const std::string& path, std::string_view what);

/// Opens `path` read-only without blocking on a FIFO and refuses anything but a regular file
/// (directory, FIFO, device); returns the descriptor. `what` names the role, e.g. "lengths file".
int open_regular_file(const std::string& path, std::string_view what);

/// Reads a whole regular file (open_regular_file); throws Error naming the path on failure.
std::string read_regular_file(const std::string& path, std::string_view what);

}  // namespace packpipe
