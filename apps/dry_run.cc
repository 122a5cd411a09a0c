#include "apps/dry_run.h"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/config/cluster_env.h"
#include "actors/config/config_file.h"
#include "actors/run/run_plan.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "kernels/compression.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "rendezvous/url.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;

// What the run would start from, worked out as trainProcess (actors/run/trainer.cc) works it out.
struct Plan {
  std::vector<std::int64_t> shares;
  std::int64_t train_size = 0;
  std::int64_t test_size = -1;  // -1: no test data
  actors::StepPlan steps;
  kernels::LrPolicy lr;
  std::vector<kernels::LayerInfo> layers;
  std::int64_t num_params = 0;
  std::int64_t num_buffers = 0;
  kernels::NetMemory memory;   // of the net at batch 1 in float32
  bool channels_last = false;  // GPU replicas keep images NHWC (memory_format)
  std::string resumed_from;
  bool finished = false;  // the checkpoint resumed from holds the run's last step
  int threads = 0;
};

// ensureWritableDir's verdict without its probe file: the nearest folder that exists must be one
// this process may write in (and the rest can then be made in it).
void checkWritableDir(const std::string& dir, const char* what) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (!ec && !p.empty() && !fs::exists(p, ec) && p != p.parent_path())
    p = p.parent_path();
  if (ec || !fs::is_directory(p, ec) || ::access(p.c_str(), W_OK | X_OK) != 0) {
    throw IoError(fmt::format("{} folder '{}' is not writable", what, dir));
  }
}

// The checks and plan of trainProcess up to its first rendezvous, with its error messages.
Plan plan(const actors::TrainOptions& o) {
  actors::checkProcessOptions(o);
  const bool server = o.role == actors::ProcessRole::kServer;
  const int workers = o.num_shards;
  Plan p;
  p.shares = actors::splitBatch(o.batch_size, o.replicas, o.work_load_list);
  actors::checkBatchMemory(o);
  p.threads = o.threads > 0 ? o.threads : actors::defaultThreads();

  p.train_size = o.synthetic
                     ? o.epoch_size
                     : data::openDataset(actors::datasetOptions(o, o.train_data, true))->size();
  if (!o.test_data.empty()) {
    p.test_size = data::openDataset(actors::datasetOptions(o, o.test_data))->size();
  }
  p.steps = actors::stepPlan(o, workers, p.train_size);
  p.lr = actors::lrPolicy(o, p.steps.steps_per_epoch);

  // The net as trainProcess builds its initial weights: on the CPU, for a batch of 1.
  kernels::NetOptions net = actors::netOptions(o, 1);
  net.pipeline = {};  // the same weights; a pipeline is checked, as by the run
  auto backend = kernels::makeCpuBackend(1);
  const auto model = kernels::makeNet(*backend, net);
  if (o.pipeline.stages > 1) {
    kernels::NetOptions smallest =
        actors::netOptions(o, *std::min_element(p.shares.begin(), p.shares.end()));
    kernels::checkPipeline(
        *model, smallest,
        {o.gpus.empty() ? kernels::DeviceKind::kCpu : kernels::DeviceKind::kCuda, 0});
  }
  p.layers = model->layers();
  p.num_params = model->numParams();
  p.num_buffers = model->buffers().numel();
  p.memory = model->memory();
  p.channels_last = actors::channelsLastOf(o, model->channelsLastMisfit());
  actors::cudaGraphsOf(o);                           // refused here as by the run
  kernels::makeOptimizer(*backend, 0, o.optimizer);  // its settings checked as by the run

  const std::string checkpoint_dir = actors::checkpointDir(o);
  if (const auto resumed = actors::findResume(o, checkpoint_dir, p.num_params, p.steps)) {
    const auto& ck = resumed->checkpoint;
    const std::string& path = resumed->path;
    actors::checkResumable(*resumed, p.num_params, p.steps, o.optimizer);
    p.steps.start(ck.metaInt("step"), o.num_epochs);
    p.resumed_from = path;
    p.finished = p.steps.first_step >= p.steps.last_step;
    if (p.finished && !resumed->latest) {
      throw InputError(
          fmt::format("checkpoint '{}' is at step {}, and this run ends at step {}: "
                      "raise num_epochs to train further",
                      path, p.steps.first_step, p.steps.last_step));
    }
  }
  if (!server && o.shard_id == 0 && !p.finished) {
    checkWritableDir(o.log_dir, "log");
    checkWritableDir(checkpoint_dir, "checkpoint");
  }
  return p;
}

