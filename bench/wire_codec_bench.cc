// The wire codec's cost per message (actors/core/wire_codec.h): encodeMessage, and decodeMessage
// of a frame parsed as a link parses it, in ns, for the messages a step sends most. Built against
// two commits, it shows what a change to the codec costs:
//   bash scripts/build.sh && build/bench/troupe_wire_codec_bench
// Each decode gets a frame of its own (a frame's reader counts what it traversed, as a link's).
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "actors/core/messages.h"
#include "actors/core/wire_codec.h"
#include "transport/message_state.h"
#include "transport/wire.capnp.h"

namespace {

using namespace troupe;
using Clock = std::chrono::steady_clock;

volatile std::uint64_t sink;

template <typename M>
void measure(const char* name, M message) {
  actors::Typed<M> envelope(std::move(message));
  constexpr int kEncodes = 200000;
  constexpr int kDecodes = 20000;
  const auto start = Clock::now();
  for (int i = 0; i < kEncodes; ++i)
    sink = sink + actors::encodeMessage({1, 2}, {0, 3}, envelope).frame().getTarget();
  const auto encode = Clock::now() - start;
  Clock::duration decode{};
  for (int i = 0; i < kDecodes; ++i) {
    const auto in = transport::loopback(actors::encodeMessage({1, 2}, {0, 3}, envelope));
    const auto begin = Clock::now();
    sink = sink + actors::decodeMessage(1, in).target;
    decode += Clock::now() - begin;
  }
  const auto ns = [](Clock::duration d, int n) {
    return std::chrono::duration<double, std::nano>(d).count() / n;
  };
  std::cout << fmt::format("{:<12} {:>10.0f} {:>10.0f}\n", name, ns(encode, kEncodes),
                           ns(decode, kDecodes));
}

}  // namespace

int main() {
  actors::RingChunk chunk;
  chunk.step = 5;
  chunk.segment = 1;
  chunk.chunk = 2;
  chunk.phase = actors::RingChunk::kAllGather;
  chunk.data = kernels::Tensor::host({256});
  std::memset(chunk.data.raw(), 0, chunk.data.bytes());
  actors::StepDone done;
  done.step = 3;
  done.loss_sum = 1.5;
  actors::KvConfigure configure;
  configure.has_optimizer = true;
  configure.optimizer.kind = &kernels::optimizerInfo("adamw");
  std::cout << fmt::format("{:<12} {:>10} {:>10}\n", "message", "encode ns", "decode ns");
  for (int round = 0; round < 2; ++round) {
    measure("RingChunk", chunk);
    measure("Push", actors::Push{1, 2, 3, 4, chunk.data});
    measure("StepDone", done);
    measure("KvConfigure", configure);
  }
  return 0;
}
