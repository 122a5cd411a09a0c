#include "actors/roles/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "troupe/error.h"

namespace troupe::actors {

RingAllreduce::RingAllreduce(int rank, int world, std::int64_t segment_elements, SendFn send,
                             DoneFn done, kernels::CompressionSpec compression, Mode mode,
                             std::uint8_t ring, Shards shards)
    : rank_(rank),
      world_(world),
      segment_elements_(std::max<std::int64_t>(segment_elements, world)),
      send_(std::move(send)),
      done_(std::move(done)),
      compression_(compression),
      mode_(mode),
      ring_(ring),
      shards_(std::move(shards)) {
  TROUPE_ENFORCE(0 <= rank && rank < world, "rank ", rank, " of ", world);
  TROUPE_ENFORCE(shards_.empty() || static_cast<int>(shards_.size()) == world, shards_.size(),
                 " shards for a world of ", world);
  TROUPE_ENFORCE(
      mode != Mode::kAllGather || compression.type == kernels::GradientCompression::kNone,
      "compression is for sums: an all-gather passes finished values around as they are");
}

std::pair<std::int64_t, std::int64_t> RingAllreduce::chunkRange(const Bucket& b,
                                                                std::int32_t segment,
                                                                std::int32_t chunk) const {
  const std::int64_t n = b.values.numel();
  const std::int64_t seg_begin = segment * segment_elements_;
  const std::int64_t seg_len = std::min(segment_elements_, n - seg_begin);
  if (shards_.empty())
    return {seg_begin + seg_len * chunk / world_, seg_begin + seg_len * (chunk + 1) / world_};
  // The segment's part of the shard of rank (chunk - 1) mod N, which finishes this chunk.
  const auto& [lo, hi] = shards_[static_cast<std::size_t>((chunk + world_ - 1) % world_)];
  const std::int64_t first = std::clamp(lo - b.begin, seg_begin, seg_begin + seg_len);
  return {first, std::clamp(hi - b.begin, first, seg_begin + seg_len)};
}

kernels::Tensor RingAllreduce::encoded(const Bucket& b, std::int64_t begin, std::int64_t lo,
                                       std::int64_t hi) {
  if (compression_.type == kernels::GradientCompression::kNone) return b.values.slice(lo, hi);
  float* residual = nullptr;
  if (compression_.type == kernels::GradientCompression::k2Bit) {
    const auto end = static_cast<std::size_t>(begin + hi);
    if (residual_.size() < end) residual_.resize(end, 0.0f);
    residual = residual_.data() + begin + lo;
  }
  return kernels::encode(compression_, b.values.f32() + lo, residual, hi - lo);
}

void RingAllreduce::sendChunk(const Bucket& b, std::int64_t step, std::int64_t begin,
                              std::int32_t segment, std::int32_t chunk, std::int32_t round,
                              RingChunk::Phase phase, kernels::Tensor data) {
  const auto [lo, hi] = chunkRange(b, segment, chunk);
  RingChunk c;
  c.step = step;
  c.bucket = begin;
  c.bucket_size = b.values.numel();
  c.offset = begin + lo;
  c.segment = segment;
  c.chunk = chunk;
  c.round = round;
  c.phase = phase;
  c.ring = ring_;
  c.data = data.raw() != nullptr ? std::move(data) : encoded(b, begin, lo, hi);
  send_(std::move(c));
}

std::pair<std::int64_t, std::int64_t> RingAllreduce::ownedRange(std::int64_t n) const {
  const std::int64_t chunk = (rank_ + 1) % world_;
  return {n * chunk / world_, n * (chunk + 1) / world_};
}

void RingAllreduce::start(std::int64_t step, std::int64_t begin, const kernels::Tensor& values) {
  if (world_ == 1) {
    done_(step, begin, begin + values.numel());
    return;
  }
  auto& b = buckets_[{step, begin}];
  TROUPE_ENFORCE(!b.started, "bucket ", begin, " of step ", step, " started twice");
  b.begin = begin;
  b.values = values;
  b.started = true;
  b.segments = static_cast<std::int32_t>(
      std::max<std::int64_t>(1, (values.numel() + segment_elements_ - 1) / segment_elements_));
  b.gathered.assign(static_cast<std::size_t>(b.segments), 0);
  const std::int32_t owned = (rank_ + 1) % world_;
  for (std::int32_t s = 0; s < b.segments; ++s) {
    if (mode_ == Mode::kAllGather) {
      sendChunk(b, step, begin, s, owned, 0, RingChunk::kAllGather);
    } else {
      sendChunk(b, step, begin, s, rank_, 0, RingChunk::kReduceScatter);
    }
  }
  if (mode_ == Mode::kAllGather) {
    // The own chunks are final already; the last bucket of a world may end right here.
    for (std::int32_t s = 0; s < b.segments; ++s) {
      auto it = buckets_.find({step, begin});
      if (it == buckets_.end()) return;
      segmentGathered(it->second, step, begin, s);
    }
    if (buckets_.find({step, begin}) == buckets_.end()) return;
  }
  auto early = std::move(b.early);
  for (auto& chunk : early) {
    auto it = buckets_.find({step, begin});
    if (it == buckets_.end()) break;  // done already (cannot happen before all chunks arrived)
    handle(it->second, chunk);
  }
}

void RingAllreduce::receive(RingChunk chunk) {
  TROUPE_ENFORCE(world_ > 1, "ring chunk in a world of one");
  auto& b = buckets_[{chunk.step, chunk.bucket}];
  if (!b.started) {
    b.early.push_back(std::move(chunk));
    return;
  }
  handle(b, chunk);
}

void RingAllreduce::handle(Bucket& b, RingChunk& c) {
  if (c.bucket_size != b.values.numel()) {
    throw InputError(fmt::format(
        "ring {}, step {}: rank {} sums {} values at {}, this rank {}: the ranks' sizes differ",
        ring_, c.step, (rank_ + world_ - 1) % world_, c.bucket_size, c.bucket, b.values.numel()));
  }
  const bool compressed = compression_.type != kernels::GradientCompression::kNone;
  const bool placed = 0 <= c.segment && c.segment < b.segments && 0 <= c.chunk &&
                      c.chunk < world_ && 0 <= c.round && c.round < world_ - 1;
  const auto [lo, hi] =
      placed ? chunkRange(b, c.segment, c.chunk) : std::pair<std::int64_t, std::int64_t>{0, 0};
  if (!placed || c.offset != c.bucket + lo || (!compressed && c.data.numel() != hi - lo)) {
    // A malformed chunk (the sizes agree).
    throw InputError(fmt::format(
        "ring {}, step {}: rank {} sent a malformed chunk: {} values at {} of segment {}, chunk "
        "{}, round {} of the bucket of {} at {}, which has {} segments and {} values there",
        ring_, c.step, (rank_ + world_ - 1) % world_, c.data.numel(), c.offset, c.segment, c.chunk,
        c.round, b.values.numel(), c.bucket, b.segments, hi - lo));
  }
  // __restrict: a received chunk never aliases the bucket, and so the loops vectorise.
  float* __restrict dst = b.values.f32() + lo;
  const std::int64_t n = hi - lo;
  const std::int64_t step = c.step, begin = c.bucket;
  const int last_round = world_ - 2;
  if (c.phase == RingChunk::kReduceScatter) {
    if (compressed) {
      kernels::decode(compression_, c.data, dst, n, /*accumulate=*/true);
    } else {
      const float* __restrict src = c.data.f32();
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] += src[i];
    }
    if (c.round < last_round) {
      sendChunk(b, step, begin, c.segment, c.chunk, c.round + 1, RingChunk::kReduceScatter);
    } else if (mode_ == Mode::kReduceScatter) {
      // This rank's own chunk is finished. Compressed, it keeps what an allreduce's owner would
      // pass around (encoded once, 2bit's residual updated), as that owner does.
      if (compressed) {
        const kernels::Tensor out = encoded(b, begin, lo, hi);
        kernels::decode(compression_, out, dst, n, /*accumulate=*/false);
      }
      segmentGathered(b, step, begin, c.segment);
    } else {
      // This rank holds the finished sum of this chunk: pass it around (encoded once; this rank
      // keeps what the others will decode).
      kernels::Tensor out = encoded(b, begin, lo, hi);
      if (compressed) kernels::decode(compression_, out, dst, n, /*accumulate=*/false);
      sendChunk(b, step, begin, c.segment, c.chunk, 0, RingChunk::kAllGather, std::move(out));
      segmentGathered(b, step, begin, c.segment);
    }
  } else {
    if (compressed) {
      kernels::decode(compression_, c.data, dst, n, /*accumulate=*/false);
    } else {
      std::memcpy(dst, c.data.f32(), static_cast<std::size_t>(n) * sizeof(float));
    }
    if (c.round < last_round) {
      // Compressed: the same bytes go on; else the bucket's own memory (which a shared-memory
      // link can pass without a copy).
      sendChunk(b, step, begin, c.segment, c.chunk, c.round + 1, RingChunk::kAllGather,
                compressed ? std::move(c.data) : kernels::Tensor());
    }
    segmentGathered(b, step, begin, c.segment);
  }
}

void RingAllreduce::segmentGathered(Bucket& b, std::int64_t step, std::int64_t begin,
                                    std::int32_t segment) {
  // Per segment: one chunk finished here plus N-1 received in the all-gather (reduce-scatter
  // only: the one finished here).
  const std::int32_t needed = mode_ == Mode::kReduceScatter ? 1 : world_;
  if (++b.gathered[static_cast<std::size_t>(segment)] < needed) return;
  if (++b.done_segments < b.segments) return;
  const std::int64_t end = begin + b.values.numel();
  buckets_.erase({step, begin});
  done_(step, begin, end);
}

}  // namespace troupe::actors
