// libFuzzer target: a run's configuration as `troupe train CONFIG --key VALUE ...` under `troupe
// launch` loads it (loadTrainOptions: the file, troupe launch's TROUPE_* variables, the flags, each
// value checked against its key's range). The input is the file's text, then optionally a NUL byte
// and lines of overrides: "key=value" is the flag --key value, "$TROUPE_X=value" sets one of
// troupe launch's variables. An empty file part loads no file.
// Bad input may only throw troupe::InputError; a config that loads must hold every numeric key
// finite and in the range configKeys() states for it (read back from the options' parameters, the
// values the run logs). Anything else (a crash, another exception, a sanitizer report, a value out
// of range) is a finding.
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "actors/config/train_config.h"
#include "fuzz_util.h"
#include "troupe/error.h"

namespace {

// troupe launch's variables that loadTrainOptions reads; the fuzzer sets them only through "$".
constexpr const char* kLaunchVars[] = {"TROUPE_NUM_WORKERS", "TROUPE_RANK",     "TROUPE_ROLE",
                                       "TROUPE_NUM_SERVERS", "TROUPE_RUN_ID",   "TROUPE_GENERATION",
                                       "TROUPE_RENDEZVOUS",  "TROUPE_INTERFACE"};

bool inRange(const troupe::actors::ConfigKey& key, double x) {
  return std::isfinite(x) && (key.min_open ? x > key.min : x >= key.min) &&
         (key.max_open ? x < key.max : x <= key.max);
}

[[noreturn]] void finding(const std::string& key, const std::string& value, const char* what) {
  std::fprintf(stderr, "config_fuzz: loaded with %s = '%s': %s\n", key.c_str(), value.c_str(),
               what);
  std::abort();
}

// Every numeric parameter of a config that loaded: finite and inside its key's range.
void checkInvariants(const troupe::actors::TrainOptions& options) {
  const auto& keys = troupe::actors::configKeys();
  if (options.parameters.size() != keys.size()) finding("", "", "a key is missing");
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& key = keys[i];
    const auto& [name, text] = options.parameters[i];
    if (name != key.name) finding(name, text, "parameters out of the keys' order");
    if (key.range.empty()) continue;
    std::string_view rest = text;
    if (rest.empty() && key.kind != "list of numbers") finding(name, text, "no value");
    while (!rest.empty()) {  // a list's elements are comma-separated
      const auto comma = rest.find(',');
      const auto element = rest.substr(0, comma);
      double x = 0;
      const auto [end, ec] = std::from_chars(element.data(), element.data() + element.size(), x);
      if (ec != std::errc() || end != element.data() + element.size()) {
        finding(name, text, "not a number");
      }
      if (!inRange(key, x)) finding(name, text, "outside the key's range");
      if (key.kind == "integer" && x != std::floor(x)) finding(name, text, "not an integer");
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* name : kLaunchVars)
    ::unsetenv(name);
  for (const char* name : {"TROUPE_SECRET", "TROUPE_SECRET_FILE"})
    ::unsetenv(name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::fuzz::ScratchFile file(".toml");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto split = input.find('\0');
  const std::string_view text = input.substr(0, split);
  troupe::actors::ConfigOverrides overrides;
  for (const char* name : kLaunchVars)
    ::unsetenv(name);
  if (split != std::string_view::npos) {
    std::string_view rest = input.substr(split + 1);
    while (!rest.empty()) {
      const auto newline = rest.find('\n');
      const std::string_view line = rest.substr(0, newline);
      rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
      const auto eq = line.find('=');
      if (eq == std::string_view::npos) continue;
      const std::string key(line.substr(0, eq));
      const std::string value(line.substr(eq + 1));
      if (key.starts_with('$')) {
        for (const char* name : kLaunchVars) {
          if (key.substr(1) == name && value.find('\0') == std::string::npos) {
            ::setenv(name, value.c_str(), 1);
          }
        }
      } else {
        overrides[key] = value;
      }
    }
  }
  try {
    const auto options = troupe::actors::loadTrainOptions(
        text.empty() ? std::string()
                     : file.write(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()),
        overrides);
    checkInvariants(options);
  } catch (const troupe::InputError&) {
    // The config is refused, naming the key and where its value came from, or the file's line.
  }
  return 0;
}
