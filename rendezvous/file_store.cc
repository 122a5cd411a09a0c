#include "rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "rendezvous/store_util.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxEncodedKey = 200;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)), name_("file store " + dir_) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw IoError(fmt::format("{}: cannot create the folder: {}", name_,
                                ec ? ec.message() : "not a directory"));
    }
    std::random_device random;
    tag_ = fmt::format("{}.{:08x}", ::getpid(), random());
  }

  void set(const std::string& key, std::string_view value) override {
    writeAtomically(pathOf(key), value);
  }

  std::string get(const std::string& key, milliseconds timeout) override {
    const auto path = pathOf(key);
    detail::Backoff backoff(Clock::now() + timeout);
    do {
      if (auto value = tryRead(path)) return *value;
    } while (backoff.sleep());
    detail::throwWaitTimeout(name_, timeout, {key});
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const auto path = pathOf(key);
    const auto lock_path = dir_ + "/.lock." + encode(key);
    Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (lock.get() < 0) fail("open", lock_path);
    struct flock request {};
    request.l_type = F_WRLCK;
    request.l_whence = SEEK_SET;
    while (::fcntl(lock.get(), F_OFD_SETLKW, &request) != 0) {
      if (errno != EINTR) fail("lock", lock_path);
    }
    int64_t value = 0;
    if (auto old = tryRead(path)) value = detail::parseCounter(name_, key, *old);
    if (__builtin_add_overflow(value, delta, &value)) {
      throw InputError(fmt::format("{}: adding {} to counter {} overflows", name_, delta,
                                   detail::quoteKeys({key})));
    }
    writeAtomically(path, std::to_string(value));
    return value;  // closing `lock` releases it
  }

  bool check(const std::vector<std::string>& keys) override { return missing(keys).empty(); }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    detail::Backoff backoff(Clock::now() + timeout);
    do {
      if (check(keys)) return;
    } while (backoff.sleep());
    detail::throwWaitTimeout(name_, timeout, missing(keys));
  }

  bool remove(const std::string& key) override {
    const auto path = pathOf(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    fail("remove", path);
  }

  std::string describe() const override { return name_; }

 private:
  std::string encode(const std::string& key) const {
    std::string out;
    for (unsigned char c : key) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-') {
        out += static_cast<char>(c);
      } else {
        out += fmt::format("%{:02X}", c);
      }
    }
    if (out.empty()) out = "%";  // the empty key
    if (out.size() > kMaxEncodedKey) {
      throw InputError(
          fmt::format("{}: key {} is too long for a file name ({} characters encoded, "
                      "at most {})",
                      name_, detail::quoteKeys({key}), out.size(), kMaxEncodedKey));
    }
    return out;
  }

  std::string pathOf(const std::string& key) const { return dir_ + "/" + encode(key); }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& key : keys) {
      const auto path = pathOf(key);
      struct stat st;
      if (::stat(path.c_str(), &st) == 0) continue;
      if (errno != ENOENT) fail("stat", path);
      out.push_back(key);
    }
    return out;
  }

  // The file's contents, or nothing when it does not exist.
  std::optional<std::string> tryRead(const std::string& path) const {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return std::nullopt;
      fail("open", path);
    }
    std::string out;
    char buffer[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
      if (n > 0) {
        out.append(buffer, static_cast<size_t>(n));
      } else if (n == 0) {
        return out;
      } else if (errno != EINTR) {
        fail("read", path);
      }
    }
  }

  void writeAtomically(const std::string& path, std::string_view value) const {
    const auto tmp = fmt::format("{}/.tmp.{}.{}", dir_, tag_, counter_.fetch_add(1));
    {
      Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (fd.get() < 0) fail("create", tmp);
      while (!value.empty()) {
        const ssize_t n = ::write(fd.get(), value.data(), value.size());
        if (n >= 0) {
          value.remove_prefix(static_cast<size_t>(n));
        } else if (errno != EINTR) {
          const int error = errno;
          ::unlink(tmp.c_str());
          errno = error;
          fail("write", tmp);
        }
      }
      // NFS reports some write errors only on close.
      if (::close(fd.release()) != 0) {
        const int error = errno;
        ::unlink(tmp.c_str());
        errno = error;
        fail("write", tmp);
      }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int error = errno;
      ::unlink(tmp.c_str());
      errno = error;
      fail("rename into", path);
    }
  }

  [[noreturn]] void fail(const char* what, const std::string& path) const {
    throw IoError(fmt::format("{}: cannot {} {}: {}", name_, what, path, std::strerror(errno)));
  }

  const std::string dir_;
  const std::string name_;
  std::string tag_;
  mutable std::atomic<uint64_t> counter_{0};
};

}  // namespace

std::unique_ptr<Store> openFileStore(const std::string& dir) {
  if (dir.empty()) throw InputError("file store: the folder must not be empty");
  return std::make_unique<FileStore>(dir);
}

}  // namespace troupe::rendezvous
