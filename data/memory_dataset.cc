#include "data/memory_dataset.h"

#include <map>
#include <mutex>

#include "troupe/error.h"

namespace troupe::data {
namespace {

std::mutex registry_mu;
std::map<std::string, std::shared_ptr<Dataset>>& registry() {
  static std::map<std::string, std::shared_ptr<Dataset>> datasets;
  return datasets;
}

// What a reader holds: the registered dataset, kept alive while it reads.
class Registered final : public Dataset {
 public:
  Registered(std::shared_ptr<Dataset> inner, DatasetOptions options)
      : inner_(std::move(inner)), options_(std::move(options)) {}
  std::int64_t size() const override { return inner_->size(); }
  const DatasetOptions& options() const override { return options_; }
  void read(const std::vector<std::int64_t>& indices, std::int64_t epoch, float* images,
            std::int32_t* labels) override {
    inner_->read(indices, epoch, images, labels);
  }

 private:
  std::shared_ptr<Dataset> inner_;
  DatasetOptions options_;
};

}  // namespace

bool isMemoryDataset(std::string_view path) {
  return path.substr(0, kMemoryScheme.size()) == kMemoryScheme;
}

void registerMemoryDataset(const std::string& path, std::shared_ptr<Dataset> dataset) {
  if (!isMemoryDataset(path)) throw InputError("memory dataset '" + path + "': not memory://NAME");
  std::lock_guard lock(registry_mu);
  if (!registry().emplace(path, std::move(dataset)).second) {
    throw InputError("memory dataset '" + path + "' is registered already");
  }
}

void unregisterMemoryDataset(const std::string& path) {
  std::lock_guard lock(registry_mu);
  registry().erase(path);
}

std::unique_ptr<Dataset> openMemoryDataset(const DatasetOptions& options) {
  if (options.uint8) {
    throw InputError("dataset '" + options.path +
                     "' holds float images: input_dtype uint8 needs a database");
  }
  std::shared_ptr<Dataset> dataset;
  {
    std::lock_guard lock(registry_mu);
    const auto it = registry().find(options.path);
    if (it != registry().end()) dataset = it->second;
  }
  if (!dataset) {
    throw InputError("dataset '" + options.path +
                     "': no such dataset in this process's memory (a service registers its "
                     "records with troupe::Trainer::start's TrainerData)");
  }
  if (options.transforms()) {
    throw InputError("dataset '" + options.path +
                     "': crop, resize_short, mirror, color_jitter and the per-channel mean and std "
                     "apply to databases of images, not to a service's records (which come as "
                     "the model takes them)");
  }
  const auto& o = dataset->options();
  if (o.channels != options.channels || o.height != options.height || o.width != options.width ||
      o.num_labels != options.num_labels) {
    throw InputError("dataset '" + options.path + "' holds " + std::to_string(o.channels) + "x" +
                     std::to_string(o.height) + "x" + std::to_string(o.width) + " images of " +
                     std::to_string(o.num_labels) + " labels, the run's model takes " +
                     std::to_string(options.channels) + "x" + std::to_string(options.height) + "x" +
                     std::to_string(options.width) + " of " + std::to_string(options.num_labels));
  }
  return std::make_unique<Registered>(std::move(dataset), options);
}

}  // namespace troupe::data
