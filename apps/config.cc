#include "apps/config.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <toml++/toml.h>
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string_view>
#include <variant>

#include "actors/run_id.h"
#include "transport/auth.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using actors::TrainOptions;
using Value = std::variant<std::int64_t, double, bool, std::string, std::vector<double>>;

enum class Kind { kInt, kFloat, kBool, kString, kFloatList };

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "number";
    case Kind::kBool:
      return "boolean";
    case Kind::kString:
      return "string";
    case Kind::kFloatList:
      return "list of numbers";
  }
  return "?";
}

struct Key {
  const char* name;
  Kind kind;
  const char* help;
  std::function<void(TrainOptions&, const Value&)> set;
  std::function<std::string(const TrainOptions&)> get;
};

std::int64_t asInt(const Value& v) {
  return std::get<std::int64_t>(v);
}
double asFloat(const Value& v) {
  return std::get<double>(v);
}
bool asBool(const Value& v) {
  return std::get<bool>(v);
}
const std::string& asString(const Value& v) {
  return std::get<std::string>(v);
}
const std::vector<double>& asList(const Value& v) {
  return std::get<std::vector<double>>(v);
}

std::string listText(const std::vector<double>& list) {
  std::string out;
  for (std::size_t i = 0; i < list.size(); ++i)
    out += (i ? "," : "") + fmt::format("{}", list[i]);
  return out;
}

#define TROUPE_INT_KEY(key, field, help)                                                \
  Key {                                                                                 \
    key, Kind::kInt, help, [](TrainOptions& o, const Value& v) { o.field = asInt(v); }, \
        [](const TrainOptions& o) { return fmt::format("{}", o.field); }                \
  }
#define TROUPE_FLOAT_KEY(key, field, help)                               \
  Key {                                                                  \
    key, Kind::kFloat, help,                                             \
        [](TrainOptions& o, const Value& v) {                            \
          o.field = static_cast<decltype(o.field)>(asFloat(v));          \
        },                                                               \
        [](const TrainOptions& o) { return fmt::format("{}", o.field); } \
  }
