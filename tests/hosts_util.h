// N hosts on this one machine for tests (tests/hosts/hosts.sh): network namespaces on a bridge of
// their own, each with private /tmp and /dev/shm and an sshd, so that troupe processes on
// different hosts meet only over TCP. Needs root, iproute2, util-linux, openssh-server (and
// python3 for delay or loss where the kernel has no netem); a missing piece fails the fixture
// with the script's message, never skips.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/launcher.h"
#include "cli_util.h"

namespace troupe::testing {

// The hosts exist from the constructor (which throws std::runtime_error with the script's output
// when they cannot be made, after the script removed what it made) to the destructor, which
// removes every namespace, link, bridge and process of them. Instances of test processes that
// died without their destructor are removed by the next constructor (`hosts.sh gc`). Host i's
// address is SUBNET.(i+2), its hostname "host<i>". Not thread-safe to construct; run, pathOn
// and the shaping calls may be used from several threads at once.
class Hosts {
 public:
  // `keep`: more folders that every host sees at their paths, read-only (hosts.sh up --keep);
  // the build and the checkout are always kept.
  explicit Hosts(int n, const std::vector<std::string>& keep = {})
      : n_(n), prefix_(uniquePrefix()) {
    std::string kept = keptFolders();
    for (const auto& dir : keep)
      kept += " --keep " + apps::shellQuote(dir);
    script("gc");  // leftovers of crashed test processes
    const auto up = runCommand(
        scriptCommand("up " + std::to_string(n) + " --owner " + std::to_string(::getpid()) + kept));
    if (up.exit_code != 0) {
      throw std::runtime_error("hosts.sh up " + std::to_string(n) + " --prefix " + prefix_ +
                               " failed (exit " + std::to_string(up.exit_code) + "):\n" +
                               up.output);
    }
    try {
      for (int i = 0; i < n; ++i)
        addresses_.push_back(script("addr " + std::to_string(i)));
      ssh_opts_ = script("ssh-opts");
      shared_ = script("shared");
    } catch (...) {
      runCommand(scriptCommand("down"));  // no destructor runs after a throwing constructor
      throw;
    }
  }
  ~Hosts() {
    const auto down = runCommand(scriptCommand("down"));
    if (down.exit_code != 0) {
      std::fprintf(stderr, "hosts.sh down --prefix %s failed:\n%s", prefix_.c_str(),
                   down.output.c_str());
    }
  }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  int size() const { return n_; }
  const std::string& prefix() const { return prefix_; }
  const std::string& address(int i) const { return addresses_.at(static_cast<size_t>(i)); }
  std::string hostname(int i) const { return "host" + std::to_string(i); }

  // Runs `command` with bash on host i, in `cwd` there, with this process's environment; stdout
  // and stderr together. After `timeout` the command's process group gets SIGTERM (SIGKILL 5 s
  // later), the exit code is 124 and the output ends with a line naming the host and the timeout.
  CommandResult run(int i, const std::string& command, std::chrono::seconds timeout,
                    const std::string& cwd = "/") const {
    auto r =
        runCommand("timeout -k 5 " + std::to_string(timeout.count()) + " " +
                   scriptCommand("exec " + std::to_string(i) + " --cwd " + apps::shellQuote(cwd) +
                                 " -- bash -c " + apps::shellQuote(command)));
    if (r.exit_code == 124 || r.exit_code == 137) {
      r.output += "\n[hosts] timed out after " + std::to_string(timeout.count()) +
                  " s waiting for host " + std::to_string(i) + " to run: " + command + "\n";
    }
    return r;
  }

  // `path` of host i's mount namespace (its private /tmp, say) as this process can open it.
  std::string pathOn(int i, const std::string& path) const {
    return script("root " + std::to_string(i)) + path;
  }

  // A folder every host sees at the same path (a cluster's shared storage, NFS say); removed
  // with the hosts. Everything else a test writes belongs in a host's private /tmp.
  const std::string& sharedDir() const { return shared_; }

