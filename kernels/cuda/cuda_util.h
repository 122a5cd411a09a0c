// Error checks of the CUDA plugin: a failed CUDA, cuDNN, cuBLAS or NCCL call throws a troupe error
// naming the call, the library's message, and where (out of memory is a ResourceError).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "troupe/error.h"

namespace troupe::kernels::cuda {

[[noreturn]] void throwCuda(const std::string& library, const std::string& call,
                            const std::string& message, bool out_of_memory, const char* file,
                            int line);

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) {
    throwCuda("CUDA", call, cudaGetErrorString(e), e == cudaErrorMemoryAllocation, file, line);
  }
}
inline void check(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS) {
    // Out of memory: on the host (ALLOC_FAILED is its old name) or on the device.
    const bool out_of_memory = s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                               s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
    throwCuda("cuDNN", call, cudnnGetErrorString(s), out_of_memory, file, line);
  }
}
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throwCuda("cuBLAS", call, cublasGetStatusString(s), s == CUBLAS_STATUS_ALLOC_FAILED, file,
              line);
  }
}

}  // namespace troupe::kernels::cuda

#define TROUPE_CUDA_CHECK(call) ::troupe::kernels::cuda::check((call), #call, __FILE__, __LINE__)
