// Finds and loads libtroupe_cuda.so (kernels/cuda_plugin.h).
#include "kernels/cuda_plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "troupe/error.h"

namespace troupe::kernels {
namespace {

constexpr const char* kLibrary = "libtroupe_cuda.so";

struct Loaded {
  const CudaPlugin* plugin = nullptr;
  CudaInfo info;
};

// The folder of the running binary (for a test or the CLI: build/tests, build/bin, /usr/bin).
std::filesystem::path binaryFolder() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

// Where to look, in order; a name without a slash goes to the loader's search path.
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TROUPE_CUDA_LIBRARY"); env && *env) {
    out.emplace_back(env);
    return out;
  }
  const auto folder = binaryFolder();
  if (!folder.empty()) {
    for (const auto& p : {folder / kLibrary, folder / ".." / "lib" / kLibrary}) {
      std::error_code ec;
      if (std::filesystem::exists(p, ec)) out.push_back(p.lexically_normal().string());
    }
  }
  out.emplace_back(kLibrary);
  return out;
}

Loaded load() {
  Loaded l;
  std::string tried;  // each candidate that failed, and why
  auto failed = [&](const std::string& path, const std::string& why) {
    tried += (tried.empty() ? "" : "; ") + path + ": " + why;
  };
  const auto paths = candidates();
  for (const auto& path : paths) {
    // Never closed: backends and their tensors may live until exit.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      failed(path, why ? why : "not loadable");
      continue;
    }
    using Entry = const CudaPlugin* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "troupe_cuda_plugin"));
    if (!entry) {
      failed(path, "no troupe_cuda_plugin symbol");
      continue;
    }
    const CudaPlugin* plugin = entry();
    if (!plugin || plugin->abi != CudaPlugin::kAbi || plugin->tensor_size != sizeof(Tensor)) {
      failed(path, "from another troupe build (plugin ABI " +
                       std::to_string(plugin ? plugin->abi : -1) + ", this build's " +
                       std::to_string(CudaPlugin::kAbi) + ")");
      continue;
    }
    l.plugin = plugin;
    try {
      l.info = plugin->info();
    } catch (const std::exception& e) {
      l.info.problem = e.what();
    }
    l.info.loaded = true;
    l.info.library = path;
    return l;
  }
  const auto folder = binaryFolder();
  const char* named = std::getenv("TROUPE_CUDA_LIBRARY");
  const bool beside = paths.size() > 1;  // one was found beside the binary (candidates())
  if (!beside && !(named && *named)) {
    // An install (cmake --install, the Debian package) leaves the plugin out unless asked: it
    // needs CUDA, cuDNN and NCCL, which Debian does not have.
    l.info.problem = "the CUDA backend (" + std::string(kLibrary) +
                     ") is not installed beside this troupe (" +
                     (folder / ".." / "lib").lexically_normal().string() +
                     "): install it from a build with `cmake --install BUILD --component cuda`, or "
                     "name it in TROUPE_CUDA_LIBRARY (" +
                     tried + ")";
    return l;
  }
  l.info.problem = "the CUDA backend (" + std::string(kLibrary) + ") is not loadable: " + tried;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

// The plugin, with at least one device, for what `what` needs; else InputError saying why not.
const CudaPlugin& pluginWithDevices(const std::string& what) {
  const Loaded& l = loaded();
  if (!l.plugin) throw InputError(what + ": " + l.info.problem);
  if (l.info.devices.empty()) throw InputError(what + ": no CUDA device: " + l.info.problem);
  return *l.plugin;
}

}  // namespace

const CudaInfo& cudaInfo() {
  return loaded().info;
}

std::unique_ptr<Backend> makeCudaBackend(int index, const CudaOptions& options) {
  const CudaPlugin& plugin = pluginWithDevices("cuda:" + std::to_string(index));
  const auto& devices = loaded().info.devices;
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    throw InputError("cuda:" + std::to_string(index) + ": this machine has " +
                     std::to_string(devices.size()) + " CUDA device(s)");
  }
  return plugin.make(index, options);
}

Tensor pinnedHostBuffer(Shape shape, DType dtype, int device) {
  const Loaded& l = loaded();
  if (!l.plugin || l.info.devices.empty()) return Tensor::host(std::move(shape), dtype);
  return l.plugin->host_buffer(std::move(shape), dtype, device);
}

std::string newNcclGroupId() {
  return pluginWithDevices("NCCL").nccl_id();
}

std::unique_ptr<Communicator> makeNcclCommunicator(const CommunicatorSpec& spec) {
  const CudaPlugin& plugin = pluginWithDevices("NCCL");
  const auto& devices = loaded().info.devices;
  TROUPE_ENFORCE(!spec.devices.empty() && spec.ranks >= 1 && spec.first_rank >= 0 &&
                     spec.first_rank + static_cast<int>(spec.devices.size()) <= spec.ranks,
                 "an NCCL group of ", spec.ranks, " rank(s) with ", spec.devices.size(),
                 " from rank ", spec.first_rank);
  for (const int d : spec.devices) {
    if (d < 0 || d >= static_cast<int>(devices.size())) {
      throw InputError("NCCL: there is no cuda:" + std::to_string(d) + ": this machine has " +
                       std::to_string(devices.size()) + " CUDA device(s)");
    }
  }
  return plugin.communicator(spec);
}

std::unique_ptr<Backend> makeBackend(Device device, int threads, const CudaOptions& options) {
  if (device.kind == DeviceKind::kCuda) return makeCudaBackend(device.index, options);
  return makeCpuBackend(threads);
}

}  // namespace troupe::kernels
