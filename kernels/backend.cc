// What every backend has by default: the sequence models' ops refused, naming the device, where a
// backend has no kernels for them (a GPU's come later).
#include "kernels/backend.h"

#include <string>

#include "troupe/error.h"

namespace troupe::kernels {
namespace {

[[noreturn]] void noKernel(const Backend& backend, const char* op) {
  throw InputError(std::string(op) + " has no kernel on " + toString(backend.device()) +
                   " yet: sequence models train on the CPU");
}

}  // namespace

std::unique_ptr<EmbeddingOp> Backend::makeEmbedding(const EmbeddingGeometry&) {
  noKernel(*this, "an embedding");
}
std::unique_ptr<LayerNormOp> Backend::makeLayerNorm(const LayerNormGeometry&) {
  noKernel(*this, "layer norm");
}
std::unique_ptr<GeluOp> Backend::makeGelu(std::int64_t) {
  noKernel(*this, "GELU");
}
std::unique_ptr<AttentionOp> Backend::makeAttention(const AttentionGeometry&) {
  noKernel(*this, "self-attention");
}

}  // namespace troupe::kernels
