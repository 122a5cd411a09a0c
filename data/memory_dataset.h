// Datasets a process holds in memory, named "memory://NAME" where a database path goes (train_data,
// test_data): a service's own records (troupe/record_source.h). openDataset opens them by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "data/dataset.h"

namespace troupe::data {

inline constexpr std::string_view kMemoryScheme = "memory://";

bool isMemoryDataset(std::string_view path);

// Makes `dataset` openable as "memory://NAME" (`path`) until unregistered. InputError when the
// name is taken or `path` lacks the scheme. Any thread.
void registerMemoryDataset(const std::string& path, std::shared_ptr<Dataset> dataset);
void unregisterMemoryDataset(const std::string& path);

// The registered dataset of options.path, checked against the options' shape; InputError naming
// the path when none is registered, when its shape is not the options', or when the options
// transform images or ask for uint8 ones (memory datasets hold the model's inputs as they are).
std::unique_ptr<Dataset> openMemoryDataset(const DatasetOptions& options);

}  // namespace troupe::data
