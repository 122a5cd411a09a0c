#include "troupe/version.h"

#include <fmt/format.h>

#include "kernels/cpu/isa.h"
#include "troupe/config.h"
#include "troupe/error.h"

namespace troupe {

const char* version() {
  return TROUPE_VERSION;
}

std::string buildSummary() {
  std::string isa;
  try {
    isa = kernels::cpu::isaName(kernels::cpu::cpuIsa());
  } catch (const Error& e) {  // a bad TROUPE_MAX_CPU_ISA: said, not thrown
    isa = fmt::format("unknown ({})", e.what());
  }
  return fmt::format("troupe {}: cpu kernels {}, cuda {}", version(), isa,
                     TROUPE_USE_CUDA ? "yes" : "no");
}

}  // namespace troupe
