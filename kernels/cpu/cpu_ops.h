// Factories of the CPU ops (private to kernels/cpu; the public entry is makeCpuBackend).
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace troupe::kernels::cpu {

struct DnnlContext;

std::unique_ptr<ConvOp> makeConv(const ConvGeometry& g, int threads, DnnlContext& dnnl);
std::unique_ptr<PoolOp> makePool(const PoolGeometry& g, int threads);
std::unique_ptr<InnerProductOp> makeInnerProduct(const InnerProductGeometry& g, int threads);
std::unique_ptr<BatchNormOp> makeBatchNorm(const BatchNormGeometry& g, int threads);
std::unique_ptr<ReluOp> makeRelu(std::int64_t numel, int threads);
std::unique_ptr<DropoutOp> makeDropout(std::int64_t numel, float ratio, int threads);
std::unique_ptr<AddOp> makeAdd(std::int64_t numel, int threads);
std::unique_ptr<GlobalAvgPoolOp> makeGlobalAvgPool(std::int64_t n, std::int64_t channels,
                                                   std::int64_t spatial, int threads);
std::unique_ptr<SoftmaxLossOp> makeSoftmaxLoss(std::int64_t n, std::int64_t classes,
                                               float label_smoothing, int threads);
std::unique_ptr<EmbeddingOp> makeEmbedding(const EmbeddingGeometry& g, int threads);
std::unique_ptr<LayerNormOp> makeLayerNorm(const LayerNormGeometry& g, int threads);
std::unique_ptr<GeluOp> makeGelu(std::int64_t numel, int threads);
std::unique_ptr<AttentionOp> makeAttention(const AttentionGeometry& g, int threads);
std::unique_ptr<LstmOp> makeLstm(const LstmGeometry& g, int threads);

}  // namespace troupe::kernels::cpu