#define TROUPE_STRING_KEY(key, field, help)                                                   \
  Key {                                                                                       \
    key, Kind::kString, help, [](TrainOptions& o, const Value& v) { o.field = asString(v); }, \
        [](const TrainOptions& o) { return o.field; }                                         \
  }

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      Key{"model", Kind::kString,
          "built-in model: mlp, lenet, resnet20 (or [[layers]] in the file)",
          [](TrainOptions& o, const Value& v) { o.model.name = asString(v); },
          [](const TrainOptions& o) { return o.model.name.empty() ? "custom" : o.model.name; }},
      TROUPE_STRING_KEY("train_data", train_data, "training database"),
      TROUPE_STRING_KEY("test_data", test_data, "test database (evaluated after every epoch)"),
      Key{"db_type", Kind::kString, "lmdb or leveldb",
          [](TrainOptions& o, const Value& v) { o.db_type = data::parseDbType(asString(v)); },
          [](const TrainOptions& o) { return std::string(data::toString(o.db_type)); }},
      TROUPE_INT_KEY("batch_size", batch_size, "inputs per step, in total over the replicas"),
      TROUPE_INT_KEY("epoch_size", epoch_size, "inputs per epoch (0: the training set's size)"),
      TROUPE_INT_KEY("num_epochs", num_epochs, "epochs to train"),
      TROUPE_FLOAT_KEY("base_learning_rate", base_learning_rate, "learning rate"),
      TROUPE_FLOAT_KEY("weight_decay", sgd.weight_decay, "L2 weight decay"),
      TROUPE_FLOAT_KEY("momentum", sgd.momentum, "SGD momentum"),
      Key{"nesterov", Kind::kBool, "Nesterov momentum",
          [](TrainOptions& o, const Value& v) { o.sgd.nesterov = asBool(v); },
          [](const TrainOptions& o) { return std::string(o.sgd.nesterov ? "true" : "false"); }},
      TROUPE_STRING_KEY("lr_policy", lr_policy, "fixed, step, multistep or cosine"),
      TROUPE_FLOAT_KEY("gamma", gamma, "decay factor of step and multistep"),
      TROUPE_FLOAT_KEY("lr_step_epochs", lr_step_epochs, "step: decay every this many epochs"),
      Key{"lr_milestones", Kind::kFloatList, "multistep: epochs at which to decay",
          [](TrainOptions& o, const Value& v) { o.lr_milestones = asList(v); },
          [](const TrainOptions& o) { return listText(o.lr_milestones); }},
      TROUPE_FLOAT_KEY("warmup_epochs", warmup_epochs, "linear warmup, in epochs"),
      TROUPE_INT_KEY("num_labels", num_labels, "number of classes"),
      TROUPE_INT_KEY("image_size", image_size, "height and width of the images"),
      TROUPE_INT_KEY("num_channels", num_channels, "channels of the images"),
      TROUPE_FLOAT_KEY("mean", mean, "subtracted from every pixel value"),
      TROUPE_FLOAT_KEY("scale", scale, "multiplies every pixel value after the mean"),
      TROUPE_INT_KEY("replicas", replicas, "model replicas in this process (the batch is split)"),
      TROUPE_INT_KEY(
          "threads", threads,
          "CPU threads of this process (0: the host's, shared among the run's processes on it)"),
      TROUPE_STRING_KEY("schedule", schedule,
                        "local, bsp-allreduce, dist_sync, dist_async or ssp (MXNet kvstore names)"),
      TROUPE_INT_KEY("num_shards", num_shards, "worker processes (set by troupe launch)"),
      TROUPE_INT_KEY("shard_id", shard_id,
                     "this process's rank in its role (set by troupe launch)"),
      TROUPE_INT_KEY("num_servers", num_servers,
                     "parameter-server processes (set by troupe launch)"),
      TROUPE_STRING_KEY("role", role, "worker or server (set by troupe launch)"),
      TROUPE_INT_KEY("staleness", staleness, "ssp: steps a worker may run ahead of the slowest"),
      TROUPE_STRING_KEY("run_id", run_id, "id shared by the processes of one run"),
      TROUPE_INT_KEY("generation", generation,
                     "restarts of the run so far (set by troupe launch --on-failure restart); "
                     "above 0 the run resumes as with --resume auto"),
      TROUPE_STRING_KEY("rendezvous", rendezvous,
                        "tcp://HOST:PORT | file:///dir | redis://[:PASSWORD@]HOST:PORT"),
      TROUPE_STRING_KEY("interface", interface, "network interface to listen on (e.g. eth0)"),
      TROUPE_STRING_KEY("secret_file", secret_file,
                        "file holding the run's secret (default: $TROUPE_SECRET; troupe launch "
                        "makes one per run)"),
      TROUPE_FLOAT_KEY("rendezvous_timeout", rendezvous_timeout_s,
                       "seconds to wait for the other processes"),
      TROUPE_FLOAT_KEY("peer_timeout", peer_timeout_s,
                       "seconds a link may be silent, or an allreduce or server wait on a peer, "
                       "before the run fails naming it"),
      TROUPE_FLOAT_KEY("stall_warning", stall_warning_s,
                       "seconds of waiting on a peer before a stall report names who is late"),
      Key{"work_load_list", Kind::kFloatList, "relative share of the batch per replica",
          [](TrainOptions& o, const Value& v) { o.work_load_list = asList(v); },
          [](const TrainOptions& o) { return listText(o.work_load_list); }},
      Key{"seed", Kind::kInt, "seed of initialisation and data order",
          [](TrainOptions& o, const Value& v) { o.seed = static_cast<std::uint64_t>(asInt(v)); },
          [](const TrainOptions& o) { return fmt::format("{}", o.seed); }},
      TROUPE_INT_KEY("prefetch", prefetch, "batches a reader keeps in flight"),
      Key{"skip_bad_records", Kind::kBool,
          "skip (and count, and log once) records that do not parse, decode or fit, instead of "
          "failing; also --skip-bad-records",
          [](TrainOptions& o, const Value& v) { o.skip_bad_records = asBool(v); },
          [](const TrainOptions& o) { return std::string(o.skip_bad_records ? "true" : "false"); }},
      TROUPE_FLOAT_KEY("bucket_size_mb", bucket_size_mb, "gradient bucket size (MiB)"),
      TROUPE_FLOAT_KEY("first_bucket_mb", first_bucket_mb, "size of the first bucket (MiB)"),
      TROUPE_STRING_KEY("log_dir", log_dir, "folder of the CSV log"),
      TROUPE_STRING_KEY("checkpoint_dir", checkpoint_dir,
                        "folder of checkpoints (default: log_dir)"),
      TROUPE_INT_KEY("checkpoint_every", checkpoint_every,
                     "epochs between checkpoints (0: end only)"),
      TROUPE_STRING_KEY("resume", resume,
                        "checkpoint to continue from, or 'auto': the newest complete checkpoint "
                        "of this run (same run_id) in checkpoint_dir, if any"),
      TROUPE_INT_KEY("log_every", log_every, "steps between console lines"),
      TROUPE_FLOAT_KEY("step_timeout", step_timeout_s, "seconds without progress before failing"),
      TROUPE_STRING_KEY("run_name", run_name, "prefix of the experiment id (default: the model)"),
      TROUPE_STRING_KEY("trace", trace, "write a Chrome trace (chrome://tracing, Perfetto) here"),
  };
  return table;
}

