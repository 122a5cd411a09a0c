#include "actors/run/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <tuple>
#include <vector>

#include "data/files.h"
#include "troupe/error.h"

namespace troupe::actors {

namespace {

constexpr char kMagic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'C', 'K'};
constexpr std::uint32_t kVersion = 1;

void writeAll(int fd, const void* data, std::size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, p + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot write checkpoint '" + path + "': " + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
}

// A checkpoint's bytes written to its file as they come, with the CRC-32 of all of them.
class Sink {
 public:
  Sink(int fd, const std::string& path) : fd_(fd), path_(path) {}
  void write(const void* data, std::size_t size) {
    const auto* p = static_cast<const Bytef*>(data);
    for (std::size_t done = 0; done < size;) {  // zlib takes a uInt at a time
      const auto n = static_cast<uInt>(std::min<std::size_t>(size - done, std::size_t{1} << 30));
      crc_ = crc32(crc_, p + done, n);
      done += n;
    }
    writeAll(fd_, data, size, path_);
  }
  template <typename T>
  void value(T v) {
    write(&v, sizeof v);
  }
  void tensor(const kernels::Tensor& t) {
    const std::uint64_t n = t.defined() ? static_cast<std::uint64_t>(t.numel()) : 0;
    value(n);
    if (n) write(t.f32(), n * sizeof(float));
  }
  std::uint32_t crc() const { return static_cast<std::uint32_t>(crc_); }

