#include "dataloader/indexed_dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/errors.h"
#include "common/file_io.h"

namespace packpipe::dataloader {

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packpipe reads Megatron's little-endian files with plain loads: a little-endian host is required"
#endif

namespace {

constexpr std::uint8_t kMmidxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr std::uint8_t kTntMagic[8] = {'T', 'N', 'T', 'I', 'D', 'X', 0, 0};
constexpr std::uint64_t kMmidxHeader = 34;
constexpr std::uint64_t kTntHeader = 56;
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

/// Printable rendering of raw bytes for error messages: \0, \xNN for non-printables.
std::string escape_bytes(const std::uint8_t* p, std::uint64_t n) {
  std::string out;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint8_t c = p[i];
    if (c == 0) {
      out += "\\0";
    } else if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

template <typename T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// The bytes an index is parsed from: a buffer in memory, or a mapped file (`file`) whose every read,
/// at the parse and through the views made here, goes through its SIGBUS guard.
struct Bytes {
  const std::uint8_t* data = nullptr;
  std::uint64_t size = 0;
  const MappedFile* file = nullptr;

  /// Copies [off, off + n) (inside the buffer) to out.
  void copy(std::uint64_t off, std::uint64_t n, void* out) const {
    if (file != nullptr) {
      file->read(off, n, out);
    } else if (n > 0) {
      std::memcpy(out, data + off, n);
    }
  }
  template <typename T>
  T at(std::uint64_t off) const {
    T v;
    copy(off, sizeof(T), &v);
    return v;
  }
  template <typename T>
  UnalignedArray<T> array(std::uint64_t off, std::uint64_t count) const {
    return UnalignedArray<T>(data + off, count, file);
  }
};

/// a * b + c for sizes read from a file; throws Error naming the file and what overflowed.
std::uint64_t size_expr(std::uint64_t a, std::uint64_t b, std::uint64_t c, const std::string& name,
                        const char* what) {
  std::uint64_t m = 0, r = 0;
  if (__builtin_mul_overflow(a, b, &m) || __builtin_add_overflow(m, c, &r)) {
    PACKPIPE_THROW(Error, "{}: size of {} overflows 64 bits ({} x {} + {})", name, what, a, b, c);
  }
  return r;
}

IndexView parse_mmidx(const Bytes& b, const std::string& name, ModesPolicy policy) {
  const std::uint64_t size = b.size;
  PACKPIPE_CHECK(size >= kMmidxHeader,
                 "{}: truncated MMIDIDX header: expected at least {} bytes, found {}", name,
                 kMmidxHeader, size);
  IndexView v;
  v.format = IndexFormat::MMIDIDX;
  v.version = b.at<std::uint64_t>(9);
  PACKPIPE_CHECK(v.version == 1, "{}: unsupported MMIDIDX version at offset 9: expected 1, found {}",
                 name, v.version);
  v.dtype = dtype_from_code(b.at<std::uint8_t>(17), name + " at offset 17");
  const std::uint64_t S = b.at<std::uint64_t>(18);
  const std::uint64_t D = b.at<std::uint64_t>(26);
  PACKPIPE_CHECK(D >= 1,
                 "{}: document index length at offset 26: expected at least 1 (doc_idx starts "
                 "with 0), found 0",
                 name);
  const std::uint64_t doc_off = size_expr(S, 12, kMmidxHeader, name, "the sizes and pointers arrays");
  const std::uint64_t base = size_expr(D, 8, doc_off, name, "the document index");
  const std::uint64_t with_modes = size_expr(S, 1, base, name, "the modes array");
  bool modes = false;
  switch (policy) {
    case ModesPolicy::Auto:
      PACKPIPE_CHECK(size == base || size == with_modes,
                     "{}: file size does not match the header (S={}, D={}): expected {} bytes "
                     "(without modes) or {} bytes (with modes), found {}",
                     name, S, D, base, with_modes, size);
      // S == 0: both formulas agree; report no modes.
      modes = size == with_modes && S > 0;
      break;
    case ModesPolicy::Present:
      PACKPIPE_CHECK(size == with_modes,
                     "{}: file size does not match the header (S={}, D={}) with sequence modes: "
                     "expected {} bytes, found {}",
                     name, S, D, with_modes, size);
      modes = true;
      break;
    case ModesPolicy::Absent:
      PACKPIPE_CHECK(size == base,
                     "{}: file size does not match the header (S={}, D={}) without sequence "
                     "modes: expected {} bytes, found {}",
                     name, S, D, base, size);
      break;
  }
  v.num_sequences = S;
  v.num_documents = D - 1;
  v.sizes = b.array<std::int32_t>(kMmidxHeader, S);
  v.pointers = b.array<std::int64_t>(kMmidxHeader + 4 * S, S);
  v.doc_idx = b.array<std::int64_t>(doc_off, D);
  v.has_modes = modes;
  if (modes) v.modes = b.array<std::int8_t>(base, S);
  const std::int64_t first_doc = v.doc_idx[0], last_doc = v.doc_idx[D - 1];
  PACKPIPE_CHECK(first_doc == 0, "{}: doc_idx[0] at offset {}: expected 0, found {}", name, doc_off, first_doc);
  PACKPIPE_CHECK(last_doc == static_cast<std::int64_t>(S),
                 "{}: doc_idx[{}] at offset {}: expected {} (the sequence count), found {}", name,
                 D - 1, doc_off + 8 * (D - 1), S, last_doc);
  const std::int64_t first_pointer = S == 0 ? 0 : v.pointers[0];
  PACKPIPE_CHECK(first_pointer == 0, "{}: pointers[0] at offset {}: expected 0, found {}",
                 name, kMmidxHeader + 4 * S, first_pointer);
  return v;
}

IndexView parse_tntidx(const std::uint8_t* data, std::uint64_t size, const std::string& name,
                       ModesPolicy policy) {
  PACKPIPE_CHECK(policy != ModesPolicy::Present,
                 "{}: legacy TNTIDX index has no sequence modes, but modes were required", name);
  PACKPIPE_CHECK(size >= kTntHeader, "{}: truncated TNTIDX header: expected at least {} bytes, found {}",
                 name, kTntHeader, size);
  IndexView v;
  v.format = IndexFormat::TNTIDX;
  v.version = load<std::uint64_t>(data + 8);
  PACKPIPE_CHECK(v.version == 1, "{}: unsupported TNTIDX version at offset 8: expected 1, found {}",
                 name, v.version);
  v.dtype = dtype_from_code(load<std::uint64_t>(data + 16), name + " at offset 16");
  const std::uint64_t item = dtype_size(v.dtype);
  const std::uint64_t elem = load<std::uint64_t>(data + 24);
  PACKPIPE_CHECK(elem == item, "{}: element size at offset 24: expected {} (dtype {}), found {}", name,
                 item, dtype_name(v.dtype), elem);
  const std::uint64_t N = load<std::uint64_t>(data + 32);
  const std::uint64_t s = load<std::uint64_t>(data + 40);
  const std::uint64_t dc = load<std::uint64_t>(data + 48);
  PACKPIPE_CHECK(dc >= 1,
                 "{}: doc_idx length at offset 48: expected at least 1 (doc_idx starts with 0), "
                 "found 0",
                 name);
  const std::uint64_t n1 = size_expr(N, 1, 1, name, "the offsets arrays");
  const std::uint64_t data_off = size_expr(n1, 8, kTntHeader, name, "dim_offsets");
  const std::uint64_t sizes_off = size_expr(n1, 8, data_off, name, "data_offsets");
  const std::uint64_t doc_off = size_expr(s, 8, sizes_off, name, "sizes");
  const std::uint64_t expected = size_expr(dc, 8, doc_off, name, "doc_idx");
  PACKPIPE_CHECK(size == expected,
                 "{}: file size does not match the TNTIDX header (N={}, s={}, doc_count={}): "
                 "expected {} bytes, found {}",
                 name, N, s, dc, expected, size);
  const std::uint8_t* dim = data + kTntHeader;
  const std::uint8_t* dat = data + data_off;
  const std::uint8_t* dims = data + sizes_off;
  const std::uint8_t* docs = data + doc_off;
  PACKPIPE_CHECK(load<std::int64_t>(dim) == 0, "{}: dim_offsets[0] at offset {}: expected 0, found {}",
                 name, kTntHeader, load<std::int64_t>(dim));
  PACKPIPE_CHECK(load<std::int64_t>(dat) == 0, "{}: data_offsets[0] at offset {}: expected 0, found {}",
                 name, data_off, load<std::int64_t>(dat));
  v.owned_sizes.resize(N);
  v.owned_pointers.resize(N);
  for (std::uint64_t i = 0; i < N; ++i) {
    const std::int64_t d0 = load<std::int64_t>(dim + 8 * i);
    const std::int64_t d1 = load<std::int64_t>(dim + 8 * (i + 1));
    PACKPIPE_CHECK(d1 >= d0 && static_cast<std::uint64_t>(d1) <= s,
                   "{}: dim_offsets[{}] at offset {}: expected a value in [{}, {}], found {}", name,
                   i + 1, kTntHeader + 8 * (i + 1), d0, s, d1);
    const std::int64_t a0 = load<std::int64_t>(dat + 8 * i);
    const std::int64_t a1 = load<std::int64_t>(dat + 8 * (i + 1));
    PACKPIPE_CHECK(a1 >= a0 && a1 - a0 <= kInt32Max,
                   "{}: data_offsets[{}] at offset {}: expected a value in [{}, {}], found {}", name,
                   i + 1, data_off + 8 * (i + 1), a0, a0 + kInt32Max, a1);
    // Item length = product of its dims (one dim for Megatron's 1-D token items).
    std::int64_t product = 1;
    for (std::int64_t j = d0; j < d1; ++j) {
      const std::int64_t dj = load<std::int64_t>(dims + 8 * static_cast<std::uint64_t>(j));
      PACKPIPE_CHECK(dj >= 0 && !__builtin_mul_overflow(product, dj, &product),
                     "{}: sizes[{}] at offset {}: invalid dimension {} of item {}", name, j,
                     sizes_off + 8 * static_cast<std::uint64_t>(j), dj, i);
    }
    PACKPIPE_CHECK(product == a1 - a0,
                   "{}: item {}: sizes give {} elements but data_offsets give {} ({} - {})", name, i,
                   product, a1 - a0, a1, a0);
    std::int64_t ptr = 0;
    PACKPIPE_CHECK(!__builtin_mul_overflow(a0, static_cast<std::int64_t>(item), &ptr),
                   "{}: data_offsets[{}] = {} overflows as a byte offset", name, i, a0);
    v.owned_sizes[i] = static_cast<std::int32_t>(a1 - a0);
    v.owned_pointers[i] = ptr;
  }
  PACKPIPE_CHECK(load<std::int64_t>(dim + 8 * N) == static_cast<std::int64_t>(s),
                 "{}: dim_offsets[{}] at offset {}: expected {} (the sizes count), found {}", name, N,
                 kTntHeader + 8 * N, s, load<std::int64_t>(dim + 8 * N));
  v.owned_doc_idx.resize(dc);
  for (std::uint64_t k = 0; k < dc; ++k) v.owned_doc_idx[k] = load<std::int64_t>(docs + 8 * k);
  PACKPIPE_CHECK(v.owned_doc_idx[0] == 0, "{}: doc_idx[0] at offset {}: expected 0, found {}", name,
                 doc_off, v.owned_doc_idx[0]);
  PACKPIPE_CHECK(v.owned_doc_idx[dc - 1] == static_cast<std::int64_t>(N),
                 "{}: doc_idx[{}] at offset {}: expected {} (the item count), found {}", name, dc - 1,
                 doc_off + 8 * (dc - 1), N, v.owned_doc_idx[dc - 1]);
  v.num_sequences = N;
  v.num_documents = dc - 1;
  v.sizes = UnalignedArray<std::int32_t>(v.owned_sizes.data(), N);
  v.pointers = UnalignedArray<std::int64_t>(v.owned_pointers.data(), N);
  v.doc_idx = UnalignedArray<std::int64_t>(v.owned_doc_idx.data(), dc);
  return v;
}

// ---- buffered POSIX files for the builder ----------------------------------------------------

std::string os_error() { return std::strerror(errno); }

void write_all(int fd, const void* p, std::size_t n, const std::string& path) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    PACKPIPE_CHECK(w > 0, "{}: write of {} bytes failed: {}", path, n, os_error());
    b += w;
    n -= static_cast<std::size_t>(w);
  }
}

/// Append-only file with a small write buffer; removed on destruction unless keep() was called.
class SpillFile {
 public:
  /// A new file `<stem>-XXXXXX` (mkostemp: a name no existing file has, so a spill file never
  /// replaces anything, an input included).
  SpillFile(const std::string& stem, std::size_t capacity) : path_(stem + "-XXXXXX"), buf_(capacity) {
    fd_ = ::mkostemp(path_.data(), O_CLOEXEC);
    PACKPIPE_CHECK(fd_ >= 0, "{}: cannot create a temporary file: {}", stem, os_error());
  }
  /// Buffers writes into `out`'s temporary; `out` owns the file (its commit or removal).
  SpillFile(AtomicFile& out, std::size_t capacity)
      : path_(out.path()), buf_(capacity), fd_(out.fd()), owned_(false) {}
  ~SpillFile() {
    if (!owned_) return;
    if (fd_ >= 0) ::close(fd_);
    if (!keep_) ::unlink(path_.c_str());
  }
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  void append(const void* p, std::size_t n) {
    if (n == 0) return;  // p may be null for an empty sequence
    if (n >= buf_.size()) {
      flush();
      write_all(fd_, p, n, path_);
      return;
    }
    if (used_ + n > buf_.size()) flush();
    std::memcpy(buf_.data() + used_, p, n);
    used_ += n;
  }
  template <typename T>
  void put(T v) {
    append(&v, sizeof(T));
  }
  void flush() {
    if (used_ > 0) write_all(fd_, buf_.data(), used_, path_);
    used_ = 0;
  }
  void close() {
    flush();
    const int fd = fd_;
    fd_ = -1;
    if (!owned_) return;  // the AtomicFile closes it on commit
    PACKPIPE_CHECK(::close(fd) == 0, "{}: close failed: {}", path_, os_error());
  }
  /// Closes without flushing and removes the file; never throws.
  void discard() noexcept {
    if (!owned_) return;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
    keep_ = true;  // nothing left to remove
  }
  /// The file outlives this object.
  void keep() noexcept { keep_ = true; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::uint8_t> buf_;
  std::size_t used_ = 0;
  int fd_ = -1;
  bool owned_ = true;
  bool keep_ = false;
};

/// Appends the whole file `src` to `dst` in fixed-size chunks.
void append_file(SpillFile& dst, const std::string& src, std::vector<std::uint8_t>& chunk) {
  const int fd = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  PACKPIPE_CHECK(fd >= 0, "{}: cannot open: {}", src, os_error());
  for (;;) {
    const ssize_t r = ::read(fd, chunk.data(), chunk.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string err = os_error();
      ::close(fd);
      PACKPIPE_THROW(Error, "{}: read failed: {}", src, err);
    }
    if (r == 0) break;
    dst.append(chunk.data(), static_cast<std::size_t>(r));
  }
  ::close(fd);
}

constexpr std::size_t kSpillBuffer = 64 * 1024;
constexpr std::size_t kBinBuffer = 1024 * 1024;
constexpr std::size_t kCopyChunk = 1024 * 1024;

}  // namespace

namespace {

IndexView parse_bytes(const Bytes& b, const std::string& name, ModesPolicy modes) {
  const std::uint64_t size = b.size;
  PACKPIPE_CHECK(size > 0, "{}: truncated header: expected at least {} bytes, found 0", name,
                 kMmidxHeader);
  PACKPIPE_CHECK(b.data != nullptr, "{}: no data for {} bytes", name, size);
  std::uint8_t head[sizeof(kMmidxMagic)] = {};
  const std::uint64_t shown = std::min<std::uint64_t>(size, sizeof(kMmidxMagic));
  b.copy(0, shown, head);
  if (shown == sizeof(kMmidxMagic) && std::memcmp(head, kMmidxMagic, sizeof(kMmidxMagic)) == 0) {
    return parse_mmidx(b, name, modes);
  }
  if (shown >= sizeof(kTntMagic) && std::memcmp(head, kTntMagic, sizeof(kTntMagic)) == 0) {
    if (b.file == nullptr) return parse_tntidx(b.data, size, name, modes);
    // The legacy format is converted on parse (O(S)): from one guarded copy of the whole file.
    std::vector<std::uint8_t> copy(size);
    b.copy(0, size, copy.data());
    return parse_tntidx(copy.data(), size, name, modes);
  }
  const bool prefix_of_magic =
      (shown < sizeof(kMmidxMagic) && std::memcmp(head, kMmidxMagic, shown) == 0) ||
      (shown < sizeof(kTntMagic) && std::memcmp(head, kTntMagic, shown) == 0);
  if (prefix_of_magic) {
    PACKPIPE_THROW(Error, "{}: truncated header: expected at least {} bytes, found {}", name,
                   kMmidxHeader, size);
  }
  PACKPIPE_THROW(Error, "{}: bad magic at offset 0: expected 'MMIDIDX\\0\\0' or 'TNTIDX\\0\\0', found '{}'",
                 name, escape_bytes(head, shown));
}

}  // namespace

IndexView parse_index(const std::uint8_t* data, std::uint64_t size, const std::string& name,
                      ModesPolicy modes) {
  return parse_bytes(Bytes{data, size, nullptr}, name, modes);
}

IndexView parse_index(const MappedFile& file, ModesPolicy modes) {
  return parse_bytes(Bytes{file.data(), file.size(), &file}, file.path(), modes);
}

// ---- IndexedDataset ----------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix) : IndexedDataset(prefix, Options{}) {}

IndexedDataset::IndexedDataset(const std::string& prefix, const Options& options) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx";
  idx_file_ = std::make_unique<MappedFile>(idx_path);
  index_ = parse_index(*idx_file_, options.modes);
  if (!index_.pointers.guarded()) {
    idx_file_.reset();  // TNTIDX: converted into memory on parse; nothing is read from the map again
  } else {
    // The sizes, read by every length query (sampling, planning), are copied once (4 bytes a
    // sequence) with one guarded copy; the size pass below reads the copy.
    index_.owned_sizes.resize(index_.num_sequences);
    index_.sizes.copy(0, index_.num_sequences, index_.owned_sizes.data());
    index_.sizes = UnalignedArray<std::int32_t>(index_.owned_sizes.data(), index_.num_sequences);
  }
  const std::string plain = prefix + ".bin";
  if (file_exists(plain) && !options.compressed) {
    bin_ = open_plain_bin(plain);
  } else {
    bin_ = open_bin(prefix);  // .bin.zst, or an Error naming both candidates
    compressed_ = true;
  }
  // O(1) check that the index and the data agree in size: the end of the last sequence.
  const std::uint64_t S = index_.num_sequences;
  const std::uint64_t item = itemsize();
  if (S == 0) {
    PACKPIPE_CHECK(bin_->size() == 0, "{}: index has no sequences, so {} should be empty: expected 0 bytes, found {}",
                   idx_path, bin_->path(), bin_->size());
    return;
  }
  const std::int64_t len = index_.sizes[S - 1];
  const std::int64_t ptr = index_.pointers[S - 1];
  PACKPIPE_CHECK(len >= 0, "{}: sequence {} has negative size {}", idx_path, S - 1, len);
  std::int64_t end = 0;
  PACKPIPE_CHECK(ptr >= 0 && !__builtin_add_overflow(ptr, len * static_cast<std::int64_t>(item), &end),
                 "{}: sequence {} has invalid pointer {}", idx_path, S - 1, ptr);
  PACKPIPE_CHECK(static_cast<std::uint64_t>(end) == bin_->size(),
                 "{}: data size mismatch: the last sequence ({}) ends at byte {} (pointer {} + {} "
                 "tokens x {} bytes), so {} should have {} bytes, found {}",
                 idx_path, S - 1, end, ptr, len, item, bin_->path(), end, bin_->size());
  // O(sequences) over the sizes alone (4 bytes each, no pointer reads): each size fits the data
  // and together they fill it exactly, so a corrupted size (0, or 2^31 - 1 on a small file) is
  // refused here, before a sampler or a partition uses it, rather than only by verify().
  if (!options.check_sizes) return;
  const std::uint64_t max_len = bin_->size() / item;
  std::uint64_t total = 0;
  for (std::uint64_t i = 0; i < S; ++i) {
    const std::int64_t n = index_.sizes[i];
    PACKPIPE_CHECK(n >= 0 && static_cast<std::uint64_t>(n) <= max_len,
                   "{}: sequence {}: size {} tokens, expected 0..{} (the tokens in {}); the index is corrupt "
                   "(`packpipe dataset verify {}` lists every problem)",
                   idx_path, i, n, max_len, bin_->path(), prefix);
    total += static_cast<std::uint64_t>(n);  // <= S * 2^31: no overflow
  }
  PACKPIPE_CHECK(total == max_len && bin_->size() % item == 0,
                 "{}: the sizes add up to {} tokens but {} holds {} bytes ({} tokens of {} bytes); the index is "
                 "corrupt (`packpipe dataset verify {}` lists every problem)",
                 idx_path, total, bin_->path(), bin_->size(), max_len, item, prefix);
}

