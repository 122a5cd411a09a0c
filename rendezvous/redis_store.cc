#include "rendezvous/redis_store.h"

#include <hiredis/hiredis.h>

#include <mutex>

#include <fmt/format.h>

#include "rendezvous/store_util.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;
using Reply = std::unique_ptr<redisReply, ReplyFree>;

timeval toTimeval(milliseconds d) {
  const auto ms = std::max<int64_t>(d.count(), 1);
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

std::string_view replyText(const redisReply& r) {
  return {r.str, r.len};
}

class RedisStore final : public Store {
 public:
  explicit RedisStore(RedisOptions options)
      : options_(std::move(options)),
        name_(fmt::format("redis store {}:{}", options_.host, options_.port)) {}

  void connect() {
    std::lock_guard lock(mu_);
    connectLocked();
  }

  void set(const std::string& key, std::string_view value) override {
    expectStatus(command({"SET", key, value}), "SET");
  }

  std::string get(const std::string& key, milliseconds timeout) override {
    detail::Backoff backoff(Clock::now() + timeout);
    do {
      auto reply = command({"GET", key});
      if (reply->type == REDIS_REPLY_STRING) return std::string(replyText(*reply));
      if (reply->type != REDIS_REPLY_NIL) unexpected(*reply, "GET");
    } while (backoff.sleep());
    detail::throwWaitTimeout(name_, timeout, {key});
  }

  int64_t add(const std::string& key, int64_t delta) override {
    auto reply = command({"INCRBY", key, std::to_string(delta)});
    if (reply->type == REDIS_REPLY_INTEGER) return reply->integer;
    if (reply->type == REDIS_REPLY_ERROR) {
      throw InputError(fmt::format("{}: cannot add {} to key {}: {}", name_, delta,
                                   detail::quoteKeys({key}), replyText(*reply)));
    }
    unexpected(*reply, "INCRBY");
  }

  bool check(const std::vector<std::string>& keys) override {
    if (keys.empty()) return true;
    std::vector<std::string_view> args{"EXISTS"};
    args.insert(args.end(), keys.begin(), keys.end());
    // EXISTS counts a key named twice twice, so all exist exactly when the count is keys.size().
    return integer(command(args), "EXISTS") == static_cast<long long>(keys.size());
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    detail::Backoff backoff(Clock::now() + timeout);
    do {
      if (check(keys)) return;
    } while (backoff.sleep());
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (integer(command({"EXISTS", key}), "EXISTS") == 0) missing.push_back(key);
    }
    detail::throwWaitTimeout(name_, timeout, missing);
  }

  bool remove(const std::string& key) override { return integer(command({"DEL", key}), "DEL") > 0; }

  std::string describe() const override { return name_; }

 private:
  // Runs one command, connecting first when needed; any reply, errors included, comes back.
  Reply command(const std::vector<std::string_view>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (auto a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    std::lock_guard lock(mu_);
    if (!context_) connectLocked();
    Reply reply(static_cast<redisReply*>(redisCommandArgv(
        context_.get(), static_cast<int>(argv.size()), argv.data(), lengths.data())));
    if (!reply) {
      const std::string error = context_->errstr;
      context_.reset();
      throw IoError(fmt::format("{}: {} failed: {}", name_, args.front(), error));
    }
    if (reply->type == REDIS_REPLY_ERROR && replyText(*reply).starts_with("NOAUTH")) {
      throw InputError(fmt::format("{} requires a password (redis://:PASSWORD@{}:{}): {}", name_,
                                   options_.host, options_.port, replyText(*reply)));
    }
    return reply;
  }

  void connectLocked() {
    const auto deadline = Clock::now() + options_.connect_timeout;
    std::string last_error;
    detail::Backoff backoff(deadline);
    do {
      const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      Context c(redisConnectWithTimeout(options_.host.c_str(), options_.port, toTimeval(left)));
      if (!c) {
        last_error = "out of memory";
      } else if (c->err) {
        last_error = c->errstr;
      } else {
        if (redisSetTimeout(c.get(), toTimeval(options_.command_timeout)) != REDIS_OK) {
          throw IoError(fmt::format("{}: cannot set the command timeout: {}", name_, c->errstr));
        }
        context_ = std::move(c);
        authenticate();
        return;
      }
    } while (backoff.sleep());
    throw TimeoutError(fmt::format("timed out after {} connecting to {} (last error: {})",
                                   detail::formatDuration(options_.connect_timeout), name_,
                                   last_error));
  }

  void authenticate() {
    if (options_.password.empty()) return;
    const char* argv[] = {"AUTH", options_.password.data()};
    const size_t lengths[] = {4, options_.password.size()};
    Reply reply(static_cast<redisReply*>(redisCommandArgv(context_.get(), 2, argv, lengths)));
    if (!reply) {
      const std::string error = context_->errstr;
      context_.reset();
      throw IoError(fmt::format("{}: AUTH failed: {}", name_, error));
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      context_.reset();
      throw InputError(fmt::format("{}: authentication failed: {}", name_, replyText(*reply)));
    }
  }

  long long integer(Reply reply, const char* what) const {
    if (reply->type != REDIS_REPLY_INTEGER) unexpected(*reply, what);
    return reply->integer;
  }

  void expectStatus(Reply reply, const char* what) const {
    if (reply->type != REDIS_REPLY_STATUS) unexpected(*reply, what);
  }

  [[noreturn]] void unexpected(const redisReply& reply, const char* what) const {
    if (reply.type == REDIS_REPLY_ERROR || reply.type == REDIS_REPLY_STATUS) {
      throw IoError(fmt::format("{}: {} failed: {}", name_, what, replyText(reply)));
    }
    throw IoError(
        fmt::format("{}: {} gave an unexpected reply of type {}", name_, what, reply.type));
  }

  const RedisOptions options_;
  const std::string name_;
  std::mutex mu_;
  Context context_;
};

}  // namespace

std::unique_ptr<Store> connectRedisStore(const RedisOptions& options) {
  if (options.host.empty()) throw InputError("redis store: the host must not be empty");
  auto store = std::make_unique<RedisStore>(options);
  store->connect();
  return store;
}

}  // namespace troupe::rendezvous
