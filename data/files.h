// Reading a file a user named (an image, a checkpoint, a list) whole, without surprises: what is
// not a regular file (a FIFO that would block, /dev/zero that never ends, a folder) and what is
// larger than the caller allows are refused from the file's status, before a byte is read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::data {

// The bytes of the regular file at path. `what` names the file in errors ("image", "checkpoint").
// Throws InputError "<what> '<path>' does not exist", "... is not a regular file (a FIFO)", "... is
// N bytes, over the limit of M (<limit_name>)"; IoError when it cannot be opened or read, or
// changes size while it is read. Thread-safe.
std::string readRegularFile(const std::string& path, std::string_view what,
                            std::uint64_t max_bytes = UINT64_MAX, std::string_view limit_name = {});

// readRegularFile's refusals without the reading: throws unless path is a regular file.
void checkRegularFile(const std::string& path, std::string_view what);

}  // namespace troupe::data
