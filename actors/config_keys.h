// The key table behind actors/train_config.h: every key's name, type, accepted values, help, and
// how it is set on and read from TrainOptions; the checked assignment every value passes, from a
// file, a flag or a variable. Private to the config loader (config_keys.cc, train_config.cc);
// everyone else reads the table through configKeys(). Any thread: the table is built once and
// never changes.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "actors/trainer.h"

namespace troupe::actors::config {

using Value =
    std::variant<std::int64_t, std::uint64_t, double, bool, std::string, std::vector<double>>;

enum class Kind { kInt, kUint, kFloat, kBool, kString, kFloatList };

// "integer", "number", "boolean", "string" or "list of numbers".
const char* kindName(Kind k);

// The values a numeric key accepts (for a list, each element): finite, from lo to hi, an open end
// excluding its bound. Integer keys have integer bounds, all below 2^53 (exact as doubles).
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  bool contains(double x) const;
  std::string text() const;  // "[1, 64]", "[0, 1)"
};

// A key: its name and kind, its range and help, and how it is set on and read from TrainOptions
// (`get` gives the text the run logs and docs/config.md shows as its default).
struct Key {
  const char* name;
  Kind kind;
  Range range;  // numeric kinds only
  const char* help;
  std::function<void(TrainOptions&, const Value&)> set;
  std::function<std::string(const TrainOptions&)> get;
  bool single = false;  // stored as a float: the range holds for the value rounded to one
};

// Every key, in the order of --help, docs/config.md and TrainOptions::parameters.
const std::vector<Key>& keys();

// The key named `name`; nullptr when there is none.
const Key* findKey(std::string_view name);

// Every key's name, comma-separated, for error messages.
std::string knownKeys();

// ": did you mean 'batch_size'?" for a misspelt key in a file, or "" when no key is near.
std::string didYouMeanKey(std::string_view name);

// ": did you mean --batch_size?" for a misspelt flag, or "" when no key is near.
std::string didYouMeanFlag(std::string_view name);

// "an integer in [1, 1048576]", "a string": what a key accepts, for --help and errors.
std::string accepted(const Key& key);

// Sets a key, checking the value against the key's range first: the one place every value, from
// a file, a flag or troupe launch's environment, passes. `origin` names where the value came from
// ("FILE: key 'k'", "--k", "VAR=TEXT: key 'k'").
void assign(TrainOptions& o, const Key& key, Value value, const std::string& origin);

// A value of `key`'s kind from a flag's or variable's text (a list comma-separated; a boolean
// true, 1, empty, false or 0): InputError "--key: expected a ..., got 'TEXT'" otherwise. The
// range is assign's to check.
Value fromText(const Key& key, const std::string& text);

// What a run has before its file, variables and flags.
TrainOptions defaultOptions();

// What `troupe launch` tells each process (MXNet's DMLC_* in troupe's names).
inline constexpr std::pair<const char*, const char*> kLauncherVariables[] = {
    {"TROUPE_NUM_WORKERS", "num_shards"},
    {"TROUPE_RANK", "shard_id"},
    {"TROUPE_ROLE", "role"},
    {"TROUPE_NUM_SERVERS", "num_servers"},
    {"TROUPE_RUN_ID", "run_id"},
    {"TROUPE_GENERATION", "generation"},
    {"TROUPE_RENDEZVOUS", "rendezvous"},
    {"TROUPE_INTERFACE", "interface"}};

}  // namespace troupe::actors::config
