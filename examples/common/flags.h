// The examples' command lines: "--flag value" pairs over each flag's default. Header-only, for the
// examples alone.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace examples {

// argv's "--flag value" pairs into `values`, whose keys are the flags the program takes (without
// "--") and whose values their defaults; prints "PROGRAM: ..." and exits 1 for an unknown flag or
// one without a value.
inline std::map<std::string, std::string> parseFlags(const char* program, int argc, char** argv,
                                                     std::map<std::string, std::string> values) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string key = flag.rfind("--", 0) == 0 ? flag.substr(2) : std::string();
    const char* what = !values.count(key) ? "unknown flag " : i + 1 >= argc ? "no value for " : "";
    if (*what) {
      std::fprintf(stderr, "%s: %s%s\n", program, what, flag.c_str());
      std::exit(1);
    }
    values[key] = argv[i + 1];
  }
  return values;
}

}  // namespace examples
