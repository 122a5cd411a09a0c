#include "actors/roles/hierarchical_allreduce.h"

#include "troupe/error.h"

namespace troupe::actors {
namespace {
// The host's rings run one segment a bucket (see the header).
constexpr std::int64_t kWholeBucket = std::int64_t{1} << 62;
}  // namespace

HierarchicalAllreduce::HierarchicalAllreduce(int local_rank, int local_world, int host, int hosts,
                                             std::int64_t segment_elements, SendFn send,
                                             DoneFn done, kernels::CompressionSpec compression)
    : done_(std::move(done)),
      in_host_(
          local_rank, local_world, kWholeBucket, send,
          [this](std::int64_t step, std::int64_t begin, std::int64_t) { scattered(step, begin); },
          {}, RingAllreduce::Mode::kReduceScatter, 0),
      across_(
          host, hosts, segment_elements, send,
          [this](std::int64_t step, std::int64_t begin, std::int64_t) {
            reducedAcross(step, begin);
          },
          compression, RingAllreduce::Mode::kAllreduce, 1),
      gather_(
          local_rank, local_world, kWholeBucket, send,
          [this](std::int64_t step, std::int64_t begin, std::int64_t end) {
            buckets_.erase({step, begin});
            done_(step, begin, end);
          },
          {}, RingAllreduce::Mode::kAllGather, 2) {}

void HierarchicalAllreduce::start(std::int64_t step, std::int64_t begin,
                                  const kernels::Tensor& values) {
  TROUPE_ENFORCE(buckets_.emplace(std::make_tuple(step, begin), Bucket{values, 0}).second,
                 "bucket ", begin, " of step ", step, " started twice");
  in_host_.start(step, begin, values);
}

void HierarchicalAllreduce::receive(RingChunk chunk) {
  switch (chunk.ring) {
    case 0:
      in_host_.receive(std::move(chunk));
      return;
    case 1:
      across_.receive(std::move(chunk));
      return;
    case 2:
      gather_.receive(std::move(chunk));
      return;
  }
  throw InputError("a ring chunk of ring " + std::to_string(chunk.ring) +
                   "; hierarchical reduction has rings 0, 1 and 2");
}

void HierarchicalAllreduce::scattered(std::int64_t step, std::int64_t begin) {
  auto& b = buckets_.at({step, begin});
  b.ring = 1;
  const auto [lo, hi] = in_host_.ownedRange(b.values.numel());
  across_.start(step, begin + lo, b.values.slice(lo, hi));
}

std::int64_t HierarchicalAllreduce::bucketHolding(std::int64_t step, std::int64_t offset) const {
  // The last bucket of this step starting at or before it.
  auto it = buckets_.upper_bound({step, offset});
  TROUPE_ENFORCE(it != buckets_.begin() && std::get<0>(std::prev(it)->first) == step,
                 "no bucket of step ", step, " holds element ", offset);
  return std::get<1>(std::prev(it)->first);
}

void HierarchicalAllreduce::reducedAcross(std::int64_t step, std::int64_t slice_begin) {
  const std::int64_t begin = bucketHolding(step, slice_begin);
  auto& b = buckets_.at({step, begin});
  b.ring = 2;
  gather_.start(step, begin, b.values);
}

int HierarchicalAllreduce::ringOf(std::int64_t step, std::int64_t begin) const {
  const auto it = buckets_.find({step, begin});
  return it == buckets_.end() ? -1 : it->second.ring;
}

}  // namespace troupe::actors
