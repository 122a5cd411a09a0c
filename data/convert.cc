#include "data/convert.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <optional>

#include "data/bpe.h"
#include "data/dataset.h"
#include "data/datum.h"
#include "data/files.h"
#include "data/image.h"
#include "data/image_transform.h"
#include "data/token_shards.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

namespace fs = std::filesystem;

// Reads a whole file, gunzipping it if it is gzipped (zlib passes other files through).
std::string readMaybeGzipped(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw IoError(detail::concat("cannot open '", path, "'"));
  gzbuffer(file, 1 << 20);
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(file, buffer, sizeof buffer);
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      throw InputError(detail::concat("file '", path, "' does not read as gzip: ", message));
    }
    if (n == 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  gzclose(file);
  return out;
}

std::string findIdxFile(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {name + ".gz", name}) {
    const fs::path path = fs::path(dir) / candidate;
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return path.string();
  }
  throw InputError(detail::concat("Fashion-MNIST folder '", dir, "' has neither '", name,
                                  ".gz' nor '", name, "'"));
}

std::uint32_t bigEndian32(const std::string& bytes, std::size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + offset;
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

struct IdxSet {
  std::string images_path;
  std::string labels_path;
  std::string images;  // whole file, header included
  std::string labels;
  std::int64_t count = 0;
  int rows = 0;
  int cols = 0;

  std::string_view image(std::int64_t i) const {
    const std::size_t size = static_cast<std::size_t>(rows) * cols;
    return std::string_view(images).substr(16 + static_cast<std::size_t>(i) * size, size);
  }
  int label(std::int64_t i) const {
    return static_cast<unsigned char>(labels[8 + static_cast<std::size_t>(i)]);
  }
};

constexpr std::uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr int kFashionMnistLabels = 10;

IdxSet readIdxSet(const std::string& dir, const std::string& prefix) {
  IdxSet set;
  set.images_path = findIdxFile(dir, prefix + "-images-idx3-ubyte");
  set.labels_path = findIdxFile(dir, prefix + "-labels-idx1-ubyte");
  set.images = readMaybeGzipped(set.images_path);
  set.labels = readMaybeGzipped(set.labels_path);

  if (set.images.size() < 16 || bigEndian32(set.images, 0) != kIdxImagesMagic) {
    throw InputError(detail::concat("file '", set.images_path,
                                    "' is not an IDX image file (magic number 0x00000803)"));
  }
  if (set.labels.size() < 8 || bigEndian32(set.labels, 0) != kIdxLabelsMagic) {
    throw InputError(detail::concat("file '", set.labels_path,
                                    "' is not an IDX label file (magic number 0x00000801)"));
  }
  set.count = bigEndian32(set.images, 4);
  set.rows = static_cast<int>(bigEndian32(set.images, 8));
  set.cols = static_cast<int>(bigEndian32(set.images, 12));
  const std::int64_t label_count = bigEndian32(set.labels, 4);
  if (set.rows <= 0 || set.cols <= 0 || set.rows > 65536 || set.cols > 65536) {
    throw InputError(detail::concat("file '", set.images_path, "' declares images of ", set.rows,
                                    "x", set.cols));
  }
  if (set.count != label_count) {
    throw InputError(detail::concat("file '", set.images_path, "' holds ", set.count,
                                    " images but '", set.labels_path, "' holds ", label_count,
                                    " labels"));
  }
  const std::size_t images_size =
      16 + static_cast<std::size_t>(set.count) * static_cast<std::size_t>(set.rows) * set.cols;
  if (set.images.size() != images_size) {
    throw InputError(detail::concat("file '", set.images_path, "' has ", set.images.size(),
                                    " bytes, expected ", images_size, " for ", set.count,
                                    " images of ", set.rows, "x", set.cols));
  }
  if (set.labels.size() != 8 + static_cast<std::size_t>(set.count)) {
    throw InputError(detail::concat("file '", set.labels_path, "' has ", set.labels.size(),
                                    " bytes, expected ", 8 + set.count, " for ", set.count,
                                    " labels"));
  }
  for (std::int64_t i = 0; i < set.count; ++i) {
    if (set.label(i) >= kFashionMnistLabels) {
      throw InputError(detail::concat("file '", set.labels_path, "' has label ", set.label(i),
                                      " at index ", i, ", expected 0..", kFashionMnistLabels - 1));
    }
  }
  return set;
}

// createDb's refusal, checked for every output before anything is written.
void checkNewDb(const std::string& path, DbType type) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  if (!fs::is_directory(path, ec) || !fs::is_empty(path, ec)) {
    throw InputError(detail::concat("cannot create ", toString(type), " database '", path,
                                    "': it exists already"));
  }
}