  // ssh client options that log in to any host as root ("-i KEY -o...").
  const std::string& sshOpts() const { return ssh_opts_; }
  // The same as `troupe launch` flags (--ssh-opt=WORD each).
  std::string launchFlags() const {
    std::string flags;
    size_t start = 0;
    while (start < ssh_opts_.size()) {
      auto end = ssh_opts_.find(' ', start);
      if (end == std::string::npos) end = ssh_opts_.size();
      if (end > start) flags += " --ssh-opt=" + ssh_opts_.substr(start, end - start);
      start = end + 1;
    }
    return flags;
  }

  // Shapes what host i sends: `spec` is "rate 1gbit", "delay 100ms", "loss 1%", any of them
  // together, or "clear" (see hosts.sh). Returns the script's line, which says how ("by netem",
  // "by relay ..."); throws std::runtime_error when it fails.
  std::string shape(int i, const std::string& spec) const {
    return script("shape " + std::to_string(i) + " " + spec);
  }
  // Takes host i's link down (a pulled cable: its packets go nowhere) or up again.
  void link(int i, bool up) const { script("link " + std::to_string(i) + (up ? " up" : " down")); }
  // "PID COMMAND" of every live process of host i, its sshd among them, one a line.
  std::string processes(int i) const { return script("ps " + std::to_string(i)); }
  // SIGKILLs every process of host i but its sshd and waits until they are gone.
  std::string killAll(int i) const { return script("kill " + std::to_string(i)); }

  // Puts every host back as `up` left it: shaping cleared, links up, every process but its sshd
  // killed, /tmp and /dev/shm emptied (but the kept folders). Throws std::runtime_error naming
  // what failed.
  void reset() const {
    for (int i = 0; i < n_; ++i) {
      shape(i, "clear");
      link(i, true);
      killAll(i);
      script("clean " + std::to_string(i));
    }
  }

  // Runs `hosts.sh ARGS --prefix P`; returns its output without the last newline, throws
  // std::runtime_error with it when it fails.
  std::string script(const std::string& args) const {
    auto r = runCommand(scriptCommand(args));
    if (r.exit_code != 0) {
      throw std::runtime_error("hosts.sh " + args + " --prefix " + prefix_ + " failed (exit " +
                               std::to_string(r.exit_code) + "):\n" + r.output);
    }
    while (!r.output.empty() && r.output.back() == '\n')
      r.output.pop_back();
    return r.output;
  }

  static std::string scriptPath() { return sourceDir() + "/tests/hosts/hosts.sh"; }

 private:
  // "h" + this process's pid in base 36 + a count of instances: unique among live processes,
  // short enough for interface names.
  static std::string uniquePrefix() {
    static int count = 0;
    std::string pid;
    for (auto p = static_cast<unsigned long>(::getpid()); p > 0; p /= 36)
      pid.insert(pid.begin(), "0123456789abcdefghijklmnopqrstuvwxyz"[p % 36]);
    return "h" + pid + "n" + std::to_string(count++);
  }

  // The folders every host must see where this process does, although they may lie under /tmp
  // (a clone in /tmp/x): the build (its binaries, libraries and test data) and the checkout.
  static std::string keptFolders() {
    namespace fs = std::filesystem;
    std::string flags;
    for (const fs::path& dir :
         {fs::path(troupeBinary()).parent_path().parent_path(), fs::path(testData("")),
          fs::path(TROUPE_EMULATED_GPU).parent_path(), fs::path(sourceDir())}) {
      if (fs::is_directory(dir)) flags += " --keep " + apps::shellQuote(dir.string());
    }
    return flags;
  }

  std::string scriptCommand(const std::string& args) const {
    return "bash " + apps::shellQuote(scriptPath()) + " --prefix " + prefix_ + " " + args;
  }

  int n_;
  std::string prefix_;
  std::vector<std::string> addresses_;
  std::string ssh_opts_;
  std::string shared_;
};

// A fixture whose suite shares one Hosts(2), made before the suite's first test and removed after
// its last; each test starts from the hosts as `up` left them (Hosts::reset after it). When the
// hosts cannot be made, every test of the suite fails with the reason.
class TwoHostsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    error_.clear();
    try {
      hosts_ = new Hosts(2);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    delete hosts_;
    hosts_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(hosts_, nullptr) << "the hosts could not be made: " << error_; }
  void TearDown() override {
    if (!hosts_) return;
    try {
      hosts_->reset();
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }

  inline static Hosts* hosts_ = nullptr;
  inline static std::string error_;
};

}  // namespace troupe::testing
