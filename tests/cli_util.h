// Running the troupe binary from tests: its exit code and everything it printed.
#pragma once

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;
  std::chrono::duration<double> elapsed{};  // from start to exit
};

// Runs `command` with sh, stderr merged into stdout.
inline CommandResult runCommand(const std::string& command) {
  CommandResult r;
  const auto start = std::chrono::steady_clock::now();
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe))
    r.output += buffer.data();
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.elapsed = std::chrono::steady_clock::now() - start;
  return r;
}

// A loopback port that was free a moment ago (bound, read, released).
inline std::uint16_t freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A command for `troupe launch -- ...` that prints how long the run's secret (TROUPE_SECRET) is
// and on how many command lines of this host's processes it stands: "secret of 64 chars on 0
// command lines" when the launcher kept it off them. Only shell built-ins see the value.
inline std::string secretCensus() {
  return "bash -c 'n=0; for f in /proc/[0-9]*/cmdline; do c=$(tr \"\\0\" \" \" < $f "
         "2>/dev/null); case \"$c\" in *\"$TROUPE_SECRET\"*) n=$((n+1));; esac; done; "
         "echo secret of ${#TROUPE_SECRET} chars on $n command lines'";
}

inline std::string troupeBinary() {
  return TROUPE_BINARY;
}
inline std::string sourceDir() {
  return TROUPE_SOURCE_DIR;
}
// Fashion-MNIST converted by the setup_fashion_mnist test: <dir>/lmdb/{train,test}, leveldb too.
inline std::string testData(const std::string& db) {
  return std::string(TROUPE_TESTDATA) + "/" + db;
}
// The flags that train on that data's `db` (lmdb or leveldb) and test on it, with a leading space.
inline std::string dataFlags(const std::string& db = "lmdb") {
  return " --train_data " + testData(db) + "/train --test_data " + testData(db) +
         "/test --db_type " + db;
}

// Whether `text` holds `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Success when `output` holds every one of `parts`; else a failure naming those it lacks, then
// the output.
inline ::testing::AssertionResult containsAll(const std::string& output,
                                              const std::vector<std::string>& parts) {
  std::string missing;
  for (const auto& part : parts) {
    if (!contains(output, part)) missing += "missing: " + part + "\n";
  }
  if (missing.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << missing << "in:\n" << output;
}

// `r` exited with `code` and its output holds every one of `parts`; a failure names a wrong exit
// code and every part missing, then the output.
inline ::testing::AssertionResult exitedWith(const CommandResult& r, int code,
                                             const std::vector<std::string>& parts) {
  auto held = containsAll(r.output, parts);
  if (r.exit_code == code) return held;
  return ::testing::AssertionFailure() << "exit code " << r.exit_code << ", not " << code << "\n"
                                       << (held ? r.output : held.message());
}

// `r` exited other than 0 (a refusal or a failure) and its output holds every one of `parts`.
inline ::testing::AssertionResult failedWith(const CommandResult& r,
                                             const std::vector<std::string>& parts) {
  auto held = containsAll(r.output, parts);
  if (r.exit_code != 0) return held;
  return ::testing::AssertionFailure() << "exit code 0\n" << (held ? r.output : held.message());
}

// Byte-level token shards of English that every Debian system has (base-files' GPL-3 and Apache
// licence texts, about 50 kB), converted by `troupe convert text` into dir/data:
// lic_val_000000.bin and lic_train_000001.bin.
inline CommandResult convertLicenceTexts(const std::string& dir) {
  return runCommand(troupeBinary() +
                    " convert text /usr/share/common-licenses/GPL-3 "
                    "/usr/share/common-licenses/Apache-2.0 --out " +
                    dir + "/data --name lic");
}

// The whole of the file at `path`; "" when it cannot be read.
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh temporary folder, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ =
        std::filesystem::temp_directory_path() /
        ("troupe_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::filesystem::path path() const { return path_; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

}  // namespace troupe::testing
