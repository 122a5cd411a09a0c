#include "actors/config/config_keys.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <set>
#include <string>
#include <type_traits>

#include "actors/config/caffe2_flags.h"
#include "actors/config/nearest_name.h"
#include "actors/config/train_config.h"
#include "actors/config/worker_bounds.h"
#include "actors/schedules/schedule.h"
#include "kernels/named.h"
#include "kernels/optimizer.h"
#include "rendezvous/url.h"
#include "rendezvous/value.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace config {
namespace {

constexpr Range closed(double lo, double hi) {
  return {lo, hi, false, false};
}
constexpr Range openBelow(double lo, double hi) {  // (lo, hi]
  return {lo, hi, true, false};
}
constexpr Range openAbove(double lo, double hi) {  // [lo, hi)
  return {lo, hi, false, true};
}

// The ranges, and why. Every bound keeps the products the trainer forms (steps x batch, epochs x
// steps per epoch, seconds x 1e9 in a std::chrono duration) inside an int64.
constexpr double k2Pow20 = 1 << 20;
constexpr double k2Pow40 = 1099511627776.0;
constexpr double kMillion = 1e6;

// The rendezvous key's help: the store backends' forms (rendezvous/url.h).
const std::string& storeForms() {
  static const std::string forms = rendezvous::storeUrlForms();
  return forms;
}
// Inputs per step and process. Published large-batch runs use 32k-64k inputs over hundreds of
// devices; 2^20 in one process is beyond any of them. Memory is checked again when the run
// starts (runTraining), from the image size.
constexpr Range kBatchSize = closed(1, k2Pow20);
// Inputs per epoch: 0 is the whole training set; 2^40 is far past any data set, and with
// num_epochs <= 10^6 keeps every step count below 2^60.
constexpr Range kEpochSize = closed(0, k2Pow40);
// Points of the learning-rate schedule, in epochs: 10^6 of them in steps stay inside an int64.
constexpr Range kEpochs = closed(0, kMillion);
// Seconds: positive, and at most 30 days, so that a std::chrono duration of them (nanoseconds:
// 2.6e15) never overflows; beyond a few hours a timeout no longer catches anything.
constexpr Range kSeconds = openBelow(0, 30 * 24 * 3600);
// Processes of a run, as troupe launch counts them; node ids stay far inside 32 bits.
constexpr Range kProcesses = closed(1, 65536);
// CPU threads: 0 is the host's own count. The largest hosts have 512 hardware threads; past 1024
// a thread pool only fails to start (libgomp: "Thread creation failed").
constexpr Range kThreads = closed(0, 1024);
// Pixel values are 8- or 16-bit; a mean or scale far outside that is a typo.
constexpr Range kMean = closed(-kMillion, kMillion);
constexpr Range kScale = openBelow(0, kMillion);
constexpr Range kBucketMb = closed(0, 4096);
// JPEG's own limit on a side.
constexpr double kImageSide = 65535;
constexpr Range kNotNumeric{};

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

// A list of two numbers, low then high.
const std::vector<double>& pairOf(const Value& v, const char* key) {
  const auto& list = std::get<std::vector<double>>(v);
  if (list.size() != 2 || list[0] > list[1]) {
    throw Refusal(fmt::format("{} is two numbers, low then high", key));
  }
  return list;
}

std::string listText(const std::vector<double>& list) {
  std::string out;
  for (std::size_t i = 0; i < list.size(); ++i)
    out += (i ? "," : "") + fmt::format("{}", list[i]);
  return out;
}

// Keys of a TrainOptions field; the _AT forms name any member of the settings.
#define TROUPE_INT_KEY(key, field, range, help) TROUPE_INT_KEY_AT(key, options.field, range, help)
#define TROUPE_INT_KEY_AT(key, member, range, help)                                         \
  Key {                                                                                     \
    key, Kind::kInt, range, help, [](Settings& s, const Value& v) { s.member = asInt(v); }, \
        [](const Settings& s) { return fmt::format("{}", s.member); }                       \
  }
#define TROUPE_FLOAT_KEY(key, field, range, help)                               \
  Key {                                                                         \
    key, Kind::kFloat, range, help,                                             \
        [](Settings& s, const Value& v) {                                       \
          s.options.field = static_cast<decltype(s.options.field)>(asFloat(v)); \
        },                                                                      \
        [](const Settings& s) { return fmt::format("{}", s.options.field); },   \
        std::is_same_v<decltype(TrainOptions{}.field), float>                   \
  }
#define TROUPE_STRING_KEY(key, field, help) TROUPE_STRING_KEY_AT(key, options.field, help)
#define TROUPE_STRING_KEY_AT(key, member, help)                      \
  Key {                                                              \
    key, Kind::kString, kNotNumeric, help,                           \
        [](Settings& s, const Value& v) { s.member = asString(v); }, \
        [](const Settings& s) { return s.member; }                   \
  }

// A count of bytes as people write it: 1500000, 512K, 512M, 16G, 1.5GiB, 2TB (K, M, G, T powers
// of 1024, with or without "i" and "B"); InputError for anything else or a negative count.
std::int64_t parseBytes(const std::string& text) {
  double value = 0;
  const char* end = text.c_str();
  if (!text.empty()) value = std::strtod(text.c_str(), const_cast<char**>(&end));
  std::string unit(end);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  const std::string units = "KMGT";
  double scale = 1;
  if (unit.size() == 1 && units.find(unit[0]) != std::string::npos) {
    scale = std::pow(1024.0, static_cast<double>(units.find(unit[0]) + 1));
  } else if (!unit.empty()) {
    value = -1;
  }
  if (end == text.c_str() || !(value >= 0) || value * scale > 9e18) {
    throw InputError("'" + text + "' is not a count of bytes (512M, 16G, 1.5GiB)");
  }
  return static_cast<std::int64_t>(value * scale);
}

// One of the choices, or a Refusal naming them.
std::string oneOf(const std::string& value, const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
  std::string list;
  for (std::size_t i = 0; i < choices.size(); ++i)
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  throw Refusal("expected " + list);
}

// A key that takes one of `table`'s names (trainer.h's Named tables), each standing for a value
// of the field.
template <typename E, std::size_t N>
E named(const Named<E> (&table)[N], const std::string& text) {
  if (const E* value = kernels::valueNamed(table, text)) return *value;
  std::vector<std::string> names;
  for (const auto& row : table)
    names.emplace_back(row.name);
  oneOf(text, names);  // throws, naming them
  return table[0].value;
}
#define TROUPE_NAMED_KEY(key, field, table, help)                                         \
  Key {                                                                                   \
    key, Kind::kString, kNotNumeric, help,                                                \
        [](Settings& s, const Value& v) { s.options.field = named(table, asString(v)); }, \
        [](const Settings& s) { return std::string(nameIn(table, s.options.field)); }     \
  }

// A key that takes one of `table`'s names and keeps it as text (the schedule's keys, which
// makeSchedule reads once every source is in).
#define TROUPE_TABLE_NAME_KEY_AT(key, member, table, help)                                        \
  Key {                                                                                           \
    key, Kind::kString, kNotNumeric, help,                                                        \
        [](Settings& s, const Value& v) { s.member = nameIn(table, named(table, asString(v))); }, \
        [](const Settings& s) { return s.member; }                                                \
  }

// A list of two numbers, low then high, into two fields.
#define TROUPE_RANGE_KEY(key, low, high, range, help)       \
  Key {                                                     \
    key, Kind::kFloatList, range, help,                     \
        [](Settings& s, const Value& v) {                   \
          const auto& r = pairOf(v, key);                   \
          s.options.low = r[0];                             \
          s.options.high = r[1];                            \
        },                                                  \
        [](const Settings& s) {                             \
          return listText({s.options.low, s.options.high}); \
        }                                                   \
  }

#define TROUPE_BOOL_KEY(key, field, help)                                                 \
  Key {                                                                                   \
    key, Kind::kBool, kNotNumeric, help,                                                  \
        [](Settings& s, const Value& v) { s.options.field = asBool(v); },                 \
        [](const Settings& s) { return std::string(s.options.field ? "true" : "false"); } \
  }

std::vector<std::string> keyNames() {
  std::vector<std::string> names;
  for (const auto& k : keys())
    names.emplace_back(k.name);
  return names;
}

// The ids of Caffe2's --gpus list ("0,1,3"): Refusal when it is not one.
std::vector<int> deviceIds(const std::string& list) {
  std::vector<int> ids;
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto end = std::min(list.find(',', start), list.size());
    const std::string id = list.substr(start, end - start);
    if (id.empty() || id.size() > 4 || id.find_first_not_of("0123456789") != std::string::npos) {
      throw Refusal("expected device ids, comma-separated (0,1,2,3)");
    }
    const int value = std::stoi(id);
    if (std::find(ids.begin(), ids.end(), value) != ids.end()) {
      throw Refusal(fmt::format("GPU {} is named twice", value));
    }
    ids.push_back(value);
    if (ids.size() > 1024) throw Refusal("more than 1024 devices");
    start = end + 1;
  }
  return ids;
}

}  // namespace

