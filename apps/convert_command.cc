// `troupe convert`: builds LMDB/LevelDB databases of Caffe Datum records, from Fashion-MNIST's IDX
// files, CIFAR-10's binary files or an image list (as Caffe's convert_mnist_data,
// convert_cifar_data and convert_imageset); and token shards of text in llm.c's format.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "data/convert.h"
#include "data/db.h"

namespace troupe::apps {
namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

using ConvertSet = data::ConvertStats (*)(const std::string& source, const std::string& out,
                                          data::DbType type, bool encoded);

// A data set of its own format -> OUT/train and OUT/test; no default_source: --source required.
void addTrainTestSet(CLI::App& convert, const char* name, const char* description,
                     const char* source_help, std::string default_source, ConvertSet run) {
  struct Args {
    std::string out;
    std::string db = "lmdb";
    std::string source;
    bool encoded = false;
  };
  auto args = std::make_shared<Args>();
  args->source = std::move(default_source);
  auto* cmd = convert.add_subcommand(name, description);
  cmd->add_option("--out", args->out, "Output folder")->required();
  cmd->add_option("--db", args->db, "Database type: lmdb or leveldb")->capture_default_str();
  auto* source = cmd->add_option("--source", args->source, source_help);
  if (args->source.empty()) {
    source->required();
  } else {
    source->capture_default_str();
  }
  cmd->add_flag("--encoded", args->encoded, "Store PNG-encoded images instead of raw pixels");
  cmd->callback([args, run] {
    const data::DbType type = data::parseDbType(args->db);
    const auto start = std::chrono::steady_clock::now();
    const data::ConvertStats stats = run(args->source, args->out, type, args->encoded);
    spdlog::info("wrote {} train and {} test records ({}{}) to {} in {:.2f} s", stats.train,
                 stats.test, data::toString(type), args->encoded ? ", PNG-encoded" : "", args->out,
                 secondsSince(start));
  });
}

void addImages(CLI::App& convert) {
  struct Args {
    std::string list;
    std::string root;
    std::string out;
    std::string db = "lmdb";
    data::ImagesetOptions options;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = convert.add_subcommand(
      "images", "A list of 'path label' lines -> one database (as Caffe's convert_imageset)");
  cmd->add_option("LISTFILE", args->list, "Lines 'relative/path.jpg LABEL'")->required();
  cmd->add_option("ROOT", args->root, "Folder the paths are relative to")->required();
  cmd->add_option("--out", args->out, "Output database folder")->required();
  cmd->add_option("--db", args->db, "Database type: lmdb or leveldb")->capture_default_str();
  cmd->add_flag("--shuffle", args->options.shuffle, "Shuffle the lines (deterministic by --seed)");
  cmd->add_option("--seed", args->options.seed, "Seed of --shuffle")->capture_default_str();
  cmd->add_option("--resize_height", args->options.resize_height, "Resize to this height")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--resize_width", args->options.resize_width, "Resize to this width")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--resize", args->options.resize_short,
                  "Resize the short side to this, keeping the aspect ratio (antialiased; for "
                  "variable-size --encoded records, e.g. 256 for ImageNet)")
      ->check(CLI::PositiveNumber)
      ->excludes("--resize_height")
      ->excludes("--resize_width");
  cmd->add_flag("--gray", args->options.gray, "One gray channel instead of BGR");
  cmd->add_flag("--encoded", args->options.encoded, "Store encoded images");
  cmd->add_option("--encode_type", args->options.encode_type,
                  "With --encoded: jpg or png (default: keep each file's format)")
      ->check(CLI::IsMember({"jpg", "png"}));
  cmd->add_option("--max_image_pixels", args->options.max_image_pixels,
                  "An image whose header declares more pixels (height x width) is bad")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max_image_bytes", args->options.max_image_bytes,
                  "An image file of more bytes is bad (read no further than its size)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--skip-bad-images,--skip_bad_images", args->options.skip_bad_images,
                "Skip (and count) bad images, as Caffe's convert_imageset, instead of failing");
  cmd->callback([args] {
    args->options.type = data::parseDbType(args->db);
    const auto start = std::chrono::steady_clock::now();
    const data::ImagesetStats stats =
        data::convertImageset(args->list, args->root, args->out, args->options);
    for (const auto& why : stats.first_skipped)
      spdlog::warn("skipped: {}", why);
    if (stats.skipped > static_cast<std::int64_t>(stats.first_skipped.size())) {
      spdlog::warn("skipped {} more bad images", stats.skipped - stats.first_skipped.size());
    }
    spdlog::info("wrote {} records ({}{}) to {} in {:.2f} s{}", stats.written,
                 data::toString(args->options.type), args->options.encoded ? ", encoded" : "",
                 args->out, secondsSince(start),
                 stats.skipped > 0 ? fmt::format("; skipped {} bad images", stats.skipped) : "");
  });
}

void addText(CLI::App& convert) {
  auto o = std::make_shared<data::TextConvertOptions>();
  auto* cmd = convert.add_subcommand(
      "text",
      "Text files -> token shards in llm.c's .bin format, byte-level tokens (vocabulary 256) or "
      "GPT-2's BPE (--vocab, --merges): OUT/NAME_val_000000.bin, then OUT/NAME_train_000001.bin "
      "...");
  cmd->add_option("FILES", o->files, "Text files (gzipped too), read as bytes in this order")
      ->required();
  cmd->add_option("--out", o->out, "Output folder")->required();
  cmd->add_option("--name", o->name, "The shards' names")->capture_default_str();
  cmd->add_option("--val_fraction", o->val_fraction,
                  "The share of the tokens, from the start, in the validation shard")
      ->capture_default_str();
  cmd->add_option("--shard_size", o->shard_tokens, "A train shard's most tokens")
      ->capture_default_str();
  cmd->add_option("--vocab", o->vocab,
                  "GPT-2's BPE: its vocabulary (encoder.json, or a byte-level BPE's vocab.json)");
  cmd->add_option("--merges", o->merges,
                  "GPT-2's BPE: its merges (vocab.bpe, or a byte-level BPE's merges.txt)");
  cmd->callback([o] {
    const auto start = std::chrono::steady_clock::now();
    const data::TextConvertStats stats = data::convertText(*o);
    spdlog::info(
        "wrote {} validation and {} training tokens ({}; {} train shard(s)) to {} in {:.2f} s; "
        "train with --vocab_size {}",
        stats.val_tokens, stats.train_tokens, o->vocab.empty() ? "byte-level" : "GPT-2's BPE",
        stats.train_shards, o->out, secondsSince(start), stats.vocab_size);
  });
}

}  // namespace

void addConvertCommand(CLI::App& app) {
  auto* convert = app.add_subcommand(
      "convert", "Convert a data set into LMDB/LevelDB databases, or text into token shards");
  convert->require_subcommand(1);
  addTrainTestSet(*convert, "fashion-mnist",
                  "Fashion-MNIST IDX files -> OUT/train (60000) and OUT/test (10000)",
                  "Folder with the IDX files (gzipped or not)", "/usr/share/datasets/fashion-mnist",
                  data::convertFashionMnist);
  addTrainTestSet(*convert, "cifar10",
                  "CIFAR-10's binary files -> OUT/train (50000) and OUT/test (10000), BGR 32x32",
                  "Folder with data_batch_1.bin .. data_batch_5.bin and test_batch.bin (or the "
                  "folder holding cifar-10-batches-bin)",
                  "", data::convertCifar10);
  addImages(*convert);
  addText(*convert);
}

}  // namespace troupe::apps
