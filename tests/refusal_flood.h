// A flood of strangers at a listener (the embedded store, a transport), and what its log says of
// them (transport/refusal_report.h).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace troupe::testing {

// Opens `connections` TCP connections to 127.0.0.1:`port` from `threads` threads at once; each
// writes 100 bytes that are no handshake and waits (10 s at most) for the listener to close it.
// Returns how many connected.
inline int floodWithGarbage(std::uint16_t port, int connections, int threads = 4) {
  std::atomic<int> connected{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const std::string garbage(100, '\x5a');
      for (int i = t; i < connections; i += threads) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(port);
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
          ++connected;
          ::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          char buffer[256];
          while (std::chrono::steady_clock::now() < deadline) {
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            if (::recv(fd, buffer, sizeof buffer, 0) <= 0) break;  // the challenge, then the end
          }
        }
        ::close(fd);
      }
    });
  }
  for (auto& w : workers)
    w.join();
  return connected.load();
}

// A listener's refusal lines among `lines`: those that name one refusal each (they contain
// `single`) and the summaries ("N more connections refused in the last ..."), and the connections
// they account for together.
struct RefusalLines {
  std::size_t lines = 0;
  std::uint64_t connections = 0;
  std::vector<std::string> summaries;
};

inline RefusalLines countRefusals(const std::vector<std::string>& lines,
                                  const std::string& single) {
  static const std::regex summary(R"(: (\d+) more connections? refused in the last )");
  RefusalLines out;
  for (const auto& line : lines) {
    std::smatch match;
    if (std::regex_search(line, match, summary)) {
      ++out.lines;
      out.connections += std::stoull(match[1].str());
      out.summaries.push_back(line);
    } else if (line.find(single) != std::string::npos) {
      ++out.lines;
      ++out.connections;
    }
  }
  return out;
}

inline std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

}  // namespace troupe::testing