bool Range::contains(double x) const {
  return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

std::string Range::text() const {
  return fmt::format("{}{}, {}{}", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
}

const char* kindName(Kind k) {
  static constexpr kernels::Named<Kind> kNames[] = {
      {"integer", Kind::kInt},  {"integer", Kind::kUint},  {"number", Kind::kFloat},
      {"boolean", Kind::kBool}, {"string", Kind::kString}, {"list of numbers", Kind::kFloatList}};
  return kernels::nameIn(kNames, k);
}

namespace {

// The optimizer key's help, from the optimizers' table.
const char* optimizerHelp() {
  static const std::string help = [] {
    std::string text = "the update rule: ";
    for (const auto& row : kernels::optimizers())
      text += row.name + ": " + row.summary + "; ";
    return text + "nag: MXNet's name for sgd with nesterov";
  }();
  return help.c_str();
}

// The schedule key's help, from the schedules' table (actors/schedules/schedule.h).
const char* scheduleHelp() {
  static const std::string help = [] {
    std::string text;
    for (const auto& row : schedules()) {
      text += (text.empty() ? "" : "; ") + row.name + ": " + row.summary;
      std::vector<std::string> others;
      for (const auto& name : row.mxnet)
        if (name != row.name) others.push_back(name);
      if (!others.empty()) text += fmt::format(" (MXNet's {})", fmt::join(others, ", "));
    }
    return text + "; nccl: device with reducer nccl, as MXNet's kvstore nccl";
  }();
  return help.c_str();
}

// The epsilon key's help: each optimizer's own default, from the table.
const char* epsilonHelp() {
  static const std::string help = [] {
    std::string defaults;
    for (const auto& row : kernels::optimizers()) {
      for (const auto& setting : row.settings) {
        if (setting.field == &kernels::OptimizerSettings::epsilon)
          defaults += fmt::format("{}{} {:g}", defaults.empty() ? "" : ", ", row.name, row.epsilon);
      }
    }
    return "added to the denominator (0: the optimizer's own default: " + defaults + ")";
  }();
  return help.c_str();
}

std::vector<Key> buildTable() {
  std::vector<Key> table = {
      agreed(
          Key{"model", Kind::kString, kNotNumeric,
              "built-in model: mlp, lenet, resnet20 and resnet56 (CIFAR), resnet18, resnet34 and "
              "resnet50 (ImageNet, as torchvision's), gpt2 (a language model: block_size, n_layer, "
              "n_head, n_embd), lstm (the LSTM language model of MXNet's and PyTorch's examples: "
              "block_size, nlayers, nhid, emsize, dropout, tied); or [[layers]] in the file",
              [](Settings& s, const Value& v) { s.options.model.name = asString(v); },
              [](const Settings& s) {
                return s.options.model.name.empty() ? "custom" : s.options.model.name;
              }}),
      Key{"train_data", Kind::kString, kNotNumeric,
          "training database; with block_size, token shards (a .bin file, a glob of them, or a "
          "folder: its *_train_* shards)",
          [](Settings& s, const Value& v) {
            // Caffe2's simulated input; ./null names a database called null.
            if (asString(v) == "null") {
              s.options.synthetic = true;
              return;
            }
            s.options.train_data = asString(v);
          },
          [](const Settings& s) { return s.options.train_data; }},
      TROUPE_STRING_KEY("test_data", test_data,
                        "test database (evaluated after every epoch); with block_size, token "
                        "shards (a folder: its *_val_* shards)"),
      Key{"max_memory", Kind::kString, kNotNumeric,
          "bytes a process may hold for its model (a worker: weights, gradients, optimizer state "
          "unless parameter servers hold it, activations; a server: its keys' weights, state "
          "and pushes), as 512M, 16G or 1.5GiB; a run that needs more is refused before it "
          "starts, and an allocation of its tensors past it fails (0: no limit)",
          [](Settings& s, const Value& v) {
            try {
              s.options.max_memory = parseBytes(asString(v));
            } catch (const InputError& e) {
              throw Refusal(e.what());
            }
          },
          [](const Settings& s) { return fmt::format("{}", s.options.max_memory); }},
      Key{"db_type", Kind::kString, kNotNumeric, "lmdb or leveldb",
          [](Settings& s, const Value& v) {
            try {
              s.options.db_type = data::parseDbType(asString(v));
            } catch (const InputError& e) {
              throw Refusal(e.what());
            }
          },
          [](const Settings& s) { return std::string(data::toString(s.options.db_type)); }},
      agreed(TROUPE_INT_KEY("batch_size", batch_size, kBatchSize,
                            "inputs per step, in total over the replicas")),
      agreed(TROUPE_INT_KEY("epoch_size", epoch_size, kEpochSize,
                            "inputs per epoch (0: the training set's size)")),
      agreed(TROUPE_INT_KEY("num_epochs", num_epochs, closed(1, kMillion), "epochs to train")),
      // A rate has no natural bound (it scales with the loss; tests drive runs to divergence with
      // 1e30): finite, not negative, and 1e38 the round number below a float's largest.
      agreed(TROUPE_FLOAT_KEY("base_learning_rate", base_learning_rate, closed(0, 1e38),
                              "learning rate")),
      agreed(Key{
          "lr_scaling", Kind::kString, kNotNumeric,
          "none, or per256: base_learning_rate is per 256 inputs and the run's rate is "
          "base_learning_rate x global batch / 256 (Goyal et al.'s rule, as Caffe2 runs used it)",
          [](Settings&, const Value& v) {
            if (asString(v) != "none" && asString(v) != "per256") {
              throw Refusal("expected none or per256");
            }
          },
          [](const Settings& s) { return s.textOr("lr_scaling", "none"); }}),
      // Caffe's and PyTorch's defaults are 1e-4 to 5e-4; at 1 a step's decay is the weight itself.
      agreed(Key{"optimizer", Kind::kString, kNotNumeric, optimizerHelp(),
                 [](Settings& s, const Value& v) {
                   if (!kernels::setOptimizerName(s.options.optimizer, asString(v)))
                     throw Refusal("expected nag or one of " + kernels::optimizerNames());
                 },
                 [](const Settings& s) { return s.options.optimizer.name(); }}),
      // Expanded by assign() into the keys it names (optimizerParams).
      agreed(
          Key{"optimizer_params", Kind::kString, kNotNumeric,
              "MXNet's optimizer_params, as a dict or name=value pairs: "
              "\"{'learning_rate': 0.1, 'wd': 1e-4, 'momentum': 0.9}\"; each sets its key (lr and "
              "learning_rate: base_learning_rate, wd: weight_decay, gamma1: rho, mom: momentum)",
              [](Settings&, const Value&) {},
              [](const Settings& s) { return s.textOr("optimizer_params", ""); }}),
      agreed(TROUPE_FLOAT_KEY("weight_decay", optimizer.weight_decay, closed(0, 1),
                              "L2 weight decay (adamw: decoupled, as torch.optim.AdamW's)")),
      // At 1 or above the velocity never decays: the run diverges.
      agreed(TROUPE_FLOAT_KEY("momentum", optimizer.momentum, openAbove(0, 1),
                              "sgd's and lars' momentum")),
      agreed(TROUPE_FLOAT_KEY("beta1", optimizer.beta1, openAbove(0, 1),
                              "adam, adamw, lamb: the gradients' moving-average decay")),
      agreed(TROUPE_FLOAT_KEY("beta2", optimizer.beta2, openAbove(0, 1),
                              "adam, adamw, lamb: the squared gradients' moving-average decay")),
      agreed(Key{"epsilon", Kind::kFloat, closed(0, 1), epsilonHelp(),
                 [](Settings& s, const Value& v) {
                   s.options.optimizer.epsilon = static_cast<float>(asFloat(v));
                 },
                 [](const Settings& s) { return fmt::format("{}", s.options.optimizer.epsilon); },
                 true}),
      agreed(TROUPE_FLOAT_KEY(
          "rho", optimizer.rho, openAbove(0, 1),
          "rmsprop: the squared gradients' decay (MXNet's gamma1, PyTorch's alpha)")),
      agreed(TROUPE_FLOAT_KEY("eta", optimizer.eta, closed(0, 1e6), "lars: the trust coefficient")),
      // Like a rate, a norm has no natural bound; 0 turns clipping off.
      agreed(
          TROUPE_FLOAT_KEY("clip_grad_norm", clip_grad_norm, closed(0, 1e38),
                           "gradients scaled down to this global L2 norm where above, as torch's "
                           "clip_grad_norm_ (0: none)")),
      agreed(
          TROUPE_FLOAT_KEY("label_smoothing", label_smoothing, openAbove(0, 1),
                           "the softmax loss's target: 1 - this on the label, this / num_labels on "
                           "every class (PyTorch's CrossEntropyLoss label_smoothing)")),
      agreed(TROUPE_BOOL_KEY(
          "no_wd", no_wd,
          "no weight decay on biases and batch-norm scales and shifts (Goyal et al.; GluonCV's "
          "--no-wd)")),
      agreed(TROUPE_BOOL_KEY("nesterov", optimizer.nesterov, "Nesterov momentum")),
      agreed(TROUPE_NAMED_KEY("lr_policy", lr_policy, kernels::kLrPolicies,
                              "fixed, step, multistep, cosine or poly")),
      agreed(
          TROUPE_FLOAT_KEY("lr_power", lr_power, closed(1e-6f, 100),
                           "poly: the rate falls as (1 - step / steps)^this (MLPerf's LARS: 2)")),
      agreed(
          TROUPE_FLOAT_KEY("lr_end", lr_end, closed(0, 1e38), "poly: the rate at the run's end")),
      // A decay: above 1 the rate would grow at every step; the step policies need it above 0.
      agreed(
          TROUPE_FLOAT_KEY("gamma", gamma, openBelow(0, 1), "decay factor of step and multistep")),
      agreed(TROUPE_FLOAT_KEY("lr_step_epochs", lr_step_epochs, kEpochs,
                              "step: decay every this many epochs")),
      agreed(Key{"lr_milestones", Kind::kFloatList, kEpochs, "multistep: epochs at which to decay",
                 [](Settings& s, const Value& v) { s.options.lr_milestones = asList(v); },
                 [](const Settings& s) { return listText(s.options.lr_milestones); }}),
      agreed(TROUPE_FLOAT_KEY("warmup_epochs", warmup_epochs, kEpochs, "linear warmup, in epochs")),
      agreed(TROUPE_INT_KEY("num_labels", num_labels, closed(1, k2Pow20), "number of classes")),
      agreed(TROUPE_INT_KEY("block_size", block_size, closed(0, k2Pow20),
                            "language models (gpt2, lstm): tokens a sequence holds, read from "
                            "token shards (llm.c's .bin), each labelled with the next (nanoGPT's "
                            "block_size, the LSTM examples' bptt; 0: the input is images)")),
      agreed(TROUPE_INT_KEY("vocab_size", vocab_size, closed(2, 16 * k2Pow20),
                            "language models: tokens the model knows (GPT-2's BPE: 50257; "
                            "troupe convert text's bytes: 256)")),
      agreed(TROUPE_INT_KEY("n_layer", gpt.n_layer, closed(1, 1000),
                            "gpt2: transformer blocks (GPT-2 124M, llm.c's d12: 12)")),
      agreed(TROUPE_INT_KEY("n_head", gpt.n_head, closed(1, 1000),
                            "gpt2: attention heads, each n_embd / n_head wide (124M: 12)")),
      agreed(TROUPE_INT_KEY("n_embd", gpt.n_embd, closed(1, k2Pow20),
                            "gpt2: width of the residual stream (124M: 768)")),
      agreed(TROUPE_INT_KEY("nlayers", lstm.nlayers, closed(1, 1000),
                            "lstm: LSTM layers (the examples' medium model: 2)")),
      agreed(TROUPE_INT_KEY("nhid", lstm.nhid, closed(1, k2Pow20),
                            "lstm: hidden units of each layer (medium: 650)")),
      agreed(TROUPE_INT_KEY("emsize", lstm.emsize, closed(1, k2Pow20),
                            "lstm: width of the token embedding (medium: 650)")),
      agreed(TROUPE_FLOAT_KEY("dropout", lstm.dropout, openAbove(0, 1),
                              "lstm: dropout after the embedding and after each LSTM layer "
                              "(medium: 0.5)")),
      agreed(TROUPE_BOOL_KEY("tied", lstm.tied,
                             "lstm: the decoder reads the embedding's weights (needs emsize = "
                             "nhid)")),
      // A 4096 x 4096 image is 64 MiB of floats per channel: larger ones are tiled first.
      agreed(TROUPE_INT_KEY("image_size", image_size, closed(1, 4096),
                            "height and width of the images")),
      agreed(
          TROUPE_INT_KEY("num_channels", num_channels, closed(1, 256), "channels of the images")),
      agreed(TROUPE_BOOL_KEY(
          "zero_init_residual", zero_init_residual,
          "resnet18/34/50: each block's last batch-norm scale starts at 0, so every block starts "
          "as the identity (Goyal et al.; torchvision's zero_init_residual)")),
      agreed(TROUPE_FLOAT_KEY("mean", mean, kMean, "subtracted from every pixel value")),
      agreed(
          TROUPE_FLOAT_KEY("scale", scale, kScale, "multiplies every pixel value after the mean")),
      agreed(Key{
          "mean_per_channel", Kind::kFloatList, kMean,
          "Caffe2's: subtracted from each channel's values, in the stored order (BGR in Caffe's "
          "and troupe's databases); replaces mean",
          [](Settings& s, const Value& v) { s.options.mean_per_channel = asList(v); },
          [](const Settings& s) { return listText(s.options.mean_per_channel); }}),
      agreed(Key{"std_per_channel", Kind::kFloatList, openBelow(0, kMillion),
                 "Caffe2's: each channel's values are divided by it after the mean; replaces scale",
                 [](Settings& s, const Value& v) { s.options.std_per_channel = asList(v); },
                 [](const Settings& s) { return listText(s.options.std_per_channel); }}),
      agreed(
          TROUPE_INT_KEY("resize_short", transform.resize_short, closed(0, kImageSide),
                         "Caffe2's scale: the short side is resized to this before the crop (0: no "
                         "resize)")),
      agreed(TROUPE_INT_KEY(
          "crop", transform.crop, closed(0, kImageSide),
          "height and width of the crop the net sees (random when training, centred "
          "when testing); records may then be of any size, and image_size is crop (0: "
          "no crop)")),
      agreed(
          TROUPE_INT_KEY("pad", transform.pad, closed(0, kImageSide),
                         "training crops may reach this many pixels past each edge, filled with 0 "
                         "(CIFAR's recipe: 4)")),
      agreed(TROUPE_BOOL_KEY(
          "random_resized_crop", transform.random_resized_crop,
          "training: the Inception crop (random_area, random_aspect_ratio), resized to crop; "
          "testing: resize_short (default crop / 0.875) and the centre")),
      agreed(TROUPE_RANGE_KEY(
          "random_area", transform.min_area, transform.max_area, openBelow(0, 1),
          "random_resized_crop: the range of the crop's share of the image's area (DALI's name)")),
      agreed(TROUPE_RANGE_KEY(
          "random_aspect_ratio", transform.min_aspect, transform.max_aspect, openBelow(0, 100),
          "random_resized_crop: the range of the crop's width / height, drawn log-uniform")),
      agreed(TROUPE_BOOL_KEY("mirror", transform.mirror,
                             "training: flip images left-right at random (1 in 2)")),
      agreed(Key{
          "color_jitter", Kind::kFloatList, closed(0, 1),
          "training: brightness, contrast and saturation, each factor drawn from [1 - j, 1 + j] "
          "(torchvision's ColorJitter without hue; empty: none)",
          [](Settings& s, const Value& v) {
            const auto& j = asList(v);
            if (!j.empty() && j.size() != 3) {
              throw Refusal("expected three numbers: brightness, contrast, saturation");
            }
            auto& t = s.options.transform;
            t.brightness = j.empty() ? 0 : static_cast<float>(j[0]);
            t.contrast = j.empty() ? 0 : static_cast<float>(j[1]);
            t.saturation = j.empty() ? 0 : static_cast<float>(j[2]);
          },
          [](const Settings& s) {
            const auto& t = s.options.transform;
            if (t.brightness == 0 && t.contrast == 0 && t.saturation == 0) return std::string();
            return listText({t.brightness, t.contrast, t.saturation});
          }}),
      TROUPE_INT_KEY("decode_threads", decode_threads, closed(1, 1024),
                     "threads that decode each reader's records (MXNet's preprocess_threads)"),
      agreed(TROUPE_BOOL_KEY(
          "synthetic", synthetic,
          "random inputs made once and sent every step, to measure the compute alone "
          "(Caffe2's train_data null); needs epoch_size, not train_data")),
      TROUPE_BOOL_KEY("shared_reader", shared_reader,
                      "one reader per process feeds all its replicas, its decode_threads decoding "
                      "for all of them (MXNet's one iterator per process); else a reader per "
                      "replica"),
      agreed(TROUPE_NAMED_KEY(
          "input_dtype", input_dtype, kInputTypes,
          "float32, or uint8: training images travel from the reader as bytes "
          "before the mean and scale, and each replica normalises them on its device "
          "(MXNet's ImageRecordIter dtype)")),
      // A replica is a thread with a team of its own: no more of them than threads.
      agreed(TROUPE_INT_KEY("replicas", replicas, closed(1, 1024),
                            "model replicas in this process (the batch is split)")),
      agreed(TROUPE_INT_KEY(
          "pipeline_stages", pipeline.stages, closed(1, 64),
          "pipeline parallelism (MXNet's model parallelism, GPipe): each replica's layers cut "
          "into this many stages, each a thread with its share of the replica's threads, the "
          "batch going through them in micro_batches parts under the 1F1B schedule (CPU; a "
          "batch norm normalises each part by its own statistics, as GPipe's)")),
      agreed(TROUPE_INT_KEY("micro_batches", pipeline.micro_batches, closed(0, 1 << 20),
                            "pipeline_stages: the parts a replica's batch is cut into (0: as many "
                            "as stages)")),
      agreed(TROUPE_NAMED_KEY(
          "pipeline_across", pipeline.placement, kernels::kStagePlacements,
          "pipeline_stages: what runs the stages: threads of each worker's process, or "
          "processes of their own (bsp-allreduce: worker W runs stage W % pipeline_stages, and "
          "each pipeline_stages workers in a row train one data-parallel replica of the model; "
          "a worker updates its stage's weights alone, their gradients summed over the stage's "
          "workers)")),
      Key{"gpus", Kind::kString, kNotNumeric,
          "GPU ids, one replica on each (Caffe2's and MXNet's --gpus 0,1); empty: the CPU",
          [](Settings& s, const Value& v) {
            s.options.gpus = asString(v).empty() ? std::vector<int>{} : deviceIds(asString(v));
          },
          [](const Settings& s) { return fmt::format("{}", fmt::join(s.options.gpus, ",")); }},
      TROUPE_BOOL_KEY("tf32", tf32,
                      "on GPUs, convolutions and matrix products in TensorFloat-32 (10-bit "
                      "mantissa products, fp32 sums: PyTorch's allow_tf32); off, float32 is IEEE "
                      "float32 as on the CPU"),
      TROUPE_BOOL_KEY("cudnn_deterministic", cudnn_deterministic,
                      "on GPUs, convolutions only with cuDNN's deterministic algorithms, so that a "
                      "run repeats to the bit (PyTorch's cudnn.deterministic); off, the fastest "
                      "measured (cudnn.benchmark)"),
      Key{"cuda_graphs", Kind::kBool, kNotNumeric,
          "on GPUs, each training step's forward and backward by a CUDA graph, recorded at the "
          "second step with the same inputs and then replayed: one launch for the host instead of "
          "a call an op, each gradient bucket's reduction still starting at an event of the graph "
          "(not in a traced run, nor for a model with dropout); auto: on wherever GPUs train",
          [](Settings& s, const Value& v) { s.options.cuda_graphs = asBool(v); },
          [](const Settings& s) {
            const auto& g = s.options.cuda_graphs;
            return std::string(!g ? "auto" : *g ? "true" : "false");
          }},
      agreed(TROUPE_NAMED_KEY(
          "precision", precision, kPrecisions,
          "fp32, or on GPUs fp16 or bf16: mixed precision (activations, convolutions "
          "and matrix products in 16 bits, accumulating in fp32; float32 weights, "
          "gradients, batch norm and loss, as PyTorch's autocast)")),
      TROUPE_NAMED_KEY("memory_format", memory_format, kMemoryFormats,
                       "images in GPU memory: nhwc (channels last, PyTorch's channels_last), "
                       "nchw, or auto (nhwc where tensor cores compute, in fp16, bf16 or tf32, "
                       "and the model is the same either way)"),
      agreed(TROUPE_FLOAT_KEY(
          "loss_scale", loss_scale, closed(0, 1e38),
          "fp16's loss scale: 0 dynamic (2^initial_scale_power to start, halved and "
          "the step skipped "
          "on an inf or NaN gradient, doubled after loss_scale_window clean steps, "
          "as PyTorch's GradScaler); > 0 fixed (for any precision)")),
      agreed(
          TROUPE_INT_KEY("initial_scale_power", initial_scale_power, closed(0, 120),
                         "a dynamic loss scale starts at 2^initial_scale_power (DeepSpeed's key)")),
      agreed(TROUPE_INT_KEY("loss_scale_window", loss_scale_window, closed(1, kMillion),
                            "clean steps after which a dynamic loss scale doubles")),
      TROUPE_INT_KEY(
          "threads",
          threads, kThreads,
          "CPU threads of this process (0: the host's, shared among the run's processes on it)"),
      agreed(TROUPE_STRING_KEY_AT("schedule", schedule_keys.schedule, scheduleHelp())),
      TROUPE_INT_KEY("num_shards", num_shards, kProcesses,
                     "worker processes (set by troupe launch)"),
      agreed(Key{"num_workers", Kind::kString, kNotNumeric,
                 "worker processes: N, or MIN:MAX for an elastic run (workers may die or join)",
                 [](Settings& s, const Value& v) {
                   const auto bounds = parseNumWorkers(asString(v));
                   s.options.min_workers = bounds.min;
                   s.options.max_workers = bounds.max;
                   if (!bounds.elastic()) s.options.num_shards = bounds.fixed;
                 },
                 [](const Settings& s) {
                   const auto& o = s.options;
                   return o.max_workers > 0 ? fmt::format("{}:{}", o.min_workers, o.max_workers)
                                            : std::to_string(o.num_shards);
                 }}),
      TROUPE_INT_KEY("shard_id", shard_id, closed(0, kProcesses.hi - 1),
                     "this process's rank in its role (set by troupe launch)"),
      agreed(TROUPE_INT_KEY("num_servers", num_servers, closed(0, kProcesses.hi),
                            "parameter-server processes (set by troupe launch)")),
      TROUPE_NAMED_KEY("role", role, kRoles, "worker or server (set by troupe launch)"),
      agreed(TROUPE_INT_KEY_AT("staleness", schedule_keys.staleness, closed(0, kMillion),
                               "ssp: steps a worker may run ahead of the slowest")),
      agreed(TROUPE_TABLE_NAME_KEY_AT("allreduce", schedule_keys.allreduce, kAllreduces,
                                      "bsp-allreduce across processes: auto, ring or hierarchical "
                                      "(inside each host, then across hosts)")),
      agreed(TROUPE_INT_KEY_AT("zero_stage", schedule_keys.zero_stage, closed(0, 3),
                               "bsp-allreduce: 1 shards the optimizer's state over the workers "
                               "(ZeRO stage 1: gradients reduce-scattered, each worker updates "
                               "its shard, weights all-gathered); 2 the gradients' sums too "
                               "(each replica's gradients in two bucket slots, on the CPU); 0: "
                               "none")),
      agreed(TROUPE_TABLE_NAME_KEY_AT(
          "reducer", schedule_keys.reducer, kReducers,
          "what sums gradients of GPU replicas: troupe (its own sums and ring) or "
          "nccl (NCCL over every GPU of the run; with allreduce ring or "
          "hierarchical, over each process's GPUs, troupe's allreduce across)")),
      // More connections than a host has cores only add context switches; 16 is NCCL's cap.
      TROUPE_INT_KEY("connections_per_peer", connections_per_peer, closed(1, 16),
                     "TCP connections to each process on another host (ring chunks spread over "
                     "them)"),
      agreed(
          TROUPE_NAMED_KEY("gradient_compression", gradient_compression, kernels::kCompressions,
                           "what gradients travel as between processes: none, fp16, bf16 or 2bit "
                           "(MXNet's)")),
      // Gradients of a trained net are of order 1e-3..1; 2bit sends +-threshold, and MXNet's
      // default is 0.5. Beyond 1e6 every value rounds to 0 for good.
      agreed(TROUPE_FLOAT_KEY("gradient_compression_threshold", gradient_compression_threshold,
                              openBelow(0, kMillion), "2bit: the magnitude each sent value takes")),
      TROUPE_STRING_KEY("run_id", run_id, "id shared by the processes of one run"),
      TROUPE_INT_KEY("generation", generation, closed(0, kMillion),
                     "restarts of the run so far (set by troupe launch --on-failure restart); "
                     "above 0 the run resumes as with --resume auto"),
      TROUPE_STRING_KEY("rendezvous", rendezvous, storeForms().c_str()),
      TROUPE_STRING_KEY("interface", interface, "network interface to listen on (e.g. eth0)"),
      TROUPE_STRING_KEY("secret_file", secret_file,
                        "file holding the run's secret (default: $TROUPE_SECRET; troupe launch "
                        "makes one per run)"),
      TROUPE_FLOAT_KEY("rendezvous_timeout", rendezvous_timeout_s, kSeconds,
                       "seconds to wait for the other processes"),
      TROUPE_FLOAT_KEY("peer_timeout", peer_timeout_s, kSeconds,
                       "seconds a link may be silent, or an allreduce, server or pipeline "
                       "stage wait on a peer, before the run fails naming it"),
      TROUPE_FLOAT_KEY("stall_warning", stall_warning_s, kSeconds,
                       "seconds of waiting on a peer before a stall report names who is late"),
      Key{"work_load_list", Kind::kFloatList, openBelow(0, kMillion),
          "relative share of the batch per replica",
          [](Settings& s, const Value& v) { s.options.work_load_list = asList(v); },
          [](const Settings& s) { return listText(s.options.work_load_list); }},
      agreed(Key{"seed", Kind::kUint, kNotNumeric, "seed of initialisation and data order",
                 [](Settings& s, const Value& v) { s.options.seed = std::get<std::uint64_t>(v); },
                 [](const Settings& s) { return fmt::format("{}", s.options.seed); }}),
      // Batches in flight per reader: memory grows with it, speed stops growing after a few.
      TROUPE_INT_KEY("prefetch", prefetch, closed(1, 1024), "batches a reader keeps in flight"),
      TROUPE_BOOL_KEY(
          "skip_bad_records", skip_bad_records,
          "skip (and count, and log once) records that do not parse, decode or fit, instead of "
          "failing; also --skip-bad-records"),
      // Horovod fuses up to 128 MiB, DDP buckets 25 MB: 4 GiB is past any model's gradients.
      agreed(TROUPE_FLOAT_KEY("bucket_size_mb", bucket_size_mb, kBucketMb,
                              "gradient bucket size (MiB)")),
      // A segment of a few KiB is all message overhead; 1 GiB is past any bucket.
      agreed(TROUPE_FLOAT_KEY(
          "ring_segment_mb", ring_segment_mb, closed(0.01, 1024),
          "bsp-allreduce across processes: the pieces a bucket is pipelined in, each "
          "its own ring (and copied from a GPU to the host and back) (MiB)")),
      agreed(TROUPE_FLOAT_KEY("first_bucket_mb", first_bucket_mb, kBucketMb,
                              "size of the first bucket (MiB)")),
  };
  // Caffe2's resnet50_trainer flags troupe's own keys do not cover, then the files' keys.
  const auto caffe2 = caffe2Keys();
  table.insert(table.end(), caffe2.begin(), caffe2.end());
  const Key last[] = {
      TROUPE_STRING_KEY("log_dir", log_dir, "folder of the CSV log"),
      TROUPE_STRING_KEY("checkpoint_dir", checkpoint_dir,
                        "folder of checkpoints, under log_dir when relative (default: log_dir)"),
      TROUPE_INT_KEY("checkpoint_every", checkpoint_every, closed(0, kMillion),
                     "epochs between checkpoints (0: end only)"),
      TROUPE_STRING_KEY("resume", resume,
                        "checkpoint to continue from, or 'auto': the newest complete checkpoint "
                        "of this run (same run_id) in checkpoint_dir, if any"),
      TROUPE_INT_KEY("log_every", log_every, closed(0, k2Pow40),
                     "steps between console lines (0: none)"),
      TROUPE_FLOAT_KEY("step_timeout", step_timeout_s, kSeconds,
                       "seconds without progress before failing"),
      TROUPE_STRING_KEY("run_name", run_name, "prefix of the experiment id (default: the model)"),
      TROUPE_STRING_KEY("trace", trace, "write a Chrome trace (chrome://tracing, Perfetto) here"),
  };
  table.insert(table.end(), std::begin(last), std::end(last));
  return table;
}

}  // namespace

Key agreed(Key key) {
  key.agree = true;
  return key;
}

const std::vector<Key>& keys() {
  static const std::vector<Key> table = buildTable();
  return table;
}

std::string accepted(const Key& key) {
  switch (key.kind) {
    case Kind::kInt:
      return "an integer in " + key.range.text();
    case Kind::kUint:
      return fmt::format("an integer in [0, {}]", std::numeric_limits<std::uint64_t>::max());
    case Kind::kFloat:
      return "a finite number in " + key.range.text();
    case Kind::kFloatList:
      return "a list of finite numbers, each in " + key.range.text();
    default:
      return std::string("a ") + kindName(key.kind);
  }
}

const Given* Settings::find(std::string_view name) const {
  const auto it = given.find(name);
  return it == given.end() ? nullptr : &it->second;
}

std::string Settings::textOr(std::string_view name, std::string_view fallback) const {
  const Given* g = find(name);
  return g ? g->text : std::string(fallback);
}

std::string valueText(const Value& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          return listText(v);
        } else {
          return fmt::format("{}", v);
        }
      },
      value);
}