std::int64_t writeIdxSet(const IdxSet& set, DbWriter& db, bool encoded) {
  caffe::Datum datum;
  datum.set_channels(1);
  datum.set_height(set.rows);
  datum.set_width(set.cols);
  datum.set_encoded(encoded);
  Image image;
  image.channels = 1;
  image.height = set.rows;
  image.width = set.cols;
  std::string value;
  for (std::int64_t i = 0; i < set.count; ++i) {
    const std::string_view pixels = set.image(i);
    if (encoded) {
      image.pixels.assign(pixels.begin(), pixels.end());
      datum.set_data(encodePng(image));
    } else {
      datum.set_data(pixels.data(), pixels.size());
    }
    datum.set_label(set.label(i));
    datum.SerializeToString(&value);
    db.put(fmt::format("{:08d}", i), value);
  }
  return set.count;
}

constexpr int kCifarSide = 32;
constexpr std::size_t kCifarPlane = kCifarSide * kCifarSide;
constexpr std::size_t kCifarRecord = 1 + 3 * kCifarPlane;  // a label byte, then R, G, B planes
constexpr int kCifarLabels = 10;

struct CifarFile {
  std::string path;
  std::string bytes;
};

std::vector<CifarFile> readCifarFiles(const std::string& dir,
                                      const std::vector<std::string>& names) {
  std::vector<CifarFile> files;
  for (const auto& name : names) {
    CifarFile file;
    file.path = (fs::path(dir) / name).string();
    std::error_code ec;
    if (!fs::is_regular_file(file.path, ec)) {
      throw InputError(detail::concat("CIFAR-10 folder '", dir, "' has no '", name, "'"));
    }
    file.bytes = readMaybeGzipped(file.path);
    if (file.bytes.empty() || file.bytes.size() % kCifarRecord != 0) {
      throw InputError(detail::concat("file '", file.path, "' has ", file.bytes.size(),
                                      " bytes, not a whole number of CIFAR-10 records of ",
                                      kCifarRecord, " bytes"));
    }
    for (std::size_t r = 0; r < file.bytes.size() / kCifarRecord; ++r) {
      const int label = static_cast<unsigned char>(file.bytes[r * kCifarRecord]);
      if (label >= kCifarLabels) {
        throw InputError(detail::concat("file '", file.path, "' has label ", label, " at record ",
                                        r, ", expected 0..", kCifarLabels - 1));
      }
    }
    files.push_back(std::move(file));
  }
  return files;
}

