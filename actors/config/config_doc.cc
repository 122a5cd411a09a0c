// docs/config.md, rendered from the key table (actors/config/config_keys.cc) so that it cannot
// drift from it: tests/apps_config_doc_test.cc fails when the checked-in file differs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <string_view>
#include <vector>

#include "actors/config/train_config.h"
#include "kernels/net.h"

namespace troupe::actors {
namespace {

// Text for a cell of a Markdown table: a '|' would end the cell.
std::string cell(std::string_view text) {
  std::string out;
  for (const char c : text)
    out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string code(std::string_view text) {
  return text.empty() ? "(none)" : fmt::format("`{}`", cell(text));
}

std::string acceptedValues(const ConfigKey& key) {
  if (!key.range.empty()) return code(key.range);
  if (key.kind == "boolean") return "`true`, `false`";
  return "";
}

constexpr std::string_view kIntroduction = R"(# troupe train: configuration keys

<!-- Generated from the key table in actors/config/config_keys.cc by `troupe docs config`; do not edit. After
     changing a key, regenerate it: build/bin/troupe docs config > docs/config.md -->

`troupe train` takes its settings from a TOML file of flat keys, from flags, and from a few
environment variables. A config file (see `configs/`) holds any of the keys below:

```toml
model = "lenet"
train_data = "data/fashion-mnist/train"
db_type = "lmdb"
batch_size = 64
lr_policy = "multistep"
lr_milestones = [10, 15]
```

A custom model is written as `[[layers]]` tables instead of `model` (`configs/lenet_layers.toml`),
the softmax loss appended after the last. Types and their arguments:
)";

constexpr std::string_view kAfterLayerTypes = R"(
Every layer takes `name`, which later layers may refer to, and `input`, a named output (or `data`,
the images) to read instead of the previous layer's: `configs/resnet20_layers.toml` writes
ResNet-20 so.
Every key is also a flag, `--key VALUE`, which wins over the file:
`troupe train configs/lenet.toml --batch_size 128 --lr_milestones 10,15 --nesterov`. A boolean
flag without a value is `true`; a list is comma-separated. MXNet's `kv_store` (`--kv_store`,
`--kv-store`) is another name for `schedule`. A misspelt key or flag is refused, naming the
nearest one.

A value comes from, last one winning: the defaults below, the config file, the cluster's variables
(Slurm, a Kubernetes Indexed Job or Open MPI, for a process that no `troupe launch` started; see
`actors/config/cluster_env.h`), the variables `troupe launch` sets, and the flags.

## Environment variables

`troupe launch` (every launcher) gives each process its place through these; each one sets its
key unless a flag gives that key:

| variable | key |
|---|---|
)";

constexpr std::string_view kAfterVariables = R"(
`TROUPE_NUM_WORKERS=MIN:MAX` (`troupe launch --elastic MIN:MAX`) sets `num_workers` instead.
When `secret_file` is not given, `TROUPE_SECRET_FILE` names the file holding the run's secret,
else `TROUPE_SECRET` holds it. `TROUPE_LOG_LEVEL` is the console's log level (trace, debug, info,
warn, error, critical, off) when neither `troupe --log-level` nor `--quiet` is given.

## Keys

Defaults are those of a run with no config file, flag or variable. Numbers are checked against
the range shown (a parenthesis excludes its bound); a list's range holds for each element.

| key | type | values | default | description |
|---|---|---|---|---|
)";

// The layer types' table (kernels/net.h): "`conv` (num_output, kernel, stride 1, ...), ...".
std::string layerTypesText() {
  std::vector<std::string> types;
  for (const auto& type : kernels::layerTypes()) {
    std::vector<std::string> args;
    for (const auto& arg : type.args)
      args.push_back(arg.shown);
    types.push_back(args.empty() ? code(type.name)
                                 : fmt::format("{} ({})", code(type.name), fmt::join(args, ", ")));
  }
  return fmt::format("{}.", fmt::join(types, ", "));
}

}  // namespace

std::string configReferenceMarkdown() {
  std::string out(kIntroduction);
  out += layerTypesText();
  out += kAfterLayerTypes;
  for (const auto& [variable, key] : launcherVariables())
    out += fmt::format("| `{}` | `{}` |\n", variable, key);
  out += kAfterVariables;
  std::vector<std::string> agreed;
  for (const auto& key : configKeys()) {
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", key.name, key.kind, acceptedValues(key),
                       code(key.default_value), cell(key.summary));
    if (key.agree) agreed.push_back(code(key.name));
  }
  out += fmt::format(
      "\n## Keys every process of a run shares\n\n"
      "These change a step's arithmetic. Processes of one run (and an elastic run's joiners) that "
      "differ in one of them are refused when they meet, naming the key and both values; the "
      "other keys are each process's own.\n\n{}\n",
      fmt::join(agreed, ", "));
  return out;
}

}  // namespace troupe::actors
