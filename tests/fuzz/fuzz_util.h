// Shared by the libFuzzer targets in tests/fuzz: a scratch file for targets whose entry point reads
// a file, so that the input is loaded through the same path a user's file takes.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace troupe::fuzz {

// A file in the temporary folder, named for this process, removed when the process exits.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& suffix)
      : path_((std::filesystem::temp_directory_path() /
               ("troupe_fuzz_" + std::to_string(::getpid()) + suffix))
                  .string()) {}
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }

  // Replaces the file's contents with `size` bytes at `data`; returns the path.
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) throw std::runtime_error("cannot write the scratch file " + path_);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace troupe::fuzz
