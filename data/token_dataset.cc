#include "data/token_dataset.h"

#include <glob.h>

#include <algorithm>
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
    std::int64_t total = 0;
    for (const std::string& path : shardPaths(options)) {
      shards_.push_back(std::make_unique<MappedTokenShard>(path));
      starts_.push_back(total);
      total += shards_.back()->size();
    }
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
    std::vector<std::uint32_t> window(static_cast<std::size_t>(t + 1));  // a sequence and the next
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const std::int64_t i = indices[k];
      if (i < 0 || i >= size_) {
        throw InputError("sequence " + std::to_string(i) + " of token shards '" + options_.path +
                         "', which hold " + std::to_string(size_));
      }
      copyTokens(i * t, t + 1, window.data());
      for (std::int64_t s = 0; s <= t; ++s) {
        if (window[static_cast<std::size_t>(s)] >= static_cast<std::uint32_t>(options_.num_labels))
          outsideVocabulary(i * t + s, window[static_cast<std::size_t>(s)]);
      }
      for (std::int64_t s = 0; s < t; ++s) {
        tokens[static_cast<std::int64_t>(k) * t + s] =
            static_cast<std::int32_t>(window[static_cast<std::size_t>(s)]);
        labels[static_cast<std::int64_t>(k) * t + s] =
            static_cast<std::int32_t>(window[static_cast<std::size_t>(s + 1)]);
      }
    }
  }
  void read(const std::vector<std::int64_t>&, std::int64_t, float*, std::int32_t*) override {
    throw InputError("token shards '" + options_.path + "' hold token sequences, not images");
  }

 private:
  // The shard holding token `at` of the shards taken end to end (an empty one holds none).
  std::size_t shardOf(std::int64_t at) const {
    return static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), at) -
                                    starts_.begin()) -
           1;
  }
  // Tokens [from, from + count) of the shards taken end to end, across their boundaries.
  void copyTokens(std::int64_t from, std::int64_t count, std::uint32_t* out) const {
    for (std::size_t k = shardOf(from); count > 0; ++k) {
      const std::int64_t begin = from - starts_[k];
      const std::int64_t n = std::min(count, shards_[k]->size() - begin);
      shards_[k]->copy(begin, n, out);
      from += n, out += n, count -= n;
    }
  }
  [[noreturn]] void outsideVocabulary(std::int64_t at, std::uint32_t token) const {
    const std::size_t k = shardOf(at);
    throw InputError("token shard '" + shards_[k]->path() + "': token " + std::to_string(token) +
                     " at position " + std::to_string(at - starts_[k]) +
                     " is outside the vocabulary [0, " + std::to_string(options_.num_labels) +
                     ") (vocab_size)");
  }

  DatasetOptions options_;
  std::vector<std::unique_ptr<MappedTokenShard>> shards_;
  std::vector<std::int64_t> starts_;  // each shard's first token, of the shards end to end
  std::int64_t size_ = 0;
};

}  // namespace

std::unique_ptr<Dataset> openTokenDataset(const DatasetOptions& options) {
  if (options.sequence_length < 1 || options.num_labels < 2)
    throw InputError("token shards need a block_size and a vocab_size");
  return std::make_unique<TokenDataset>(options);
}

}  // namespace troupe::data
