// One rank's part in ring allreduces (sums) of gradient buckets, apart from any transport.
//
// A bucket is cut into segments of at most `segment_elements`; each segment runs its own ring:
// N-1 reduce-scatter rounds, then N-1 all-gather rounds, each message carrying 1/N of the segment
// to the next rank. Segments of one bucket, and different buckets, are in flight at once, so the
// links stay busy (pipelining). Every rank ends with bitwise the same sums: each chunk is reduced
// once, along the ring, and then copied.
// Chunks may arrive before their bucket was started here (a faster neighbour); they wait.
// With gradient compression (kernels/compression.h) every chunk travels encoded: a rank encodes
// what it sends in the reduce-scatter (its partial sum; 2bit keeps a residual per element, and
// each element is sent at most once per step by a rank), the owner of a finished chunk encodes it
// once, adopts the decoded values itself and passes the same bytes around the all-gather, so
// every rank still ends with bitwise the same values.
// Modes, for hierarchical reduction (actors/roles/hierarchical_allreduce.h): kReduceScatter stops
// when this rank holds the finished sum of its own chunk of each segment (chunk (rank + 1) % N) and
// leaves the rest of the bucket partial; kAllGather starts from those finished chunks and only
// passes them around. Compressed, kReduceScatter sends its partial sums encoded and keeps its
// finished chunk as it would have passed it around (encoded once and decoded); kAllGather takes no
// compression.
// Shards (ZeRO: each rank owns the optimizer's state of one contiguous range of the flat
// parameters, actors/roles/roles.h ReducerConfig::shards): a segment's chunks are cut at the
// shards' bounds instead of evenly, chunk c being the segment's part of rank (c - 1) mod N's shard,
// so that kReduceScatter finishes each rank's sums of its own shard, and kAllGather passes each
// rank's shard around. A chunk may then be empty (a bucket within one shard); it still travels, so
// that every rank counts the same messages. Thread safety: one thread at a time (the reducer
// actor's).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "actors/core/messages.h"
#include "kernels/compression.h"
#include "kernels/tensor.h"

namespace troupe::actors {

class RingAllreduce {
 public:
  using SendFn = std::function<void(RingChunk chunk)>;  // to the next rank, (rank + 1) % world
  using DoneFn = std::function<void(std::int64_t step, std::int64_t begin, std::int64_t end)>;

  enum class Mode : std::uint8_t { kAllreduce, kReduceScatter, kAllGather };
  // Per rank, the elements [begin, end) of the flat parameters it owns; contiguous, in rank order,
  // covering every bucket. Empty: chunks are even parts of each segment.
  using Shards = std::vector<std::pair<std::int64_t, std::int64_t>>;

  RingAllreduce(int rank, int world, std::int64_t segment_elements, SendFn send, DoneFn done,
                kernels::CompressionSpec compression = {}, Mode mode = Mode::kAllreduce,
                std::uint8_t ring = 0, Shards shards = {});

  // The elements [lo, hi) of a bucket of n that this rank finishes in kReduceScatter (and starts
  // from in kAllGather), when segment_elements >= n (one segment).
  std::pair<std::int64_t, std::int64_t> ownedRange(std::int64_t n) const;

  // The local sum of bucket [begin, begin + values.numel()) of `step` is ready in `values`; the
  // result is written back into `values`, which must stay alive until done() is called for it.
  void start(std::int64_t step, std::int64_t begin, const kernels::Tensor& values);
  // A chunk from the previous rank.
  void receive(RingChunk chunk);
  // Buckets started here and not done yet.
  std::size_t pending() const { return buckets_.size(); }
  // The segments a bucket is cut into: segment_elements, at least one per rank.
  std::int64_t segmentElements() const { return segment_elements_; }

 private:
  struct Bucket {
    std::int64_t begin = 0;  // its first element's index in the flat parameters
    kernels::Tensor values;
    bool started = false;
    std::int32_t segments = 0;
    std::vector<std::int32_t> gathered;  // all-gather chunks received (or own final), per segment
    std::int32_t done_segments = 0;
    std::vector<RingChunk> early;  // received before start()
  };
  using Key = std::tuple<std::int64_t, std::int64_t>;

  void handle(Bucket& b, RingChunk& chunk);
  // Sends `data`, or, when undefined, the chunk's values (encoded when compressing).
  void sendChunk(const Bucket& b, std::int64_t step, std::int64_t begin, std::int32_t segment,
                 std::int32_t chunk, std::int32_t round, RingChunk::Phase phase,
                 kernels::Tensor data = {});
  // The chunk's values as they travel: a view, or encoded with this rank's residual.
  kernels::Tensor encoded(const Bucket& b, std::int64_t begin, std::int64_t lo, std::int64_t hi);
  std::pair<std::int64_t, std::int64_t> chunkRange(const Bucket& b, std::int32_t segment,
                                                   std::int32_t chunk) const;
  void segmentGathered(Bucket& b, std::int64_t step, std::int64_t begin, std::int32_t segment);

  int rank_, world_;
  std::int64_t segment_elements_;
  SendFn send_;
  DoneFn done_;
  kernels::CompressionSpec compression_;
  Mode mode_;
  std::uint8_t ring_;
  Shards shards_;
  std::vector<float> residual_;  // 2bit: per element of the flat gradient
  std::map<Key, Bucket> buckets_;
};

}  // namespace troupe::actors
