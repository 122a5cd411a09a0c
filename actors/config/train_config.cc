#include "actors/config/train_config.h"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string_view>

#include "actors/config/caffe2_flags.h"
#include "actors/config/cluster_env.h"
#include "actors/config/config_file.h"
#include "actors/config/config_keys.h"
#include "actors/core/run_id.h"
#include "actors/schedules/schedule.h"
#include "rendezvous/url.h"
#include "transport/auth.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// crop is the size the net sees: image_size follows it, unless given by as strong a source (a
// flag over a file's crop, or the same file) with another value; per-channel values come one
// per channel, or one for all.
void resolveImageKeys(config::Settings& s) {
  auto& o = s.options;
  if (o.transform.crop > 0) {
    const auto* crop = s.find("crop");
    if (const auto* g = s.find("image_size");
        g && o.image_size != o.transform.crop && crop && g->source.rank >= crop->source.rank) {
      throw InputError(fmt::format(
          "{} and crop {} disagree: crop is the height and width of the images the net sees "
          "(leave image_size out)",
          g->source.by, o.transform.crop));
    }
    o.image_size = o.transform.crop;
  }
  for (const auto& [key, list] : {std::pair{"mean_per_channel", &o.mean_per_channel},
                                  std::pair{"std_per_channel", &o.std_per_channel}}) {
    if (list->size() > 1 && list->size() != static_cast<std::size_t>(o.num_channels)) {
      throw InputError(fmt::format("{}: {} values for images of num_channels {}",
                                   s.find(key) ? s.find(key)->source.by : key, list->size(),
                                   o.num_channels));
    }
  }
  if ((o.transform.resize_short > 0 || o.transform.random_resized_crop) && o.transform.crop == 0) {
    throw InputError("resize_short and random_resized_crop need crop, the size the net sees");
  }
}

using config::Key;
using config::Kind;
using config::Rank;
using config::Value;

Value fromToml(const std::string& file, const Key& key, const toml::node& node) {
  auto wrong = [&]() -> InputError {
    return InputError(
        fmt::format("{}: key '{}' must be a {}, got {}", file, key.name, config::kindName(key.kind),
                    toml::impl::node_type_friendly_names[static_cast<std::size_t>(node.type())]));
  };
  switch (key.kind) {
    case Kind::kInt:
    case Kind::kUint:
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

// A TOML value as the messages show it: "float16", "64", "[1, 2]".
std::string nodeText(const toml::node& node) {
  if (auto v = node.value_exact<std::string>()) return *v;
  if (auto v = node.value_exact<std::int64_t>()) return std::to_string(*v);
  if (auto v = node.value_exact<double>()) return fmt::format("{}", *v);
  if (auto v = node.value_exact<bool>()) return *v ? "true" : "false";
  if (const auto* arr = node.as_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < arr->size(); ++i)
      out += (i ? ", " : "") + nodeText(*arr->get(i));
    return out + "]";
  }
  return std::string(toml::impl::node_type_friendly_names[static_cast<std::size_t>(node.type())]);
}

using KeyGiven = std::function<bool(std::string_view key)>;
using SetFromVariable = std::function<void(const std::string& by, const std::string& text,
                                           std::string_view key, Rank rank)>;

// MXNet's variables, for the keys that neither a flag nor a TROUPE_* variable gives: what
// tools/launch.py (dmlc-core's trackers) or a hand-made ps-lite script tells each process.
void applyMxnetVariables(const EnvLookup& env, const KeyGiven& flag_gives,
                         const SetFromVariable& set) {
  auto open = [&](std::string_view key) {
    if (flag_gives(key) || (key == "num_shards" && flag_gives("num_workers"))) return false;
    for (const auto& [var, k] : config::kLauncherVariables) {
      if (key == k && env(var)) return false;
    }
    return true;
  };
  const auto role = env("DMLC_ROLE");
  if (role && *role == "scheduler" && open("role")) {
    throw InputError(
        "DMLC_ROLE=scheduler: troupe runs no scheduler process: worker 0 serves the rendezvous "
        "at tcp://DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT itself (or troupe launch serves one): start "
        "only the workers and the servers");
  }
  if (role && *role != "worker" && *role != "server" && open("role")) {
    throw InputError(fmt::format("DMLC_ROLE={}: expected worker or server", *role));
  }
  for (const auto& [var, key] : config::kMxnetVariables) {
    if (auto v = env(var); v && open(key)) {
      set(fmt::format("{}={}", var, *v), *v, key, Rank::kMxnet);
    }
  }
  const char* id = role && *role == "server" ? "DMLC_SERVER_ID" : "DMLC_WORKER_ID";
  if (auto v = env(id); v && open("shard_id")) {
    set(fmt::format("{}={}", id, *v), *v, "shard_id", Rank::kMxnet);
  }
  const auto uri = env("DMLC_PS_ROOT_URI");
  const auto port = env("DMLC_PS_ROOT_PORT");
  if ((uri || port) && open("rendezvous")) {
    if (!uri || !port) {
      throw InputError(fmt::format("{} without {}: the two name the rendezvous (tcp://URI:PORT)",
                                   uri ? "DMLC_PS_ROOT_URI=" + *uri : "DMLC_PS_ROOT_PORT=" + *port,
                                   uri ? "DMLC_PS_ROOT_PORT" : "DMLC_PS_ROOT_URI"));
    }
    const bool digits =
        port->size() <= 5 && port->find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(*port) < 1 || std::stoi(*port) > 65535) {
      throw InputError(fmt::format("DMLC_PS_ROOT_PORT={}: expected a port in [1, 65535]", *port));
    }
    const bool ipv6 = uri->find(':') != std::string::npos && !uri->starts_with('[');
    set(fmt::format("DMLC_PS_ROOT_URI={} DMLC_PS_ROOT_PORT={}", *uri, *port),
        fmt::format("tcp://{}:{}", ipv6 ? "[" + *uri + "]" : *uri, *port), "rendezvous",
        Rank::kMxnet);
  }
}

