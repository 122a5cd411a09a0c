#include "actors/train_config.h"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <sys/stat.h>

#include <cstdlib>
#include <optional>
#include <string_view>

#include "actors/cluster_env.h"
#include "actors/config_file.h"
#include "actors/config_keys.h"
#include "actors/run_id.h"
#include "transport/auth.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using config::Key;
using config::Kind;
using config::Value;

// MXNet's kvstore names map onto schedules; "kv_store" is accepted as a key alias too.
std::string canonicalSchedule(const std::string& s) {
  if (s == "dist_device_sync") return "dist_sync";
  return s;
}

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

}  // namespace

TrainOptions loadTrainOptions(const std::string& file, const ConfigOverrides& overrides) {
  TrainOptions o = config::defaultOptions();
  if (!file.empty()) {
    const std::string text = readConfigFile(file);
    checkNonAscii(file, text);
    toml::table table;
    try {
      table = toml::parse(text, file);
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
      const Key* def = config::findKey(key == "kv_store" ? "schedule" : key);
      if (!def) {
        throw InputError(fmt::format("unknown key '{}' in {}{} (known: {}, layers)", key, file,
                                     config::didYouMeanKey(key), config::knownKeys()));
      }
      config::assign(o, *def, fromToml(file, *def, node), fmt::format("{}: key '{}'", file, key));
    }
    if (!o.model.layers.empty() && !table.contains("model")) o.model.name.clear();
  }
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v && *v ? std::optional<std::string>(v) : std::nullopt;
  };
  for (auto [var, key] : config::kLauncherVariables) {
    // `troupe launch --elastic MIN:MAX` says TROUPE_NUM_WORKERS=MIN:MAX.
    if (auto v = env(var);
        v && key == std::string_view("num_shards") && v->find(':') != std::string::npos) {
      key = "num_workers";
    }
    if (auto v = env(var);
        v && !overrides.count(key) &&
        !(key == std::string_view("num_shards") && overrides.count("num_workers"))) {
      const Key& def = *config::findKey(key);
      Value value;
      try {
        value = config::fromText(def, *v);
      } catch (const InputError& e) {
        throw InputError(fmt::format("{}={}: {}", var, *v, e.what()));
      }
      config::assign(o, def, std::move(value), fmt::format("{}={}: key '{}'", var, *v, key));
    }
  }
  for (const auto& [name, text] : overrides) {
    const Key* def = config::findKey(name);
    if (!def) {
      throw InputError(fmt::format("unknown flag --{}{} (known: {})", name,
                                   config::didYouMeanFlag(name), config::knownKeys()));
    }
    config::assign(o, *def, config::fromText(*def, text), "--" + name);
  }
  if (!o.model.layers.empty() && overrides.count("model")) o.model.layers.clear();
  o.schedule = canonicalSchedule(o.schedule);
  // Started by srun, an Indexed Job or mpirun without `troupe launch`: the place the engine
  // gives, for what no flag and no TROUPE_* variable gave (actors/cluster_env.h).
  auto given_by = [&](std::string_view key) -> std::optional<std::string> {
    if (const auto it = overrides.find(std::string(key)); it != overrides.end()) {
      return fmt::format("--{} {}", key, it->second);
    }
    for (const auto& [var, k] : config::kLauncherVariables) {
      if (auto v = env(var); v && key == k) return fmt::format("{}={}", var, *v);
    }
    return std::nullopt;
  };
  applyClusterEnvironment(o, given_by, processEnvironment());
  // The secret file is read whole (transport::loadSecret): refused first if it is not a small
  // regular file, as a config file would be.
  const std::string secret_file =
      !o.secret_file.empty() ? o.secret_file : env("TROUPE_SECRET_FILE").value_or("");
  if (struct stat st{}; !secret_file.empty() && ::stat(secret_file.c_str(), &st) == 0) {
    checkSmallRegularFile(secret_file, "secret file", st);
  }
  o.secret = transport::loadSecret(o.secret_file);
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
  if (!o.run_id.empty()) checkRunId(o.run_id);
  for (const auto& k : config::keys())
    o.parameters.emplace_back(k.name, k.get(o));
  return o;
}

}  // namespace troupe::actors