namespace {

// MXNet's optimizer_params ("{'learning_rate': 0.1, 'wd': 1e-4}" or "learning_rate=0.1,wd=1e-4"):
// each pair set on the key it names, as given by optimizer_params from the same source, so that
// the key given on its own as well from there is refused as two names for one key.
void assignOptimizerParams(Settings& s, const Key& key, const std::string& text,
                           const Source& from) {
  static constexpr std::pair<std::string_view, const char*> kNames[] = {
      {"learning_rate", "base_learning_rate"},
      {"lr", "base_learning_rate"},
      {"wd", "weight_decay"},
      {"weight_decay", "weight_decay"},
      {"momentum", "momentum"},
      {"mom", "momentum"},
      {"beta1", "beta1"},
      {"beta2", "beta2"},
      {"epsilon", "epsilon"},
      {"gamma1", "rho"},
      {"rho", "rho"},
      {"eta", "eta"},
      {"nesterov", "nesterov"}};
  static constexpr std::pair<std::string_view, const char*> kRefused[] = {
      {"clip_gradient",
       "MXNet's clip_gradient clips each element; troupe's clip_grad_norm clips "
       "the gradients' global norm"},
      {"rescale_grad",
       "troupe averages the gradients over the global batch itself (MXNet's "
       "rescale_grad = 1 / batch size)"}};
  const auto trim = [](std::string_view t) {
    const auto strip = std::string_view(" \t'\"");
    const auto b = t.find_first_not_of(strip);
    if (b == std::string_view::npos) return std::string_view();
    return t.substr(b, t.find_last_not_of(strip) - b + 1);
  };
  std::string_view body = trim(text);
  if (body.starts_with('{') && body.ends_with('}')) body = body.substr(1, body.size() - 2);
  for (std::size_t at = 0; at <= body.size();) {
    const std::size_t comma = std::min(body.find(',', at), body.size());
    const std::string_view pair = trim(body.substr(at, comma - at));
    at = comma + 1;
    if (pair.empty()) continue;
    const std::size_t sep = pair.find_first_of("=:");
    if (sep == std::string_view::npos) {
      throw InputError(fmt::format("{}: '{}' is not name=value (or 'name': value)", from.by, pair));
    }
    const std::string name(trim(pair.substr(0, sep)));
    const std::string value(trim(pair.substr(sep + 1)));
    for (const auto& [refused, why] : kRefused) {
      if (name == refused) throw InputError(fmt::format("{}: {}: {}", from.by, name, why));
    }
    const char* target = nullptr;
    for (const auto& [mxnet, ours] : kNames) {
      if (name == mxnet) target = ours;
    }
    if (!target) {
      std::string known;
      for (const auto& [mxnet, ours] : kNames)
        known += (known.empty() ? "" : ", ") + std::string(mxnet);
      throw InputError(
          fmt::format("{}: no optimizer parameter '{}' (known: {})", from.by, name, known));
    }
    Key as_given = *findKey(target);
    as_given.name = key.name;
    as_given.sets = target;
    Source part = from;
    part.origin = fmt::format("{} ({})", from.origin, name);
    part.by = fmt::format("{} ({}={})", from.by, name, value);
    assign(s, as_given, fromText(as_given, value), part);
  }
}

}  // namespace

