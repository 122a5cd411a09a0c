// libFuzzer target: a TOML config file whose text is the input, loaded as `troupe train CONFIG`
// loads it (loadTrainOptions: parse, then check every key and value type), with no command-line
// overrides and none of troupe launch's TROUPE_* variables set. Bad input may only throw
// troupe::Error; anything else (a crash, another exception, a sanitizer report) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "apps/config.h"
#include "fuzz_util.h"
#include "troupe/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* name : {"TROUPE_NUM_WORKERS", "TROUPE_RANK", "TROUPE_ROLE", "TROUPE_NUM_SERVERS",
                           "TROUPE_RUN_ID", "TROUPE_RENDEZVOUS", "TROUPE_INTERFACE"}) {
    ::unsetenv(name);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::fuzz::ScratchFile file(".toml");
  try {
    troupe::apps::loadTrainOptions(file.write(data, size), {});
  } catch (const troupe::Error&) {
    // The config is refused, naming the file and the key or the line.
  }
  return 0;
}
