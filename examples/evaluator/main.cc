// An evaluator service: joins a running training as an observer (troupe::Observer), scores the
// chief's weights every N steps on a database of its own (troupe::Model), and serves the scores
// over HTTP in Prometheus's text format, for Prometheus to scrape or anyone to fetch:
//
//   evaluator --config configs/mlp.toml --data DIR/test [--every 100] [--records 0]
//             [--rendezvous tcp://HOST:PORT --run_id ID --secret_file FILE]
//             [--listen 127.0.0.1] [--port 9100] [--linger 0]
//   curl http://127.0.0.1:9100/metrics
//
// The run is found as its workers find it: the flags, else the launcher's TROUPE_* variables.
// --port 0 takes a free port; the line "serving http://ADDRESS:PORT/metrics" says which. Scores
// come from a thread of their own that takes the newest weights (older ones not yet scored are
// skipped), so a slow evaluation never holds the run up. When the run's last step has been
// scored the service stays --linger seconds more (for a last scrape), then exits 0; it exits 1
// with the error when it cannot join, or when the run ends before its last step.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <troupe/model.h>
#include <troupe/observer.h>
#include <troupe/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/flags.h"

namespace {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "evaluator: %s\n", message.c_str());
  std::exit(1);
}

// The newest weights not yet scored, and the scores so far; shared by the observer's callback,
// the scoring thread and the HTTP server.
struct State {
  std::mutex mu;
  std::condition_variable changed;
  std::optional<std::pair<std::int64_t, std::vector<float>>> waiting;  // step, weights
  std::int64_t steps_per_epoch = 0, last_step = 0;
  bool done = false;  // the run is over: nothing more will come
  // The newest score.
  std::int64_t step = -1;
  troupe::Score score;
  double seconds = 0;        // that evaluation's time
  std::int64_t scored = 0;   // evaluations so far
  std::int64_t skipped = 0;  // weights replaced before they were scored
  bool last_scored = false;
};

std::string metrics(State& s, const std::string& run) {
  std::lock_guard lock(s.mu);
  std::string out;
  const auto gauge = [&](const char* name, const char* help, const char* type, double value) {
    char line[512];
    std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s{run=\"%s\"} %.17g\n", name,
                  help, name, type, name, run.c_str(), value);
    out += line;
  };
  if (s.step >= 0) {
    gauge("troupe_eval_accuracy", "Top-1 accuracy of the newest weights scored.", "gauge",
          s.score.accuracy);
    gauge("troupe_eval_loss", "Mean cross-entropy of the newest weights scored.", "gauge",
          s.score.loss);
    gauge("troupe_eval_records", "Records the newest score is over.", "gauge",
          static_cast<double>(s.score.count));
    gauge("troupe_eval_epoch", "Epochs the scored weights were trained for.", "gauge",
          s.steps_per_epoch > 0 ? static_cast<double>(s.step) / s.steps_per_epoch : 0);
    gauge("troupe_eval_seconds", "Time the newest evaluation took.", "gauge", s.seconds);
  }
  gauge("troupe_eval_step", "Training step of the newest weights scored (-1: none yet).", "gauge",
        static_cast<double>(s.step));
  gauge("troupe_eval_scored_total", "Evaluations done.", "counter", static_cast<double>(s.scored));
  gauge("troupe_eval_skipped_total", "Weights replaced by newer ones before they were scored.",
        "counter", static_cast<double>(s.skipped));
  return out;
}