IndexedDataset::~IndexedDataset() = default;
IndexedDataset::IndexedDataset(IndexedDataset&&) noexcept = default;
IndexedDataset& IndexedDataset::operator=(IndexedDataset&&) noexcept = default;

std::uint64_t IndexedDataset::num_tokens() const { return bin_->size() / itemsize(); }

std::uint32_t IndexedDataset::length(std::uint64_t i) const {
  PACKPIPE_CHECK_RANGE(i < size(), "{}.idx: sequence index {} out of range (dataset has {} sequences)",
                       prefix_, i, size());
  const std::int32_t len = index_.sizes[i];
  PACKPIPE_CHECK(len >= 0, "{}.idx: sequence {}: size expected >= 0, found {}", prefix_, i, len);
  return static_cast<std::uint32_t>(len);
}

std::uint64_t IndexedDataset::checked_pointer(std::uint64_t i) const {
  const std::int64_t item = static_cast<std::int64_t>(itemsize());
  const std::int64_t len = length(i);
  // pointers[i - 1] and pointers[i] in one guarded copy (the map's reads each cost a guard)
  std::int64_t ptrs[2] = {0, 0};
  if (i > 0) {
    index_.pointers.copy(i - 1, 2, ptrs);
  } else {
    index_.pointers.copy(0, 1, ptrs + 1);
  }
  const std::int64_t ptr = ptrs[1];
  std::int64_t expected = 0;
  if (i > 0) {
    const std::int64_t prev_len = index_.sizes[i - 1];
    const std::int64_t prev_ptr = ptrs[0];
    PACKPIPE_CHECK(prev_len >= 0, "{}.idx: sequence {}: size expected >= 0, found {}", prefix_, i - 1,
                   prev_len);
    PACKPIPE_CHECK(!__builtin_add_overflow(prev_ptr, prev_len * item, &expected),
                   "{}.idx: sequence {}: pointer {} + {} tokens overflows", prefix_, i - 1, prev_ptr,
                   prev_len);
  }
  // Bounds first: a wild pointer is reported as such, not only as a broken chain.
  const std::uint64_t bin_size = bin_->size();
  PACKPIPE_CHECK(ptr >= 0 && static_cast<std::uint64_t>(ptr) <= bin_size &&
                     static_cast<std::uint64_t>(len * item) <= bin_size - static_cast<std::uint64_t>(ptr),
                 "{}.idx: sequence {}: pointer {} + {} tokens x {} bytes is past the end of {} ({} bytes)",
                 prefix_, i, ptr, len, item, bin_->path(), bin_size);
  PACKPIPE_CHECK(ptr == expected,
                 "{}.idx: sequence {}: pointer expected {} ({}), found {}", prefix_, i, expected,
                 i == 0 ? std::string("first sequence") : fmt::format("end of sequence {}", i - 1), ptr);
  return static_cast<std::uint64_t>(ptr);
}

