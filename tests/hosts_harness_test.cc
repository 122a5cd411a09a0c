// The hosts harness itself (hosts_util.h, tests/hosts/hosts.sh): what tests across hosts rely on.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "cli_util.h"
#include "hosts_util.h"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A process that exists and is no zombie (a killed process here may wait a while to be reaped).
bool running(const std::string& pid) {
  std::ifstream status("/proc/" + pid + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("State:", 0) == 0) return !contains(line, "Z");
  }
  return false;
}

class HostsHarness : public TwoHostsTest {
 protected:
  // Writes `text` to `path` in host i's private mount namespace.
  void writeOn(int i, const std::string& path, const std::string& text) const {
    std::ofstream(hosts_->pathOn(i, path)) << text;
  }

  // Seconds a TCP connect from host `from` to host `to`'s sshd takes, the least of 3 tries.
  double connectSeconds(int from, int to) const {
    writeOn(from, "/tmp/connect.py",
            "import socket, sys, time\n"
            "best = 1e9\n"
            "for _ in range(3):\n"
            "    t = time.monotonic()\n"
            "    socket.create_connection((sys.argv[1], 22), timeout=5).close()\n"
            "    best = min(best, time.monotonic() - t)\n"
            "print('connect', best)\n");
    const auto r = hosts_->run(from, "python3 /tmp/connect.py " + hosts_->address(to), 30s);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto at = r.output.find("connect ");
    return at == std::string::npos ? -1 : std::stod(r.output.substr(at + 8));
  }
};

TEST_F(HostsHarness, EveryHostHasItsOwnTmpHostnameAndAddress) {
  writeOn(0, "/tmp/mark", "on host 0\n");
  const auto zero = hosts_->run(0, "hostname; cat /tmp/mark; ip -4 -o addr show | wc -l", 30s);
  const auto one = hosts_->run(1, "hostname; cat /tmp/mark; ip -4 -br addr show eth0", 30s);
  EXPECT_EQ(zero.output, "host0\non host 0\n2\n") << "loopback and eth0 only";
  EXPECT_TRUE(contains(one.output, "host1\n")) << one.output;
  EXPECT_TRUE(contains(one.output, "/tmp/mark: No such file")) << "host 1 sees host 0's /tmp\n"
                                                               << one.output;
  EXPECT_TRUE(contains(one.output, hosts_->address(1) + "/24")) << one.output;
  EXPECT_EQ(hosts_->address(0), "10.77.0.2");
  EXPECT_EQ(hosts_->address(1), "10.77.0.3");
}

TEST_F(HostsHarness, AHostReachesTheOthersOverTcpAndNothingOutsideTheBridge) {
  const auto ssh =
      hosts_->run(0, "ssh " + hosts_->sshOpts() + " root@" + hosts_->address(1) + " hostname", 30s);
  EXPECT_EQ(ssh.output, "host1\n");
  // A host routes its subnet only: anything else (192.0.2.1 is TEST-NET-1) fails before a packet
  // leaves it.
  const auto out =
      hosts_->run(0, "ip -4 route; exec 3<>/dev/tcp/192.0.2.1/22 && echo reached", 30s);
  EXPECT_EQ(out.output.rfind("10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2 \n", 0),
            0u)
      << out.output;
  EXPECT_FALSE(contains(out.output, "default")) << "a host has a default route\n" << out.output;
  EXPECT_TRUE(contains(out.output, "Network is unreachable")) << out.output;
  EXPECT_FALSE(contains(out.output, "reached\n")) << out.output;
}

TEST_F(HostsHarness, ADelayedHostAnswersLateUntilTheShapingIsCleared) {
  const double before = connectSeconds(1, 0);
  const std::string how = hosts_->shape(1, "delay 100ms");
  const double delayed = connectSeconds(1, 0);
  hosts_->shape(1, "clear");
  const double after = connectSeconds(1, 0);
  std::cout << "[ measured ] connect from host 1 to host 0: " << before * 1e3 << " ms; " << how
            << ": " << delayed * 1e3 << " ms; cleared: " << after * 1e3 << " ms\n";
  EXPECT_GE(delayed, 0.095);  // the SYN waits 100 ms (timer slack: a few ms early at most)
  EXPECT_LT(delayed, 0.5);
  EXPECT_LT(before, 0.05);
  EXPECT_LT(after, 0.05);
}