 private:
  int fd_;
  const std::string& path_;
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

// A checkpoint file read where it lies: its whole CRC-32 checked first (a pass through a buffer),
// then its parts read at their offsets straight into their tensors, so that loading holds nothing
// but what it returns. Every read is refused past the body (the CRC's 4 bytes end the file).
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {
    data::checkRegularFile(path, "checkpoint");  // a FIFO would block the open
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0) {
      const int error = errno;
      if (fd_ >= 0) ::close(fd_);
      throw InputError("cannot open checkpoint '" + path + "': " + std::strerror(error));
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~Reader() { ::close(fd_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The magic; reads may go up to the end of the file (no checksum checked: the meta's reader).
  void magic() {
    char magic[sizeof kMagic] = {};
    if (size_ >= sizeof kMagic) readAt(0, magic, sizeof magic);
    if (size_ < sizeof kMagic || std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
      throw InputError("'" + path_ + "' is not a troupe checkpoint");
    }
    body_ = size_;
  }
  // The magic, then the CRC of everything before the last 4 bytes against them; reads end there.
  void verify() {
    magic();
    if (size_ < sizeof kMagic + 4 + 4) throw InputError("checkpoint '" + path_ + "' is truncated");
    body_ = size_ - 4;
    std::vector<char> piece(static_cast<std::size_t>(std::min<std::uint64_t>(body_, 1 << 20)));
    uLong crc = crc32(0L, Z_NULL, 0);
    for (std::uint64_t at = 0; at < body_;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), body_ - at));
      readAt(at, piece.data(), n);
      crc = crc32(crc, reinterpret_cast<const Bytef*>(piece.data()), static_cast<uInt>(n));
      at += n;
    }
    std::uint32_t stored = 0;
    readAt(body_, &stored, sizeof stored);
    if (static_cast<std::uint32_t>(crc) != stored) {
      throw InputError("checkpoint '" + path_ + "' is corrupt or truncated (checksum mismatch)");
    }
  }

  template <typename T>
  T value() {
    T v;
    take(&v, sizeof v);
    return v;
  }
  void take(void* out, std::uint64_t n) {
    need(n);
    readAt(pos_, out, n);
    pos_ += n;
  }
  // The count of a tensor's floats that follows, checked to fit.
  std::uint64_t floats() {
    const auto n = value<std::uint64_t>();
    if (n > (body_ - pos_) / sizeof(float)) {
      throw InputError("checkpoint '" + path_ + "' is truncated or corrupt (a tensor of " +
                       std::to_string(n) + " floats does not fit)");
    }
    return n;
  }
  // The `n` floats that follow (their count read already: floats()).
  kernels::Tensor floatsOf(std::int64_t n) {
    auto t = kernels::Tensor::host({n});
    take(t.f32(), static_cast<std::uint64_t>(n) * sizeof(float));
    return t;
  }
  kernels::Tensor tensor() { return floatsOf(static_cast<std::int64_t>(floats())); }
  // Of the `rows` rows of `columns` floats that follow (their count read already), columns
  // [begin, end) of each row, one row after another; the rest is passed over.
  kernels::Tensor columns(std::int64_t rows, std::int64_t columns, std::int64_t begin,
                          std::int64_t end) {
    const std::uint64_t at = pos_;
    const std::int64_t width = end - begin;
    auto t = kernels::Tensor::host({rows * width});
    for (std::int64_t r = 0; r < rows; ++r) {
      readAt(at + static_cast<std::uint64_t>(r * columns + begin) * sizeof(float),
             t.f32() + r * width, static_cast<std::uint64_t>(width) * sizeof(float));
    }
    pos_ = at + static_cast<std::uint64_t>(rows * columns) * sizeof(float);
    return t;
  }
  std::uint64_t pos() const { return pos_; }
  std::uint64_t body() const { return body_; }
  // Past the magic (already checked by verify) and the format version, which must be ours.
  void header() {
    pos_ = sizeof kMagic;
    const auto version = value<std::uint32_t>();
    if (version != kVersion) {
      throw InputError("checkpoint '" + path_ + "' has version " + std::to_string(version) +
                       ", this troupe reads version " + std::to_string(kVersion));
    }
  }

 private:
  void need(std::uint64_t n) const {
    if (n > body_ - pos_) {
      throw InputError("checkpoint '" + path_ + "' is truncated (needed " + std::to_string(n) +
                       " more bytes at offset " + std::to_string(pos_) + ")");
    }
  }
  void readAt(std::uint64_t at, void* out, std::uint64_t n) const {
    auto* p = static_cast<char*>(out);
    for (std::uint64_t done = 0; done < n;) {
      const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw IoError("cannot read checkpoint '" + path_ + "': " + std::strerror(errno));
      if (r == 0) throw InputError("checkpoint '" + path_ + "' is truncated");
      done += static_cast<std::uint64_t>(r);
    }
  }

  const std::string& path_;
  int fd_ = -1;
  std::uint64_t size_ = 0, body_ = 0, pos_ = 0;
};

std::map<std::string, std::string> parseMeta(const std::string& path, const std::string& text) {
  std::map<std::string, std::string> meta;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) throw InputError("checkpoint '" + path + "' is corrupt");
    meta[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return meta;
}

// "name.ckpt.tmp.123" -> 123; 0 for any other name.
pid_t temporaryWriter(const std::string& name) {
  constexpr std::string_view kTmp = ".ckpt.tmp.";
  const auto at = name.rfind(kTmp);
  if (at == std::string::npos) return 0;
  const std::string digits = name.substr(at + kTmp.size());
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  return static_cast<pid_t>(std::stol(digits));
}

template <typename T>
T metaValue(const std::map<std::string, std::string>& meta, const std::string& key,
            const char* kind) {
  auto it = meta.find(key);
  if (it == meta.end()) throw InputError("checkpoint has no '" + key + "'");
  const std::string& text = it->second;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw InputError("checkpoint's '" + key + "' is '" + text + "', not " + kind);
  }
  return value;
}

// Throws unless every value of `t` is finite: a diverged run must not leave a checkpoint that a
// resume would load.
// `v` holds elements [from, from + n) of `total`.
void checkFinite(const std::string& path, const char* what, const float* v, std::int64_t n,
                 std::int64_t from, std::int64_t total) {
  float sum = 0;  // inf or NaN anywhere makes the sum non-finite: one pass, vectorisable
  for (std::int64_t i = 0; i < n; ++i)
    sum += v[i] * 0.0f;
  if (std::isfinite(sum)) return;
  const auto bad = std::find_if(v, v + n, [](float x) { return !std::isfinite(x); }) - v;
  throw NumericError(fmt::format(
      "not writing checkpoint '{}': its {} hold a non-finite value ({} at index {} of {}); the "
      "run diverged",
      path, what, v[bad], from + bad, total));
}
void checkFinite(const std::string& path, const char* what, const kernels::Tensor& t) {
  if (t.defined()) checkFinite(path, what, t.f32(), t.numel(), 0, t.numel());
}

// The floats of `file` (the state's, Checkpoint::state_file, or the weights') into `sink`, a piece
// at a time, each checked as checkFinite checks a tensor; errors name the file as `whose` ("its
// state's") and its values as `what`.
void copyFile(const std::string& path, const std::string& file, Sink& sink, const char* whose,
              const char* what) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(fmt::format("checkpoint '{}': cannot open {} file '{}': {}", path, whose, file,
                              std::strerror(errno)));
  }
  std::vector<float> piece(std::size_t{1} << 18);
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size % static_cast<off_t>(sizeof(float)) != 0) {
      throw IoError(
          fmt::format("checkpoint '{}': {} file '{}' is not whole floats", path, whose, file));
    }
    const std::int64_t total = st.st_size / static_cast<off_t>(sizeof(float));
    sink.value(static_cast<std::uint64_t>(total));
    for (std::int64_t from = 0; from < total;) {
      const auto n = std::min<std::int64_t>(total - from, static_cast<std::int64_t>(piece.size()));
      const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
      for (std::size_t got = 0; got < bytes;) {
        const ssize_t r = ::pread(fd, reinterpret_cast<char*>(piece.data()) + got, bytes - got,
                                  static_cast<off_t>(from * 4 + static_cast<std::int64_t>(got)));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          throw IoError(fmt::format("checkpoint '{}': cannot read {} file '{}': {}", path, whose,
                                    file, r < 0 ? std::strerror(errno) : "cut short"));
        }
        got += static_cast<std::size_t>(r);
      }
      checkFinite(path, what, piece.data(), n, from, total);
      sink.write(piece.data(), bytes);
      from += n;
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

