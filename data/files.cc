#include "data/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "troupe/error.h"

namespace troupe::data {
namespace {

[[noreturn]] void cannot(std::string_view verb, std::string_view what, const std::string& path,
                         int error) {
  if (error == ENOENT || error == ENOTDIR) {
    throw InputError(detail::concat(what, " '", path, "' does not exist"));
  }
  throw InputError(
      detail::concat("cannot ", verb, " ", what, " '", path, "': ", std::strerror(error)));
}

void checkKind(const std::string& path, std::string_view what, mode_t mode) {
  if (!S_ISREG(mode)) {
    throw InputError(
        detail::concat(what, " '", path, "' is ", fileKind(mode), ", not a regular file"));
  }
}

}  // namespace

const char* fileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void checkRegularFile(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) cannot("open", what, path, errno);
  checkKind(path, what, st.st_mode);
}

std::string readRegularFile(const std::string& path, std::string_view what, std::uint64_t max_bytes,
                            std::string_view limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) cannot("open", what, path, errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) cannot("open", what, path, errno);
  checkKind(path, what, st.st_mode);
  const auto over = [&](std::uint64_t size) {
    const std::string shown =
        limit.empty() ? detail::concat(max_bytes, " bytes") : std::string(limit);
    return InputError(detail::concat(what, " '", path, "' is ", size, " bytes, over the ", shown,
                                     " it may hold"));
  };
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) throw over(st.st_size);
  // Room for what fstat reports and a little more (files in /proc report 0), grown while the
  // file goes on, up to one byte past the limit.
  const std::uint64_t cap = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  std::string bytes(static_cast<std::size_t>(st.st_size) + 4096, '\0');
  std::uint64_t size = 0;
  while (size < cap) {
    if (size == bytes.size())
      bytes.resize(static_cast<std::size_t>(std::min<std::uint64_t>(2 * bytes.size(), cap)));
    const ssize_t n = ::read(fd, bytes.data() + size, bytes.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) cannot("read", what, path, errno);
    if (n == 0) break;
    size += static_cast<std::uint64_t>(n);
  }
  if (size > max_bytes) throw over(size);
  bytes.resize(static_cast<std::size_t>(size));
  return bytes;
}

}  // namespace troupe::data