const Key* findKey(std::string_view name) {
  for (const auto& k : keys()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string knownKeys() {
  std::string out;
  for (const auto& k : keys())
    out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

// MXNet's kvstore names map onto schedules; "kv_store" is accepted as a key alias too.
std::string canonicalSchedule(const std::string& s) {
  if (s == "dist_device_sync") return "dist_sync";
  return s;
}

Value fromToml(const std::string& file, const Key& key, const toml::node& node) {
  auto wrong = [&]() -> InputError {
    return InputError(
        fmt::format("{}: key '{}' must be a {}, got {}", file, key.name, kindName(key.kind),
                    toml::impl::node_type_friendly_names[static_cast<std::size_t>(node.type())]));
  };
  switch (key.kind) {
    case Kind::kInt:
      if (auto v = node.value_exact<std::int64_t>()) return *v;
      throw wrong();
    case Kind::kFloat:
      if (auto v = node.value<double>(); v && (node.is_floating_point() || node.is_integer())) {
        return *v;
      }
      throw wrong();
    case Kind::kBool:
      if (auto v = node.value_exact<bool>()) return *v;
      throw wrong();
    case Kind::kString:
      if (auto v = node.value_exact<std::string>()) return *v;
      throw wrong();
    case Kind::kFloatList: {
      const auto* arr = node.as_array();
      if (!arr) throw wrong();
      std::vector<double> out;
      for (const auto& e : *arr) {
        auto v = e.value<double>();
        if (!v || !(e.is_floating_point() || e.is_integer())) throw wrong();
        out.push_back(*v);
      }
      return out;
    }
  }
  throw wrong();
}

Value fromText(const Key& key, const std::string& text) {
  auto wrong = [&] {
    return InputError(
        fmt::format("--{}: expected a {}, got '{}'", key.name, kindName(key.kind), text));
  };
  auto parseDouble = [&](std::string_view s) {
    double d = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty()) throw wrong();
    return d;
  };
  switch (key.kind) {
    case Kind::kInt: {
      std::int64_t i = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
      if (ec != std::errc() || p != text.data() + text.size() || text.empty()) throw wrong();
      return i;
    }
    case Kind::kFloat:
      return parseDouble(text);
    case Kind::kBool:
      if (text == "true" || text == "1" || text.empty()) return true;
      if (text == "false" || text == "0") return false;
      throw wrong();
    case Kind::kString:
      return text;
    case Kind::kFloatList: {
      std::vector<double> out;
      std::string_view rest = text;
      while (!rest.empty()) {
        const auto comma = rest.find(',');
        out.push_back(parseDouble(rest.substr(0, comma)));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      return out;
    }
  }
  throw wrong();
}

kernels::LayerSpec layerFromToml(const std::string& file, std::size_t index,
                                 const toml::table& table) {
  kernels::LayerSpec spec;
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    if (node.is_string()) {
      (key == "type" ? spec.type : spec.args[key]) = *node.value<std::string>();
    } else if (node.is_integer()) {
      spec.args[key] = std::to_string(*node.value<std::int64_t>());
    } else if (node.is_floating_point()) {
      spec.args[key] = fmt::format("{}", *node.value<double>());
    } else if (node.is_boolean()) {
      spec.args[key] = *node.value<bool>() ? "true" : "false";
    } else {
      throw InputError(
          fmt::format("{}: layers[{}].{} must be a string or a number", file, index, key));
    }
  }
  if (spec.type.empty()) {
    throw InputError(fmt::format("{}: layers[{}] has no 'type'", file, index));
  }
  return spec;
}

// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable() when it asks whether some non-ASCII
// characters are whitespace (marzer/tomlplusplus#190): one outside a string or comment (toml++
// asks of every character of a bare word, quotes included), or one after a backslash (or a
// line-ending backslash) in a multi-line basic string. TOML allows non-ASCII characters only in
// strings and comments; this refuses the rest before toml++ sees them. It follows TOML's grammar
// just enough to know where a quote opens a string: at the start of a key or of a value.
void checkNonAscii(const std::string& file, std::string_view text) {
  enum class At { kKeyStart, kKey, kValueStart, kWord, kAfter };
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  auto fail = [&](std::size_t pos, const char* what) {
    const auto line = 1 + std::count(text.begin(), text.begin() + pos, '\n');
    const auto line_start = text.rfind('\n', pos);
    const auto column = line_start == std::string_view::npos ? pos + 1 : pos - line_start;
    throw InputError(fmt::format("{}:{}:{}: {}", file, line, column, what));
  };
  auto nonAscii = [&](std::size_t pos) {
    return pos < text.size() && static_cast<unsigned char>(text[pos]) >= 0x80;
  };
  // At a closing """ or ''' (which may follow up to two quotes of the string): moves past it.
  auto closes = [&](std::size_t& pos, char quote) {
    if (text.substr(pos, 3) != std::string(3, quote)) return false;
    pos += 2;
    for (int extra = 0; extra < 2 && pos + 1 < text.size() && text[pos + 1] == quote; ++extra)
      ++pos;
    return true;
  };
  In in = In::kCode;
  At at = At::kKeyStart;
  At afterString = At::kAfter;
  std::string open;  // enclosing '[' (array), '{' (inline table), 'h' (table header)
  auto endString = [&] {
    in = In::kCode;
    at = afterString;
  };
  for (std::size_t pos = text.starts_with("\xEF\xBB\xBF") ? 3 : 0; pos < text.size(); ++pos) {
    const char c = text[pos];
    switch (in) {
      case In::kCode:
        if (nonAscii(pos)) fail(pos, "a non-ASCII character outside a string or comment");
        if (c == '#') {
          in = In::kComment;
        } else if (c == '\n') {
          at = !open.empty() && open.back() == '[' ? At::kValueStart : At::kKeyStart;
        } else if (c == ' ' || c == '\t' || c == '\r') {
          if (at == At::kWord) at = At::kAfter;
        } else if ((c == '"' || c == '\'') && (at == At::kKeyStart || at == At::kValueStart)) {
          const bool multi = text.substr(pos, 3) == std::string(3, c);
          in = c == '"' ? (multi ? In::kMultiBasic : In::kBasic)
                        : (multi ? In::kMultiLiteral : In::kLiteral);
          if (multi) pos += 2;
          afterString = at == At::kKeyStart ? At::kKey : At::kAfter;
        } else if (c == '=' && (at == At::kKeyStart || at == At::kKey)) {
          at = At::kValueStart;
        } else if (c == '.' && at == At::kKey) {
          at = At::kKeyStart;
        } else if (c == '[' && at == At::kValueStart) {
          open += '[';
        } else if (c == '[' && at == At::kKeyStart && (open.empty() || open.back() == 'h')) {
          open += 'h';
        } else if (c == '{' && at == At::kValueStart) {
          open += '{';
          at = At::kKeyStart;
        } else if (c == ']' || c == '}') {
          if (!open.empty()) open.pop_back();
          at = At::kAfter;
        } else if (c == ',') {
          at = open.empty() ? At::kAfter : open.back() == '[' ? At::kValueStart : At::kKeyStart;
        } else if (at == At::kKeyStart || at == At::kKey) {
          at = At::kKey;
        } else {
          at = At::kWord;  // a bare value, or what toml++ reads as part of one
        }
        break;
      case In::kComment:
        if (c == '\n') {
          in = In::kCode;
          at = !open.empty() && open.back() == '[' ? At::kValueStart : At::kKeyStart;
        }
        break;
      case In::kBasic:
        if (c == '\\') {
          ++pos;
        } else if (c == '"') {
          endString();
        } else if (c == '\n') {
          --pos;  // unterminated: the newline ends the line as code
          endString();
        }
        break;
      case In::kLiteral:
        if (c == '\'') {
          endString();
        } else if (c == '\n') {
          --pos;
          endString();
        }
        break;
      case In::kMultiBasic:
        if (c == '\\') {
          std::size_t next = pos + 1;
          while (next < text.size() && (text[next] == ' ' || text[next] == '\t' ||
                                        text[next] == '\r' || text[next] == '\n')) {
            ++next;
          }
          if (nonAscii(next)) {
            fail(next, "a non-ASCII character after a backslash in a multi-line string");
          }
          pos = next > pos + 1 ? next - 1 : next;
        } else if (c == '"' && closes(pos, '"')) {
          endString();
        }
        break;
      case In::kMultiLiteral:
        if (c == '\'' && closes(pos, '\'')) endString();
        break;
    }
  }
}

}  // namespace

const std::vector<ConfigKey>& configKeys() {
  static const std::vector<ConfigKey> out = [] {
    std::vector<ConfigKey> v;
    for (const auto& k : keys())
      v.push_back({k.name, kindName(k.kind), k.help});
    return v;
  }();
  return out;
}

void addConfigOptions(CLI::App& command, Overrides* overrides) {
  for (const auto& k : keys()) {
    const std::string name = k.name;
    std::string flags = "--" + name;
    if (name == "skip_bad_records") flags += ",--skip-bad-records";
    auto* opt = command.add_option_function<std::string>(
        flags, [overrides, name](const std::string& v) { (*overrides)[name] = v; },
        fmt::format("{} ({})", k.help, kindName(k.kind)));
    if (k.kind == Kind::kBool) opt->expected(0, 1);
  }
  command.add_option_function<std::string>(
      "--kv_store,--kv-store", [overrides](const std::string& v) { (*overrides)["schedule"] = v; },
      "MXNet's name for --schedule");
  command.add_option_function<std::string>(
      "--secret-file", [overrides](const std::string& v) { (*overrides)["secret_file"] = v; },
      "same as --secret_file");
}

actors::TrainOptions loadTrainOptions(const std::string& file, const Overrides& overrides) {
  TrainOptions o;
  o.model.name = "lenet";
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw InputError(fmt::format("cannot open config file '{}'", file));
    std::stringstream text;
    text << in.rdbuf();
    checkNonAscii(file, text.view());
    toml::table table;
    try {
      table = toml::parse(text.view(), file);
    } catch (const toml::parse_error& e) {
      const auto& where = e.source().begin;
      throw InputError(
          fmt::format("{}:{}:{}: {}", file, where.line, where.column, e.description()));
    }
    for (const auto& [k, node] : table) {
      const std::string key(k.str());
      if (key == "layers") {
        const auto* arr = node.as_array();
        if (!arr || !arr->is_array_of_tables()) {
          throw InputError(
              fmt::format("{}: 'layers' must be an array of tables ([[layers]])", file));
        }
        o.model.layers.clear();
        for (std::size_t i = 0; i < arr->size(); ++i) {
          o.model.layers.push_back(layerFromToml(file, i, *arr->get(i)->as_table()));
        }
        continue;
      }
      const Key* def = findKey(key == "kv_store" ? "schedule" : key);
      if (!def) {
        throw InputError(
            fmt::format("{}: unknown key '{}' (known: {}, layers)", file, key, knownKeys()));
      }
      def->set(o, fromToml(file, *def, node));
    }
    if (!o.model.layers.empty() && !table.contains("model")) o.model.name.clear();
  }
  // What `troupe launch` tells each process (MXNet's DMLC_* in troupe's names).
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v && *v ? std::optional<std::string>(v) : std::nullopt;
  };
  const std::pair<const char*, const char*> from_env[] = {{"TROUPE_NUM_WORKERS", "num_shards"},
                                                          {"TROUPE_RANK", "shard_id"},
                                                          {"TROUPE_ROLE", "role"},
                                                          {"TROUPE_NUM_SERVERS", "num_servers"},
                                                          {"TROUPE_RUN_ID", "run_id"},
                                                          {"TROUPE_GENERATION", "generation"},
                                                          {"TROUPE_RENDEZVOUS", "rendezvous"},
                                                          {"TROUPE_INTERFACE", "interface"}};
  for (const auto& [var, key] : from_env) {
    if (auto v = env(var); v && !overrides.count(key)) {
      try {
        findKey(key)->set(o, fromText(*findKey(key), *v));
      } catch (const InputError& e) {
        throw InputError(fmt::format("{}={}: {}", var, *v, e.what()));
      }
    }
  }
  for (const auto& [name, text] : overrides) {
    const Key* def = findKey(name);
    if (!def) throw InputError(fmt::format("unknown flag --{} (known: {})", name, knownKeys()));
    def->set(o, fromText(*def, text));
  }
  if (!o.model.layers.empty() && overrides.count("model")) o.model.layers.clear();
  o.schedule = canonicalSchedule(o.schedule);
  o.secret = transport::loadSecret(o.secret_file);
  for (const auto& [key, seconds] : {std::pair{"rendezvous_timeout", o.rendezvous_timeout_s},
                                     {"step_timeout", o.step_timeout_s},
                                     {"peer_timeout", o.peer_timeout_s},
                                     {"stall_warning", o.stall_warning_s}}) {
    if (!(seconds > 0)) {
      throw InputError(
          fmt::format("{} must be a positive number of seconds, not {}", key, seconds));
    }
  }
  // Started by hand (no launcher serving the store): rank 0 serves a tcp:// store itself.
  o.serve_store = !env("TROUPE_RENDEZVOUS").has_value();
  if (o.num_shards + o.num_servers > 1) {
    if (o.rendezvous.empty()) {
      throw InputError(
          fmt::format("{} processes need a rendezvous: --rendezvous tcp://HOST:PORT, "
                      "file:///shared/dir or redis://HOST:PORT (troupe launch sets it)",
                      o.num_shards));
    }
    if (o.run_id.empty()) {
      throw InputError("processes started by hand need the same --run_id");
    }
  }
  if (!o.run_id.empty()) actors::checkRunId(o.run_id);
  for (const auto& k : keys())
    o.parameters.emplace_back(k.name, k.get(o));
  return o;
}

}  // namespace troupe::apps
