#include "apps/system_info.h"

#include <cairo.h>
#include <capnp/common.h>
#include <fmt/format.h>
#include <google/protobuf/stubs/common.h>
#include <hiredis/hiredis.h>
#include <leveldb/db.h>
#include <lmdb.h>
#include <oneapi/dnnl/dnnl.h>
#include <openssl/crypto.h>
#include <png.h>
#include <spdlog/version.h>
#include <toml++/toml.h>
#include <zlib.h>
#include <CLI/Version.hpp>
#include <asio/version.hpp>
#if __has_include(<jconfig.h>)
#include <jconfig.h>  // libjpeg-turbo's, under turbojpeg.h
#endif

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include "actors/run/run_plan.h"
#include "actors/schedules/schedule.h"
#include "kernels/cpu/isa.h"
#include "kernels/cuda_plugin.h"
#include "kernels/net.h"
#include "rendezvous/url.h"
#include "troupe/config.h"
#include "troupe/error.h"
#include "troupe/version.h"

#define TROUPE_INFO_STR2(x) #x
#define TROUPE_INFO_STR(x) TROUPE_INFO_STR2(x)

namespace troupe::apps {
namespace {

InfoField text(std::string label, std::string key, std::string value) {
  return {std::move(label), std::move(key), std::move(value), false};
}
InfoField number(std::string label, std::string key, long long value) {
  return {std::move(label), std::move(key), std::to_string(value), true};
}
InfoField boolean(std::string label, std::string key, bool value) {
  return {std::move(label), std::move(key), value ? "true" : "false", true};
}

std::string compiler() {
#if defined(__clang__)
  return "Clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#else
  return "unknown";
#endif
}

// CMake's build type is not recorded; what the compiler was told is.
std::string buildType() {
#if defined(__OPTIMIZE__) && defined(NDEBUG)
  return "release (optimized, NDEBUG)";
#elif defined(__OPTIMIZE__)
  return "optimized, with assertions";
#elif defined(NDEBUG)
  return "not optimized, NDEBUG";
#else
  return "debug (not optimized, with assertions)";
#endif
}

std::string dnnlRuntime(unsigned runtime) {
  switch (runtime) {
    case DNNL_RUNTIME_NONE:
      return "none";
    case DNNL_RUNTIME_SEQ:
      return "sequential";
    case DNNL_RUNTIME_OMP:
      return "OpenMP";
    case DNNL_RUNTIME_TBB:
      return "TBB";
    case DNNL_RUNTIME_THREADPOOL:
      return "threadpool";
    case DNNL_RUNTIME_OCL:
      return "OpenCL";
    case DNNL_RUNTIME_SYCL:
      return "SYCL";
    default:
      return fmt::format("{:#x}", runtime);
  }
}

// oneDNN's own kernels' instruction set, as ONEDNN_MAX_CPU_ISA leaves it.
std::string dnnlIsa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return fmt::format("{:#x}", static_cast<unsigned>(dnnl_get_effective_cpu_isa()));
  }
}

