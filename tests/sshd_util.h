// A real OpenSSH server on loopback for the ssh launcher's tests: a free port, a throwaway host key
// and a throwaway client key, no PAM, run as root in the foreground (`sshd -D -e -f CONFIG`).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli_util.h"
#include "daemon_util.h"

namespace troupe::testing {

inline bool acceptsConnections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

// Starts in the constructor (throws std::runtime_error with sshd's log when it cannot), stops in
// the destructor. Needs root and Debian's openssh-server (scripts/setup.sh).
class Sshd {
 public:
  Sshd() : dir_("sshd") {
    if (::geteuid() != 0) throw std::runtime_error("the sshd fixture must run as root");
    for (const char* key : {"host_key", "user_key"}) {
      const auto r = runCommand("ssh-keygen -q -t ed25519 -N '' -C troupe-test -f " + path(key));
      if (r.exit_code != 0) throw std::runtime_error("ssh-keygen failed: " + r.output);
    }
    std::filesystem::copy_file(path("user_key.pub"), path("authorized_keys"));
    std::filesystem::create_directories("/run/sshd");  // sshd's privilege separation folder
    for (int attempt = 0; attempt < 3 && pid_ < 0; ++attempt)
      start();
    if (pid_ < 0) throw std::runtime_error("sshd did not start:\n" + log());
  }
  ~Sshd() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Sshd(const Sshd&) = delete;
  Sshd& operator=(const Sshd&) = delete;

  int port() const { return port_; }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
  // The `troupe launch` flags that make its ssh client use the throwaway key.
  std::string launchFlags() const {
    return "--ssh-opt -i --ssh-opt " + path("user_key") +
           " --ssh-opt=-oUserKnownHostsFile=/dev/null";
  }
  // The same as a TROUPE_SSH_OPTS value.
  std::string sshOpts() const {
    return "-oIdentityFile=" + path("user_key") + " -oUserKnownHostsFile=/dev/null";
  }
  std::string log() const { return slurp(path("sshd.log")); }

 private:
  std::string path(const std::string& name) const { return dir_.str() + "/" + name; }

  void start() {
    port_ = freeLoopbackPort();
    std::ofstream(path("sshd_config"))
        << "Port " << port_ << "\nListenAddress 127.0.0.1\nHostKey " << path("host_key")
        << "\nAuthorizedKeysFile " << path("authorized_keys")
        << "\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
           "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPidFile none\n"
           "MaxStartups 100\nMaxSessions 100\nLogLevel INFO\n";
    const pid_t pid = spawnDaemon({"/usr/sbin/sshd", "-D", "-e", "-f", path("sshd_config")},
                                  path("sshd.log"), SIGTERM);
    switch (awaitDaemon(pid, std::chrono::milliseconds(20),
                        [&] { return acceptsConnections(port_); })) {
      case DaemonStart::kReady:
        pid_ = pid;
        return;
      case DaemonStart::kExited:  // maybe the port was taken
        return;
      case DaemonStart::kTimedOut:
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        return;
    }
  }

  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace troupe::testing
