// Direct convolution for layers with few input channels and narrow outputs (LeNet's first layer:
// 1 -> 20, 5x5, 28x28), with AVX-512: one output row (up to 32 pixels, two registers) for a block
// of output channels at a time, every input row loaded once per tap for the whole block. im2col
// + sgemm spends most of its time there copying (K = 25 makes a thin GEMM). Private to
// kernels/cpu.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace troupe::kernels::cpu {

// Whether the kernels below take this geometry on this CPU: stride 1, no padding, outputs at
// most 32 wide, and AVX-512.
bool directConvFits(const ConvGeometry& g);

// y = conv(x, w) + b for `images` images (x: [images, C, H, W], y: [images, OC, OH, OW]); b may be
// null.
void directConvForward(const ConvGeometry& g, const float* x, const float* w, const float* b,
                       float* y, std::int64_t images);

// dw += d(loss)/dw and db += d(loss)/db (db may be null) over `images` images of x and dy.
void directConvWeightGrad(const ConvGeometry& g, const float* x, const float* dy,
                          std::int64_t images, float* dw, float* db);

}  // namespace troupe::kernels::cpu
