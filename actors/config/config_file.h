// A config file's text, read with the checks that keep a wrong file from hurting the process: a
// config file (or the secret file) must be a regular file of at most 1 MiB, and its non-ASCII
// characters must sit where TOML allows them before toml++ sees it. Every refusal is an InputError
// naming the file. Any thread; nothing here keeps state.
#pragma once

#include <sys/stat.h>

#include <string>
#include <string_view>

namespace troupe::actors {

// Refuses anything but a regular file of at most 1 MiB, as `st` (stat or fstat of `path`)
// describes it; `what` names the file's role in the InputError ("config file", "secret file").
void checkSmallRegularFile(const std::string& path, const char* what, const struct stat& st);

// The text of a config file. Opened without blocking (a FIFO would wait for a writer), checked
// as checkSmallRegularFile says, and read to at most 1 MiB, however the file grows meanwhile.
// InputError when it cannot be opened or read.
std::string readConfigFile(const std::string& path);

// toml++ 3.3.0 (Debian 12's) reaches __builtin_unreachable() when it asks whether some non-ASCII
// characters are whitespace (marzer/tomlplusplus#190): one outside a string or comment (toml++
// asks of every character of a bare word, quotes included), or one after a backslash (or a
// line-ending backslash) in a multi-line basic string. TOML allows non-ASCII characters only in
// strings and comments; this refuses the rest before toml++ sees them. It follows TOML's grammar
// just enough to know where a quote opens a string: at the start of a key or of a value.
// InputError "FILE:LINE:COLUMN: ..." at the first such character.
void checkNonAscii(const std::string& file, std::string_view text);

}  // namespace troupe::actors