// What MXNet's variables leave to settle once every source is read: a run id from the rendezvous
// when none is given (every process of the run sees the same DMLC_PS_ROOT_URI and _PORT), and a
// rank for a process that DMLC_ROLE places among several of its role.
void settleMxnetPlace(config::Settings& s, const EnvLookup& env) {
  TrainOptions& o = s.options;
  if (const auto* store = s.find("rendezvous");
      store && store->source.rank == Rank::kMxnet && !s.find("run_id") && o.run_id.empty()) {
    std::string id = "dmlc-" + store->text.substr(std::string_view("tcp://").size());
    for (char& c : id) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '-';
    }
    o.run_id = id;
  }
  const auto role = env("DMLC_ROLE");
  const auto* role_given = s.find("role");
  if (!role || !role_given || role_given->source.rank != Rank::kMxnet || s.find("shard_id")) {
    return;
  }
  const bool server = o.role == ProcessRole::kServer;
  const int count = server ? o.num_servers : o.num_shards;
  if (count > 1) {
    throw InputError(fmt::format(
        "DMLC_ROLE={} among {} {}s, but nothing gives this one's rank: ps-lite's scheduler numbers "
        "processes as they join, and troupe has none: set {} (0 to {}), TROUPE_RANK or "
        "--shard_id, or start the run with troupe launch",
        *role, count, *role, server ? "DMLC_SERVER_ID" : "DMLC_WORKER_ID", count - 1));
  }
}

// A config file's text as a TOML table; InputError at FILE:LINE:COLUMN where it does not parse.
toml::table parseConfigFile(const std::string& file) {
  const std::string text = readConfigFile(file);
  checkNonAscii(file, text);
  try {
    return toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw InputError(fmt::format("{}:{}:{}: {}", file, where.line, where.column, e.description()));
  }
}

// A file's [[layers]]: a custom model's layers, in order.
std::vector<kernels::LayerSpec> layersFromToml(const std::string& file, const toml::node& node) {
  const auto* arr = node.as_array();
  if (!arr || !arr->is_array_of_tables()) {
    throw InputError(fmt::format("{}: 'layers' must be an array of tables ([[layers]])", file));
  }
  std::vector<kernels::LayerSpec> layers;
  for (std::size_t i = 0; i < arr->size(); ++i)
    layers.push_back(layerFromToml(file, i, *arr->get(i)->as_table()));
  return layers;
}