// Moves `tmp` to `path` unless `path` exists, atomically: of two writers of one name, exactly one
// succeeds and the other gets an IoError (a check before a rename would let both "succeed").
void publishNoReplace(const std::string& tmp, const std::string& path) {
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return;
  int error = errno;
  if (error == EINVAL || error == ENOSYS) {
    // A file system without RENAME_NOREPLACE: link() refuses an existing name just as atomically.
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
      return;
    }
    error = errno;
  }
  ::unlink(tmp.c_str());
  if (error == EEXIST) {
    throw IoError("checkpoint '" + path +
                  "' was written by another process meanwhile; not replacing it (do two runs "
                  "share one checkpoint folder and run id?)");
  }
  throw IoError("cannot publish '" + tmp + "' as '" + path + "': " + std::strerror(error));
}

}  // namespace

std::int64_t Checkpoint::metaInt(const std::string& key) const {
  return metaValue<std::int64_t>(meta, key, "an integer");
}

std::string Checkpoint::optimizer() const {
  const auto it = meta.find("optimizer");
  return it == meta.end() ? "sgd" : it->second;
}

std::vector<std::string> Checkpoint::stateNames() const {
  const auto it = meta.find("optimizer_state");
  if (it == meta.end()) return {"momentum_buffer"};
  std::vector<std::string> names;
  std::string::size_type at = 0;
  while (at <= it->second.size()) {
    const auto comma = std::min(it->second.find(',', at), it->second.size());
    names.push_back(it->second.substr(at, comma - at));
    at = comma + 1;
  }
  return names;
}

double Checkpoint::metaDouble(const std::string& key) const {
  return metaValue<double>(meta, key, "a number");
}

