// libFuzzer target: a checkpoint file whose bytes are the input, loaded as `troupe train --resume`
// loads one (loadCheckpoint, then the meta values the trainer reads). Each input is loaded twice:
// as it is, and with its last four bytes replaced by the CRC-32 of the rest, so that the parser
// behind the checksum is reached too. Bad input may only throw troupe::Error; anything else (a
// crash, another exception, a sanitizer report) is a finding.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "actors/run/checkpoint.h"
#include "fuzz_util.h"
#include "troupe/error.h"

namespace {

volatile double sink;

void load(const std::string& path) {
  try {
    const auto ck = troupe::actors::loadCheckpoint(path);
    // What actors/run/trainer.cc reads of a checkpoint it resumes from.
    sink = static_cast<double>(ck.weights.numel() + ck.state.numel() + ck.buffers.numel());
    sink = static_cast<double>(ck.metaInt("global_batch") + ck.metaInt("steps_per_epoch") +
                               ck.metaInt("step") + ck.metaInt("cumulative_input_count"));
    sink = ck.metaDouble("cumulative_time_spent");
  } catch (const troupe::Error&) {
    // The checkpoint is refused, naming it.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::fuzz::ScratchFile file(".ckpt");
  load(file.write(data, size));
  if (size >= 4) {
    std::vector<std::uint8_t> sealed(data, data + size);
    const auto crc = static_cast<std::uint32_t>(crc32(0L, sealed.data(), size - 4));
    std::memcpy(sealed.data() + size - 4, &crc, 4);
    load(file.write(sealed.data(), sealed.size()));
  }
  return 0;
}