// The config file's keys, each set as the file gives it; [[layers]] replace the model's layers,
// and name no model unless the file names one too.
void applyConfigFile(config::Settings& s, const std::string& file) {
  TrainOptions& o = s.options;
  const toml::table table = parseConfigFile(file);
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    if (key == "layers") {
      o.model.layers = layersFromToml(file, node);
      continue;
    }
    const Key* def = config::findKey(key == "kv_store" ? "schedule" : key);
    if (!def) {
      throw InputError(fmt::format(
          "unknown key '{}' in {}{} (docs/config.md and troupe train --help list the keys)", key,
          file, config::didYouMeanKey(key)));
    }
    const config::Source from{Rank::kFile, fmt::format("{}: key '{}'", file, key),
                              fmt::format("{}: {} = {}", file, key, nodeText(node))};
    if (def->refusal) throw InputError(fmt::format("{}: {}", from.by, def->refusal));
    config::assign(s, *def, fromToml(file, *def, node), from);
  }
  if (!o.model.layers.empty() && !table.contains("model")) o.model.name.clear();
}

// troupe launch's TROUPE_* variables (any launcher's), for the keys that no flag gives.
void applyLauncherVariables(const EnvLookup& env, const KeyGiven& flag_gives,
                            const SetFromVariable& set) {
  for (auto [var, key] : config::kLauncherVariables) {
    // `troupe launch --elastic MIN:MAX` says TROUPE_NUM_WORKERS=MIN:MAX.
    if (auto v = env(var);
        v && key == std::string_view("num_shards") && v->find(':') != std::string::npos) {
      key = "num_workers";
    }
    if (auto v = env(var); v && !flag_gives(key) &&
                           !(key == std::string_view("num_shards") && flag_gives("num_workers"))) {
      set(fmt::format("{}={}", var, *v), *v, key, Rank::kLauncher);
    }
  }
}

// The flags (or a service's values in their place), over every other source; a --model flag
// drops the file's [[layers]].
void applyFlags(config::Settings& s, const ConfigOverrides& overrides) {
  TrainOptions& o = s.options;
  for (const auto& [given_name, text] : overrides) {
    // A setting copied from a command line keeps its dashes: "--batch_size" is batch_size.
    std::string_view name = given_name;
    while (name.starts_with('-'))
      name.remove_prefix(1);
    const Key* def = config::findKey(name);
    if (!def) {
      throw InputError(fmt::format("unknown setting '{}'{} (docs/config.md lists the settings)",
                                   given_name, config::didYouMeanKey(name)));
    }
    const config::Source from{
        Rank::kFlag, fmt::format("--{}", name),
        text.empty() ? fmt::format("--{}", name) : fmt::format("--{} {}", name, text)};
    if (def->refusal) throw InputError(fmt::format("{}: {}", from.by, def->refusal));
    config::assign(s, *def, config::fromText(*def, text), from);
  }
  if (!o.model.layers.empty() && overrides.count("model")) o.model.layers.clear();
}

// Started by srun, an Indexed Job or mpirun without `troupe launch`: the place the engine gives,
// for what no flag, TROUPE_* or DMLC_* variable gave (actors/config/cluster_env.h).
void applyClusterPlace(config::Settings& s, const EnvLookup& env) {
  auto given_by = [&](std::string_view key) -> std::optional<std::string> {
    if (const auto* g = s.find(key); g && g->source.rank >= Rank::kMxnet) return g->source.by;
    for (const auto& [var, k] : config::kLauncherVariables) {
      if (auto v = env(var); v && key == k) return fmt::format("{}={}", var, *v);
    }
    return std::nullopt;
  };
  applyClusterEnvironment(s.options, given_by, env);
}