std::vector<InfoField> libraries() {
  const dnnl_version_t* dnnl = dnnl_version();
  int lmdb_major = 0, lmdb_minor = 0, lmdb_patch = 0;
  mdb_version(&lmdb_major, &lmdb_minor, &lmdb_patch);
  std::vector<InfoField> out = {
      text("oneDNN", "onednn",
           fmt::format("{}.{}.{} ({}cpu runtime {})", dnnl->major, dnnl->minor, dnnl->patch,
                       dnnl->hash && std::string_view(dnnl->hash) != "N/A"
                           ? fmt::format("commit {}, ", dnnl->hash)
                           : std::string(),
                       dnnlRuntime(dnnl->cpu_runtime))),
      text("Cap'n Proto", "capnproto",
           fmt::format("{}.{}.{}", CAPNP_VERSION_MAJOR, CAPNP_VERSION_MINOR, CAPNP_VERSION_MICRO)),
      text("LMDB", "lmdb", fmt::format("{}.{}.{}", lmdb_major, lmdb_minor, lmdb_patch)),
      text("LevelDB", "leveldb",
           fmt::format("{}.{}", leveldb::kMajorVersion, leveldb::kMinorVersion)),
      text("protobuf", "protobuf",
           fmt::format("{}.{}.{}", GOOGLE_PROTOBUF_VERSION / 1000000,
                       GOOGLE_PROTOBUF_VERSION / 1000 % 1000, GOOGLE_PROTOBUF_VERSION % 1000)),
      text("hiredis", "hiredis",
           fmt::format("{}.{}.{}", HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH)),
      text("OpenSSL", "openssl", OpenSSL_version(OPENSSL_VERSION)),
      text("cairo", "cairo", cairo_version_string()),
      text("libpng", "libpng", png_get_libpng_ver(nullptr)),
#ifdef LIBJPEG_TURBO_VERSION
      text("libjpeg-turbo", "libjpeg_turbo", TROUPE_INFO_STR(LIBJPEG_TURBO_VERSION)),
#endif
      text("zlib", "zlib", zlibVersion()),
      text("spdlog", "spdlog",
           fmt::format("{}.{}.{}", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH)),
      text(
          "fmt", "fmt",
          fmt::format("{}.{}.{}", FMT_VERSION / 10000, FMT_VERSION / 100 % 100, FMT_VERSION % 100)),
      text("toml++", "tomlplusplus",
           fmt::format("{}.{}.{}", TOML_LIB_MAJOR, TOML_LIB_MINOR, TOML_LIB_PATCH)),
      text("CLI11", "cli11", CLI11_VERSION),
      text("Asio", "asio",
           fmt::format("{}.{}.{}", ASIO_VERSION / 100000, ASIO_VERSION / 100 % 1000,
                       ASIO_VERSION % 100)),
  };
  return out;
}

std::string firstLineOf(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "model name" and the physical cores (distinct physical id / core id pairs) of /proc/cpuinfo.
std::pair<std::string, int> cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string model, physical;
  std::set<std::pair<std::string, std::string>> cores;
  auto value = [](const std::string& line) {
    const auto start = line.find_first_not_of(" \t", line.find(':') + 1);
    return line.find(':') == std::string::npos || start == std::string::npos ? std::string()
                                                                             : line.substr(start);
  };
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0 && model.empty()) model = value(line);
    if (line.rfind("physical id", 0) == 0) physical = value(line);
    if (line.rfind("core id", 0) == 0) cores.emplace(physical, value(line));
  }
  return {model.empty() ? "unknown" : model, static_cast<int>(cores.size())};
}

// MemTotal and MemAvailable of /proc/meminfo, in bytes (0 when unknown).
std::pair<long long, long long> memory() {
  std::ifstream in("/proc/meminfo");
  long long total = 0, available = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string name;
    long long kib = 0;
    words >> name >> kib;
    if (name == "MemTotal:") total = kib * 1024;
    if (name == "MemAvailable:") available = kib * 1024;
  }
  return {total, available};
}

std::string gib(long long bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
}

// "13.0" of 13000 (CUDA's encoding), "9.19.0" of 91900 (cuDNN's), "2.28.4" of 22804 (NCCL's).
std::string cudaVersion(long long v) {
  return fmt::format("{}.{}", v / 1000, v % 1000 / 10);
}
std::string threePart(long long v, long long major, long long minor) {
  return v ? fmt::format("{}.{}.{}", v / major, v % major / minor, v % minor) : "unknown";
}

// What the CUDA plugin loaded (kernels/cuda_plugin.h): the libraries it runs with, the GPUs.
void cudaDevices(std::vector<InfoField>& out) {
  const auto& c = kernels::cudaInfo();
  if (!c.loaded) {
    out.push_back(text("cuda plugin", "cuda_plugin", c.problem));
    return;
  }
  out.push_back(text("cuda plugin", "cuda_plugin", c.library));
  out.push_back(text("cuda code", "cuda_architectures", c.architectures));
  out.push_back(text("cuda runtime", "cuda_runtime", cudaVersion(c.runtime)));
  out.push_back(text("cuda driver", "cuda_driver", c.driver ? cudaVersion(c.driver) : "none"));
  out.push_back(text("cuDNN", "cudnn", threePart(c.cudnn, 10000, 100)));
  out.push_back(text("cuBLAS", "cublas", threePart(c.cublas, 10000, 100)));
  out.push_back(text("NCCL", "nccl", threePart(c.nccl, 10000, 100)));
  out.push_back(number("gpus", "gpus", static_cast<long long>(c.devices.size())));
  if (!c.problem.empty()) out.push_back(text("no gpu", "gpu_problem", c.problem));
  for (const auto& d : c.devices) {
    out.push_back(text(fmt::format("cuda:{}", d.index), fmt::format("cuda_{}", d.index),
                       fmt::format("{}, sm_{}{}, {}, {} multiprocessors", d.name, d.major, d.minor,
                                   gib(d.memory), d.multiprocessors)));
  }
}

