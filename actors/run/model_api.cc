// troupe::Model (include/troupe/model.h): a net of the run's config, evaluated as the replicas
// evaluate the test data.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "actors/config/train_config.h"
#include "actors/core/status_of.h"
#include "actors/run/run_plan.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "kernels/net.h"
#include "troupe/error.h"
#include "troupe/model.h"

namespace troupe {
namespace {

class ModelImpl final : public Model {
 public:
  explicit ModelImpl(const actors::TrainOptions& o)
      : options_(o),
        batch_(std::max<std::int64_t>(1, o.batch_size)),
        backend_(kernels::makeCpuBackend(o.threads > 0 ? o.threads : actors::defaultThreads())),
        net_(kernels::makeNet(*backend_, actors::netOptions(o, batch_))),
        weights_(backend_->empty({net_->numParams()})),
        metrics_(kernels::Tensor::host({2})) {}

  std::int64_t numParams() const override { return net_->numParams(); }

  Result<Score> evaluate(std::span<const float> weights, const std::string& data,
                         std::int64_t max_records) override {
    if (static_cast<std::int64_t>(weights.size()) != net_->numParams()) {
      return Status{ErrorKind::kInput, fmt::format("Model::evaluate: {} weights, the model has {}",
                                                   weights.size(), net_->numParams())};
    }
    try {
      auto& dataset = open(data);
      auto host = kernels::Tensor::host({net_->numParams()});
      std::copy(weights.begin(), weights.end(), host.f32());
      backend_->copy(host, weights_);
      net_->useWeights(weights_);
      const auto& t = test_options_.at(data);
      std::int64_t n = dataset.size();
      if (max_records > 0) n = std::min(n, max_records);
      Score score;
      double loss = 0, correct = 0, predictions = 0;
      std::vector<std::int64_t> indices;
      for (std::int64_t first = 0; first < n; first += batch_) {
        const std::int64_t count = std::min(batch_, n - first);
        indices.resize(static_cast<std::size_t>(count));
        for (std::int64_t i = 0; i < count; ++i)
          indices[static_cast<std::size_t>(i)] = first + i;
        // Images, or a language model's token sequences, a label each token.
        const bool tokens = t.sequence_length > 0;
        const kernels::Shape shape = tokens ? kernels::Shape{count, t.sequence_length}
                                            : kernels::Shape{count, t.channels, t.height, t.width};
        auto input = kernels::Tensor::host(
            shape, tokens ? kernels::DType::kInt32 : kernels::DType::kFloat32);
        auto labels =
            kernels::Tensor::host(tokens ? shape : kernels::Shape{count}, kernels::DType::kInt32);
        if (tokens)
          dataset.read(indices, /*epoch=*/0, input.i32(), labels.i32());
        else
          dataset.read(indices, /*epoch=*/0, input.f32(), labels.i32());
        net_->forward(input, labels, /*train=*/false);
        backend_->copy(net_->metrics(), metrics_);
        backend_->synchronize();
        loss += metrics_.f32()[0];
        correct += metrics_.f32()[1];
        score.count += count;
        predictions += static_cast<double>(labels.numel());
      }
      if (score.count > 0) {
        score.loss = loss / predictions;
        score.accuracy = correct / predictions;
      }
      return score;
    } catch (const std::exception& e) {
      return actors::statusOf(e);
    }
  }

 private:
  data::Dataset& open(const std::string& path) {
    auto it = datasets_.find(path);
    if (it == datasets_.end()) {
      auto options = actors::datasetOptions(options_, path);
      auto dataset = data::openDataset(options);
      test_options_[path] = options;
      it = datasets_.emplace(path, std::move(dataset)).first;
    }
    return *it->second;
  }

  actors::TrainOptions options_;
  std::int64_t batch_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Net> net_;
  kernels::Tensor weights_, metrics_;
  std::map<std::string, std::unique_ptr<data::Dataset>> datasets_;
  std::map<std::string, data::DatasetOptions> test_options_;
};

}  // namespace

Result<std::unique_ptr<Model>> Model::create(const std::string& config_file,
                                             const ModelSettings& settings) {
  try {
    return std::unique_ptr<Model>(new ModelImpl(actors::loadTrainOptions(config_file, settings)));
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
}

}  // namespace troupe