std::int64_t writeCifarSet(const std::vector<CifarFile>& files, DbWriter& db, bool encoded) {
  caffe::Datum datum;
  datum.set_channels(3);
  datum.set_height(kCifarSide);
  datum.set_width(kCifarSide);
  datum.set_encoded(encoded);
  Image image;
  image.channels = 3;
  image.height = image.width = kCifarSide;
  image.pixels.resize(3 * kCifarPlane);
  std::string planes(3 * kCifarPlane, '\0'), value;
  std::int64_t index = 0;
  for (const auto& file : files) {
    for (std::size_t at = 0; at < file.bytes.size(); at += kCifarRecord) {
      const char* rgb = file.bytes.data() + at + 1;
      for (int c = 0; c < 3; ++c)  // BGR plane c is CIFAR's plane 2 - c
        std::copy_n(rgb + (2 - c) * kCifarPlane, kCifarPlane, planes.data() + c * kCifarPlane);
      if (encoded) {
        for (std::size_t j = 0; j < kCifarPlane; ++j) {
          for (int c = 0; c < 3; ++c)
            image.pixels[3 * j + c] = static_cast<std::uint8_t>(planes[c * kCifarPlane + j]);
        }
        datum.set_data(encodePng(image));
      } else {
        datum.set_data(planes);
      }
      datum.set_label(static_cast<unsigned char>(file.bytes[at]));
      datum.SerializeToString(&value);
      db.put(fmt::format("{:05d}", index++), value);
    }
  }
  return index;
}

// out_dir/train and out_dir/test, both checked before either is written, and both published
// once both are written: write(set, writer).
template <typename Set, typename Write>
ConvertStats writeTrainAndTest(const std::string& out_dir, DbType type, const Set& train,
                               const Set& test, Write write) {
  const std::string train_db = (fs::path(out_dir) / "train").string();
  const std::string test_db = (fs::path(out_dir) / "test").string();
  checkNewDb(train_db, type);
  checkNewDb(test_db, type);
  auto train_writer = createDb(train_db, type);
  auto test_writer = createDb(test_db, type);
  ConvertStats stats;
  stats.train = write(train, *train_writer);
  stats.test = write(test, *test_writer);
  train_writer->publish();
  test_writer->publish();
  return stats;
}

struct ListEntry {
  std::string path;
  int label = 0;
  int line = 0;
};

std::vector<ListEntry> readList(const std::string& list_file) {
  std::error_code ec;
  if (!fs::is_regular_file(list_file, ec)) {
    throw InputError(detail::concat("image list '", list_file, "' does not exist"));
  }
  std::ifstream in(list_file);
  if (!in) throw IoError(detail::concat("cannot read image list '", list_file, "'"));
  std::vector<ListEntry> entries;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
      text.pop_back();
    const std::size_t first = text.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    text.erase(0, first);
    const std::size_t split = text.find_last_of(" \t");
    ListEntry entry;
    entry.line = line;
    const char* begin = text.data() + (split == std::string::npos ? 0 : split + 1);
    const char* end = text.data() + text.size();
    const auto [ptr, err] = std::from_chars(begin, end, entry.label);
    if (split == std::string::npos || err != std::errc() || ptr != end || entry.label < 0) {
      throw InputError(detail::concat("image list '", list_file, "' line ", line,
                                      ": expected 'path label' with a label >= 0, got '", text,
                                      "'"));
    }
    entry.path = text.substr(0, split);
    while (!entry.path.empty() && (entry.path.back() == ' ' || entry.path.back() == '\t')) {
      entry.path.pop_back();
    }
    entries.push_back(std::move(entry));
  }
  if (in.bad()) throw IoError(detail::concat("cannot read image list '", list_file, "'"));
  return entries;
}

ImageFormat formatFromName(std::string name, const std::string& what) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (!name.empty() && name.front() == '.') name.erase(0, 1);
  if (name == "jpg" || name == "jpeg") return ImageFormat::kJpeg;
  if (name == "png") return ImageFormat::kPng;
  throw InputError(detail::concat(what, ": cannot encode as '", name, "' (known: jpg, png)"));
}