TokenSpan IndexedDataset::view(std::uint64_t i) const {
  const std::uint64_t ptr = checked_pointer(i);
  if (compressed_) {
    PACKPIPE_THROW(Unsupported, "{}: zero-copy view of sequence {} needs a plain .bin; use read()",
                   bin_->path(), i);
  }
  TokenSpan s;
  s.length = index_.sizes[i];
  s.dtype = dtype();
  s.data = bin_->data() == nullptr ? nullptr : bin_->data() + ptr;
  return s;
}

void IndexedDataset::read(std::uint64_t i, std::uint64_t offset, std::uint64_t length, void* out) const {
  const std::uint64_t ptr = checked_pointer(i);
  const std::uint64_t len = static_cast<std::uint64_t>(index_.sizes[i]);
  PACKPIPE_CHECK_RANGE(offset <= len && length <= len - offset,
                       "{}.idx: sequence {}: slice [{}, {} + {}) is outside its {} tokens", prefix_, i,
                       offset, offset, length, len);
  if (length == 0) return;
  bin_->read(ptr + offset * itemsize(), length * itemsize(), out);
}

std::vector<std::uint8_t> IndexedDataset::read(std::uint64_t i) const {
  const std::uint64_t len = length(i);
  std::vector<std::uint8_t> out(len * itemsize());
  read(i, 0, len, out.data());
  return out;
}