// Several processes and no schedule named: Caffe2's trainer ran synchronous SGD across its
// --num_shards (docs/flags.md), and MXNet's launch.py with servers dist_sync; so does troupe.
void settleSchedule(config::Settings& s) {
  const TrainOptions& o = s.options;
  if (s.find("schedule") || o.num_shards + o.num_servers <= 1) return;
  const std::string schedule = o.num_servers > 0 ? "dist_sync" : "bsp-allreduce";
  config::assign(s, *config::findKey("schedule"), schedule,
                 config::Source{Rank::kDefault, "several processes",
                                fmt::format("several processes ({} workers, {} servers)",
                                            o.num_shards, o.num_servers)});
}

// The secret file is read whole (transport::loadSecret): refused first if it is not a small
// regular file, as a config file would be.
void loadSecretFile(TrainOptions& o, const EnvLookup& env) {
  const std::string secret_file =
      !o.secret_file.empty() ? o.secret_file : env("TROUPE_SECRET_FILE").value_or("");
  if (struct stat st{}; !secret_file.empty() && ::stat(secret_file.c_str(), &st) == 0) {
    checkSmallRegularFile(secret_file, "secret file", st);
  }
  o.secret = transport::loadSecret(o.secret_file);
}

// Several processes need a rendezvous and, started by hand, one run id; a run id must be valid.
void checkRendezvous(const TrainOptions& o) {
  if (o.num_shards + o.num_servers > 1) {
    if (o.rendezvous.empty()) {
      throw InputError(
          fmt::format("{} processes need a rendezvous: --rendezvous {} (troupe launch sets it; "
                      "so do Caffe2's --redis_host and --file_store_path)",
                      o.num_shards, rendezvous::storeUrlForms()));
    }
    if (o.run_id.empty()) {
      throw InputError("processes started by hand need the same --run_id");
    }
  }
  if (!o.run_id.empty()) checkRunId(o.run_id);
}

}  // namespace

TrainOptions loadTrainOptions(const std::string& file, const ConfigOverrides& overrides) {
  config::Settings s = config::defaultSettings();
  TrainOptions& o = s.options;
  if (!file.empty()) applyConfigFile(s, file);
  const EnvLookup env = processEnvironment();
  // A flag gives `key`: its own, or one of Caffe2's that sets it.
  auto flag_gives = [&](std::string_view key) {
    for (const auto& [name, text] : overrides) {
      const Key* def = config::findKey(name);
      if (name == key || (def && def->sets && key == def->sets)) return true;
    }
    return false;
  };
  // `text` from a variable (`by`: "VAR=TEXT") for `key`.
  auto from_variable = [&](const std::string& by, const std::string& text, std::string_view key,
                           Rank rank) {
    const Key& def = *config::findKey(key);
    Value value;
    try {
      value = config::fromText(def, text);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", by, e.what()));
    }
    config::assign(s, def, std::move(value),
                   config::Source{rank, fmt::format("{}: key '{}'", by, key), by});
  };
  applyMxnetVariables(env, flag_gives, from_variable);
  applyLauncherVariables(env, flag_gives, from_variable);
  applyFlags(s, overrides);
  config::resolveCaffe2Flags(s);
  resolveImageKeys(s);
  settleMxnetPlace(s, env);
  applyClusterPlace(s, env);
  settleSchedule(s);
  // MXNet's kvstore names map onto schedules (the table's rows name theirs; "kv_store" is
  // accepted as a key alias too): the log shows the row's name.
  o.schedule = makeSchedule(s.schedule_keys);
  s.schedule_keys.schedule = o.schedule.name();
  if (o.schedule.nccl()) s.schedule_keys.reducer = "nccl";
  loadSecretFile(o, env);
  // Started by hand (no launcher serving the store), or given a rendezvous of its own beside the
  // launcher's (a torch.distributed subgroup's ring): rank 0 serves a tcp:// store itself.
  const auto launchers = env("TROUPE_RENDEZVOUS");
  o.serve_store = !launchers || (flag_gives("rendezvous") && o.rendezvous != *launchers);
  checkRendezvous(o);
  // As given: lr_scaling's factor is applied after (docs/config.md).
  for (const auto& k : config::keys())
    o.parameters.emplace_back(k.name, config::shownValue(k, k.get(s)));
  config::applyLrScaling(s);
  return std::move(s.options);
}

}  // namespace troupe::actors