// ---- the config as TOML ----

std::string tomlString(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

bool isNumber(std::string_view s) {
  double d = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// A key's text (ConfigKey::kind says which kind) as a TOML value.
std::string tomlValue(const std::string& kind, const std::string& text) {
  if (kind == "integer" || kind == "number" || kind == "boolean") return text;  // fmt's are TOML
  if (kind == "list of numbers") {
    std::string out = "[";
    for (std::size_t begin = 0; begin < text.size();) {
      const auto comma = std::min(text.find(',', begin), text.size());
      out += (begin ? ", " : "") + text.substr(begin, comma - begin);
      begin = comma + 1;
    }
    return out + "]";
  }
  return tomlString(text);
}

// A [[layers]] argument as its file had it (the loader keeps them as text).
std::string tomlArgument(const std::string& text) {
  return text == "true" || text == "false" || isNumber(text) ? text : tomlString(text);
}

// One of Caffe2's trainer flags that troupe takes beside its own keys
// (actors/config/caffe2_flags.h): the loader sets its troupe key from it, and its help says so.

// Where each key's value came from, by the precedence of actors/config/train_config.h and
// actors/config/cluster_env.h: a flag, a TROUPE_* variable, the cluster engine, the file, the
// default.
class Provenance {
 public:
  Provenance(const std::string& file, const actors::ConfigOverrides& overrides,
             const actors::TrainOptions& o)
      : overrides_(overrides) {
    if (!file.empty()) {
      // The loader has parsed this file already: a failure here is the file changing meanwhile.
      try {
        const toml::table table = toml::parse(actors::readConfigFile(file), file);
        for (const auto& [key, node] : table)
          in_file_.insert(key == "kv_store" ? "schedule" : std::string(key.str()));
        if (in_file_.count("layers")) in_file_.insert("model");
      } catch (const std::exception&) {
      }
    }
    const auto env = actors::processEnvironment();
    for (const auto& [var, key] : actors::launcherVariables()) {
      if (const auto v = env(var.c_str())) {
        vars_.emplace(
            key == "num_shards" && v->find(':') != std::string::npos ? "num_workers" : key, var);
      }
    }
    // The engine that placed this process, asked again of a copy: its values are set already.
    actors::TrainOptions copy = o;
    try {
      engine_ = actors::applyClusterEnvironment(
          copy, [this](std::string_view key) { return given(std::string(key)); }, env);
    } catch (const Error&) {
    }
    slurm_rendezvous_ = engine_ == "slurm" && o.num_shards + o.num_servers > 1;
  }

  std::string of(const std::string& key) const {
    if (const auto g = given(key)) return *g;
    if (!engine_.empty()) {
      const bool placed = !given("role") && !given("shard_id");
      if ((key == "role" || key == "shard_id") && placed) return engine_;
      if ((key == "num_shards" || key == "num_workers") && engine_ != "kubernetes") return engine_;
      if ((key == "run_id" || key == "rendezvous") && slurm_rendezvous_ && !inFile(key)) {
        return engine_;
      }
    }
    return inFile(key) ? "file" : "default";
  }

 private:
  // num_shards and num_workers set each other.
  static std::string twin(const std::string& key) {
    return key == "num_shards" ? "num_workers" : key == "num_workers" ? "num_shards" : "";
  }
  bool inFile(const std::string& key) const {
    return in_file_.count(key) || in_file_.count(twin(key));
  }
  std::optional<std::string> given(const std::string& key) const {
    for (const auto& k : {key, twin(key)}) {
      if (!k.empty() && overrides_.count(k)) return "--" + k;
    }
    for (const auto& k : {key, twin(key)}) {
      if (const auto it = vars_.find(k); !k.empty() && it != vars_.end()) return it->second;
    }
    return std::nullopt;
  }

  const actors::ConfigOverrides& overrides_;
  std::set<std::string> in_file_;
  std::map<std::string, std::string> vars_;  // key -> the TROUPE_* variable that gave it
  std::string engine_;
  bool slurm_rendezvous_ = false;  // the engine gave the run id and rendezvous where none was
};

std::string configSection(const std::string& file, const actors::ConfigOverrides& overrides,
                          const actors::TrainOptions& o) {
  const Provenance provenance(file, overrides, o);
  std::string out = fmt::format(
      "# The resolved config (flag > TROUPE_* variable > cluster engine > file > default), each "
      "key\n# followed by where its value came from; file: {}\n",
      file.empty() ? "none" : file);
  std::map<std::string, const actors::ConfigKey*> keys;
  for (const auto& key : actors::configKeys())
    keys.emplace(key.name, &key);
  for (const auto& [name, text] : o.parameters) {
    const auto it = keys.find(name);
    const actors::ConfigKey* key = it == keys.end() ? nullptr : it->second;
    std::string line = fmt::format("{} = {}", name, tomlValue(key ? key->kind : "", text));
    std::string origin = provenance.of(name);
    if (key && key->caffe2_flag) {
      // Its value is in the key it sets; written beside it, a reload would refuse the pair.
      if (origin == "default") continue;
      line = "# " + line;
      origin += " (Caffe2's flag: its value is in the key it sets)";
    } else if (key && key->kind == "boolean" && text == "auto") {
      // Unset, decided by the run (cuda_graphs: on where GPUs train); no boolean to reload.
      line = "# " + line;
      origin += " (unset: the run decides)";
    } else if (name == "model" && !o.model.layers.empty()) {
      line = "# model: the [[layers]] below";
    } else if (origin == "default" && name == "schedule" && text != key->default_value) {
      origin =
          "several processes and no schedule named: Caffe2's sync SGD, or dist_sync with "
          "servers";
    } else if (origin == "default" && key && text != key->default_value) {
      origin = "another key or variable (a Caffe2 flag, DMLC_*, MXNET_*)";
    }
    out += fmt::format("{:<48} # {}\n", line, origin);
  }
  for (const auto& layer : o.model.layers) {
    out += fmt::format("\n[[layers]]\ntype = {}\n", tomlString(layer.type));
    for (const auto& [name, value] : layer.args)
      out += fmt::format("{} = {}\n", name, tomlArgument(value));
  }
  return out;
}

// ---- the rest, as comments ----

std::string shapeText(const kernels::Shape& shape) {
  if (shape.empty()) return "-";
  std::string out;
  for (const auto d : shape)
    out += (out.empty() ? "" : " x ") + std::to_string(d);
  return out;
}

std::string modelSection(const actors::TrainOptions& o, const Plan& p) {
  std::size_t width = 5;
  for (const auto& l : p.layers)
    width = std::max(width, l.name.size());
  std::string out = fmt::format(
      "\n# model: {}, input {} x {} x {}, {} labels; output per sample (C x H x W) for a batch of "
      "1\n",
      o.model.layers.empty() ? o.model.name : "[[layers]]", o.num_channels, o.image_size,
      o.image_size, o.num_labels);
  out += fmt::format("#   {:<{}}  {:<16}  {:>12}\n", "layer", width, "output", "parameters");
  // A layer a batch norm computes in its own pass (kernels::LayerInfo::computed_by) says so.
  for (const auto& l : p.layers)
    out += fmt::format("#   {:<{}}  {:<16}  {:>12}{}\n", l.name, width, shapeText(l.output),
                       l.num_params,
                       l.computed_by.empty() ? "" : "  (fused into " + l.computed_by + ")");
  out += fmt::format("#   {:<{}}  {:<16}  {:>12}\n", "total", width, "", p.num_params);
  if (p.num_buffers > 0) {
    out += fmt::format("#   (and {} batch-norm statistics, not trained)\n", p.num_buffers);
  }
  return out;
}

std::string dataSection(const actors::TrainOptions& o, const Plan& p) {
  std::string out =
      o.block_size > 0
          ? fmt::format("\n# data: token shards, sequences of {} tokens (vocabulary {})\n",
                        o.block_size, o.vocab_size)
          : fmt::format("\n# data: {}, {} x {} x {} inputs\n", data::toString(o.db_type),
                        o.num_channels, o.image_size, o.image_size);
  out +=
      fmt::format("#   train  {} records  {}\n", p.train_size,
                  o.synthetic ? std::string("synthetic (random inputs, made once)") : o.train_data);
  if (p.test_size >= 0) {
    out += fmt::format("#   test   {} records  {}\n", p.test_size, o.test_data);
  } else {
    out += "#   test   none (no evaluation)\n";
  }
  const std::int64_t trained = p.steps.steps_per_epoch * p.steps.global_batch;
  out += fmt::format("#   epoch  {} records{}, {} trained ({} steps of {}{})\n", p.steps.epoch_size,
                     o.epoch_size > 0 ? " (epoch_size)" : " (the training set)", trained,
                     p.steps.steps_per_epoch, p.steps.global_batch,
                     trained < p.steps.epoch_size ? "; the rest left out" : "");
  return out;
}

// The threads of each process, and who decided them.
std::string describeThreads(const actors::TrainOptions& o, const Plan& p, int processes) {
  if (o.threads > 0) return fmt::format("{} per process (--threads)", p.threads);
  if (actors::launcherSharesCores()) {
    return fmt::format("{} per process: this host's {} cores shared by the run's processes on it",
                       p.threads, actors::hostCores());
  }
  if (processes > 1) {
    return fmt::format(
        "{} per process, unless other processes of the run share this machine's {} cores: they "
        "share them out when they meet (--threads N sets it)",
        p.threads, actors::hostCores());
  }
  return fmt::format("{} per process: this machine's cores", p.threads);
}

// The learning-rate policy: its kind, base, steps and warmup.
std::string describeLr(const actors::TrainOptions& o, const Plan& p) {
  std::string lr =
      fmt::format("{} from {:g}", kernels::nameIn(kernels::kLrPolicies, p.lr.policy), p.lr.base);
  for (const auto& [name, value] : o.parameters) {
    if (name == "lr_scaling" && !value.empty() && value != "none")
      lr += fmt::format(" (base_learning_rate scaled by lr_scaling {})", value);
  }
  if (p.lr.policy == kernels::LrSchedule::kStep)
    lr += fmt::format(", x {:g} every {} steps", p.lr.gamma, p.lr.stepsize);
  if (p.lr.policy == kernels::LrSchedule::kMultistep) {
    std::string at;
    for (const auto s : p.lr.stepvalues)
      at += (at.empty() ? "" : ", ") + std::to_string(s);
    lr += fmt::format(", x {:g} at steps {}", p.lr.gamma, at);
  }
  if (p.lr.policy == kernels::LrSchedule::kPoly) {
    lr += fmt::format(", to {:g} as (1 - step / {})^{:g}", p.lr.end, p.lr.max_steps, p.lr.power);
  }
  if (p.lr.warmup_steps > 0) lr += fmt::format(", warmup {} steps", p.lr.warmup_steps);
  return lr;
}

std::string planSection(const actors::TrainOptions& o, const Plan& p) {
  const int workers = o.num_shards;
  const int processes = workers + o.num_servers;
  const bool elastic = o.max_workers > 0;
  std::string out = "\n# plan\n";
  auto row = [&out](std::string_view what, const std::string& value) {
    out += fmt::format("#   {:<15} {}\n", what, value);
  };
  row("workers",
      elastic ? fmt::format("{} to {} (elastic; this plan is for {}: each generation re-plans for "
                            "its own)",
                            o.min_workers, o.max_workers, workers)
              : fmt::format("{}", workers));
  row("servers", fmt::format("{}", o.num_servers));
  row("this process",
      fmt::format("{} {}{}", actors::roleName(o.role), o.shard_id,
                  o.role == actors::ProcessRole::kWorker && o.shard_id == 0 ? " (the chief)" : ""));
  row("schedule", o.schedule.name());
  std::string shares;
  for (const auto s : p.shares)
    shares += (shares.empty() ? "" : ", ") + std::to_string(s);
  row("replicas", fmt::format("{} per worker, batch shares {}", o.replicas, shares));
  if (o.pipeline.stages > 1 && o.pipeline.placement == kernels::StagePlacement::kProcesses) {
    row("pipeline",
        fmt::format("{} stages a replica, each a worker's process (this one's: stage {}), each "
                    "batch in {} micro-batches (1F1B); {} data-parallel replica(s) of {} workers; "
                    "each worker updates its stage's weights alone, their gradients summed over "
                    "the stage's {} worker(s){}",
                    o.pipeline.stages, o.shard_id % o.pipeline.stages, o.pipeline.microBatches(),
                    workers / o.pipeline.stages, o.pipeline.stages, workers / o.pipeline.stages,
                    o.schedule.zeroStage() > 0 && workers > o.pipeline.stages
                        ? ", its optimizer's state sharded over them"
                        : ""));
  } else if (o.pipeline.stages > 1) {
    row("pipeline", fmt::format("{} stages a replica, each batch in {} micro-batches (1F1B)",
                                o.pipeline.stages, o.pipeline.microBatches()));
  }
  if (!o.gpus.empty()) {
    const bool ps = o.schedule.servers() != nullptr;
    const auto devices = actors::devicesOf(o, ps, processes);
    row("devices", fmt::format("{}; TF32 {}", actors::describe(devices, o, ps, processes),
                               o.tf32 ? "on" : "off"));
    row("precision", actors::describePrecision(o, p.channels_last));
    row("cuda graphs", actors::describeCudaGraphs(o));
  }
  row("batch", fmt::format("{} per worker, {} global", o.batch_size, p.steps.global_batch));
  {
    // Linear in the batch, and in the element size of the replica's precision.
    const std::int64_t batch = *std::max_element(p.shares.begin(), p.shares.end());
    const double scale = static_cast<double>(batch) *
                         (actors::precisionOf(o) == kernels::DType::kFloat32 ? 1.0 : 0.5) /
                         (1 << 20);
    row("memory",
        fmt::format("activations {:.1f} MiB and their gradients {:.1f} MiB a replica (batch {}), "
                    "{:.1f} MiB held: each only while it is live",
                    static_cast<double>(p.memory.activations) * scale,
                    static_cast<double>(p.memory.gradients) * scale, batch,
                    static_cast<double>(p.memory.held) * scale));
  }
  row("threads", describeThreads(o, p, processes));
  const std::int64_t steps = p.steps.last_step - p.steps.first_step;
  row("steps", fmt::format("{} per epoch x {} epochs = {}", p.steps.steps_per_epoch, o.num_epochs,
                           p.steps.steps_per_epoch * o.num_epochs));
  if (!p.resumed_from.empty()) {
    row("resume", p.finished
                      ? fmt::format("{} holds the last step: nothing left to train", p.resumed_from)
                      : fmt::format("from {} at step {}: {} steps left", p.resumed_from,
                                    p.steps.first_step, steps));
  } else if (o.resume == "auto") {
    row("resume", "auto: no checkpoint of this run yet, from scratch");
  }
  row("learning rate", describeLr(o, p));
  if (steps > 0) {
    const auto first = p.steps.first_step, last = p.steps.last_step - 1;
    row("", fmt::format("{:g} at step {}, {:g} at step {}", kernels::learningRate(p.lr, first),
                        first, kernels::learningRate(p.lr, last), last));
  }
  std::string optimizer = kernels::describe(o.optimizer);
  if (o.clip_grad_norm > 0)
    optimizer += fmt::format(", gradients clipped to norm {:g}", o.clip_grad_norm);
  if (o.label_smoothing > 0) optimizer += fmt::format(", label smoothing {:g}", o.label_smoothing);
  row("optimizer", optimizer);
  if (processes > 1 || elastic) {
    const bool serves = o.serve_store && o.role == actors::ProcessRole::kWorker &&
                        o.shard_id == 0 && o.rendezvous.starts_with("tcp://");
    row("rendezvous",
        rendezvous::redactedStoreUrl(o.rendezvous) + (serves ? " (this process serves it)" : ""));
    row("run id", o.run_id);
    row("compression", kernels::describe(actors::compressionOf(o)));
    if (const auto* all = o.schedule.allreduce()) {
      row("allreduce", actors::allreduceName(all->across()));
      if (all->zero_stage > 0) {
        row("zero_stage",
            fmt::format("{}: the optimizer's state sharded over the {} workers (gradients "
                        "reduce-scattered, weights all-gathered)",
                        all->zero_stage, workers));
      }
    }
  }
  if (o.role == actors::ProcessRole::kWorker && o.shard_id == 0) {
    const std::string checkpoints = actors::checkpointDir(o);
    row("log", fmt::format("{}/{}.log", o.log_dir, actors::experimentId(o)));
    row("checkpoints", o.checkpoint_every > 0
                           ? fmt::format("every {} epoch(s) and at the end, in {}",
                                         o.checkpoint_every, checkpoints)
                           : fmt::format("at the end, in {}", checkpoints));
  }
  return out;
}

}  // namespace

std::string dryRunReport(const std::string& file, const actors::ConfigOverrides& overrides,
                         const actors::TrainOptions& options) {
  actors::TrainOptions o = options;
  if (o.max_workers > 0) {
    actors::validateElastic(o);
    o.num_shards = o.max_workers;  // as a generation of all of them would have it
    o.shard_id = 0;
  }
  const Plan p = plan(o);
  return "# troupe train --dry-run: nothing was trained or written\n" +
         configSection(file, overrides, options) + modelSection(o, p) + dataSection(o, p) +
         planSection(o, p);
}

}  // namespace troupe::apps