std::vector<VerifyProblem> IndexedDataset::verify(std::size_t max_problems) const {
  std::vector<VerifyProblem> problems;
  const std::string idx_path = prefix_ + ".idx";
  auto add = [&](const std::string& file, std::string msg) {
    if (problems.size() < max_problems) problems.push_back({file, std::move(msg)});
  };
  const std::uint64_t S = size();
  const std::uint64_t item = itemsize();
  std::uint64_t expected = 0;  // exclusive prefix sum of sizes x itemsize
  bool overflow = false;
  for (std::uint64_t i = 0; i < S && problems.size() < max_problems; ++i) {
    const std::int64_t len = index_.sizes[i];
    const std::int64_t ptr = index_.pointers[i];
    if (len < 0) add(idx_path, fmt::format("sequence {}: size expected >= 0, found {}", i, len));
    if (!overflow && (ptr < 0 || static_cast<std::uint64_t>(ptr) != expected)) {
      add(idx_path, fmt::format("sequence {}: pointer expected {} (prefix sum of sizes x {} bytes), found {}",
                                i, expected, item, ptr));
    }
    if (len > 0 && __builtin_add_overflow(expected, static_cast<std::uint64_t>(len) * item, &expected)) {
      add(idx_path, fmt::format("sequence {}: total data size overflows 64 bits", i));
      overflow = true;
    }
  }
  if (!overflow && expected != bin_->size()) {
    add(bin_->path(), fmt::format("data size: expected {} bytes (sum of sizes x {} bytes), found {}",
                                  expected, item, bin_->size()));
  }
  const std::uint64_t D = index_.doc_idx.size();
  std::int64_t prev = 0;
  for (std::uint64_t k = 0; k < D && problems.size() < max_problems; ++k) {
    const std::int64_t d = index_.doc_idx[k];
    if (k == 0 && d != 0) add(idx_path, fmt::format("doc_idx[0]: expected 0, found {}", d));
    if (d < prev) {
      add(idx_path, fmt::format("doc_idx[{}]: expected >= {} (non-decreasing), found {}", k, prev, d));
    }
    if (d < 0 || static_cast<std::uint64_t>(d) > S) {
      add(idx_path, fmt::format("doc_idx[{}]: expected a value in [0, {}], found {}", k, S, d));
    }
    prev = d;
  }
  if (D > 0 && index_.doc_idx[D - 1] != static_cast<std::int64_t>(S)) {
    add(idx_path, fmt::format("doc_idx[{}]: expected {} (the sequence count), found {}", D - 1, S,
                              index_.doc_idx[D - 1]));
  }
  if (problems.size() < max_problems) {
    try {
      bin_->verify();
    } catch (const std::exception& e) {
      add(bin_->path(), e.what());
    }
  }
  return problems;
}