std::vector<InfoField> devices() {
  std::vector<InfoField> out;
  utsname os{};
  if (::uname(&os) == 0) {
    out.push_back(text("os", "os", fmt::format("{} {} {}", os.sysname, os.release, os.machine)));
  }
  const auto [model, physical] = cpuModel();
  out.push_back(text("cpu", "cpu_model", model));
  if (physical > 0) out.push_back(number("physical cores", "physical_cores", physical));
  out.push_back(number("hardware threads", "hardware_threads",
                       static_cast<long long>(std::thread::hardware_concurrency())));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    out.push_back(number("usable cpus", "usable_cpus", CPU_COUNT(&set)));
  }
  // cgroup v2: "QUOTA PERIOD", or "max".
  std::istringstream quota(firstLineOf("/sys/fs/cgroup/cpu.max"));
  if (long long q = 0, period = 0; (quota >> q >> period) && period > 0) {
    out.push_back(text("cpu quota", "cpu_quota",
                       fmt::format("{:g} cpus (cgroup)", static_cast<double>(q) / period)));
  }
  out.push_back(number("threads per process", "default_threads", actors::defaultThreads()));
  std::string isa;
  try {
    isa = kernels::cpu::isaName(kernels::cpu::cpuIsa());
  } catch (const Error& e) {
    isa = fmt::format("unknown ({})", e.what());
  }
  std::string caps;
  for (const char* var : {"TROUPE_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA"}) {
    if (const char* v = std::getenv(var); v && *v)
      caps += fmt::format("{}{}={}", caps.empty() ? "" : ", ", var, v);
  }
  out.push_back(text("cpu kernels", "cpu_kernels", isa));
  if (!caps.empty()) out.push_back(text("held by", "isa_caps", caps));
  out.push_back(text("oneDNN isa", "onednn_isa", dnnlIsa()));
  const auto [total, available] = memory();
  if (total > 0) {
    out.push_back(number("memory", "memory_bytes", total));
    out.push_back(number("memory available", "memory_available_bytes", available));
  }
  if (const auto limit = firstLineOf("/sys/fs/cgroup/memory.max");
      !limit.empty() && limit != "max") {
    out.push_back(text("memory limit", "memory_limit", limit + " bytes (cgroup)"));
  }
  out.push_back(text("cuda backend", "cuda_backend", TROUPE_USE_CUDA ? "built" : "not built"));
  if (TROUPE_USE_CUDA) cudaDevices(out);
  return out;
}

// Where `program` is on PATH; "" when it is not.
std::string onPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string found(const std::string& program) {
  const auto where = onPath(program);
  return where.empty() ? fmt::format(" ({} is not on PATH)", program) : " (" + where + ")";
}

// From the schedules' table (actors/schedules/schedule.h).
std::vector<InfoItem> schedules() {
  std::vector<InfoItem> items;
  for (const auto& row : actors::schedules())
    items.push_back({row.name, row.mxnet, row.summary});
  return items;
}

// From the optimizers' table (kernels/optimizer.h); MXNet's names where they differ.
std::vector<InfoItem> optimizerItems() {
  std::vector<InfoItem> items;
  for (const auto& row : kernels::optimizers()) {
    std::vector<std::string> mxnet{row.name};
    if (row.name == "sgd") mxnet.push_back("nag");
    std::string reads;
    for (const auto& setting : row.settings)
      reads += (reads.empty() ? "" : ", ") + std::string(setting.key);
    if (row.name == "sgd") reads += ", nesterov";
    items.push_back({row.name, mxnet,
                     row.summary + (reads.empty() ? "" : "; reads " + reads + ", weight_decay")});
  }
  return items;
}