void assign(Settings& s, const Key& key, Value value, const Source& given_from) {
  if (key.name == std::string_view("optimizer_params") && !key.sets) {  // not one of its parts
    assignOptimizerParams(s, key, asString(value), given_from);
    s.given[key.name] = Given{key.name, valueText(value), given_from};
    return;
  }
  // Who gave it, as every message shows it: a password in a rendezvous URL redacted there too.
  Source from = given_from;
  if (const std::string raw = valueText(value), shown = shownValue(key, raw); shown != raw) {
    for (auto* text : {&from.by, &from.origin}) {
      if (const auto at = text->find(raw); at != std::string::npos)
        text->replace(at, raw.size(), shown);
    }
  }
  if (key.refusal) throw InputError(fmt::format("{}: {}", from.by, key.refusal));
  auto refuse = [&](const std::string& got) {
    return InputError(fmt::format("{} must be {}, got {}", from.origin, accepted(key), got));
  };
  switch (key.kind) {
    case Kind::kInt: {
      const auto i = asInt(value);
      if (!key.range.contains(static_cast<double>(i))) throw refuse(std::to_string(i));
      break;
    }
    case Kind::kUint:  // a TOML integer is signed
      if (const auto* i = std::get_if<std::int64_t>(&value)) {
        if (*i < 0) throw refuse(std::to_string(*i));
        value = static_cast<std::uint64_t>(*i);
      }
      break;
    case Kind::kFloat: {
      const double x = asFloat(value);
      if (!key.range.contains(x)) throw refuse(fmt::format("{}", x));
      // 0.99999999 is 1 as a float: outside momentum's [0, 1).
      if (key.single && !key.range.contains(static_cast<float>(x))) {
        throw refuse(fmt::format("{} ({} as a 32-bit float)", x, static_cast<float>(x)));
      }
      break;
    }
    case Kind::kFloatList: {
      const auto& list = asList(value);
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (!key.range.contains(list[i])) {
          constexpr std::size_t kShown = 8;  // of a long list, its start
          const std::vector<double> shown(list.begin(),
                                          list.begin() + std::min(list.size(), kShown));
          throw refuse(fmt::format("{}{} (element {} is {})", listText(shown),
                                   list.size() > kShown ? ",..." : "", i, list[i]));
        }
      }
      break;
    }
    case Kind::kBool:
    case Kind::kString:
      break;
  }
  // One source, two names for one key: neither may silently win.
  const std::string target = key.sets ? key.sets : key.name;
  if (const Given* before = s.find(target);
      before && before->source.rank == from.rank && before->name != key.name) {
    throw InputError(
        fmt::format("{} and {} both set {}: give one", before->source.by, from.by, target));
  }
  try {
    key.set(s, value);
  } catch (const Refusal& e) {
    throw InputError(fmt::format("{}: {}", from.by, e.what()));
  }
  Given given{key.name, shownValue(key, valueText(value)), from};
  if (key.sets) s.given[key.sets] = given;
  s.given[key.name] = std::move(given);
}