// InputError for sizes that contradict each other and limits below 1, before anything is read.
void checkImagesetOptions(const ImagesetOptions& options) {
  if ((options.resize_height > 0) != (options.resize_width > 0) || options.resize_height < 0 ||
      options.resize_width < 0) {
    throw InputError(detail::concat("resize needs both a height and a width > 0, got ",
                                    options.resize_height, "x", options.resize_width));
  }
  if (options.resize_short < 0 || (options.resize_short > 0 && options.resize_height > 0)) {
    throw InputError(detail::concat(
        "resize (the short side) must be > 0 and excludes resize_height and resize_width, got ",
        options.resize_short, " with ", options.resize_height, "x", options.resize_width));
  }
  if (options.max_image_pixels < 1 || options.max_image_bytes < 1) {
    throw InputError(detail::concat("max_image_pixels and max_image_bytes must be > 0, got ",
                                    options.max_image_pixels, " and ", options.max_image_bytes));
  }
}

// The list's entries in the order `seed` shuffles their indices to.
std::vector<ListEntry> shuffled(std::vector<ListEntry> entries, std::uint64_t seed) {
  std::vector<std::int64_t> order(entries.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = static_cast<std::int64_t>(i);
  SplitMix64 rng(seed);
  shuffle(order, rng);
  std::vector<ListEntry> out;
  out.reserve(entries.size());
  for (std::int64_t i : order)
    out.push_back(std::move(entries[static_cast<std::size_t>(i)]));
  return out;
}

// An image file of the list as read: its bytes, their format and the size its header gives.
struct ImageFile {
  std::string bytes;
  ImageFormat format = ImageFormat::kUnknown;
  ImageInfo info;
};

// The image file at path, decoded into `image` with `channels` and resized as options ask;
// InputError (without the list's line) if it is bad.
ImageFile readImage(const std::string& path, const ImagesetOptions& options, int channels,
                    Image& image) {
  ImageFile file;
  file.bytes =
      readRegularFile(path, "image", options.max_image_bytes,
                      detail::concat("max_image_bytes (", options.max_image_bytes, " bytes)"));
  file.format = sniffImageFormat(file.bytes);
  try {
    if (file.format == ImageFormat::kUnknown) throw InputError("is not a JPEG or PNG image");
    file.info = probeImage(file.bytes);
    decodeImage(file.bytes, channels, image, options.max_image_pixels);
  } catch (const InputError& e) {
    throw InputError(detail::concat("image '", path, "' ", e.what()));
  } catch (const std::bad_alloc&) {
    throw InputError(detail::concat("image '", path, "' (", file.info.width, "x", file.info.height,
                                    ") does not fit in memory decoded"));
  }
  if (options.resize_short > 0) {
    const ImageSize size = shortSideResized(image.height, image.width, options.resize_short);
    image = resizeAntialiased(image, size.height, size.width);
  } else if (options.resize_height > 0) {
    image = resizeBilinear(image, options.resize_height, options.resize_width);
  }
  return file;
}

// An H x W x C image's pixels as a raw Datum's data, C x H x W.
void setRawPixels(const Image& image, caffe::Datum& datum) {
  std::string* data = datum.mutable_data();
  const int c = image.channels;
  const std::size_t plane = static_cast<std::size_t>(image.height) * image.width;
  data->resize(plane * c);
  for (int k = 0; k < c; ++k) {
    for (std::size_t j = 0; j < plane; ++j) {
      (*data)[k * plane + j] = static_cast<char>(image.pixels[j * c + k]);
    }
  }
}

// The image at path as a Datum in `datum` (`image` holding its pixels); InputError (without the
// list's line) if it is bad. An encoded record keeps the file as it is where nothing changed it.
void toDatum(const ListEntry& entry, const std::string& path, const ImagesetOptions& options,
             const std::optional<ImageFormat>& encode_as, Image& image, caffe::Datum& datum) {
  const int channels = options.gray ? 1 : 3;
  const bool resize = options.resize_height > 0 || options.resize_short > 0;
  const ImageFile file = readImage(path, options, channels, image);
  datum.Clear();
  datum.set_label(entry.label);
  datum.set_channels(image.channels);
  datum.set_height(image.height);
  datum.set_width(image.width);
  if (!options.encoded) {
    setRawPixels(image, datum);
    return;
  }
  const ImageFormat target =
      encode_as ? *encode_as : formatFromName(fs::path(entry.path).extension().string(), path);
  datum.set_encoded(true);
  if (!resize && file.info.channels == channels && file.format == target) {
    datum.set_data(file.bytes);  // the file as it is
  } else {
    datum.set_data(target == ImageFormat::kPng ? encodePng(image) : encodeJpeg(image));
  }
}

}  // namespace