void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  namespace fs = std::filesystem;
  checkFinite(path, "weights", checkpoint.weights);
  checkFinite(path, "optimizer state values", checkpoint.state);
  checkFinite(path, "buffers", checkpoint.buffers);
  // Cheap early refusal; publishNoReplace is what makes two writers of one name safe.
  if (fs::exists(path)) throw IoError("checkpoint '" + path + "' exists; not replacing it");
  std::string meta;
  for (const auto& [k, v] : checkpoint.meta)
    meta += k + "=" + v + "\n";

  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // a dead writer that had our pid
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw IoError("cannot create checkpoint '" + tmp + "': " + std::strerror(errno));
  }
  try {
    Sink sink(fd, tmp);
    sink.write(kMagic, sizeof kMagic);
    sink.value(kVersion);
    sink.value(static_cast<std::uint64_t>(meta.size()));
    sink.write(meta.data(), meta.size());
    if (checkpoint.weights.defined() || checkpoint.weights_file.empty()) {
      sink.tensor(checkpoint.weights);
    } else {
      copyFile(path, checkpoint.weights_file, sink, "its weights'", "weights");
    }
    if (checkpoint.state.defined() || checkpoint.state_file.empty()) {
      sink.tensor(checkpoint.state);
    } else {
      copyFile(path, checkpoint.state_file, sink, "its state's", "optimizer state values");
    }
    sink.tensor(checkpoint.buffers);
    const std::uint32_t crc = sink.crc();
    writeAll(fd, &crc, sizeof crc, tmp);
    if (::fsync(fd) != 0) throw IoError("cannot fsync '" + tmp + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  publishNoReplace(tmp, path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

StateFile::StateFile(std::string path, std::int64_t rows, std::int64_t columns)
    : path_(std::move(path)), rows_(rows), columns_(columns) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw IoError(fmt::format("cannot create the optimizer state's file '{}': {}", path_,
                              std::strerror(errno)));
  }
  if (::ftruncate(fd_, static_cast<off_t>(rows * columns * 4)) != 0) {
    const int error = errno;
    ::close(fd_);
    ::unlink(path_.c_str());
    throw IoError(fmt::format("cannot size the optimizer state's file '{}': {}", path_,
                              std::strerror(error)));
  }
}

StateFile::~StateFile() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

void StateFile::write(std::int64_t begin, std::int64_t end, std::int64_t offset,
                      const float* values, std::int64_t n) {
  const std::int64_t width = end - begin;
  TROUPE_ENFORCE(
      begin >= 0 && width > 0 && end <= columns_ && offset >= 0 && offset + n <= rows_ * width,
      "state file: elements ", offset, " + ", n, " of the shard [", begin, ", ", end, ") of ",
      rows_, " rows of ", columns_);
  while (n > 0) {
    const std::int64_t row = offset / width, column = offset % width;
    const std::int64_t m = std::min(n, width - column);
    const auto bytes = static_cast<std::size_t>(m) * sizeof(float);
    const auto at = static_cast<off_t>((row * columns_ + begin + column) * 4);
    for (std::size_t done = 0; done < bytes;) {
      const ssize_t w = ::pwrite(fd_, reinterpret_cast<const char*>(values) + done, bytes - done,
                                 at + static_cast<off_t>(done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        throw IoError(fmt::format("cannot write the optimizer state's file '{}': {}", path_,
                                  std::strerror(errno)));
      }
      done += static_cast<std::size_t>(w);
    }
    values += m;
    offset += m;
    n -= m;
  }
}

Checkpoint loadCheckpoint(const std::string& path,
                          std::optional<std::pair<std::int64_t, std::int64_t>> state_columns) {
  Reader file(path);
  file.verify();
  file.header();
  Checkpoint ck;
  const auto meta_size = file.value<std::uint64_t>();
  if (meta_size > file.body()) throw InputError("checkpoint '" + path + "' is corrupt");
  std::string meta(meta_size, '\0');
  file.take(meta.data(), meta_size);
  ck.meta = parseMeta(path, meta);
  ck.weights = file.tensor();
  // Whole rows of the weights' size, as many as the meta names (one, SGD's, when it names none).
  const std::int64_t n = ck.weights.numel(), rows = ck.stateNames().size();
  const auto count = static_cast<std::int64_t>(file.floats());
  if (count != rows * n) {
    throw InputError(fmt::format(
        "checkpoint '{}' is inconsistent: {} weights but {} optimizer state values ({} rows "
        "named: {})",
        path, n, count, rows, fmt::join(ck.stateNames(), ", ")));
  }
  if (state_columns) {
    const auto [begin, end] = *state_columns;
    TROUPE_ENFORCE(0 <= begin && begin <= end && end <= n, "columns [", begin, ", ", end,
                   ") of checkpoint '", path, "''s state, whose rows hold ", n);
    ck.state = file.columns(rows, n, begin, end);
  } else {
    ck.state = file.floatsOf(count);
  }
  ck.buffers = file.tensor();
  if (file.pos() != file.body()) {
    throw InputError("checkpoint '" + path + "' has trailing bytes");
  }
  return ck;
}

std::map<std::string, std::string> loadCheckpointMeta(const std::string& path) {
  Reader file(path);
  file.magic();
  file.header();
  const auto meta_size = file.value<std::uint64_t>();
  if (meta_size > (1u << 20)) throw InputError("checkpoint '" + path + "' is corrupt");
  std::string meta(meta_size, '\0');
  file.take(meta.data(), meta_size);
  return parseMeta(path, meta);
}

std::vector<std::string> removeStaleTemporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const pid_t writer = temporaryWriter(it->path().filename().string());
    if (writer <= 0 || !it->is_regular_file(ec)) continue;
    if (::kill(writer, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code rm;
    if (fs::remove(it->path(), rm)) removed.push_back(it->path().string());
  }
  return removed;
}

std::optional<FoundCheckpoint> findLatestCheckpoint(
    const std::string& dir,
    const std::function<std::string(const std::map<std::string, std::string>& meta)>& accept,
    std::optional<std::pair<std::int64_t, std::int64_t>> state_columns) {
  namespace fs = std::filesystem;
  struct Candidate {
    std::int64_t step;
    fs::file_time_type time;
    std::string path;
  };
  std::vector<Candidate> candidates;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".ckpt" || !it->is_regular_file(ec)) continue;
    const std::string path = it->path().string();
    try {
      const auto meta = loadCheckpointMeta(path);
      if (const std::string why = accept(meta); !why.empty()) {
        spdlog::info("passing over checkpoint {}: {}", path, why);
        continue;
      }
      const auto step = meta.find("step");
      if (step == meta.end()) throw InputError("checkpoint '" + path + "' has no 'step'");
      std::error_code time_ec;
      candidates.push_back({std::stoll(step->second), it->last_write_time(time_ec), path});
    } catch (const std::exception& e) {
      spdlog::warn("passing over checkpoint {}: {}", path, e.what());
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.step, a.time, a.path) > std::tie(b.step, b.time, b.path);
  });
  for (const auto& c : candidates) {
    try {
      return FoundCheckpoint{c.path, loadCheckpoint(c.path, state_columns)};
    } catch (const Error& e) {
      spdlog::warn("passing over checkpoint {}: {}", c.path, e.what());
    }
  }
  return std::nullopt;
}

}  // namespace troupe::actors
