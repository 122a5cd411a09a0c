// Building databases of Caffe Datum records: from Fashion-MNIST's IDX files and from image lists
// (what Caffe's convert_mnist_data and convert_imageset do).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/db.h"
#include "data/image.h"

namespace troupe::data {

struct ConvertStats {
  std::int64_t train = 0;
  std::int64_t test = 0;
};

// Reads train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), t10k-images-idx3-ubyte(.gz)
// and t10k-labels-idx1-ubyte(.gz) from source_dir (gzipped or not) and writes the databases
// out_dir/train and out_dir/test: keys "%08d" (the record's index), Datum channels=1 and the IDX
// rows x cols (28x28), label 0..9. encoded: the pixels are stored PNG-encoded (encoded=true).
// Everything is read and checked before anything is written. Throws InputError naming the file for
// a missing file, a wrong magic number, image and label counts that differ, a file size that does
// not match its header, or a label > 9; InputError if out_dir/train or out_dir/test exists and is
// not an empty folder; IoError naming the folder if it cannot be created or written.
ConvertStats convertFashionMnist(const std::string& source_dir, const std::string& out_dir,
                                 DbType type, bool encoded);

// Reads CIFAR-10's binary files from source_dir (data_batch_1.bin .. data_batch_5.bin and
// test_batch.bin, as the cifar-10-batches-bin folder of its archive holds them; a folder holding
// that folder does too): records of a label byte and 3 x 32 x 32 pixels, planes R, G, B. Writes
// out_dir/train (the five batches in order) and out_dir/test, keys "%05d" as Caffe's
// convert_cifar_data, Datum 3 x 32 x 32 with the planes in BGR order as every colour record of
// troupe (and of Caffe2's image input); Caffe's own converter kept CIFAR's RGB. encoded: PNG.
// Everything is read and checked first. Throws InputError naming the file for a missing file, a
// size that is not a whole number of records, or a label > 9; and as convertFashionMnist for the
// output.
ConvertStats convertCifar10(const std::string& source_dir, const std::string& out_dir, DbType type,
                            bool encoded);

struct ImagesetOptions {
  DbType type = DbType::kLmdb;
  // Shuffle the list's lines with shuffle(..., SplitMix64(seed)) (see dataset.h) before writing.
  bool shuffle = false;
  std::uint64_t seed = 1;
  // Both > 0: resize every image (bilinear) to resize_height x resize_width; both 0: keep sizes.
  int resize_height = 0;
  int resize_width = 0;
  // > 0: resize every image so that its short side is this long, keeping its aspect ratio (Caffe2's
  // `scale`: ImageNet databases are often stored at 256 or so), with the antialiased filter of
  // the training transform. Exclusive of resize_height and resize_width.
  int resize_short = 0;
  // One gray channel instead of three (BGR).
  bool gray = false;
  // Store encoded images (as convert_imageset --encoded) instead of decoded pixels. The file's own
  // bytes are kept when no resize is asked, its channel count is the one asked (gray or color)
  // and its format is encode_type; otherwise the decoded image is re-encoded as encode_type
  // ("jpg" at quality 95, or "png"). An empty encode_type means the file's extension.
  bool encoded = false;
  std::string encode_type;
  // Limits checked before an image is read or decoded: a file of more bytes (a 6 GiB file named
  // .png) and a header declaring more pixels (a PNG of 200 bytes claiming 65535 x 65535, a zlib
  // bomb) are bad images. The defaults fit ImageNet (its largest file is about 15 MB, its
  // largest image about 35 million pixels).
  std::uint64_t max_image_bytes = std::uint64_t{64} << 20;
  std::int64_t max_image_pixels = kMaxImagePixels;
  // A bad image (missing, not a regular file, over a limit, not a JPEG or PNG, not decodable) is
  // skipped and counted, as Caffe's convert_imageset does; without it, it fails the conversion.
  bool skip_bad_images = false;
};

struct ImagesetStats {
  std::int64_t written = 0;
  std::int64_t skipped = 0;
  // Why the first kNamed skipped images were skipped, each naming the image and its line.
  std::vector<std::string> first_skipped;
  static constexpr std::size_t kNamed = 20;
};

// What Caffe's convert_imageset does. list_file holds lines "relative/path.jpg LABEL" (the label
// after the last blank, so paths may hold spaces; blank lines are skipped); images (JPEG or PNG)
// are read from root/relative/path.jpg. Keys are "%08d_%s" (index after shuffling, path as in the
// list). Raw records hold C x H x W uint8 pixels in BGR order, as Caffe's; without a resize to
// resize_height x resize_width they must all have the first image's size. The database appears
// at out_db only once every record is written (createDb): a conversion that fails leaves none.
// Throws InputError naming the image and the list's line number for a bad image (unless
// skip_bad_images) or a raw record of another size, InputError naming the list for a missing list
// or a malformed line, or when every image was skipped, and as createDb() for the output.
ImagesetStats convertImageset(const std::string& list_file, const std::string& root,
                              const std::string& out_db, const ImagesetOptions& options);

struct TextConvertOptions {
  std::vector<std::string> files;  // text files (or gzipped), read as bytes, in this order
  std::string out;                 // folder for the shards (made; refused if it holds shards)
  std::string name = "text";       // the shards' names: NAME_val_000000.bin, NAME_train_000001.bin
  double val_fraction = 0.1;       // of the tokens, from the start (llm.c's val comes first)
  std::int64_t shard_tokens = 100'000'000;  // a train shard's most tokens (llm.c's fineweb: 1e8)
  // GPT-2's BPE (data/bpe.h) instead of byte-level tokens, from its vocabulary and merges files
  // (both or neither): each file is a document, "<|endoftext|>" before it where the vocabulary
  // has that token (llm.c's data scripts).
  std::string vocab, merges;
};

struct TextConvertStats {
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
  int train_shards = 0;
  std::int64_t vocab_size = 256;  // the vocab_size a model of these tokens needs
};

// Text as token shards (data/token_shards.h), as `troupe convert text` makes them. Tokenizes the
// files (bytes, or GPT-2's BPE; a gzipped file, such as a dictzip .dz, decompressed) and writes
// OUT/NAME_val_000000.bin with the first val_fraction of the tokens and the rest as
// OUT/NAME_train_000001.bin, ... of at most shard_tokens each. InputError naming the culprit for a
// missing file, no text, a val_fraction outside [0, 1) or not finite, a shard_tokens below 1, an
// OUT that already holds shards, a vocabulary without merges or the other way round, or as
// Gpt2Tokenizer::load; IoError naming the file that cannot be written.
TextConvertStats convertText(const TextConvertOptions& options);

}  // namespace troupe::data