std::string shownValue(const Key& key, std::string_view text) {
  return key.name == std::string_view("rendezvous") ? rendezvous::redactedStoreUrl(text)
                                                    : std::string(text);
}

const Key* findKey(std::string_view name) {
  for (const auto& k : keys()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::optional<OtherName> keyForOtherName(std::string_view name) {
  // The flags users bring from MXNet's example trainers (train_imagenet.py, fit.py), PyTorch's
  // examples and Horovod's, with the key that does their job here.
  static constexpr OtherName kOthers[] = {
      {"lr", "base_learning_rate", "MXNet's and PyTorch's"},
      {"learning_rate", "base_learning_rate", "PyTorch's and Keras'"},
      {"base_lr", "base_learning_rate", "Caffe's solver"},
      {"epochs", "num_epochs", "PyTorch's and Keras'"},
      {"num_epoch", "num_epochs", "MXNet's"},
      {"max_epochs", "num_epochs", "Lightning's"},
      {"mom", "momentum", "MXNet's"},
      {"wd", "weight_decay", "MXNet's and PyTorch's"},
      {"lr_factor", "gamma", "MXNet's"},
      {"lr_step", "lr_step_epochs", "MXNet's"},
      {"network", "model", "MXNet's"},
      {"arch", "model", "PyTorch's"},
      {"num_classes", "num_labels", "MXNet's"},
      {"num_examples", "epoch_size", "MXNet's"},
      {"data_train", "train_data", "MXNet's"},
      {"data_val", "test_data", "MXNet's"},
      {"disp_batches", "log_every", "MXNet's"},
      {"print_freq", "log_every", "PyTorch's"},
      {"load_epoch", "resume", "MXNet's"},
      {"workers", "decode_threads", "PyTorch's (DataLoader workers)"},
      {"kvstore", "schedule", "MXNet's"},
      {"kv_store", "schedule", "MXNet's"},
      {"world_size", "num_shards", "PyTorch's"},
      {"rank", "shard_id", "PyTorch's"},
      {"fp16", "precision", "Horovod's and Apex's"},
      {"amp", "precision", "PyTorch's"},
  };
  for (const auto& other : kOthers) {
    if (editDistance(name, other.name) == 0) return other;
  }
  return std::nullopt;
}

std::string didYouMeanKey(std::string_view name) {
  if (const auto other = keyForOtherName(name)) {
    return fmt::format(": did you mean '{}'? ('{}' is {})", other->key, name, other->whose);
  }
  auto names = keyNames();
  names.emplace_back("layers");
  const auto nearest = nearestName(name, names);
  return nearest ? fmt::format(": did you mean '{}'?", *nearest) : "";
}

Settings defaultSettings() {
  Settings s;
  s.options.model.name = "lenet";
  return s;
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
    case Kind::kUint: {
      std::uint64_t u = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), u);
      if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
        throw InputError(fmt::format("--{} must be {}, got '{}'", key.name, accepted(key), text));
      }
      return u;
    }
    case Kind::kFloat:
      return parseDouble(text);
    case Kind::kBool:
      if (text == "true" || text == "True" || text == "1" || text.empty()) return true;
      if (text == "false" || text == "False" || text == "0") return false;
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

}  // namespace config

