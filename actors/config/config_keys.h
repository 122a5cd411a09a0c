// The key table behind actors/config/train_config.h: every key's name, type, accepted values, help,
// and how it is set on and read from TrainOptions (Caffe2's flags among them: caffe2_flags.h); the
// checked assignment every value passes, from a file, a flag or a variable. Private to the config
// loader (config_keys.cc, train_config.cc); everyone else reads the table through configKeys(). Any
// thread: the table is built once and never changes.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "actors/run/trainer.h"
#include "troupe/error.h"

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

// Where a value came from, weakest first: a source of a higher rank overrides a lower one's value
// (the loader reads them in this order), and two names that set one key from the same source are
// an InputError.
enum class Rank { kDefault, kFile, kMxnet, kLauncher, kFlag };

struct Source {
  Rank rank = Rank::kDefault;
  std::string origin;  // for a value out of range: "FILE: key 'k'", "--k", "VAR=TEXT: key 'k'"
  std::string by;      // for any other message: "FILE: k = V", "--k V", "VAR=V"
};

// A value that was given, and by whom.
struct Given {
  std::string name;  // the key or alias that gave it
  std::string text;  // the value, as a flag would give it
  Source source;
};

// A run's settings while the loader reads its sources: the options, what gave each key its value
// (an alias's under its own name and under the key it sets), and what TrainOptions has no field
// for (lr_scaling, and Caffe2's flags that combine: caffe2_flags.h).
struct Settings {
  TrainOptions options;
  ScheduleKeys schedule_keys;  // options.schedule once every source is read (makeSchedule)
  std::map<std::string, Given, std::less<>> given;
  std::optional<bool> use_cpu;  // Caffe2's --use_cpu, as given

  const Given* find(std::string_view name) const;
  // The text `name` was given as; `fallback` when nothing gave it.
  std::string textOr(std::string_view name, std::string_view fallback) const;
};

// Thrown by a key's `set` that refuses a value: assign() puts who gave it in front ("--dtype
// float16: ...").
class Refusal : public InputError {
 public:
  using InputError::InputError;
};

// A key: its name and kind, its range and help, and how it is set on and read from the settings
// (`get` gives the text the run logs and docs/config.md shows as its default). An alias (one of
// Caffe2's flags) names the key it `sets`; one that is always refused says why in `refusal`,
// whatever its value.
struct Key {
  const char* name;
  Kind kind;
  Range range;  // numeric kinds only
  const char* help;
  std::function<void(Settings&, const Value&)> set;
  std::function<std::string(const Settings&)> get;
  bool single = false;  // stored as a float: the range holds for the value rounded to one
  const char* sets = nullptr;
  const char* refusal = nullptr;
  // Changes the arithmetic of a step (a rate, a batch, the data's normalisation, the model, the
  // exchange of gradients): every process of a run must have the same value (agreeOnPlan), where
  // the others are a process's own (paths, threads, timeouts, output, its place in the run).
  bool agree = false;
};

// `key`, marked as one every process of a run must give the same value (Key::agree). A rank
// started by hand with another learning rate once trained beside the others and diverged
// (1.9e11) without a word.
Key agreed(Key key);

// Every key, in the order of --help, docs/config.md and TrainOptions::parameters.
const std::vector<Key>& keys();

// The key named `name`; nullptr when there is none.
const Key* findKey(std::string_view name);

// Another framework's name for a key: MXNet's --lr is base_learning_rate.
struct OtherName {
  const char* name;   // as the other tool spells it, dashes as underscores
  const char* key;    // troupe's
  const char* whose;  // "MXNet's and PyTorch's"
};
// The key of another framework's flag or key `name` (dashes and case aside), if troupe has one.
std::optional<OtherName> keyForOtherName(std::string_view name);

// ": did you mean 'batch_size'?" for a misspelt key in a file (or another framework's name for
// it: "did you mean 'base_learning_rate'? ('lr' is MXNet's and PyTorch's)"), or "" when no key is
// near.
std::string didYouMeanKey(std::string_view name);

// "an integer in [1, 1048576]", "a string": what a key accepts, for --help and errors.
std::string accepted(const Key& key);

// Sets a key, checking the value against the key's range first: the one place every value, from
// a file, a flag or a variable, passes. Records who gave it in `s.given`. InputError naming
// `from` for a value out of range, a refused one, or a second name for the same key from the same
// source ("--interface eth0 and --distributed_interfaces eth1 both set interface").
void assign(Settings& s, const Key& key, Value value, const Source& from);

// A value as a flag gives it: "64", "0.1", "true", "1,3".
std::string valueText(const Value& value);

// `text`, a value of `key`, fit for a log, a message or a terminal: a password in a rendezvous
// URL redacted (rendezvous/url.h). Every place that shows a key's value goes through it.
std::string shownValue(const Key& key, std::string_view text);

// A value of `key`'s kind from a flag's or variable's text (a list comma-separated; a boolean
// true, 1, empty, false or 0, or Python's True and False): InputError "--key: expected a ..., got
// 'TEXT'" otherwise. The range is assign's to check.
Value fromText(const Key& key, const std::string& text);

// What a run has before its file, variables and flags.
Settings defaultSettings();

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

// MXNet's variables (ps-lite's, as tools/launch.py and dmlc-core's trackers set them, and MXNet's
// own switch for CUDA graphs) that set a key as they are, each unless a flag or a TROUPE_*
// variable gives that key. DMLC_WORKER_ID and DMLC_SERVER_ID (shard_id, by role) and
// DMLC_PS_ROOT_URI with DMLC_PS_ROOT_PORT (rendezvous tcp://URI:PORT) are read beside them
// (train_config.cc).
inline constexpr std::pair<const char*, const char*> kMxnetVariables[] = {
    {"DMLC_NUM_WORKER", "num_shards"},
    {"DMLC_NUM_SERVER", "num_servers"},
    {"DMLC_ROLE", "role"},
    {"DMLC_INTERFACE", "interface"},
    {"MXNET_ENABLE_CUDA_GRAPHS", "cuda_graphs"}};

}  // namespace troupe::actors::config
