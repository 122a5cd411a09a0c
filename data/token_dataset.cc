#include "data/token_dataset.h"

#include <glob.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/token_shards.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> shardPaths(const DatasetOptions& o) {
  const std::string& path = o.path;
  if (path.find_first_of("*?[") != std::string::npos) {
    glob_t found{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &found);
    std::vector<std::string> paths(found.gl_pathv, found.gl_pathv + found.gl_pathc);
    ::globfree(&found);
    if (rc != 0 || paths.empty()) throw InputError("token shards '" + path + "': no file matches");
    return paths;  // glob sorts them
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) return tokenShardsIn(path, o.train ? "train" : "val");
  return {path};  // readTokenShard names it if it is missing or no shard
}

class TokenDataset final : public Dataset {
 public:
  explicit TokenDataset(const DatasetOptions& options) : options_(options) {
    const std::int64_t t = options.sequence_length;
    for (const std::string& path : shardPaths(options)) {
      TokenShard shard = readTokenShard(path);
      for (std::size_t i = 0; i < shard.tokens.size(); ++i) {
        if (shard.tokens[i] >= static_cast<std::uint32_t>(options.num_labels)) {
          throw InputError("token shard '" + path + "': token " + std::to_string(shard.tokens[i]) +
                           " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                           std::to_string(options.num_labels) + ") (vocab_size)");
        }
      }
      tokens_.insert(tokens_.end(), shard.tokens.begin(), shard.tokens.end());
    }
    const auto total = static_cast<std::int64_t>(tokens_.size());
    if (total < t + 1) {
      throw InputError("token shards '" + options.path + "' hold " + std::to_string(total) +
                       " tokens, fewer than block_size + 1 = " + std::to_string(t + 1));
    }
    size_ = (total - 1) / t;
  }

  std::int64_t size() const override { return size_; }
  const DatasetOptions& options() const override { return options_; }

  void read(const std::vector<std::int64_t>& indices, std::int64_t, std::int32_t* tokens,
            std::int32_t* labels) override {
    const std::int64_t t = options_.sequence_length;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const std::int64_t i = indices[k];
      if (i < 0 || i >= size_) {
        throw InputError("sequence " + std::to_string(i) + " of token shards '" + options_.path +
                         "', which hold " + std::to_string(size_));
      }
      const std::uint32_t* from = tokens_.data() + i * t;
      for (std::int64_t s = 0; s < t; ++s) {
        tokens[static_cast<std::int64_t>(k) * t + s] = static_cast<std::int32_t>(from[s]);
        labels[static_cast<std::int64_t>(k) * t + s] = static_cast<std::int32_t>(from[s + 1]);
      }
    }
  }
  void read(const std::vector<std::int64_t>&, std::int64_t, float*, std::int32_t*) override {
    throw InputError("token shards '" + options_.path + "' hold token sequences, not images");
  }

 private:
  DatasetOptions options_;
  std::vector<std::uint32_t> tokens_;
  std::int64_t size_ = 0;
};

}  // namespace

std::unique_ptr<Dataset> openTokenDataset(const DatasetOptions& options) {
  if (options.sequence_length < 1 || options.num_labels < 2)
    throw InputError("token shards need a block_size and a vocab_size");
  return std::make_unique<TokenDataset>(options);
}

}  // namespace troupe::data