ConvertStats convertFashionMnist(const std::string& source_dir, const std::string& out_dir,
                                 DbType type, bool encoded) {
  std::error_code ec;
  if (!fs::is_directory(source_dir, ec)) {
    throw InputError(detail::concat("Fashion-MNIST folder '", source_dir, "' does not exist"));
  }
  const IdxSet train = readIdxSet(source_dir, "train");
  const IdxSet test = readIdxSet(source_dir, "t10k");
  return writeTrainAndTest(out_dir, type, train, test, [&](const IdxSet& set, DbWriter& db) {
    return writeIdxSet(set, db, encoded);
  });
}

ConvertStats convertCifar10(const std::string& source_dir, const std::string& out_dir, DbType type,
                            bool encoded) {
  std::error_code ec;
  if (!fs::is_directory(source_dir, ec)) {
    throw InputError(detail::concat("CIFAR-10 folder '", source_dir, "' does not exist"));
  }
  std::string dir = source_dir;
  const fs::path inner = fs::path(source_dir) / "cifar-10-batches-bin";
  if (!fs::exists(fs::path(dir) / "test_batch.bin", ec) && fs::is_directory(inner, ec)) {
    dir = inner.string();
  }
  std::vector<std::string> train_names;
  for (int b = 1; b <= 5; ++b)
    train_names.push_back(fmt::format("data_batch_{}.bin", b));
  const auto train = readCifarFiles(dir, train_names);
  const auto test = readCifarFiles(dir, {"test_batch.bin"});
  return writeTrainAndTest(out_dir, type, train, test,
                           [&](const std::vector<CifarFile>& set, DbWriter& db) {
                             return writeCifarSet(set, db, encoded);
                           });
}

ImagesetStats convertImageset(const std::string& list_file, const std::string& root,
                              const std::string& out_db, const ImagesetOptions& options) {
  checkImagesetOptions(options);
  std::optional<ImageFormat> encode_as;
  if (!options.encode_type.empty()) encode_as = formatFromName(options.encode_type, "convert");
  std::vector<ListEntry> entries = readList(list_file);
  if (options.shuffle) entries = shuffled(std::move(entries), options.seed);

  auto db = createDb(out_db, options.type);
  caffe::Datum datum;
  Image image;
  std::string value;
  std::optional<ImageInfo> raw_shape;
  ImagesetStats stats;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ListEntry& entry = entries[i];
    const std::string path = root.empty() ? entry.path : (fs::path(root) / entry.path).string();
    const auto where = [&] { return detail::concat("list '", list_file, "' line ", entry.line); };
    try {
      toDatum(entry, path, options, encode_as, image, datum);
    } catch (const InputError& e) {
      if (!options.skip_bad_images) throw InputError(detail::concat(e.what(), " (", where(), ")"));
      if (stats.first_skipped.size() < ImagesetStats::kNamed) {
        stats.first_skipped.push_back(detail::concat(e.what(), " (", where(), ")"));
      }
      ++stats.skipped;
      continue;
    }
    if (!options.encoded) {
      if (!raw_shape) raw_shape = ImageInfo{image.height, image.width, image.channels};
      if (image.height != raw_shape->height || image.width != raw_shape->width) {
        throw InputError(detail::concat("image '", path, "' (", where(), ") is ", image.height, "x",
                                        image.width, ", the first image ", raw_shape->height, "x",
                                        raw_shape->width,
                                        "; raw records must share one size (use --resize_height "
                                        "and --resize_width)"));
      }
    }
    datum.SerializeToString(&value);
    db->put(fmt::format("{:08d}_{}", i, entry.path), value);
    ++stats.written;
  }
  if (stats.written == 0 && stats.skipped > 0) {
    throw InputError(detail::concat("no image of list '", list_file, "' could be converted: all ",
                                    stats.skipped,
                                    " were bad, the first: ", stats.first_skipped.front()));
  }
  db->publish();
  return stats;
}