// ---- IndexedDatasetBuilder ---------------------------------------------------------------------

// The .bin and the .idx are written to temporaries beside them (AtomicFile: each holds the
// output's lock, so a second builder of the same prefix fails at once) and renamed into place in
// finalize(); a builder that fails or is destroyed first leaves the previous dataset untouched.
struct IndexedDatasetBuilder::Impl {
  explicit Impl(const std::string& prefix, bool with_modes)
      : idx_path(prefix + ".idx"),
        bin_out(prefix + ".bin"),
        idx_out(prefix + ".idx"),
        bin(bin_out, kBinBuffer),
        sizes(prefix + ".idx.tmp-sizes", kSpillBuffer),
        pointers(prefix + ".idx.tmp-pointers", kSpillBuffer),
        doc_idx(prefix + ".idx.tmp-docidx", kSpillBuffer),
        modes(prefix + ".idx.tmp-modes", with_modes ? kSpillBuffer : 1) {}
  std::string idx_path;
  AtomicFile bin_out;
  AtomicFile idx_out;
  SpillFile bin;
  SpillFile sizes;
  SpillFile pointers;
  SpillFile doc_idx;
  SpillFile modes;
  std::uint64_t last_doc_end = 0;
  bool finalized = false;
  std::string failed;  ///< a call that failed part-way: the output holds a part of what it was to add

