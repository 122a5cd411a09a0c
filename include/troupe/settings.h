// The settings every troupe API takes (Trainer, KVStore, Model, Observer): config keys and their
// values as text, as in a config file or on `troupe train`'s command line, {{"batch_size", "32"}};
// one value a key. docs/config.md lists the keys; a leading "--" (a key copied from a command
// line) is taken off; an unknown key is an error naming the nearest one.
#pragma once

#include <map>
#include <string>

namespace troupe {

using Settings = std::map<std::string, std::string>;

}  // namespace troupe