TEST_F(HostsHarness, ARateLimitedHostSendsNoFasterThanItsRate) {
  writeOn(0, "/tmp/sink.py",
          "import socket, sys, time\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind((sys.argv[1], 5001)); s.listen(1); s.settimeout(20)\n"
          "c, _ = s.accept(); n = 0; t0 = None\n"
          "while True:\n"
          "    d = c.recv(1 << 20)\n"
          "    if not d: break\n"
          "    t0 = t0 or time.monotonic(); n += len(d)\n"
          "print('rate', n * 8 / (time.monotonic() - t0))\n");
  writeOn(1, "/tmp/source.py",
          "import socket, sys, time\n"
          "for _ in range(100):\n"
          "    try: c = socket.create_connection((sys.argv[1], 5001)); break\n"
          "    except OSError: time.sleep(0.05)\n"
          "blob = b'x' * (1 << 20)\n"
          "for _ in range(64): c.sendall(blob)\n"
          "c.close()\n");
  const std::string how = hosts_->shape(1, "rate 1gbit");
  CommandResult sink;
  std::thread receiver(
      [&] { sink = hosts_->run(0, "python3 /tmp/sink.py " + hosts_->address(0), 60s); });
  const auto source = hosts_->run(1, "python3 /tmp/source.py " + hosts_->address(0), 60s);
  receiver.join();
  ASSERT_EQ(source.exit_code, 0) << source.output;
  ASSERT_EQ(sink.exit_code, 0) << sink.output;
  const double rate = std::stod(sink.output.substr(sink.output.find("rate ") + 5));
  std::cout << "[ measured ] 64 MiB from host 1 to host 0 (" << how << "): " << rate / 1e9
            << " Gbit/s\n";
  EXPECT_LT(rate, 1.1e9) << "tbf lets at most its rate (plus one 4 ms burst) through";
  EXPECT_GT(rate, 0.2e9);
  EXPECT_TRUE(contains(hosts_->shape(1, "rate 10gbit"), "rate 10gbit by tbf"));
  const auto qdisc = hosts_->run(1, "tc qdisc show dev eth0", 30s);
  EXPECT_TRUE(contains(qdisc.output, "tbf")) << qdisc.output;
  EXPECT_TRUE(contains(qdisc.output, "rate 10Gbit")) << qdisc.output;
}

// Datagrams, which nothing resends: 1000 of them through 20% loss arrive 800 +- 13 (one standard
// deviation); 700..900 is 8 of them.
TEST_F(HostsHarness, ALossyHostLosesTheShareOfPacketsItWasToldTo) {
  writeOn(0, "/tmp/count.py",
          "import socket, sys\n"
          "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
          "s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE\n"
          "s.bind((sys.argv[1], 5002)); s.settimeout(10); n = 0\n"
          "s.recv(100); n += 1; s.settimeout(1)\n"
          "try:\n"
          "    while True: s.recv(100); n += 1\n"
          "except socket.timeout: pass\n"
          "print('received', n)\n");
  writeOn(1, "/tmp/spray.py",
          "import socket, sys, time\n"
          "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
          "for _ in range(1000):\n"
          "    s.sendto(b'x' * 64, (sys.argv[1], 5002)); time.sleep(0.0002)\n");
  const std::string how = hosts_->shape(1, "loss 20%");
  CommandResult counter;
  std::thread receiver(
      [&] { counter = hosts_->run(0, "python3 /tmp/count.py " + hosts_->address(0), 60s); });
  std::this_thread::sleep_for(300ms);  // the receiver binds; a datagram before that is lost
  const auto spray = hosts_->run(1, "python3 /tmp/spray.py " + hosts_->address(0), 60s);
  receiver.join();
  ASSERT_EQ(spray.exit_code, 0) << spray.output;
  ASSERT_EQ(counter.exit_code, 0) << counter.output;
  const int received = std::stoi(counter.output.substr(counter.output.find("received ") + 9));
  std::cout << "[ measured ] " << how << ": " << received << " of 1000 datagrams arrived\n";
  EXPECT_GE(received, 700);
  EXPECT_LE(received, 900);
}

TEST_F(HostsHarness, ALinkTakenDownCutsTheHostOffUntilItComesUp) {
  const std::string probe = "timeout 2 bash -c 'exec 3<>/dev/tcp/" + hosts_->address(1) +
                            "/22' && echo reached || echo cut off";
  hosts_->link(1, false);
  const auto down = hosts_->run(0, probe, 30s);
  hosts_->link(1, true);
  const auto up = hosts_->run(0, probe, 30s);
  EXPECT_TRUE(contains(down.output, "cut off")) << down.output;
  EXPECT_TRUE(contains(up.output, "reached")) << up.output;
}