  /// Runs a call's body after checking the builder is usable (a refusal before anything is
  /// written leaves it as it was).
  template <typename F>
  void run(const std::string& prefix, const char* call, F&& body) {
    PACKPIPE_CHECK_ARG(!finalized, "{}: {} after finalize()", prefix, call);
    PACKPIPE_CHECK_ARG(failed.empty(), "{}: {} refused: an earlier call failed part-way ({}), so the dataset would "
                       "be incomplete; make a new builder", prefix, call, failed);
    body();
  }
  /// Runs what a call writes; a throw there leaves the builder unusable, naming the call:
  /// finalize() would write a dataset with a part of what the call was to add.
  template <typename F>
  void writing(const char* call, F&& write) {
    try {
      write();
    } catch (const std::exception& e) {
      failed = fmt::format("{}: {}", call, e.what());
      throw;
    }
  }
};

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& prefix, DType dtype, bool with_modes)
    : prefix_(prefix), dtype_(dtype), with_modes_(with_modes) {
  PACKPIPE_CHECK_ARG(is_valid_dtype_code(static_cast<std::uint64_t>(dtype)),
                     "{}: invalid dtype code {}", prefix, static_cast<int>(dtype));
  impl_ = std::make_unique<Impl>(prefix, with_modes);  // a failure removes what it created
  impl_->doc_idx.put<std::int64_t>(0);
}

