// NCCL's communicator as a troupe Communicator (kernels/communicator.h). The communicators are
// non-blocking (NCCL's config.blocking = 0), so that joining the group and queueing a sum can be
// given up after a timeout and aborted: troupe never waits on NCCL without a deadline.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_event.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/nccl_communicator.h"

namespace troupe::kernels::cuda {
namespace {

std::string ncclMessage(ncclResult_t r, ncclComm_t comm) {
  std::string message = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') message += std::string(": ") + last;
  return message;
}

// ncclInProgress is a non-blocking communicator's "queued, going on": not a failure.
void checkNccl(ncclResult_t r, const char* call, ncclComm_t comm, const char* file, int line) {
  if (r != ncclSuccess && r != ncclInProgress) {
    throwCuda("NCCL", call, ncclMessage(r, comm), false, file, line);
  }
}
#define TROUPE_NCCL_CHECK(call, comm) checkNccl((call), #call, (comm), __FILE__, __LINE__)

// ncclGroupStart() ... ncclGroupEnd(): end() closes the group and checks it; a group left by an
// exception is closed all the same, as an open one would hold back this thread's later NCCL calls.
class Group {
 public:
  Group() { TROUPE_NCCL_CHECK(ncclGroupStart(), nullptr); }
  ~Group() {
    if (open_) ncclGroupEnd();  // after a failed call: its result adds nothing to that error
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  void end() {
    open_ = false;
    TROUPE_NCCL_CHECK(ncclGroupEnd(), nullptr);
  }

 private:
  bool open_ = true;
};

std::string toHex(const ncclUniqueId& id) {
  std::string hex;
  hex.reserve(2 * sizeof(id.internal));
  for (const char c : id.internal) {
    char byte[3];
    std::snprintf(byte, sizeof(byte), "%02x", static_cast<unsigned char>(c));
    hex += byte;
  }
  return hex;
}

ncclUniqueId fromHex(const std::string& hex) {
  ncclUniqueId id{};
  if (hex.size() != 2 * sizeof(id.internal)) {
    throw InputError("an NCCL group id of " + std::to_string(hex.size()) +
                     " characters, where NCCL's has " + std::to_string(2 * sizeof(id.internal)) +
                     ": the processes of the run are not all the same troupe");
  }
  if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw InputError(
        "an NCCL group id that is not lowercase hex digits: the processes of the run "
        "are not all the same troupe, or its store was written by another");
  }
  for (std::size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return id;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const CommunicatorSpec& spec)
      : devices_(spec.devices), ranks_(spec.ranks), timeout_(spec.timeout) {
    const ncclUniqueId id = fromHex(spec.id);
    const std::size_t n = devices_.size();
    comms_.assign(n, nullptr);
    streams_.assign(n, nullptr);
    for (std::size_t i = 0; i < n; ++i) {
      TROUPE_CUDA_CHECK(cudaSetDevice(devices_[i]));
      // The sums run at the device's highest priority, so that their kernels start as soon as a
      // bucket is ready, between the backward pass's kernels.
      int lowest = 0, highest = 0;
      TROUPE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
      TROUPE_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking, highest));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      {
        Group group;
        for (std::size_t i = 0; i < n; ++i) {
          TROUPE_CUDA_CHECK(cudaSetDevice(devices_[i]));
          TROUPE_NCCL_CHECK(ncclCommInitRankConfig(&comms_[i], spec.ranks, id,
                                                   spec.first_rank + static_cast<int>(i), &config),
                            comms_[i]);
        }
        group.end();
      }
      settle("to form (every rank joined)");
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCommunicator() override {
    if (!aborted_) finish();
    release();
  }

  Event allreduce(const std::vector<Tensor>& buffers, const std::vector<Event>& ready,
                  Event* began) override {
    TROUPE_ENFORCE(buffers.size() == devices_.size() && ready.size() == devices_.size(),
                   "an NCCL sum of ", buffers.size(), " buffer(s) on a group with ",
                   devices_.size(), " GPU(s) in this process");
    std::lock_guard lock(mutex_);
    if (aborted_) throw Error("NCCL: the group was aborted; it sums no more");
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const Tensor& b = buffers[i];
      TROUPE_ENFORCE(b.dtype() == DType::kFloat32 && b.numel() == buffers[0].numel() &&
                         b.device() == (Device{DeviceKind::kCuda, devices_[i]}),
                     "NCCL sums float32 buffers of one length, each on its GPU of the group");
      TROUPE_CUDA_CHECK(cudaSetDevice(devices_[i]));
      streamWaitFor(streams_[i], ready[i]);
    }
    if (began) {
      // devices[0]'s stream waits for the others' buffers too, so that the mark is the start of
      // the group's sums (NCCL's kernels wait for each other anyway).
      for (std::size_t i = 1; i < buffers.size(); ++i)
        streamWaitFor(streams_[0], ready[i]);
      TROUPE_CUDA_CHECK(cudaSetDevice(devices_[0]));
      *began = Event(std::make_shared<const CudaEvent>(devices_[0], streams_[0], /*timed=*/true));
    }
    {
      Group group;
      for (std::size_t i = 0; i < buffers.size(); ++i) {
        TROUPE_CUDA_CHECK(cudaSetDevice(devices_[i]));
        TROUPE_NCCL_CHECK(ncclAllReduce(buffers[i].raw(), buffers[i].raw(),
                                        static_cast<std::size_t>(buffers[i].numel()), ncclFloat32,
                                        ncclSum, comms_[i], streams_[i]),
                          comms_[i]);
      }
      group.end();
    }
    settleLocked("to queue a sum");
    // The event on devices[0] covers the sums of every GPU of this process: the replicas write
    // their buckets again only after it.
    for (std::size_t i = 1; i < buffers.size(); ++i) {
      TROUPE_CUDA_CHECK(cudaSetDevice(devices_[i]));
      const CudaEvent done(devices_[i], streams_[i]);
      TROUPE_CUDA_CHECK(cudaStreamWaitEvent(streams_[0], done.event(), 0));
    }
    TROUPE_CUDA_CHECK(cudaSetDevice(devices_[0]));
    return Event(std::make_shared<const CudaEvent>(devices_[0], streams_[0], began != nullptr));
  }

