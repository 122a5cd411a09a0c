// Events of the CUDA plugin (kernels/event.h): a CUDA event recorded on a stream, and how a stream
// waits for any Event.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_util.h"
#include "kernels/event.h"

namespace troupe::kernels::cuda {

// A CUDA event recorded on a stream of `device`, destroyed with its last handle. `in_graph`: the
// stream is being captured, and each replay of the graph records it at this point (an external
// event node); not to be asked before the first replay.
class CudaEvent final : public EventImpl {
 public:
  CudaEvent(int device, cudaStream_t stream, bool timed = false, bool in_graph = false)
      : device_(device) {
    TROUPE_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timed ? cudaEventDefault : cudaEventDisableTiming));
    if (in_graph) {
      TROUPE_CUDA_CHECK(cudaEventRecordWithFlags(event_, stream, cudaEventRecordExternal));
    } else {
      TROUPE_CUDA_CHECK(cudaEventRecord(event_, stream));
    }
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }

  bool done() const override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) {
      // Not an error, but CUDA keeps it as the thread's last one: cleared, or the next check of
      // cudaGetLastError() (synchronize(), a kernel's launch) would throw "device not ready".
      (void)cudaGetLastError();
      return false;
    }
    TROUPE_CUDA_CHECK(e);
    return true;
  }
  void wait() const override { TROUPE_CUDA_CHECK(cudaEventSynchronize(event_)); }
  cudaEvent_t event() const { return event_; }
  int device() const { return device_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

// Work queued on `stream` from now on starts once `e` is done: on the device for a CUDA event
// (of any device of the process), else by waiting on the host. Returns at once for a CUDA event.
inline void streamWaitFor(cudaStream_t stream, const Event& e) {
  if (e.done()) return;
  if (const auto* cuda_event = dynamic_cast<const CudaEvent*>(e.impl())) {
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(stream, cuda_event->event(), 0));
  } else {
    e.wait();
  }
}

// Seconds from `from` to `to`, two done timed CudaEvents of one device.
inline double secondsBetween(const Event& from, const Event& to) {
  const auto* a = dynamic_cast<const CudaEvent*>(from.impl());
  const auto* b = dynamic_cast<const CudaEvent*>(to.impl());
  TROUPE_ENFORCE(a != nullptr && b != nullptr, "elapsed() between events of another kind");
  float ms = 0;
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&ms, a->event(), b->event()));
  return ms / 1000.0;
}

}  // namespace troupe::kernels::cuda
