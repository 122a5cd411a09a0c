// The emulated NCCL (emulated_nccl.h). Its segment, /dev/shm/troupe-emulated-nccl-ID, holds a
// header and one slot of kSlot floats per rank. A sum goes in rounds of up to kSlot floats: each
// rank copies its part into its slot and says so (arrived = 2r - 1), waits for every rank, adds
// the slots in rank order into its buffers, says so again (2r), and waits for every rank to have
// read the slots before the next round writes them. The work runs on a stream of the
// communicator's own, after the buckets' events, as NCCL's runs on a stream of its own.
#include "emulated_nccl.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "stream.h"
#include "troupe/error.h"

namespace troupe::kernels::emulated {
namespace {

constexpr std::int64_t kSlot = std::int64_t{1} << 18;  // floats per rank and round (1 MiB)
constexpr int kMaxRanks = 64;

struct Header {
  std::atomic<std::int32_t> joined;
  std::atomic<std::uint64_t> arrived[kMaxRanks];
  std::atomic<std::int32_t> pids[kMaxRanks];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
constexpr std::size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;

std::string segmentName(const std::string& id) {
  return "/troupe-emulated-nccl-" + id;
}

class EmulatedCommunicator final : public Communicator {
 public:
  explicit EmulatedCommunicator(const CommunicatorSpec& spec)
      : ranks_(spec.ranks), first_(spec.first_rank), local_(static_cast<int>(spec.devices.size())) {
    if (ranks_ > kMaxRanks) {
      throw InputError("the emulated NCCL takes up to " + std::to_string(kMaxRanks) + " ranks");
    }
    const std::string name = segmentName(spec.id);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) throw IoError("emulated NCCL: shm_open " + name + ": " + std::strerror(errno));
    bytes_ = kHeaderBytes + static_cast<std::size_t>(ranks_ * kSlot) * sizeof(float);
    const bool sized = ::ftruncate(fd, static_cast<off_t>(bytes_)) == 0;
    void* p =
        sized ? ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    ::close(fd);
    if (p == MAP_FAILED) throw IoError("emulated NCCL: mapping " + name + " failed");
    base_ = static_cast<char*>(p);
    header_ = reinterpret_cast<Header*>(base_);  // zeros from ftruncate: atomics at 0
    for (int i = 0; i < local_; ++i) {
      // As NCCL, a rank claimed twice is an error, not a group that waits for the rank missing.
      std::int32_t before = 0;
      if (!header_->pids[first_ + i].compare_exchange_strong(
              before, static_cast<std::int32_t>(::getpid()))) {
        ::munmap(base_, bytes_);
        throw InputError("NCCL (emulated): rank " + std::to_string(first_ + i) +
                         " of the group joined twice (pids " + std::to_string(before) + " and " +
                         std::to_string(::getpid()) + ")");
      }
    }
    header_->joined.fetch_add(local_);
    const auto deadline = std::chrono::steady_clock::now() + spec.timeout;
    while (header_->joined.load() < ranks_) {
      if (std::chrono::steady_clock::now() >= deadline) {
        const int joined = header_->joined.load();
        ::munmap(base_, bytes_);
        ::shm_unlink(name.c_str());
        throw TimeoutError("NCCL (emulated): the group of " + std::to_string(ranks_) +
                           " GPU(s) did not form within the timeout: " + std::to_string(joined) +
                           " joined");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Every rank has it open: the name can go.
    if (first_ == 0) ::shm_unlink(name.c_str());
  }

  ~EmulatedCommunicator() override {
    aborted_ = true;
    stream_.reset();  // its work ends at the abort
    ::munmap(base_, bytes_);
  }

  Event allreduce(const std::vector<Tensor>& buffers, const std::vector<Event>& ready,
                  Event* began) override {
    TROUPE_ENFORCE(
        static_cast<int>(buffers.size()) == local_ && static_cast<int>(ready.size()) == local_,
        "an NCCL sum of ", buffers.size(), " buffer(s) on a group with ", local_,
        " GPU(s) in this process");
    if (aborted_) throw Error("NCCL (emulated): the group was aborted; it sums no more");
    std::vector<Tensor> views;
    for (const auto& b : buffers) {
      TROUPE_ENFORCE(b.dtype() == DType::kFloat32 && b.numel() == buffers[0].numel(),
                     "NCCL sums float32 buffers of one length");
      views.push_back(hostView(b));
    }
    auto start = std::make_shared<StreamEvent>();
    if (began) *began = Event(start);
    std::vector<std::function<void()>> waits;  // for each event's record as it stands now
    for (const auto& e : ready)
      waits.push_back(waitAsQueued(e));
    stream_->enqueue([this, views, waits, start] {
      for (const auto& wait : waits)
        wait();
      start->fire();
      sum(views);
    });
    return mark();
  }

  Event mark() override {
    auto done = std::make_shared<StreamEvent>();
    stream_->enqueue([done] { done->fire(); });
    return Event(done);
  }

  double elapsed(const Event& from, const Event& to) override { return secondsBetween(from, to); }

  std::string error() override {
    std::lock_guard lock(mutex_);
    return error_;
  }

  bool failed() override { return aborted_ || !error().empty(); }

  void abort() override { aborted_ = true; }

 private:
  float* slot(int rank) const {
    return reinterpret_cast<float*>(base_ + kHeaderBytes) + rank * kSlot;
  }

  void sum(const std::vector<Tensor>& buffers) {
    const std::int64_t n = buffers[0].numel();
    for (std::int64_t begin = 0; begin < n; begin += kSlot) {
      const std::int64_t count = std::min(kSlot, n - begin);
      ++round_;
      for (int i = 0; i < local_; ++i) {
        std::memcpy(slot(first_ + i), buffers[static_cast<std::size_t>(i)].f32() + begin,
                    static_cast<std::size_t>(count) * sizeof(float));
        header_->arrived[first_ + i].store(2 * round_ - 1, std::memory_order_release);
      }
      waitForAll(2 * round_ - 1);
      float* out = buffers[0].f32() + begin;
      std::memcpy(out, slot(0), static_cast<std::size_t>(count) * sizeof(float));
      for (int r = 1; r < ranks_; ++r) {
        const float* in = slot(r);
        for (std::int64_t j = 0; j < count; ++j)
          out[j] += in[j];
      }
      for (int i = 1; i < local_; ++i) {
        std::memcpy(buffers[static_cast<std::size_t>(i)].f32() + begin, out,
                    static_cast<std::size_t>(count) * sizeof(float));
      }
      for (int i = 0; i < local_; ++i)
        header_->arrived[first_ + i].store(2 * round_, std::memory_order_release);
      waitForAll(2 * round_);
    }
  }

  // Until every rank has reached `mark`; throws at an abort, or when a rank's process is gone
  // (as NCCL reports a peer's closed connection: ncclRemoteError).
  void waitForAll(std::uint64_t mark) {
    auto checked = std::chrono::steady_clock::now();
    for (int r = 0; r < ranks_; ++r) {
      while (header_->arrived[r].load(std::memory_order_acquire) < mark) {
        if (aborted_) throw Error("NCCL (emulated): aborted");
        if (std::chrono::steady_clock::now() - checked > std::chrono::milliseconds(100)) {
          checked = std::chrono::steady_clock::now();
          const int pid = header_->pids[r].load();
          if (::kill(pid, 0) != 0 && errno == ESRCH) {
            std::lock_guard lock(mutex_);
            error_ = "NCCL (emulated): remote process exited: rank " + std::to_string(r) +
                     " (pid " + std::to_string(pid) + ") is gone";
            throw Error(error_);
          }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  const int ranks_, first_, local_;
  std::size_t bytes_ = 0;
  char* base_ = nullptr;
  Header* header_ = nullptr;
  std::uint64_t round_ = 0;  // on the stream's thread only
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::string error_;
  std::unique_ptr<Stream> stream_ = std::make_unique<Stream>();
};

}  // namespace

std::string ncclId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char word[9];
    std::snprintf(word, sizeof(word), "%08x", random());
    id += word;
  }
  return id;
}

std::unique_ptr<Communicator> makeCommunicator(const CommunicatorSpec& spec) {
  return std::make_unique<EmulatedCommunicator>(spec);
}

}  // namespace troupe::kernels::emulated
