#include "actors/config/caffe2_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "troupe/error.h"

namespace troupe::actors::config {
namespace {

using SetFn = std::function<void(Settings&, const Value&)>;

constexpr const char* kNoResNeXt =
    "troupe has no ResNeXt (grouped convolutions): its ImageNet ResNets are model resnet18, "
    "resnet34 and resnet50 (Caffe2's --num_layers 18, 34, 50)";

// A flag of Caffe2's that gives `sets` (or nothing, for nullptr) its value through `set`; `get`
// is the value as given, else `fallback`.
Key alias(const char* name, Kind kind, Range range, const char* help, const char* sets, SetFn set,
          std::string fallback) {
  Key key{name,
          kind,
          range,
          help,
          std::move(set),
          [name, fallback = std::move(fallback)](const Settings& s) {
            return s.textOr(name, fallback);
          }};
  key.sets = sets;
  return key;
}

// A boolean flag that troupe takes as false and refuses as true, saying `why`.
Key onlyFalse(const char* name, const char* help, const char* why) {
  return alias(
      name, Kind::kBool, Range{}, help, nullptr,
      [why](Settings&, const Value& v) {
        if (std::get<bool>(v)) throw Refusal(why);
      },
      "false");
}

// A text flag that gives the rendezvous its store, refusing an empty one as not `what`.
Key rendezvousFlag(const char* name, const char* help, const char* what) {
  return alias(
      name, Kind::kString, Range{}, help, "rendezvous",
      [what](Settings&, const Value& v) {
        if (std::get<std::string>(v).empty()) throw Refusal(std::string("expected ") + what);
      },
      "");
}

// An integer flag that troupe takes at `accepted` only (Caffe2's default), refusing any other value
// saying `why`.
Key onlyInt(const char* name, Range range, const char* help, std::int64_t accepted,
            const char* why) {
  return alias(
      name, Kind::kInt, range, help, nullptr,
      [accepted, why](Settings&, const Value& v) {
        if (std::get<std::int64_t>(v) != accepted) throw Refusal(why);
      },
      std::to_string(accepted));
}

// A flag that troupe refuses whatever its value, saying `why`.
Key refused(const char* name, const char* help, const char* why) {
  Key key{name,
          Kind::kString,
          Range{},
          help,
          [](Settings&, const Value&) {},
          [](const Settings&) { return std::string(); }};
  key.refusal = why;
  return key;
}

// "host" as a URL's host: an IPv6 address in brackets.
std::string urlHost(const std::string& host) {
  return host.find(':') != std::string::npos && !host.starts_with('[') ? "[" + host + "]" : host;
}

}  // namespace

std::vector<Key> caffe2Keys() {
  constexpr Range kPort{1, 65535};
  constexpr Range kDevices{1, 1024};
  constexpr Range kSeconds{0, 30 * 24 * 3600, true, false};  // step_timeout's
  return {
      alias(
          "num_gpus", Kind::kInt, kDevices,
          "Caffe2's GPU count: gpus 0 .. num_gpus-1; with use_cpu, that many replicas on the CPU "
          "(Caffe2's CPU devices)",
          "gpus",
          [](Settings& s, const Value& v) {
            s.options.gpus.clear();
            for (std::int64_t i = 0; i < std::get<std::int64_t>(v); ++i)
              s.options.gpus.push_back(static_cast<int>(i));
          },
          "1"),
      onlyFalse("model_parallel", "Caffe2's: true is refused (no model parallelism)",
                "troupe has no model parallelism: every replica holds the whole model (replicas "
                "and num_shards split the data)"),
      refused("cudnn_workspace_limit_mb",
              "Caffe2's: refused (troupe's cuDNN convolutions size their own workspace)",
              "troupe's cuDNN convolutions size their own workspace (the fastest algorithm's, "
              "up to half the GPU's free memory and 4 GiB), and there is no limit to set yet"),
      refused("gpu_engine_workspace_limit_mb",
              "Caffe2's: refused (troupe's GPU kernels size their own workspace)",
              "troupe's GPU kernels size their own workspace (cuDNN's, up to half the GPU's "
              "free memory and 4 GiB an algorithm), and there is no limit to set yet"),
      rendezvousFlag("redis_host", "Caffe2's: rendezvous redis://HOST:PORT, PORT being redis_port",
                     "a host name"),
      alias(
          "redis_port", Kind::kInt, kPort, "Caffe2's: the port of redis_host", nullptr,
          [](Settings&, const Value&) {}, "6379"),
      rendezvousFlag("file_store_path",
                     "Caffe2's: rendezvous file://DIR (a folder every process sees)", "a folder"),
      alias(
          "save_model_name", Kind::kString, Range{},
          "Caffe2's: run_name, which begins the names of the log and of the checkpoints "
          "(NAME_cpu..._epochN.ckpt in checkpoint_dir)",
          "run_name",
          [](Settings& s, const Value& v) { s.options.run_name = std::get<std::string>(v); }, ""),
      alias(
          "load_model_path", Kind::kString, Range{},
          "Caffe2's: resume (a troupe checkpoint; a Caffe2 .mdl is refused)", "resume",
          [](Settings& s, const Value& v) {
            const auto& path = std::get<std::string>(v);
            if (path.ends_with(".mdl")) {
              throw Refusal(
                  "a Caffe2 model (minidb), which troupe cannot read: it resumes from its own "
                  "checkpoints only (resume = a .ckpt file, or auto)");
            }
            s.options.resume = path;
          },
          ""),
      alias(
          "use_cpu", Kind::kBool, Range{},
          "Caffe2's: true trains on the CPU (gpus and num_gpus count CPU replicas); false on "
          "GPUs (gpus, num_gpus; GPU 0 without them). Without it, troupe trains on the CPU "
          "unless gpus or num_gpus is given",
          nullptr, [](Settings& s, const Value& v) { s.use_cpu = std::get<bool>(v); }, "true"),
      alias(
          "use_nccl", Kind::kBool, Range{},
          "Caffe2's: true sums GPU replicas' gradients with NCCL (reducer nccl), false with "
          "troupe's own sums and ring (reducer troupe)",
          "reducer",
          [](Settings& s, const Value& v) {
            s.schedule_keys.reducer = std::get<bool>(v) ? "nccl" : "troupe";
          },
          "false"),
      alias(
          "use_ideep", Kind::kBool, Range{},
          "Caffe2's: accepted either way (troupe's CPU kernels use oneDNN, which iDeep wraps)",
          nullptr, [](Settings&, const Value&) {}, "false"),
      alias(
          "dtype", Kind::kString, Range{},
          "Caffe2's: float, or float16 (precision fp16: mixed precision on GPUs)", "precision",
          [](Settings& s, const Value& v) {
            const auto& type = std::get<std::string>(v);
            if (type != "float" && type != "float16") throw Refusal("expected float or float16");
            s.options.precision =
                type == "float16" ? kernels::DType::kFloat16 : kernels::DType::kFloat32;
          },
          "float"),
      agreed(onlyFalse("float16_compute",
                       "Caffe2's: true is refused (troupe's fp16 accumulates in float32)",
                       "troupe's fp16 (--dtype float16, precision fp16) multiplies in fp16 and "
                       "accumulates in float32; it has no fp16 accumulation")),
      alias(
          "enable_tensor_core", Kind::kBool, Range{},
          "Caffe2's: Tensor Core math on GPUs; troupe's in float32 is TF32 (tf32)", "tf32",
          [](Settings& s, const Value& v) { s.options.tf32 = std::get<bool>(v); }, "false"),
      alias(
          "distributed_transport", Kind::kString, Range{},
          "Caffe2's: tcp (troupe's links are TCP); ibverbs is refused", nullptr,
          [](Settings&, const Value& v) {
            const auto& transport = std::get<std::string>(v);
            if (transport == "ibverbs") {
              throw Refusal(
                  "troupe has no ibverbs transport: its links are TCP (connections_per_peer "
                  "spreads each over several connections)");
            }
            if (transport != "tcp") throw Refusal("expected tcp (Caffe2's ibverbs troupe lacks)");
          },
          "tcp"),
      alias(
          "distributed_interfaces", Kind::kString, Range{},
          "Caffe2's: interface, the first of a comma-separated list (Caffe2 used only the "
          "first)",
          "interface",
          [](Settings& s, const Value& v) {
            const auto& list = std::get<std::string>(v);
            s.options.interface = list.substr(0, list.find(','));
          },
          ""),
      alias(
          "num_layers", Kind::kInt, Range{1, 1000},
          "Caffe2's: model resnet18, resnet34 or resnet50", "model",
          [](Settings& s, const Value& v) {
            const auto depth = std::get<std::int64_t>(v);
            if (depth != 18 && depth != 34 && depth != 50) {
              throw Refusal(
                  "troupe's built-in ImageNet ResNets are 18, 34 and 50 layers deep (model "
                  "resnet18, resnet34, resnet50); deeper ones are not built in");
            }
            s.options.model.name = fmt::format("resnet{}", depth);
          },
          "50"),  // Caffe2's default; it sets model only when given
      agreed(onlyInt("resnext_num_groups", Range{1, 1024},
                     "Caffe2's: 1 (a plain ResNet) accepted, more refused (no ResNeXt)", 1,
                     kNoResNeXt)),
      agreed(onlyInt("resnext_width_per_group", Range{1, 65536},
                     "Caffe2's: 64 (a plain ResNet) accepted, others refused (no ResNeXt)", 64,
                     kNoResNeXt)),
      alias(
          "image_mean_per_channel", Kind::kFloatList, Range{-1e6, 1e6},
          "Caffe2's: mean_per_channel", "mean_per_channel",
          [](Settings& s, const Value& v) {
            s.options.mean_per_channel = std::get<std::vector<double>>(v);
          },
          ""),
      alias(
          "image_std_per_channel", Kind::kFloatList, Range{1e-6, 1e6}, "Caffe2's: std_per_channel",
          "std_per_channel",
          [](Settings& s, const Value& v) {
            s.options.std_per_channel = std::get<std::vector<double>>(v);
          },
          ""),
      refused("test_epoch_size", "Caffe2's: refused (troupe tests on the whole test_data)",
              "troupe tests on the whole test_data after every epoch, and no key limits it (a "
              "smaller test database does)"),
      refused("first_iter_timeout", "Caffe2's: refused (see rendezvous_timeout, step_timeout)",
              "troupe has no separate timeout for the first step: rendezvous_timeout bounds the "
              "wait for the other processes, step_timeout every step"),
      Key{"timeout", Kind::kFloat, kSeconds, "Caffe2's: step_timeout",
          [](Settings& s, const Value& v) { s.options.step_timeout_s = std::get<double>(v); },
          [](const Settings& s) { return fmt::format("{}", s.options.step_timeout_s); }, false,
          "step_timeout"},
  };
}

void resolveCaffe2Flags(Settings& s) {
  auto& o = s.options;
  if (const Given* port = s.find("redis_port"); port && !s.find("redis_host")) {
    throw InputError(fmt::format(
        "{} needs redis_host: troupe's rendezvous is redis://HOST:PORT (--redis_host HOST "
        "--redis_port PORT, as Caffe2's)",
        port->source.by));
  }
  if (const Given* store = s.find("rendezvous"); store && store->name == "redis_host") {
    o.rendezvous =
        fmt::format("redis://{}:{}", urlHost(store->text), s.textOr("redis_port", "6379"));
  } else if (store && store->name == "file_store_path") {
    std::error_code ec;  // a folder that cannot be made absolute stays as it is
    const auto dir = std::filesystem::absolute(store->text, ec);
    o.rendezvous = "file://" + (ec ? store->text : dir.lexically_normal().string());
  }
  // Caffe2's devices: with --use_cpu, --gpus and --num_gpus count replicas on the CPU (Caffe2's
  // CPU devices); --use_cpu false alone is Caffe2's default, GPU 0. On GPUs, a replica each.
  const Given* gpus = s.find("gpus");
  const Given* replicas = s.find("replicas");
  if (s.use_cpu == true && !o.gpus.empty()) {
    if (gpus && replicas && replicas->source.rank == gpus->source.rank) {
      throw InputError(fmt::format("{} and {} both set replicas: give one", gpus->source.by,
                                   replicas->source.by));
    }
    if (!replicas || (gpus && replicas->source.rank < gpus->source.rank))
      o.replicas = static_cast<int>(o.gpus.size());
    o.gpus.clear();
    return;
  }
  if (s.use_cpu == false && o.gpus.empty()) o.gpus = {0};
  // An explicit replicas must match (checkGpus says so, naming both).
  if (!o.gpus.empty() && !replicas) o.replicas = static_cast<int>(o.gpus.size());
}

double lrScale(std::string_view scaling, std::int64_t global_batch) {
  return scaling == "per256" ? static_cast<double>(global_batch) / 256.0 : 1.0;
}

void applyLrScaling(Settings& s) {
  const std::string scaling = s.textOr("lr_scaling", "none");
  if (scaling == "none") return;
  auto& o = s.options;
  if (o.max_workers > 0) {
    throw InputError(fmt::format(
        "lr_scaling {} needs a fixed number of workers: an elastic run's global batch (num_workers "
        "{}:{}) changes as workers come and go",
        scaling, o.min_workers, o.max_workers));
  }
  const std::int64_t global_batch = o.batch_size * o.num_shards;
  const double rate = o.base_learning_rate * lrScale(scaling, global_batch);
  if (!(rate <= 1e38)) {  // base_learning_rate's bound
    throw InputError(fmt::format(
        "lr_scaling {}: base_learning_rate {} x global batch {} / 256 is {:.4g}, above 1e+38",
        scaling, o.base_learning_rate, global_batch, rate));
  }
  o.base_learning_rate = static_cast<float>(rate);
}

}  // namespace troupe::actors::config
