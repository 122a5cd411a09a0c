// Reading a file a user named (an image, a checkpoint, a config, a list) whole, without surprises:
// what is not a regular file (a FIFO that would block, /dev/zero that never ends, a folder) and
// what is larger than the caller allows are refused from the open file's status, and the read
// stops one byte past the limit however the file grows meanwhile.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::data {

// The bytes of the regular file at path. `what` names the file in errors ("image", "config file");
// `limit` how max_bytes reads in them (default "N bytes"). Throws InputError "<what> '<path>' does
// not exist", "... is a FIFO, not a regular file", "... is N bytes, over the <limit> it may hold",
// or "cannot open/read ..."; opens without blocking (a FIFO would wait for a writer). Thread-safe.
std::string readRegularFile(const std::string& path, std::string_view what,
                            std::uint64_t max_bytes = UINT64_MAX, std::string_view limit = {});

// readRegularFile's refusals of what is not a regular file, without the reading (from a stat).
void checkRegularFile(const std::string& path, std::string_view what);

// "a FIFO", "a directory", "a character device" ... of a file's mode, for these errors.
const char* fileKind(mode_t mode);

}  // namespace troupe::data