// A minimal HTTP/1.0 server: GET /metrics answers with the scores, anything else with 404.
// One thread serves every connection at once (poll), so a client that connects and says nothing
// holds no one up: a connection has kClientSeconds from its accept for the whole exchange (its
// request line may come in pieces, up to kMaxRequest bytes), and at most kMaxClients are open at
// once (a newcomer beyond that closes the oldest). After the reply the server closes its side and
// reads what the client still sends until it closes too, so that no reset cuts the reply short.
class MetricsServer {
 public:
  MetricsServer(const std::string& address, int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    wake_ = ::eventfd(0, EFD_CLOEXEC);
    if (fd_ < 0 || wake_ < 0) fail("socket: cannot make one");
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1)
      fail("--listen " + address + ": not an IPv4 address");
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, SOMAXCONN) != 0)
      fail("cannot listen on " + address + ":" + std::to_string(port));
    socklen_t size = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &size);
    port_ = ntohs(a.sin_port);
  }
  ~MetricsServer() {
    const std::uint64_t stop = 1;
    [[maybe_unused]] const auto ignored = ::write(wake_, &stop, sizeof stop);
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
    ::close(wake_);
  }
  int port() const { return port_; }

  void serve(State& state, const std::string& run) {
    thread_ = std::thread([this, &state, run] { loop(state, run); });
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxClients = 64;
  static constexpr std::size_t kMaxRequest = 8192;
  static constexpr auto kClientSeconds = std::chrono::seconds(5);

  struct Client {
    int fd = -1;
    Clock::time_point deadline;
    std::string request;  // until its first line is complete
    std::string reply;    // non-empty: being written
    std::size_t sent = 0;
    bool replied = false;  // written and our side shut: reading until the client closes
  };

  static std::string replyTo(const std::string& line, State& state, const std::string& run) {
    const bool wanted = line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics";
    const std::string body = wanted ? metrics(state, run) : "not found: try /metrics\n";
    return std::string(wanted ? "HTTP/1.0 200 OK\r\n" : "HTTP/1.0 404 Not Found\r\n") +
           "Content-Type: text/plain; version=0.0.4\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  }

  // Reads what `c` sent; false once it is to be closed (it closed or failed; one that closed its
  // side after its request still gets the reply).
  static bool onReadable(Client& c, State& state, const std::string& run) {
    char buffer[4096];
    for (;;) {
      const auto n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n == 0) {
        // Closed after a request line without its newline: that line is the request.
        if (c.reply.empty() && !c.replied && !c.request.empty()) {
          std::string line = c.request;
          if (line.back() == '\r') line.pop_back();
          c.reply = replyTo(line, state, run);
          c.request.clear();
        }
        return !c.reply.empty();
      }
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      if (c.replied || !c.reply.empty()) continue;  // the rest of a request already answered
      c.request.append(buffer, static_cast<std::size_t>(n));
      const auto end = c.request.find('\n');
      if (end == std::string::npos && c.request.size() < kMaxRequest) continue;
      std::string line = c.request.substr(0, std::min(end, c.request.size()));
      if (!line.empty() && line.back() == '\r') line.pop_back();
      c.reply = replyTo(line, state, run);
      c.request.clear();
    }
  }

  // Writes what the socket takes of `c`'s reply; false on a failure.
  static bool onWritable(Client& c) {
    while (c.sent < c.reply.size()) {
      const auto n = ::send(c.fd, c.reply.data() + c.sent, c.reply.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<std::size_t>(n);
    }
    ::shutdown(c.fd, SHUT_WR);
    c.replied = true;
    c.reply.clear();
    return true;
  }

  void loop(State& state, const std::string& run) {
    std::vector<Client> clients;
    std::vector<pollfd> fds;
    Clock::time_point acceptAgain{};  // after a failed accept (out of descriptors): a pause
    for (;;) {
      const auto now = Clock::now();
      const bool accepting = now >= acceptAgain;
      fds.assign({{wake_, POLLIN, 0}, {fd_, static_cast<short>(accepting ? POLLIN : 0), 0}});
      auto timeout = std::chrono::milliseconds(-1);
      if (!accepting) timeout = std::chrono::ceil<std::chrono::milliseconds>(acceptAgain - now);
      for (const auto& c : clients) {
        const short events = c.reply.empty() ? POLLIN : POLLOUT;
        fds.push_back({c.fd, events, 0});
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now);
        const auto wait = std::max(left, std::chrono::milliseconds(0));
        if (timeout.count() < 0 || wait < timeout) timeout = wait;
      }
      if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) < 0 && errno != EINTR)
        return;
      if (fds[0].revents != 0) break;  // shut down
      const auto after = Clock::now();
      std::vector<Client> open;
      for (std::size_t i = 0; i < clients.size(); ++i) {
        Client& c = clients[i];
        const short got = fds[i + 2].revents;
        bool keep = after < c.deadline;
        if (keep && (got & (POLLIN | POLLHUP | POLLERR))) keep = onReadable(c, state, run);
        if (keep && !c.reply.empty()) keep = onWritable(c);
        if (keep) {
          open.push_back(std::move(c));
        } else {
          ::close(c.fd);
        }
      }
      clients = std::move(open);
      if (fds[1].revents & POLLIN) {
        for (;;) {
          const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
              acceptAgain = after + std::chrono::milliseconds(100);  // EMFILE ...: no busy loop
            }
            break;
          }
          if (clients.size() >= kMaxClients) {
            ::close(clients.front().fd);  // the oldest: accepted first
            clients.erase(clients.begin());
          }
          Client& c = clients.emplace_back();
          c.fd = fd;
          c.deadline = after + kClientSeconds;
        }
      }
    }
    for (const auto& c : clients)
      ::close(c.fd);
  }

  int fd_ = -1;
  int wake_ = -1;  // an eventfd: readable once the destructor wants the thread to stop
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  auto flags = examples::parseFlags("evaluator", argc, argv,
                                    {{"config", ""},
                                     {"data", ""},
                                     {"every", "100"},
                                     {"records", "0"},
                                     {"listen", "127.0.0.1"},
                                     {"port", "9100"},
                                     {"linger", "0"},
                                     {"rendezvous", ""},
                                     {"run_id", ""},
                                     {"secret_file", ""}});
  const std::string config = flags["config"], data = flags["data"], listen = flags["listen"];
  const std::int64_t every = std::atoll(flags["every"].c_str());
  const std::int64_t records = std::atoll(flags["records"].c_str());
  const int port = std::atoi(flags["port"].c_str()), linger = std::atoi(flags["linger"].c_str());
  // The run is found as its workers find it: these flags, else the launcher's TROUPE_* variables.
  troupe::ObserverSettings settings;
  for (const char* key : {"rendezvous", "run_id", "secret_file"})
    if (!flags[key].empty()) settings[key] = flags[key];
  if (config.empty() || data.empty()) fail("--config and --data are needed");
  if (port < 0 || port > 65535 || linger < 0) fail("--port or --linger out of range");

  auto model = troupe::Model::create(config);
  if (!model) fail(model.status().message());
  State state;
  MetricsServer server(listen, port);
  const std::string run = settings.count("run_id") ? settings["run_id"] : "run";
  server.serve(state, run);
  std::printf("%s; serving http://%s:%d/metrics\n", troupe::buildSummary().c_str(), listen.c_str(),
              server.port());
  std::fflush(stdout);

  // Scores the newest weights, one evaluation at a time.
  std::thread scorer([&] {
    for (;;) {
      std::pair<std::int64_t, std::vector<float>> next;
      {
        std::unique_lock lock(state.mu);
        state.changed.wait(lock, [&] { return state.waiting.has_value() || state.done; });
        if (!state.waiting) return;
        next = std::move(*state.waiting);
        state.waiting.reset();
      }
      const auto began = std::chrono::steady_clock::now();
      auto score = model.value()->evaluate(next.second, data, records);
      if (!score) fail(score.status().message());
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      std::lock_guard lock(state.mu);
      state.step = next.first;
      state.score = score.value();
      state.seconds = seconds;
      ++state.scored;
      state.last_scored = next.first >= state.last_step;
      std::printf("step %lld: accuracy %.4f, loss %.4f over %lld records (%.2f s)\n",
                  static_cast<long long>(next.first), state.score.accuracy, state.score.loss,
                  static_cast<long long>(state.score.count), seconds);
      std::fflush(stdout);
    }
  });

  auto observer = troupe::Observer::join(settings, every, [&](const troupe::ObservedWeights& w) {
    std::lock_guard lock(state.mu);
    state.steps_per_epoch = w.steps_per_epoch;
    state.last_step = w.last_step;
    if (state.waiting) ++state.skipped;
    state.waiting.emplace(w.step, std::vector<float>(w.weights.begin(), w.weights.end()));
    state.changed.notify_all();
  });
  if (!observer) fail(observer.status().message());
  const troupe::Status ended = observer.value()->wait(std::chrono::hours(24 * 365));
  {
    std::lock_guard lock(state.mu);
    state.done = true;
    state.changed.notify_all();
  }
  scorer.join();
  if (!ended) fail(ended.message());
  std::printf("the run is over; serving %d s more\n", linger);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(linger));
  return 0;
}
