// The launcher's OutputRelay, in-process, writing into pipes this test reads when it wants.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "apps/output_relay.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;
using apps::OutputRelay;
using apps::OutputRelayOptions;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A pipe with a small buffer (one page), so a reader that does not read stalls the writer soon.
class Pipe {
 public:
  Pipe() {
    if (::pipe2(fds_, O_CLOEXEC) == 0) ::fcntl(fds_[1], F_SETPIPE_SZ, 4096);
  }
  ~Pipe() {
    closeRead();
    closeWrite();
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  int writeEnd() const { return fds_[1]; }
  void closeRead() {
    if (fds_[0] >= 0) ::close(fds_[0]);
    fds_[0] = -1;
  }
  void closeWrite() {
    if (fds_[1] >= 0) ::close(fds_[1]);
    fds_[1] = -1;
  }
  // Everything until the write end is closed everywhere.
  std::string readAll() {
    std::string text;
    char buf[65536];
    for (ssize_t n; (n = ::read(fds_[0], buf, sizeof buf)) > 0;)
      text.append(buf, static_cast<std::size_t>(n));
    return text;
  }

 private:
  int fds_[2] = {-1, -1};
};

// The sum of N over the "[launcher] N lines dropped: ..." notices in `text`; -1: none.
long droppedIn(const std::string& text) {
  long sum = -1;
  for (auto at = text.find(" lines dropped: "); at != std::string::npos;
       at = text.find(" lines dropped: ", at + 1)) {
    const auto start = text.rfind("[launcher] ", at);
    if (start == std::string::npos) continue;
    sum = std::max(sum, 0L) + std::stol(text.substr(start + 11, at - start - 11));
  }
  return sum;
}

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

TEST(LaunchOutputRelay, LinesDroppedWhileTheReaderStallsAreCountedExactlyAndOwnLinesAreKept) {
  Pipe out, err;
  constexpr int kLines = 20000;
  std::string text;
  {
    OutputRelay relay(OutputRelayOptions{out.writeEnd(), err.writeEnd(), 8192, 4096, 10s});
    for (int i = 0; i < kLines; ++i)
      relay.relay(OutputRelay::Stream::kOut, "worker 0", "line " + std::to_string(i));
    relay.out("[launcher] all 1 process(es) exited 0");
    std::thread reader([&] { text = out.readAll(); });
    relay.finish();
    out.closeWrite();  // the relay's writers are done with it: the reader sees the end
    reader.join();
  }
  const long dropped = droppedIn(text);
  ASSERT_GT(dropped, 0) << text.substr(0, 2000);
  EXPECT_TRUE(contains(text, "lines dropped: the launcher's output was not read for ")) << dropped;
  EXPECT_EQ(count(text, "[worker 0] line ") + static_cast<std::size_t>(dropped),
            static_cast<std::size_t>(kLines));
  EXPECT_TRUE(contains(text, "[worker 0] line 0\n"));
  EXPECT_TRUE(contains(text, "\n[launcher] all 1 process(es) exited 0\n"));
  // The notice stands where the lines went missing: before what was said after them.
  EXPECT_LT(text.find(" lines dropped: "), text.find("[launcher] all 1 process(es) exited 0"));
}

TEST(LaunchOutputRelay, FinishGivesUpOnAReaderThatNeverReadsAndSaysSoOnTheOtherStream) {
  Pipe out, err;
  OutputRelay relay(OutputRelayOptions{out.writeEnd(), err.writeEnd(), 8192, 4096, 300ms});
  for (int i = 0; i < 5000; ++i)
    relay.relay(OutputRelay::Stream::kOut, "worker 0", "line " + std::to_string(i));
  relay.err("[launcher] run failed: worker 0 on localhost exited with code 3");
  const auto started = std::chrono::steady_clock::now();
  relay.finish();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  err.closeWrite();
  const std::string text = err.readAll();
  EXPECT_TRUE(contains(text, "[launcher] run failed: worker 0 on localhost exited with code 3\n"))
      << text;
  EXPECT_TRUE(contains(text, " lines dropped: the launcher's stdout was not read for ")) << text;
  // Its writer, still blocked on the full pipe, ends when the pipe goes.
  out.closeRead();
}

TEST(LaunchOutputRelay, AReaderThatIsGoneMakesLinesDroppedNotTheProcessDead) {
  Pipe out, err;
  out.closeRead();
  OutputRelay relay(OutputRelayOptions{out.writeEnd(), err.writeEnd(), 8192, 4096, 2s});
  for (int i = 0; i < 10; ++i)
    relay.relay(OutputRelay::Stream::kOut, "worker 0", "line " + std::to_string(i));
  relay.finish();
  err.closeWrite();
  const std::string text = err.readAll();
  EXPECT_TRUE(contains(text,
                       "[launcher] 10 lines dropped: the launcher's stdout could not be "
                       "written (Broken pipe)\n"))
      << text;
}

TEST(LaunchOutputRelay, StdoutAndStderrIntoOneFileKeepTheirOrder) {
  Pipe both;
  std::string text;
  std::thread reader;
  {
    OutputRelay relay(OutputRelayOptions{both.writeEnd(), both.writeEnd(), 1u << 20, 4096, 5s});
    reader = std::thread([&] { text = both.readAll(); });
    for (int i = 0; i < 100; ++i) {
      relay.relay(OutputRelay::Stream::kOut, "worker 0", std::to_string(i));
      relay.err("[launcher] after {}", i);
    }
  }
  both.closeWrite();
  reader.join();
  std::string expected;
  for (int i = 0; i < 100; ++i)
    expected +=
        "[worker 0] " + std::to_string(i) + "\n[launcher] after " + std::to_string(i) + "\n";
  EXPECT_EQ(text, expected);
}

}  // namespace
}  // namespace troupe::testing
