// libFuzzer target: a token shard whose bytes are the input, read as a text model's reader reads
// one (readTokenShard). Bad input may only throw troupe::Error; anything else (a crash, another
// exception, a sanitizer report) is a finding.
#include <cstddef>
#include <cstdint>

#include "data/token_shards.h"
#include "fuzz_util.h"
#include "troupe/error.h"

namespace {

volatile std::uint64_t sink;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::fuzz::ScratchFile file(".bin");
  try {
    const auto shard = troupe::data::readTokenShard(file.write(data, size));
    for (const std::uint32_t t : shard.tokens)
      sink = sink + t;
  } catch (const troupe::Error&) {
    // The shard is refused, naming it.
  }
  return 0;
}
