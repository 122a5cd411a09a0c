// Token shards as a dataset (DatasetOptions::sequence_length t): record i is the sequence of
// tokens [i t, i t + t) of the shards taken end to end, each labelled with the token after it
// (so that consecutive records cover the text once), as llm.c's and nanoGPT's loaders cut it.
#pragma once

#include <memory>

#include "data/dataset.h"

namespace troupe::data {

// The path is a shard (a .bin file), a glob of them ("fineweb_train_*.bin", as llm.c's -i
// takes), or a folder: its shards of split "train" for a training set (DatasetOptions::train),
// else of "val" (data/token_shards.h, tokenShardsIn). The shards are read whole when opened
// and held in memory (4 bytes a token). InputError naming the culprit for no shards, a damaged
// one, a token outside the vocabulary (num_labels), or fewer than t + 1 tokens in all.
std::unique_ptr<Dataset> openTokenDataset(const DatasetOptions& options);

}  // namespace troupe::data
