// libFuzzer target: a token shard whose bytes are the input, read whole (readTokenShard) and
// mapped as a text model's readers map one (MappedTokenShard), which must agree: the same tokens,
// or both refusing it. Bad input may only throw troupe::Error; anything else (a crash, another
// exception, a sanitizer report, a disagreement) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "data/token_shards.h"
#include "fuzz_util.h"
#include "troupe/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::fuzz::ScratchFile file(".bin");
  const std::string path = file.write(data, size);
  std::optional<std::vector<std::uint32_t>> read, mapped;
  try {
    read = troupe::data::readTokenShard(path).tokens;
  } catch (const troupe::Error&) {
    // The shard is refused, naming it.
  }
  try {
    const troupe::data::MappedTokenShard shard(path);
    mapped.emplace(static_cast<std::size_t>(shard.size()));
    shard.copy(0, shard.size(), mapped->data());
  } catch (const troupe::Error&) {
  }
  if (read != mapped) std::abort();  // one refused what the other took, or they read it apart
  return 0;
}
