// Helpers shared by the data tests: temporary folders, hand-made Caffe Datum bytes, running the
// CLI.
#pragma once

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/db.h"
#include "data/image.h"
#include "troupe/error.h"

namespace troupe::data::testing {

// Writes the given values under keys "%08d", as Caffe's convert_mnist_data does.
inline void writeDb(const std::string& path, DbType type, const std::vector<std::string>& values) {
  auto writer = createDb(path, type);
  for (std::size_t i = 0; i < values.size(); ++i)
    writer->put(fmt::format("{:08d}", i), values[i]);
  writer->publish();
}

// What fn throws as troupe::Error, or "(no error)".
template <typename Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A fresh folder under the system's temp folder, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe_data_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Protobuf wire format, written by hand so the tests do not depend on the generated class:
// this is what Caffe's tools put in their databases.
inline void appendVarint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

struct RawDatum {
  int channels = 1;
  int height = 28;
  int width = 28;
  std::string data = {};
  int label = 0;
  std::vector<float> float_data = {};
  bool encoded = false;
};

inline std::string datumBytes(const RawDatum& d) {
  std::string out;
  out.push_back(0x08);  // field 1, varint
  appendVarint(out, static_cast<std::uint64_t>(d.channels));
  out.push_back(0x10);
  appendVarint(out, static_cast<std::uint64_t>(d.height));
  out.push_back(0x18);
  appendVarint(out, static_cast<std::uint64_t>(d.width));
  if (!d.data.empty()) {
    out.push_back(0x22);  // field 4, length-delimited
    appendVarint(out, d.data.size());
    out += d.data;
  }
  out.push_back(0x28);  // field 5, varint (negative int32 as 10-byte two's complement)
  appendVarint(out, static_cast<std::uint64_t>(static_cast<std::int64_t>(d.label)));
  for (float f : d.float_data) {  // field 6, fixed32, unpacked as proto2 writes it
    out.push_back(0x35);
    out.append(reinterpret_cast<const char*>(&f), sizeof f);
  }
  if (d.encoded) {
    out.push_back(0x38);  // field 7, varint
    out.push_back(1);
  }
  return out;
}

// A deterministic pattern of pixels for record i.
inline std::string pattern(std::size_t size, int i) {
  std::string out(size, '\0');
  for (std::size_t j = 0; j < size; ++j)
    out[j] = static_cast<char>((j * 7 + i * 31) & 0xFF);
  return out;
}

// A height x width image of `channels` channels (interleaved, as decodeImage gives them) whose
// pixel (y, x, c) is shade(y, x, c).
template <typename Shade>
Image imageOf(int height, int width, int channels, Shade shade) {
  Image image;
  image.height = height;
  image.width = width;
  image.channels = channels;
  image.pixels.resize(static_cast<std::size_t>(height) * width * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c)
        image.pixels[(static_cast<std::size_t>(y) * width + x) * channels + c] = shade(y, x, c);
    }
  }
  return image;
}

struct CliResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, its stderr with its stdout.
inline CliResult runShell(const std::string& command_line) {
  CliResult result;
  const std::string command = command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  std::size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Runs the troupe CLI with the given arguments (a shell-quoted string).
inline CliResult runTroupe(const std::string& args) {
  return runShell(std::string("'") + TROUPE_BINARY + "' " + args);
}

}  // namespace troupe::data::testing