// Without finalize() the Impl's files (the .bin and the spill files) remove themselves.
IndexedDatasetBuilder::~IndexedDatasetBuilder() = default;

void IndexedDatasetBuilder::add_item(const void* tokens, std::uint64_t count, std::int8_t mode) {
  impl_->run(prefix_, "add_item", [&] {
    PACKPIPE_CHECK_ARG(count <= static_cast<std::uint64_t>(kInt32Max),
                       "{}: sequence {} has {} tokens; Megatron sizes are int32 (at most {})", prefix_,
                       num_sequences_, count, kInt32Max);
    PACKPIPE_CHECK_ARG(count == 0 || tokens != nullptr, "{}: add_item: null tokens for {} tokens", prefix_,
                       count);
    const std::uint64_t bytes = count * dtype_size(dtype_);
    const std::uint64_t end = add_checked(bin_bytes_, bytes, "the .bin size");
    PACKPIPE_CHECK(end <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                   "{}.bin: size {} exceeds the int64 pointers of the format", prefix_, end);
    impl_->writing("add_item", [&] {
      impl_->bin.append(tokens, bytes);
      impl_->sizes.put<std::int32_t>(static_cast<std::int32_t>(count));
      impl_->pointers.put<std::int64_t>(static_cast<std::int64_t>(bin_bytes_));
      if (with_modes_) impl_->modes.put<std::int8_t>(mode);
    });
    bin_bytes_ = end;
    ++num_sequences_;
  });
}

void IndexedDatasetBuilder::end_document() {
  impl_->run(prefix_, "end_document", [&] {
    impl_->writing("end_document", [&] { impl_->doc_idx.put<std::int64_t>(static_cast<std::int64_t>(num_sequences_)); });
    impl_->last_doc_end = num_sequences_;
    ++num_documents_;
  });
}

void IndexedDatasetBuilder::add_document(const void* tokens, const std::int64_t* lengths,
                                         std::size_t num_sequences, const std::int8_t* modes) {
  PACKPIPE_CHECK_ARG(num_sequences == 0 || lengths != nullptr, "{}: add_document: null lengths", prefix_);
  const auto* p = static_cast<const std::uint8_t*>(tokens);
  for (std::size_t j = 0; j < num_sequences; ++j) {
    PACKPIPE_CHECK_ARG(lengths[j] >= 0, "{}: add_document: lengths[{}] = {} is negative", prefix_, j,
                       lengths[j]);
    const auto n = static_cast<std::uint64_t>(lengths[j]);
    add_item(p, n, modes != nullptr ? modes[j] : 0);
    if (n > 0) p += n * dtype_size(dtype_);
  }
  end_document();
}

void IndexedDatasetBuilder::add_index(const std::string& other_prefix) {
  impl_->run(prefix_, "add_index", [&] {
    // (the refusal keeps the builder from finishing too: it would write over the input it refused)
    impl_->writing("add_index", [&] { check_output_prefix_is_not_input(prefix_, {other_prefix}); });
    const IndexedDataset other(other_prefix);
    PACKPIPE_CHECK(other.dtype() == dtype_,
                   "cannot add '{}' to '{}': dtype {} differs from the builder's {}", other_prefix,
                   prefix_, dtype_name(other.dtype()), dtype_name(dtype_));
    PACKPIPE_CHECK(other.size() == 0 || other.has_modes() == with_modes_,
                   "cannot add '{}' to '{}': it {} sequence modes but the builder {}", other_prefix,
                   prefix_, other.has_modes() ? "has" : "has no",
                   with_modes_ ? "writes modes" : "writes none");
    const std::uint64_t S = other.size();
    const std::uint64_t base = bin_bytes_;
    const std::uint64_t seq_base = num_sequences_;
    const std::uint64_t other_bytes = other.bin().size();
    const std::uint64_t end = add_checked(base, other_bytes, "the merged .bin size");
    PACKPIPE_CHECK(end <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                   "{}.bin: size {} exceeds the int64 pointers of the format", prefix_, end);
    // The document index is checked before anything is written (O(documents)).
    const auto& docs = other.doc_idx();
    std::int64_t prev = 0;
    for (std::uint64_t k = 1; k < docs.size(); ++k) {
      const std::int64_t d = docs[k];
      PACKPIPE_CHECK(d >= prev && static_cast<std::uint64_t>(d) <= S,
                     "{}.idx: doc_idx[{}]: expected a value in [{}, {}], found {}", other_prefix, k, prev,
                     S, d);
      prev = d;
    }
    // Arrays are streamed element by element through the spill buffers: constant memory. (A
    // pointer out of its chain, or a failed read, is found part-way.)
    impl_->writing("add_index", [&] {
      for (std::uint64_t i = 0; i < S; ++i) {
        const std::uint32_t len = other.length(i);
        const std::uint64_t ptr = other.checked_pointer(i);  // chain-checked: equals the prefix sum
        impl_->sizes.put<std::int32_t>(static_cast<std::int32_t>(len));
        impl_->pointers.put<std::int64_t>(static_cast<std::int64_t>(base + ptr));
        if (with_modes_) impl_->modes.put<std::int8_t>(other.modes()[i]);
      }
      for (std::uint64_t k = 1; k < docs.size(); ++k) {
        impl_->doc_idx.put<std::int64_t>(static_cast<std::int64_t>(seq_base) + docs[k]);
      }
      std::vector<std::uint8_t> chunk(static_cast<std::size_t>(std::min<std::uint64_t>(kCopyChunk, other_bytes)));
      for (std::uint64_t off = 0; off < other_bytes;) {
        const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), other_bytes - off);
        other.bin().read(off, n, chunk.data());
        impl_->bin.append(chunk.data(), static_cast<std::size_t>(n));
        off += n;
      }
    });
    bin_bytes_ = end;
    num_sequences_ += S;
    num_documents_ += other.num_documents();
    if (other.num_documents() > 0) impl_->last_doc_end = seq_base + static_cast<std::uint64_t>(prev);
  });
}

