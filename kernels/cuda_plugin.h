// The CUDA backend as a plugin: libtroupe_cuda.so (kernels/cuda/), built wherever CMake finds the
// CUDA toolkit with cuDNN and NCCL, and loaded on first use. troupe itself links no CUDA library,
// so the same binaries run on machines without a GPU or without the CUDA libraries, and report
// why they cannot use one (`troupe info`).
//
//   const auto& info = kernels::cudaInfo();          // versions, devices, or the problem
//   auto backend = kernels::makeCudaBackend(0, {});  // cuda:0, or InputError saying why not
//
// The plugin is looked for in $TROUPE_CUDA_LIBRARY, then beside the running binary and in its
// ../lib, then on the loader's path (LD_LIBRARY_PATH, rpath).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/communicator.h"

namespace troupe::kernels {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  std::int64_t memory = 0;   // bytes
  int multiprocessors = 0;
};

// Versions as the libraries report them at run time (the ones actually loaded), 0 when unknown.
struct CudaInfo {
  bool loaded = false;        // the plugin was found and loaded
  std::string library;        // its path
  std::string problem;        // why there is no plugin or no device; empty when devices were found
  int runtime = 0;            // cudaRuntimeGetVersion: 13000 is 13.0
  int driver = 0;             // cudaDriverGetVersion; 0: no driver
  std::int64_t cudnn = 0;     // cudnnGetVersion: 91900 is 9.19.0
  int cublas = 0;             // cublasGetVersion: 130000 is 13.0.0
  int nccl = 0;               // ncclGetVersion: 22804 is 2.28.4
  std::string architectures;  // the GPU code built in, e.g. "sm_90"
  std::vector<CudaDeviceInfo> devices;
};

struct CudaOptions {
  // TensorFloat-32 in convolutions and matrix products (faster, 10-bit mantissa products). Off:
  // fp32 ops compute in IEEE fp32, as the CPU backend does.
  bool tf32 = false;
  // Convolutions only with cuDNN's deterministic algorithms, so that a run repeats to the bit
  // (PyTorch's torch.backends.cudnn.deterministic); off, the fastest measured, as cudnn.benchmark.
  bool deterministic = false;
};

// What the plugin knows, loading it on the first call (thread-safe; never throws).
const CudaInfo& cudaInfo();

// A backend on GPU `index`: throws InputError naming what is missing (the plugin, a driver, the
// device) when there is none.
std::unique_ptr<Backend> makeCudaBackend(int index, const CudaOptions& options = {});

// A backend on `device`: makeCpuBackend(threads) or makeCudaBackend(device.index).
std::unique_ptr<Backend> makeBackend(Device device, int threads, const CudaOptions& options = {});

// Host memory, zero-filled, that the GPUs copy to and from asynchronously (pinned: what
// Backend::hostBuffer gives on a GPU), for whoever stages data for a device without a backend of
// its own (a reader); plain host memory where there is no CUDA device. Slow to allocate: keep it.
// `device`: the GPU whose copies will read it, made the calling thread's current device first (a
// reader's thread then makes no context on GPU 0); -1: the thread's current one.
Tensor pinnedHostBuffer(Shape shape, DType dtype = DType::kFloat32, int device = -1);

// The plugin's side: libtroupe_cuda.so exports troupe_cuda_plugin(), returning this table.
struct CudaPlugin {
  // Bumped whenever this struct, Backend, Communicator or Tensor changes.
  static constexpr int kAbi = 16;
  int abi = kAbi;
  CudaInfo (*info)() = nullptr;
  std::unique_ptr<Backend> (*make)(int index, const CudaOptions& options) = nullptr;
  Tensor (*host_buffer)(Shape shape, DType dtype, int device) = nullptr;
  std::string (*nccl_id)() = nullptr;
  std::unique_ptr<Communicator> (*communicator)(const CommunicatorSpec& spec) = nullptr;
  // Tensors cross the boundary by value: a plugin built against another Tensor is refused even
  // where the ABI number was not bumped.
  std::size_t tensor_size = sizeof(Tensor);
};

}  // namespace troupe::kernels

// Exports troupe_cuda_plugin() from a plugin whose namespace NS defines describe, make, pinnedFor,
// ncclId and makeCommunicator (the table's functions, in its order).
#define TROUPE_CUDA_PLUGIN(NS)                                                         \
  extern "C" __attribute__((visibility("default"))) const troupe::kernels::CudaPlugin* \
  troupe_cuda_plugin() {                                                               \
    static const troupe::kernels::CudaPlugin plugin{troupe::kernels::CudaPlugin::kAbi, \
                                                    &NS::describe,                     \
                                                    &NS::make,                         \
                                                    &NS::pinnedFor,                    \
                                                    &NS::ncclId,                       \
                                                    &NS::makeCommunicator};            \
    return &plugin;                                                                    \
  }
