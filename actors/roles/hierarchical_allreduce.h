// One rank's part in hierarchical allreduces (sums) of gradient buckets, as NCCL does across
// nodes: with L processes on each of H hosts, a bucket is
//  1. reduce-scattered among the L processes of the host (ring 0; one segment, so that local
//     process l ends with the host's sum of one contiguous slice, RingAllreduce::ownedRange);
//  2. allreduced, slice by slice, among the H processes of local index l, one per host (ring 1;
//     segmented and pipelined, compressed if asked: the only traffic between hosts, 2(H-1)/H of
//     a slice per process instead of 2(N-1)/N of the bucket);
//  3. all-gathered among the L processes of the host (ring 2).
// Every rank ends with bitwise the same sums: each slice is finished by one ring across hosts and
// then copied. The sums differ from a flat ring's only by the order of additions (float
// rounding: within gamma_N * sum |x| of the exact sum, as a flat ring is).
// Sends carry chunk.ring: 0 and 2 go to the next process of this host, 1 to the process of the
// same local index on the next host. Thread safety: one thread at a time (the reducer's).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "actors/roles/ring_allreduce.h"

namespace troupe::actors {

class HierarchicalAllreduce {
 public:
  using SendFn = RingAllreduce::SendFn;
  using DoneFn = RingAllreduce::DoneFn;

  HierarchicalAllreduce(int local_rank, int local_world, int host, int hosts,
                        std::int64_t segment_elements, SendFn send, DoneFn done,
                        kernels::CompressionSpec compression = {});
  // Its rings call back into it: it stays where it was made.
  HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
  HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

  // As RingAllreduce::start and receive.
  void start(std::int64_t step, std::int64_t begin, const kernels::Tensor& values);
  void receive(RingChunk chunk);
  std::size_t pending() const { return buckets_.size(); }
  // Which ring a started, unfinished bucket waits in (0, 1 or 2; see the header); -1 if none.
  int ringOf(std::int64_t step, std::int64_t begin) const;
  // The first element of the started, unfinished bucket of `step` that holds element `offset`
  // (a ring-1 chunk names its slice's start, RingChunk::bucket). Throws (TROUPE_ENFORCE) if none.
  std::int64_t bucketHolding(std::int64_t step, std::int64_t offset) const;

 private:
  void scattered(std::int64_t step, std::int64_t begin);
  void reducedAcross(std::int64_t step, std::int64_t slice_begin);

  DoneFn done_;
  RingAllreduce in_host_, across_, gather_;
  struct Bucket {
    kernels::Tensor values;
    int ring = 0;
  };
  std::map<std::tuple<std::int64_t, std::int64_t>, Bucket> buckets_;  // started here
};

}  // namespace troupe::actors
