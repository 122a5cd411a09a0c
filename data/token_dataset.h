// Token shards as a dataset (DatasetOptions::sequence_length t): record i is the sequence of
// tokens [i t, i t + t) of the shards taken end to end, each labelled with the token after it
// (so that consecutive records cover the text once), as llm.c's and nanoGPT's loaders cut it.
#pragma once

#include <memory>

#include "data/dataset.h"

namespace troupe::data {

// The path is a shard (a .bin file), a glob of them ("fineweb_train_*.bin", as llm.c's -i
// takes), or a folder: its shards of split "train" for a training set (DatasetOptions::train),
// else of "val" (data/token_shards.h, tokenShardsIn). The shards are mapped, not read
// (MappedTokenShard): opening checks their headers and sizes only, and a read copies its
// sequences. InputError naming the culprit for no shards, a damaged one, or fewer than t + 1
// tokens in all when opened; for a token outside the vocabulary (num_labels) when a sequence
// holding it is read, naming the shard and the token's position in it.
std::unique_ptr<Dataset> openTokenDataset(const DatasetOptions& options);

}  // namespace troupe::data