  Event mark() override {
    std::lock_guard lock(mutex_);
    if (aborted_) throw Error("NCCL: the group was aborted");
    TROUPE_CUDA_CHECK(cudaSetDevice(devices_[0]));
    return Event(std::make_shared<const CudaEvent>(devices_[0], streams_[0], /*timed=*/true));
  }

  double elapsed(const Event& from, const Event& to) override { return secondsBetween(from, to); }

  std::string error() override {
    std::lock_guard lock(error_mutex_);
    if (aborted_) return "";
    for (ncclComm_t comm : comms_) {
      ncclResult_t state = ncclSuccess;
      if (comm == nullptr) continue;
      if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        return "NCCL: " + ncclMessage(state, comm);
      }
    }
    return "";
  }

  bool failed() override { return aborted_ || !error().empty(); }

  void abort() override {
    aborted_ = true;  // first, so that a settle() in progress gives up and lets go of the mutex
    std::lock_guard lock(mutex_);
    release();
  }

 private:
  // Waits until every communicator of this process is done with what was asked of it (joining
  // the group, queueing a sum), up to the timeout; throws what went wrong, aborting the group.
  void settle(const char* what) {
    std::lock_guard lock(mutex_);
    settleLocked(what);
  }
  void settleLocked(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      if (aborted_) throw Error("NCCL: the group was aborted");
      bool pending = false;
      for (ncclComm_t comm : comms_) {
        ncclResult_t state = ncclSuccess;
        TROUPE_NCCL_CHECK(ncclCommGetAsyncError(comm, &state), comm);
        if (state == ncclInProgress) {
          pending = true;
        } else if (state != ncclSuccess) {
          const std::string message = ncclMessage(state, comm);
          release();
          throw Error("NCCL: the group of " + std::to_string(ranks_) + " GPU(s) failed " + what +
                      ": " + message);
        }
      }
      if (!pending) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        release();
        char seconds[32];
        std::snprintf(seconds, sizeof(seconds), "%g", static_cast<double>(timeout_.count()) / 1000);
        throw TimeoutError("NCCL: the group of " + std::to_string(ranks_) +
                           " GPU(s) took more than " + seconds + " s " + what +
                           ": a process of the run did not join, or is hung");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // At the end of a run: what this process queued is flushed to the peers (ncclCommFinalize)
  // before the communicators go, so that a peer still receiving the last sum gets all of it; what
  // does not finish within the timeout is aborted (release).
  void finish() {
    try {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < comms_.size(); ++i) {
        TROUPE_CUDA_CHECK(cudaSetDevice(devices_[i]));
        TROUPE_NCCL_CHECK(ncclCommFinalize(comms_[i]), comms_[i]);
      }
      settleLocked("to finish");
      std::lock_guard comms(error_mutex_);
      for (std::size_t i = 0; i < comms_.size(); ++i) {
        cudaSetDevice(devices_[i]);
        ncclCommDestroy(comms_[i]);
        comms_[i] = nullptr;
      }
    } catch (const std::exception&) {
      // A destructor throws nothing: release() aborts whatever is left.
    }
  }

  // Aborts the communicators (their queued and running work ends) and lets go of the streams.
  void release() {
    aborted_ = true;
    std::lock_guard lock(error_mutex_);
    for (std::size_t i = 0; i < comms_.size(); ++i) {
      if (comms_[i] != nullptr) {
        cudaSetDevice(devices_[i]);
        ncclCommAbort(comms_[i]);
        comms_[i] = nullptr;
      }
      if (streams_[i] != nullptr) {
        cudaStreamDestroy(streams_[i]);
        streams_[i] = nullptr;
      }
    }
  }

  const std::vector<int> devices_;
  const int ranks_;
  const std::chrono::milliseconds timeout_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::mutex mutex_;        // the NCCL calls of allreduce and abort
  std::mutex error_mutex_;  // comms_ between error() and release()
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::string ncclId() {
  ncclUniqueId id{};
  TROUPE_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return toHex(id);
}

std::unique_ptr<Communicator> makeCommunicator(const CommunicatorSpec& spec) {
  return std::make_unique<NcclCommunicator>(spec);
}

}  // namespace troupe::kernels::cuda
