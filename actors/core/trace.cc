#include "actors/core/trace.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "troupe/error.h"

namespace troupe::actors {
namespace {

std::int64_t micros(Trace::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

}  // namespace

Trace::Trace(std::uint32_t node, std::string process) : node_(node), process_(std::move(process)) {
  body_ = fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":{}}}}})", node_,
                      jsonString(process_));
}

int Trace::track(std::string_view actor) {
  auto it = tracks_.find(actor);
  if (it != tracks_.end()) return it->second;
  const int id = static_cast<int>(tracks_.size()) + 1;
  tracks_.emplace(std::string(actor), id);
  body_ +=
      fmt::format(R"(,{{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})",
                  node_, id, jsonString(actor));
  return id;
}

void Trace::span(std::string_view actor, std::string_view name, Clock::time_point begin,
                 Clock::time_point end) {
  std::lock_guard lock(mu_);
  const int tid = track(actor);
  body_ += fmt::format(R"(,{{"ph":"X","name":{},"pid":{},"tid":{},"ts":{},"dur":{}}})",
                       jsonString(name), node_, tid, micros(begin),
                       std::max<std::int64_t>(0, micros(end) - micros(begin)));
}

void Trace::asyncSpan(std::string_view actor, std::string_view name, std::uint64_t id,
                      Clock::time_point begin, Clock::time_point end) {
  std::lock_guard lock(mu_);
  const int tid = track(actor);
  for (const auto& [ph, t] : {std::pair{'b', begin}, std::pair{'e', end}}) {
    body_ += fmt::format(
        R"(,{{"ph":"{}","cat":"comm","name":{},"id":"{}:{}","pid":{},"tid":{},"ts":{}}})", ph,
        jsonString(name), node_, id, node_, tid, micros(t));
  }
}

std::string Trace::events() const {
  std::lock_guard lock(mu_);
  return body_;
}

void Trace::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw IoError(fmt::format("cannot write trace '{}'", path));
    out << "{\"traceEvents\":[" << events() << "]}\n";
    if (!out) throw IoError(fmt::format("cannot write trace '{}'", path));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError(fmt::format("cannot write trace '{}': {}", path, ec.message()));
}

std::string Trace::partPath(const std::string& path, std::uint32_t node) {
  return fmt::format("{}.part{}", path, node);
}

void Trace::merge(const std::string& path, std::uint32_t nodes) {
  std::string all;
  for (std::uint32_t n = 0; n < nodes; ++n) {
    std::ifstream in(partPath(path, n));
    if (!in) throw IoError(fmt::format("trace part '{}' is missing", partPath(path, n)));
    std::stringstream s;
    s << in.rdbuf();
    std::string text = s.str();
    // Each part is a whole trace file: keep what is between the brackets.
    const auto open = text.find('['), close = text.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close < open) {
      throw IoError(fmt::format("trace part '{}' is malformed", partPath(path, n)));
    }
    if (!all.empty()) all += ",";
    all += text.substr(open + 1, close - open - 1);
  }
  std::ofstream out(path);
  if (!out) throw IoError(fmt::format("cannot write trace '{}'", path));
  out << "{\"traceEvents\":[" << all << "]}\n";
  for (std::uint32_t n = 0; n < nodes; ++n)
    std::filesystem::remove(partPath(path, n));
}

}  // namespace troupe::actors
