// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) with troupe's own
// writers: frames from the wire codec and the transport's encoder, Datum records from the
// Fashion-MNIST and image-list converters, a checkpoint from saveCheckpoint, token shards from
// writeTokenShard (GPT-2's and Llama 3's layouts). The config seeds are
// the repository's configs/*.toml, which make_seeds.sh copies.
// Usage: troupe_fuzz_seeds FASHION_MNIST_DIR CORPUS_DIR
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "actors/core/messages.h"
#include "actors/core/wire_codec.h"
#include "actors/roles/ring_allreduce.h"
#include "actors/run/checkpoint.h"
#include "data/convert.h"
#include "data/datum.h"
#include "data/db.h"
#include "data/image.h"
#include "data/token_shards.h"
#include "transport/message_state.h"
#include "troupe/error.h"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

void writeFile(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw IoError("cannot write " + path.string());
  std::cout << path.string() << ": " << bytes.size() << " bytes\n";
}

kernels::Tensor ramp(std::int64_t n, float scale) {
  auto t = kernels::Tensor::host({n});
  for (std::int64_t i = 0; i < n; ++i)
    t.f32()[i] = scale * static_cast<float>(i) - 1.0f;
  return t;
}

// The bytes the transport writes for one message: its frame and any bulk chunks.
std::string frameBytes(transport::OutgoingMessage message, const transport::EncodeLimits& limits) {
  auto encoded = transport::encodeMessage(
      std::shared_ptr<transport::OutgoingMessage::State>(message.takeState()), limits);
  std::string out;
  for (auto piece : encoded.pieces)
    out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  return out;
}

template <typename M>
std::string actorFrame(M message, const transport::EncodeLimits& limits) {
  actors::Typed<M> envelope(std::move(message));
  return frameBytes(actors::encodeMessage({1, 3}, {0, 2}, envelope), limits);
}

void writeFrames(const fs::path& dir) {
  const transport::TransportOptions options;
  const transport::EncodeLimits limits{options.maxFrameBytes, options.inlineTensorBytes,
                                       options.bulkChunkBytes};
  // Small enough that a 24-float tensor goes as a bulk part in 40-byte chunks.
  const transport::EncodeLimits bulkLimits{4096, 48, 40};

  transport::OutgoingMessage hello;
  auto frame = hello.frame();
  frame.setSourceNode(1);
  auto h = frame.initHello();
  h.setNode(1);
  h.setRunId("r1");
  h.setAddress("tcp://127.0.0.1:29500;unix:///tmp/troupe/node1.sock");
  const std::string helloBytes = frameBytes(std::move(hello), limits);
  writeFile(dir / "hello", helloBytes);

  actors::GradBucket bucket;
  bucket.step = 7;
  bucket.end = 16;
  bucket.grads = ramp(16, 0.125f);
  writeFile(dir / "grad_bucket", actorFrame(std::move(bucket), limits));
  actors::Weights weights;
  weights.step = 8;
  weights.weights = ramp(24, 0.5f);
  weights.buffers = ramp(8, 0.25f);
  writeFile(dir / "weights_bulk", actorFrame(std::move(weights), bulkLimits));
  actors::RingChunk chunk;
  chunk.step = 9;
  chunk.bucket = 32;
  chunk.offset = 40;
  chunk.segment = 1;
  chunk.chunk = 2;
  chunk.round = 1;
  chunk.phase = actors::RingChunk::kAllGather;
  chunk.data = ramp(8, 1.0f);
  // A link's first frames: the Hello, then messages back to back.
  writeFile(dir / "link",
            helloBytes + actorFrame(actors::StepDone{9, 1, 2.5, 30, 32}, limits) +
                actorFrame(chunk, limits) +
                actorFrame(actors::PullReply{10, 0, 6, ramp(6, 0.5f), ramp(6, 0.1f)}, bulkLimits) +
                actorFrame(actors::Shutdown{}, limits));
}

std::string firstRecord(const std::string& db) {
  auto reader = data::openDb(db, data::DbType::kLmdb);
  return reader->get(reader->keys().front());
}

void writeDatums(const std::string& fashionMnist, const fs::path& dir, const fs::path& work) {
  data::convertFashionMnist(fashionMnist, (work / "raw").string(), data::DbType::kLmdb, false);
  data::convertFashionMnist(fashionMnist, (work / "png").string(), data::DbType::kLmdb, true);
  const std::string raw = firstRecord((work / "raw" / "train").string());
  const std::string png = firstRecord((work / "png" / "train").string());
  writeFile(dir / "fashion_mnist_raw", raw);
  writeFile(dir / "fashion_mnist_png", png);

  // The same image through convert_imageset's path: a PNG file in a list, stored as JPEG (gray and
  // color) and as a color PNG.
  caffe::Datum datum;
  datum.ParseFromString(png);
  writeFile(work / "images" / "shirt.png", datum.data());
  std::ofstream(work / "list.txt") << "shirt.png " << datum.label() << "\n";
  const auto imageset = [&](const std::string& name, const std::string& type, bool gray) {
    data::ImagesetOptions options;
    options.encoded = true;
    options.encode_type = type;
    options.gray = gray;
    const auto db = work / ("imageset_" + name);
    data::convertImageset((work / "list.txt").string(), (work / "images").string(), db.string(),
                          options);
    writeFile(dir / ("imageset_" + name), firstRecord(db.string()));
  };
  imageset("gray_jpg", "jpg", true);
  imageset("color_jpg", "jpg", false);
  imageset("color_png", "png", false);
}

void writeCheckpoint(const fs::path& dir, const fs::path& work) {
  // The meta keys the coordinator writes; tensors small enough for a seed.
  actors::Checkpoint ck;
  ck.meta = {{"model", "mlp"},
             {"step", "1875"},
             {"epoch", "2"},
             {"num_params", "12"},
             {"global_batch", "64"},
             {"steps_per_epoch", "937"},
             {"seed", "1"},
             {"cumulative_time_spent", "12.345678"},
             {"cumulative_input_count", "120000"}};
  ck.weights = ramp(12, 0.25f);
  ck.state = ramp(12, 0.01f);
  ck.buffers = ramp(4, 1.0f);
  const auto path = work / "mlp_epoch2.ckpt";
  actors::saveCheckpoint(path.string(), ck);
  std::ifstream in(path, std::ios::binary);
  writeFile(dir / "mlp_epoch2", std::string(std::istreambuf_iterator<char>(in), {}));
}

// Token shards: byte-level tokens of a sentence (GPT-2's layout) and tokens past 16 bits (Llama
// 3's).
void writeTokenShards(const fs::path& dir) {
  fs::create_directories(dir);
  data::writeTokenShard((dir / "bytes").string(), data::byteTokens("The quick brown fox.\n"));
  data::writeTokenShard((dir / "wide").string(), std::vector<std::uint32_t>{128000, 9906, 13});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " FASHION_MNIST_DIR CORPUS_DIR\n";
    return 2;
  }
  const fs::path corpus = argv[2];
  const fs::path work =
      fs::temp_directory_path() / ("troupe_fuzz_seeds." + std::to_string(::getpid()));
  try {
    fs::create_directories(work);
    writeFrames(corpus / "frame");
    writeDatums(argv[1], corpus / "datum", work);
    writeCheckpoint(corpus / "checkpoint", work);
    writeTokenShards(corpus / "token_shard");
  } catch (const std::exception& e) {
    std::cerr << "troupe_fuzz_seeds: " << e.what() << "\n";
    fs::remove_all(work);
    return 1;
  }
  fs::remove_all(work);
  return 0;
}
