// `troupe convert`: builds LMDB/LevelDB databases of Caffe Datum records, from Fashion-MNIST's IDX
// files or from an image list (as Caffe's convert_mnist_data and convert_imageset).
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

void addFashionMnist(CLI::App& convert) {
  struct Args {
    std::string out;
    std::string db = "lmdb";
    std::string source = "/usr/share/datasets/fashion-mnist";
    bool encoded = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = convert.add_subcommand(
      "fashion-mnist", "Fashion-MNIST IDX files -> OUT/train (60000) and OUT/test (10000)");
  cmd->add_option("--out", args->out, "Output folder")->required();
  cmd->add_option("--db", args->db, "Database type: lmdb or leveldb")->capture_default_str();
  cmd->add_option("--source", args->source, "Folder with the IDX files (gzipped or not)")
      ->capture_default_str();
  cmd->add_flag("--encoded", args->encoded, "Store PNG-encoded images instead of raw pixels");
  cmd->callback([args] {
    const data::DbType type = data::parseDbType(args->db);
    const auto start = std::chrono::steady_clock::now();
    const data::ConvertStats stats =
        data::convertFashionMnist(args->source, args->out, type, args->encoded);
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
  cmd->add_flag("--gray", args->options.gray, "One gray channel instead of BGR");
  cmd->add_flag("--encoded", args->options.encoded, "Store encoded images");
  cmd->add_option("--encode_type", args->options.encode_type,
                  "With --encoded: jpg or png (default: keep each file's format)")
      ->check(CLI::IsMember({"jpg", "png"}));
  cmd->callback([args] {
    args->options.type = data::parseDbType(args->db);
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t count =
        data::convertImageset(args->list, args->root, args->out, args->options);
    spdlog::info("wrote {} records ({}{}) to {} in {:.2f} s", count,
                 data::toString(args->options.type), args->options.encoded ? ", encoded" : "",
                 args->out, secondsSince(start));
  });
}

}  // namespace

void addConvertCommand(CLI::App& app) {
  auto* convert = app.add_subcommand("convert", "Convert a data set into an LMDB/LevelDB database");
  convert->require_subcommand(1);
  addFashionMnist(*convert);
  addImages(*convert);
}

}  // namespace troupe::apps
