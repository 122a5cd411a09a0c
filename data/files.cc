#include "data/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "troupe/error.h"

namespace troupe::data {
namespace {

const char* kindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

struct stat regularFileStatus(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      throw InputError(detail::concat(what, " '", path, "' does not exist"));
    }
    throw IoError(detail::concat("cannot open ", what, " '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    throw InputError(
        detail::concat(what, " '", path, "' is not a regular file (", kindOf(st.st_mode), ")"));
  }
  return st;
}

}  // namespace

void checkRegularFile(const std::string& path, std::string_view what) {
  regularFileStatus(path, what);
}

std::string readRegularFile(const std::string& path, std::string_view what, std::uint64_t max_bytes,
                            std::string_view limit_name) {
  const auto size = static_cast<std::uint64_t>(regularFileStatus(path, what).st_size);
  if (size > max_bytes) {
    const std::string limit = limit_name.empty() ? "" : detail::concat(" (", limit_name, ")");
    throw InputError(detail::concat(what, " '", path, "' is ", size, " bytes, over the limit of ",
                                    max_bytes, limit));
  }
  // O_NONBLOCK: were it swapped for a FIFO since the stat, the open returns instead of waiting.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw IoError(detail::concat("cannot open ", what, " '", path, "': ", std::strerror(errno)));
  }
  std::string bytes(size, '\0');
  std::uint64_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, bytes.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      throw IoError(detail::concat("cannot read ", what, " '", path, "': ",
                                   n < 0 ? std::strerror(error) : "it shrank while it was read"));
    }
    got += static_cast<std::uint64_t>(n);
  }
  char more;
  const ssize_t extra = ::read(fd, &more, 1);
  ::close(fd);
  if (extra > 0) {
    throw IoError(detail::concat("cannot read ", what, " '", path, "': it grew while it was read"));
  }
  return bytes;
}

}  // namespace troupe::data
