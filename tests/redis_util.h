// A real redis-server for the rendezvous tests: a child process on a free loopback port.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "daemon_util.h"

namespace troupe::testing {

// redis-server on 127.0.0.1, with no persistence, stopped (SIGTERM) by the destructor and killed
// with the test process. The constructor throws std::runtime_error when redis-server is missing or
// does not answer; tests must let that fail them, never skip.
class RedisServer {
 public:
  explicit RedisServer(std::string password = "") : password_(std::move(password)) {
    const std::string binary = findBinary();
    std::string last_error;
    for (int attempt = 0; attempt < 3; ++attempt) {
      port_ = freeLoopbackPort();
      pid_ = spawn(binary);
      if (waitUntilReady(last_error)) return;
      stop();
    }
    throw std::runtime_error("redis-server did not start: " + last_error);
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  uint16_t port() const { return port_; }
  const std::string& password() const { return password_; }

  // Empties every database.
  void flush() const {
    std::string error;
    auto* c = connect(error);
    if (c == nullptr) throw std::runtime_error("cannot flush redis-server: " + error);
    auto* reply = static_cast<redisReply*>(redisCommand(c, "FLUSHALL"));
    const bool ok = reply != nullptr && reply->type == REDIS_REPLY_STATUS;
    if (reply != nullptr) freeReplyObject(reply);
    redisFree(c);
    if (!ok) throw std::runtime_error("FLUSHALL failed");
  }

 private:
  static std::string findBinary() {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
    dirs += ":/usr/bin:/usr/sbin";
    size_t start = 0;
    while (start <= dirs.size()) {
      const auto end = std::min(dirs.find(':', start), dirs.size());
      const auto candidate = dirs.substr(start, end - start) + "/redis-server";
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
    throw std::runtime_error(
        "redis-server is not installed; run scripts/setup.sh (it installs Debian's redis-server)");
  }

  pid_t spawn(const std::string& binary) const {
    const std::string port = std::to_string(port_);
    const std::string dir = std::filesystem::temp_directory_path().string();
    std::vector<std::string> args = {binary,   "--port",     port,           "--bind", "127.0.0.1",
                                     "--save", "",           "--appendonly", "no",     "--dir",
                                     dir,      "--loglevel", "warning"};
    if (!password_.empty()) {
      args.push_back("--requirepass");
      args.push_back(password_);
    }
    return spawnDaemon(std::move(args), "/dev/null", SIGKILL);
  }

  redisContext* connect(std::string& error) const {
    auto* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{0, 200000});
    if (c == nullptr || c->err) {
      error = c != nullptr ? c->errstr : "out of memory";
      if (c != nullptr) redisFree(c);
      return nullptr;
    }
    if (!password_.empty()) {
      auto* reply = static_cast<redisReply*>(redisCommand(c, "AUTH %s", password_.c_str()));
      if (reply != nullptr) freeReplyObject(reply);
    }
    return c;
  }

  bool waitUntilReady(std::string& error) {
    const auto start = awaitDaemon(pid_, std::chrono::milliseconds(5), [&] {
      auto* c = connect(error);
      if (c == nullptr) return false;
      auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
      const bool pong = reply != nullptr && reply->type == REDIS_REPLY_STATUS;
      if (reply != nullptr) freeReplyObject(reply);
      redisFree(c);
      return pong;
    });
    if (start == DaemonStart::kExited) {
      error = "it exited early (port " + std::to_string(port_) + " taken?)";
      pid_ = -1;
    } else if (start == DaemonStart::kTimedOut) {
      error = "it did not answer PING within 10 s";
    }
    return start == DaemonStart::kReady;
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string password_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

// One password-less server shared by every test of the binary, started on first use.
inline RedisServer& sharedRedisServer() {
  static RedisServer server;
  return server;
}

}  // namespace troupe::testing
