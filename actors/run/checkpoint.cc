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
#include <fstream>
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

class Parser {
 public:
  Parser(const std::string& path, const std::string& bytes) : path_(path), bytes_(bytes) {}

  template <typename T>
  T value() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  const char* take(std::size_t n) {
    if (n > bytes_.size() - pos_) {
      throw InputError("checkpoint '" + path_ + "' is truncated (needed " + std::to_string(n) +
                       " more bytes at offset " + std::to_string(pos_) + ")");
    }
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  kernels::Tensor tensor() {
    const auto n = value<std::uint64_t>();
    if (n > (bytes_.size() - pos_) / sizeof(float)) {
      throw InputError("checkpoint '" + path_ + "' is truncated or corrupt (a tensor of " +
                       std::to_string(n) + " floats does not fit)");
    }
    auto t = kernels::Tensor::host({static_cast<std::int64_t>(n)});
    if (n) std::memcpy(t.f32(), take(n * sizeof(float)), n * sizeof(float));
    return t;
  }
  std::size_t pos() const { return pos_; }
  // Past the magic (already checked by the caller) and the format version, which must be ours.
  void header() {
    take(sizeof kMagic);
    const auto version = value<std::uint32_t>();
    if (version != kVersion) {
      throw InputError("checkpoint '" + path_ + "' has version " + std::to_string(version) +
                       ", this troupe reads version " + std::to_string(kVersion));
    }
  }

 private:
  const std::string& path_;
  const std::string& bytes_;
  std::size_t pos_ = 0;
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

// The state's floats from `checkpoint.state_file` into `sink`, a piece at a time, each checked as
// checkFinite checks a tensor.
void copyStateFile(const std::string& path, const std::string& file, Sink& sink) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(fmt::format("checkpoint '{}': cannot open its state's file '{}': {}", path, file,
                              std::strerror(errno)));
  }
  std::vector<float> piece(std::size_t{1} << 18);
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size % static_cast<off_t>(sizeof(float)) != 0) {
      throw IoError(
          fmt::format("checkpoint '{}': its state's file '{}' is not whole floats", path, file));
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
          throw IoError(fmt::format("checkpoint '{}': cannot read its state's file '{}': {}", path,
                                    file, r < 0 ? std::strerror(errno) : "cut short"));
        }
        got += static_cast<std::size_t>(r);
      }
      checkFinite(path, "optimizer state values", piece.data(), n, from, total);
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
    sink.tensor(checkpoint.weights);
    if (checkpoint.state.defined() || checkpoint.state_file.empty()) {
      sink.tensor(checkpoint.state);
    } else {
      copyStateFile(path, checkpoint.state_file, sink);
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

Checkpoint loadCheckpoint(const std::string& path) {
  const std::string bytes = data::readRegularFile(path, "checkpoint");
  if (bytes.size() < sizeof kMagic + 4 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    throw InputError("'" + path + "' is not a troupe checkpoint");
  }
  if (bytes.size() < sizeof kMagic + 4 + 4) {
    throw InputError("checkpoint '" + path + "' is truncated");
  }
  std::uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  const auto crc = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  if (crc != stored_crc) {
    throw InputError("checkpoint '" + path + "' is corrupt or truncated (checksum mismatch)");
  }
  const std::string body = bytes.substr(0, bytes.size() - 4);
  Parser p(path, body);
  p.header();
  Checkpoint ck;
  const auto meta_size = p.value<std::uint64_t>();
  if (meta_size > body.size()) throw InputError("checkpoint '" + path + "' is corrupt");
  ck.meta = parseMeta(path, std::string(p.take(meta_size), meta_size));
  ck.weights = p.tensor();
  ck.state = p.tensor();
  ck.buffers = p.tensor();
  if (p.pos() != body.size()) {
    throw InputError("checkpoint '" + path + "' has trailing bytes");
  }
  // Whole rows of the weights' size, as many as the meta names (one, SGD's, when it names none).
  const std::int64_t n = ck.weights.numel(), rows = ck.stateNames().size();
  if (ck.state.numel() != rows * n) {
    throw InputError(fmt::format(
        "checkpoint '{}' is inconsistent: {} weights but {} optimizer state values ({} rows "
        "named: {})",
        path, n, ck.state.numel(), rows, fmt::join(ck.stateNames(), ", ")));
  }
  return ck;
}

std::map<std::string, std::string> loadCheckpointMeta(const std::string& path) {
  data::checkRegularFile(path, "checkpoint");  // a FIFO would block the open
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open checkpoint '" + path + "'");
  constexpr std::size_t kHead = sizeof kMagic + sizeof(std::uint32_t) + sizeof(std::uint64_t);
  std::string head(kHead, '\0');
  in.read(head.data(), static_cast<std::streamsize>(kHead));
  if (static_cast<std::size_t>(in.gcount()) < sizeof kMagic ||
      std::memcmp(head.data(), kMagic, sizeof kMagic) != 0) {
    throw InputError("'" + path + "' is not a troupe checkpoint");
  }
  if (static_cast<std::size_t>(in.gcount()) < kHead) {
    throw InputError("checkpoint '" + path + "' is truncated");
  }
  Parser p(path, head);
  p.header();
  const auto meta_size = p.value<std::uint64_t>();
  if (meta_size > (1u << 20)) throw InputError("checkpoint '" + path + "' is corrupt");
  std::string meta(meta_size, '\0');
  in.read(meta.data(), static_cast<std::streamsize>(meta_size));
  if (static_cast<std::uint64_t>(in.gcount()) != meta_size) {
    throw InputError("checkpoint '" + path + "' is truncated");
  }
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
    const std::function<std::string(const std::map<std::string, std::string>& meta)>& accept) {
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
      return FoundCheckpoint{c.path, loadCheckpoint(c.path)};
    } catch (const Error& e) {
      spdlog::warn("passing over checkpoint {}: {}", c.path, e.what());
    }
  }
  return std::nullopt;
}

}  // namespace troupe::actors
