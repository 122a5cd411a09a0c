#include "apps/config.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::apps {

namespace {

// The groups of `troupe train --help`, by purpose; a key named in none is under "Other keys".
struct Group {
  const char* title;
  std::vector<std::string_view> keys;
};
const std::vector<Group>& groups() {
  static const std::vector<Group> kGroups = {
      {"Data", {"train_data",
                "test_data",
                "db_type",
                "epoch_size",
                "num_labels",
                "block_size",
                "vocab_size",
                "image_size",
                "num_channels",
                "mean",
                "scale",
                "mean_per_channel",
                "std_per_channel",
                "resize_short",
                "crop",
                "pad",
                "random_resized_crop",
                "random_area",
                "random_aspect_ratio",
                "mirror",
                "color_jitter",
                "decode_threads",
                "synthetic",
                "shared_reader",
                "input_dtype",
                "prefetch",
                "skip_bad_records"}},
      {"Model and optimizer",
       {"model",
        "n_layer",
        "n_head",
        "n_embd",
        "nlayers",
        "nhid",
        "emsize",
        "dropout",
        "tied",
        "batch_size",
        "num_epochs",
        "base_learning_rate",
        "lr_scaling",
        "weight_decay",
        "optimizer",
        "optimizer_params",
        "momentum",
        "nesterov",
        "beta1",
        "beta2",
        "epsilon",
        "rho",
        "eta",
        "no_wd",
        "clip_grad_norm",
        "label_smoothing",
        "lr_policy",
        "gamma",
        "lr_step_epochs",
        "lr_milestones",
        "lr_power",
        "lr_end",
        "warmup_epochs",
        "seed",
        "zero_init_residual"}},
      {"Devices and precision",
       {"replicas", "pipeline_stages", "micro_batches", "pipeline_across", "gpus", "threads",
        "max_memory", "work_load_list", "precision", "tf32", "cudnn_deterministic", "memory_format",
        "loss_scale", "initial_scale_power", "loss_scale_window", "cuda_graphs"}},
      {"Distributed",
       {"schedule",
        "num_shards",
        "num_workers",
        "shard_id",
        "num_servers",
        "role",
        "staleness",
        "allreduce",
        "zero_stage",
        "reducer",
        "gradient_compression",
        "gradient_compression_threshold",
        "bucket_size_mb",
        "first_bucket_mb",
        "ring_segment_mb",
        "connections_per_peer",
        "run_id",
        "generation",
        "rendezvous",
        "interface",
        "secret_file",
        "rendezvous_timeout",
        "peer_timeout",
        "stall_warning",
        "step_timeout",
        "serve_store"}},
      {"Output and checkpoints",
       {"log_dir", "checkpoint_dir", "checkpoint_every", "resume", "log_every", "run_name",
        "trace"}},
  };
  return kGroups;
}

std::string groupOf(const actors::ConfigKey& k) {
  if (k.caffe2_flag) return "Caffe2's trainer flags";
  for (const auto& g : groups()) {
    if (std::find(g.keys.begin(), g.keys.end(), k.name) != g.keys.end()) return g.title;
  }
  return "Other keys";
}

std::string typeOf(const actors::ConfigKey& k) {
  if (k.kind == "integer") return "INT";
  if (k.kind == "number") return "NUMBER";
  if (k.kind == "boolean") return "[BOOL]";
  if (k.kind == "list of numbers") return "LIST";
  return "TEXT";
}

}  // namespace

void addConfigOptions(CLI::App& command, actors::ConfigOverrides* overrides) {
  for (const auto& k : actors::configKeys()) {
    const std::string name = k.name;
    std::string flags = "--" + name;
    if (name == "skip_bad_records") flags += ",--skip-bad-records";
    const std::string shown = k.default_value.empty() ? "none" : k.default_value;
    auto* opt = command.add_option_function<std::string>(
        flags, [overrides, name](const std::string& v) { (*overrides)[name] = v; },
        fmt::format("{} ({}; default {})", k.summary, k.accepted, shown));
    opt->type_name(typeOf(k))->group(groupOf(k));
    if (k.kind == "boolean") opt->expected(0, 1);
  }
  command
      .add_option_function<std::string>(
          "--kv_store,--kv-store",
          [overrides](const std::string& v) { (*overrides)["schedule"] = v; },
          "MXNet's name for --schedule")
      ->type_name("TEXT")
      ->group("Distributed");
  command
      .add_option_function<std::string>(
          "--secret-file", [overrides](const std::string& v) { (*overrides)["secret_file"] = v; },
          "same as --secret_file")
      ->type_name("TEXT")
      ->group("Distributed");
}

}  // namespace troupe::apps