const std::vector<ConfigKey>& configKeys() {
  using config::Kind;
  static const std::vector<ConfigKey> out = [] {
    std::vector<ConfigKey> v;
    std::set<std::string> caffe2;
    for (const auto& k : config::caffe2Keys())
      caffe2.insert(k.name);
    for (const auto& k : config::keys()) {
      ConfigKey c;
      c.name = k.name;
      c.caffe2_flag = caffe2.count(k.name) > 0;
      c.agree = k.agree;
      c.kind = config::kindName(k.kind);
      c.help = k.help;
      c.summary = k.help;
      c.accepted = config::accepted(k);
      c.default_value = k.get(config::defaultSettings());
      if (k.kind == Kind::kInt || k.kind == Kind::kFloat || k.kind == Kind::kFloatList) {
        c.help += fmt::format(" ({})", c.accepted);
        c.range = k.range.text();
        c.min = k.range.lo;
        c.max = k.range.hi;
        c.min_open = k.range.lo_open;
        c.max_open = k.range.hi_open;
      } else if (k.kind == Kind::kUint) {
        c.help += fmt::format(" ({})", c.accepted);
        c.range = fmt::format("[0, {}]", std::numeric_limits<std::uint64_t>::max());
        c.min = 0;
        c.max = static_cast<double>(std::numeric_limits<std::uint64_t>::max());
      }
      v.push_back(std::move(c));
    }
    return v;
  }();
  return out;
}

const std::vector<std::pair<std::string, std::string>>& launcherVariables() {
  static const std::vector<std::pair<std::string, std::string>> out(
      std::begin(config::kLauncherVariables), std::end(config::kLauncherVariables));
  return out;
}

}  // namespace troupe::actors