std::vector<InfoItem> layerTypeItems() {
  std::vector<InfoItem> items;
  for (const auto& type : kernels::layerTypes()) {
    std::string takes;
    for (const auto& arg : type.args)
      takes += (takes.empty() ? "; takes " : ", ") + arg.key;
    items.push_back({type.name, {}, type.summary + takes});
  }
  return items;
}

std::vector<InfoItem> rendezvousStores() {
  std::vector<InfoItem> items;
  for (const auto& backend : rendezvous::storeBackends())
    items.push_back({std::string(backend.form), {}, std::string(backend.summary)});
  return items;
}

std::vector<InfoItem> launchers() {
  return {
      {"local", {}, "processes on this host"},
      {"ssh", {}, "a process on each host of the hostfile (-H), through ssh" + found("ssh")},
      {"mpi", {}, "Open MPI's mpirun, hosts from -H if given" + found("mpirun")},
      {"slurm", {}, "one srun step in a Slurm allocation" + found("srun")},
  };
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::vector<InfoSection> systemInfo() {
  std::vector<InfoSection> out;
  out.push_back(
      {buildSummary(),
       "troupe",
       {text("version", "version", version()), text("headers", "headers_version", TROUPE_VERSION)},
       {}});
  out.push_back(
      {"build",
       "build",
       {text("compiler", "compiler", compiler()), text("build type", "build_type", buildType()),
        number("c++ standard", "cplusplus", __cplusplus),
#ifdef _OPENMP
        number("openmp", "openmp", _OPENMP),
#endif
        boolean("cuda", "cuda", TROUPE_USE_CUDA)},
       {}});
  out.push_back({"libraries", "libraries", libraries(), {}});
  out.push_back({"devices", "devices", devices(), {}});
  out.push_back(
      {"schedules (--schedule; MXNet kvstore names accepted)", "schedules", {}, schedules()});
  out.push_back(
      {"optimizers (--optimizer; MXNet names accepted)", "optimizers", {}, optimizerItems()});
  out.push_back({"layer types (a config's [[layers]] type)", "layers", {}, layerTypeItems()});
  out.push_back({"rendezvous (--rendezvous)", "rendezvous", {}, rendezvousStores()});
  out.push_back({"launchers (troupe launch --launcher)", "launchers", {}, launchers()});
  return out;
}

std::string infoText(const std::vector<InfoSection>& sections) {
  std::string out;
  for (const auto& section : sections) {
    out += fmt::format("{}{}\n", out.empty() ? "" : "\n", section.title);
    for (const auto& f : section.fields) {
      if (f.key.ends_with("bytes") && f.number) {
        out += fmt::format("  {}: {} ({} bytes)\n", f.label, gib(std::stoll(f.value)), f.value);
      } else {
        out += fmt::format("  {}: {}\n", f.label, f.value);
      }
    }
    for (const auto& item : section.items) {
      std::string mxnet;
      for (const auto& name : item.mxnet)
        mxnet += (mxnet.empty() ? "" : ", ") + name;
      out += fmt::format("  {}{}: {}\n", item.name,
                         mxnet.empty() ? "" : fmt::format(" (MXNet: {})", mxnet), item.description);
    }
  }
  return out;
}

std::string infoJson(const std::vector<InfoSection>& sections) {
  std::string out = "{";
  for (std::size_t s = 0; s < sections.size(); ++s) {
    const auto& section = sections[s];
    out += fmt::format("{}\n  {}: ", s ? "," : "", jsonString(section.key));
    if (section.items.empty()) {
      out += "{";
      for (std::size_t i = 0; i < section.fields.size(); ++i) {
        const auto& f = section.fields[i];
        out += fmt::format("{}\n    {}: {}", i ? "," : "", jsonString(f.key),
                           f.number ? f.value : jsonString(f.value));
      }
      out += "\n  }";
    } else {
      out += "[";
      for (std::size_t i = 0; i < section.items.size(); ++i) {
        const auto& item = section.items[i];
        std::string mxnet;
        for (const auto& name : item.mxnet)
          mxnet += (mxnet.empty() ? "" : ", ") + jsonString(name);
        out +=
            fmt::format("{}\n    {{\"name\": {}, \"mxnet\": [{}], \"description\": {}}}",
                        i ? "," : "", jsonString(item.name), mxnet, jsonString(item.description));
      }
      out += "\n  ]";
    }
  }
  return out + "\n}\n";
}

}  // namespace troupe::apps