TextConvertStats convertText(const TextConvertOptions& o) {
  if (!std::isfinite(o.val_fraction) || o.val_fraction < 0 || o.val_fraction >= 1) {
    throw InputError(fmt::format("--val_fraction {}: expected a number in [0, 1)", o.val_fraction));
  }
  if (o.shard_tokens < 1) {
    throw InputError(fmt::format("--shard_size {}: expected at least 1 token", o.shard_tokens));
  }
  if (o.files.empty()) throw InputError("convert text: no text files given");
  if (o.vocab.empty() != o.merges.empty()) {
    throw InputError(
        fmt::format("convert text: GPT-2's BPE needs its vocabulary and its merges "
                    "(--vocab and --merges); only --{} was given",
                    o.vocab.empty() ? "merges" : "vocab"));
  }
  std::optional<Gpt2Tokenizer> bpe;
  if (!o.vocab.empty()) bpe = Gpt2Tokenizer::load(o.vocab, o.merges);
  std::string text;                   // bytes: every file's text
  std::vector<std::uint32_t> tokens;  // BPE: every file's tokens (its text read one at a time)
  bool any_text = false;
  for (const auto& file : o.files) {
    checkRegularFile(file, "text file");  // a FIFO or a folder refused, not read
    std::string document = readMaybeGzipped(file);
    any_text = any_text || !document.empty();
    if (!bpe) {
      text += document;
      continue;
    }
    if (const auto eot = bpe->endOfText()) tokens.push_back(*eot);
    const auto ids = bpe->encode(document);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  if (!any_text) {
    throw InputError(fmt::format("convert text: the {} file(s) hold no text", o.files.size()));
  }
  std::error_code ec;
  if (fs::exists(o.out, ec)) {
    for (const auto& entry : fs::directory_iterator(o.out, ec)) {
      if (entry.path().extension() == ".bin") {
        throw InputError(fmt::format("convert text: '{}' holds token shards already ({})", o.out,
                                     entry.path().filename().string()));
      }
    }
  }
  fs::create_directories(o.out, ec);
  if (ec) throw IoError(fmt::format("cannot create '{}': {}", o.out, ec.message()));

  // A byte is a token: each shard's tokens are made from its part of the text as it is written,
  // so that memory holds the text and one shard, not every token. BPE's are all made already.
  const auto total = static_cast<std::int64_t>(bpe ? tokens.size() : text.size());
  TextConvertStats stats;
  if (bpe) stats.vocab_size = bpe->vocabSize();
  stats.val_tokens = static_cast<std::int64_t>(std::floor(o.val_fraction * total));
  stats.train_tokens = total - stats.val_tokens;
  const auto write = [&](const std::string& split, int index, std::int64_t begin, std::int64_t n) {
    const auto path = fs::path(o.out) / fmt::format("{}_{}_{:06d}.bin", o.name, split, index);
    const auto at = static_cast<std::size_t>(begin), count = static_cast<std::size_t>(n);
    if (bpe) {
      writeTokenShard(path.string(), std::span<const std::uint32_t>(tokens).subspan(at, count));
    } else {
      writeTokenShard(path.string(), byteTokens(std::string_view(text).substr(at, count)));
    }
  };
  write("val", 0, 0, stats.val_tokens);
  for (std::int64_t begin = stats.val_tokens; begin < total; begin += o.shard_tokens)
    write("train", ++stats.train_shards, begin, std::min(o.shard_tokens, total - begin));
  return stats;
}

}  // namespace troupe::data
