// Which troupe this is: the library's version, and what its build has.
#pragma once

#include <string>

namespace troupe {

// The library's version, "MAJOR.MINOR.PATCH". TROUPE_VERSION (troupe/config.h) is the headers';
// a program built against one release and run with another's library sees them differ.
const char* version();

// One line for logs and bug reports: the version, the CPU kernels chosen on this machine
// (avx512, avx2 or baseline) and whether the CUDA backend is built in.
std::string buildSummary();

}  // namespace troupe