TEST_F(HostsHarness, KillingAHostsProcessesSparesItsSshdAndTheOtherHosts) {
  for (int i : {0, 1}) {
    const auto r =
        hosts_->run(i, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > /tmp/pid", 30s);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  auto pidOn = [&](int i) {
    std::ifstream in(hosts_->pathOn(i, "/tmp/pid"));
    std::string pid;
    in >> pid;
    return pid;
  };
  const std::string zero = pidOn(0), one = pidOn(1);
  ASSERT_FALSE(zero.empty() || one.empty());
  EXPECT_TRUE(contains(hosts_->killAll(1), "killed"));
  EXPECT_FALSE(running(one)) << "host 1's sleep outlived the kill";
  EXPECT_TRUE(running(zero)) << "host 0's sleep was killed with host 1's";
  const auto ssh =
      hosts_->run(0, "ssh " + hosts_->sshOpts() + " root@" + hosts_->address(1) + " hostname", 30s);
  EXPECT_EQ(ssh.output, "host1\n") << "host 1's sshd went with its processes";
}

// Teardown finds what to remove by name, so an instance whose owner died (a test killed by its
// timeout) goes with the next `gc`, and `down` twice is harmless.
TEST_F(HostsHarness, AnInstanceWhoseOwnerDiedIsRemovedByGcAndDownIsIdempotent) {
  const pid_t owner = ::fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string script = "bash " + Hosts::scriptPath() + " --prefix " + hosts_->prefix() + "x";
  const auto up = runCommand(script + " up 1 --owner " + std::to_string(owner));
  ::kill(owner, SIGKILL);
  ::waitpid(owner, nullptr, 0);
  ASSERT_EQ(up.exit_code, 0) << up.output;
  const std::string ns = hosts_->prefix() + "x-host0";
  EXPECT_TRUE(contains(runCommand("ip netns list").output, ns));
  const auto gc = runCommand(script + " gc");
  EXPECT_EQ(gc.exit_code, 0) << gc.output;
  EXPECT_TRUE(contains(gc.output, "their owner " + std::to_string(owner) + " is gone"))
      << gc.output;
  EXPECT_FALSE(contains(runCommand("ip netns list").output, ns));
  EXPECT_FALSE(contains(runCommand("ip -o link").output, hosts_->prefix() + "xbr0"));
  EXPECT_FALSE(fs::exists(hosts_->script("dir") + "x"));
  const auto again = runCommand(script + " down");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(hosts_->shape(0, "delay 1ms"), "delay 1ms"));  // ours are untouched
}

// A checkout under /tmp (a clone in /tmp/x) is hidden by each host's private /tmp unless kept:
// a kept folder is there at its own path, read-only, and outlives the hosts' cleaning between
// tests, which empties the rest of their /tmp.
TEST_F(HostsHarness, AFolderKeptUnderTmpIsSeenReadOnlyByAHostAndOutlivesItsCleaning) {
  char name[] = "/tmp/troupe-kept-XXXXXX";
  ASSERT_NE(::mkdtemp(name), nullptr);
  const fs::path kept = fs::path(name) / "checkout";
  fs::create_directories(kept / "build");
  std::ofstream(kept / "build" / "tool") << "#!/bin/sh\necho ran on $(hostname)\n";
  fs::permissions(kept / "build" / "tool", fs::perms::owner_all);
  {
    Hosts one(1, {kept.string()});
    const auto ran = one.run(0, kept.string() + "/build/tool", 30s);
    EXPECT_EQ(ran.output, "ran on host0\n");
    const auto write = one.run(0, "touch " + kept.string() + "/new", 30s);
    EXPECT_NE(write.exit_code, 0) << "a host could write into a kept folder";
    EXPECT_EQ(one.run(0, "mkdir -p /tmp/run && touch /tmp/run/log " + std::string(name) + "/x", 30s)
                  .exit_code,
              0);
    one.script("clean 0");
    // (The checkout of these tests may be kept under /tmp too: only what was written goes.)
    const auto after = one.run(
        0, "ls -A " + std::string(name) + "; ls -d /tmp/run " + std::string(name) + "/x", 30s);
    EXPECT_EQ(after.output.substr(0, after.output.find('\n') + 1), "checkout\n") << after.output;
    EXPECT_NE(after.output.find("/tmp/run': No such file"), std::string::npos) << after.output;
    EXPECT_NE(after.output.find("/x': No such file"), std::string::npos) << after.output;
    EXPECT_EQ(one.run(0, kept.string() + "/build/tool", 30s).exit_code, 0);
  }
  EXPECT_TRUE(fs::exists(kept / "build" / "tool")) << "the hosts removed a kept folder";
  fs::remove_all(name);
}

}  // namespace
}  // namespace troupe::testing