void IndexedDatasetBuilder::finalize() {
  PACKPIPE_CHECK_ARG(!impl_->finalized, "{}: finalize() called twice", prefix_);
  PACKPIPE_CHECK_ARG(impl_->failed.empty(), "{}: finalize refused: an earlier call failed part-way ({}), so the "
                     "dataset would be incomplete; make a new builder", prefix_, impl_->failed);
  if (impl_->last_doc_end != num_sequences_) end_document();
  impl_->bin.close();
  impl_->sizes.close();
  impl_->pointers.close();
  impl_->doc_idx.close();
  impl_->modes.close();
  {
    SpillFile idx(impl_->idx_out, kSpillBuffer);
    idx.append(kMmidxMagic, sizeof(kMmidxMagic));
    idx.put<std::uint64_t>(1);
    idx.put<std::uint8_t>(static_cast<std::uint8_t>(dtype_));
    idx.put<std::uint64_t>(num_sequences_);
    idx.put<std::uint64_t>(num_documents_ + 1);
    std::vector<std::uint8_t> chunk(kSpillBuffer);
    append_file(idx, impl_->sizes.path(), chunk);
    append_file(idx, impl_->pointers.path(), chunk);
    append_file(idx, impl_->doc_idx.path(), chunk);
    if (with_modes_) append_file(idx, impl_->modes.path(), chunk);
    idx.close();
  }
  // The .bin first: between the two renames a reader sees the new .bin with the old .idx, which
  // open()'s size checks refuse, never an old .bin with a new index.
  impl_->bin_out.commit();
  impl_->idx_out.commit();
  impl_->finalized = true;
  impl_->sizes.discard();
  impl_->pointers.discard();
  impl_->doc_idx.discard();
  impl_->modes.discard();
}

std::vector<std::string> dataset_input_files(const std::string& prefix) {
  return {prefix + ".idx", prefix + ".bin", prefix + ".bin.zst"};
}

std::vector<OutputFile> dataset_output_files(const std::string& prefix, const std::string& what) {
  return {{prefix + ".bin", what}, {prefix + ".idx", what}};
}

void check_output_prefix_is_not_input(const std::string& out_prefix, const std::vector<std::string>& in_prefixes) {
  std::vector<std::string> inputs;
  for (const auto& in : in_prefixes) {
    for (auto& f : dataset_input_files(in)) inputs.push_back(std::move(f));
  }
  std::vector<OutputFile> outputs = dataset_output_files(out_prefix, "output dataset file");
  // a stale .bin.zst beside the output is not written, but it is no input either
  check_output_is_not_input(out_prefix + ".bin.zst", inputs, "output dataset file");
  check_command_files(inputs, outputs);
}

void merge_datasets(const std::vector<std::string>& inputs, const std::string& out_prefix) {
  PACKPIPE_CHECK_ARG(!inputs.empty(), "merge into '{}': no input datasets", out_prefix);
  check_output_prefix_is_not_input(out_prefix, inputs);  // before anything is opened for writing
  // Check every input first (O(1) each) so a mismatch fails before anything is written.
  DType dtype = DType::UInt16;
  bool modes = false;
  std::string modes_from;
  for (std::size_t j = 0; j < inputs.size(); ++j) {
    const IndexedDataset ds(inputs[j]);
    if (j == 0) {
      dtype = ds.dtype();
    } else {
      PACKPIPE_CHECK(ds.dtype() == dtype, "merge into '{}': '{}' has dtype {} but '{}' has dtype {}",
                     out_prefix, inputs[0], dtype_name(dtype), inputs[j], dtype_name(ds.dtype()));
    }
    if (ds.size() == 0) continue;  // an empty index cannot tell whether it has modes
    if (modes_from.empty()) {
      modes = ds.has_modes();
      modes_from = inputs[j];
    } else {
      PACKPIPE_CHECK(ds.has_modes() == modes,
                     "merge into '{}': '{}' {} sequence modes but '{}' {}", out_prefix, modes_from,
                     modes ? "has" : "has no", inputs[j], ds.has_modes() ? "has" : "has none");
    }
  }
  IndexedDatasetBuilder builder(out_prefix, dtype, modes);
  for (const auto& in : inputs) builder.add_index(in);
  builder.finalize();
}

}  // namespace packpipe::dataloader
