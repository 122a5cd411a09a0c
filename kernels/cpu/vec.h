// Element-wise loops of the CPU ops, compiled for AVX-512, AVX2 and baseline x86-64 and chosen at
// load time for the CPU at hand (GCC function multiversioning), so the build's baseline ISA stays
// the portable one. Each works on one thread's range; callers split the work.
#pragma once

#include <cstdint>

namespace troupe::kernels::cpu::vec {

// y = max(x, 0).
void reluForward(const float* x, float* y, std::int64_t n);
// dx = dy where y > 0, else 0.
void reluBackward(const float* y, const float* dy, float* dx, std::int64_t n);
// PyTorch's SGD step (see Backend::sgdUpdate). Returns whether every new w[i] is finite, tested
// on the bits in the same pass (fast-math flags cannot fold the test away).
bool sgd(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
         float weight_decay, bool nesterov);
// y += alpha * x.
void axpy(float alpha, const float* x, float* y, std::int64_t n);
// x *= alpha.
void scale(float* x, float alpha, std::int64_t n);
// y = a + b.
void add(const float* a, const float* b, float* y, std::int64_t n);
// y[i] = x[i] + bias (one plane of a bias add).
void addScalar(const float* x, float bias, float* y, std::int64_t n);
// y[r][c] += b[c] for rows r < rows.
void addRowVector(float* y, const float* b, std::int64_t rows, std::int64_t cols);
// s[c] = sum over rows r of x[r * ld + c], for c < cols.
void sumRows(const float* x, std::int64_t ld, float* s, std::int64_t rows, std::int64_t cols);

// GELU in GPT-2's tanh form (kernels/ops.h, GeluOp), its tanh from a polynomial e^x within 2
// ulp: y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and dx = dy y'(x).
void geluForward(const float* x, float* y, std::int64_t n);
void geluBackward(const float* x, const float* dy, float* dx, std::int64_t n);

// y[i] = e^(x[i] - shift) from the same polynomial (shift: the row's largest, for a softmax; a
// value below -87 gives e^-87, not 0), and their sum. x and y may be the same memory.
float expSum(const float* x, float shift, float* y, std::int64_t n);

// One LSTM step's cells, n of them (kernels/ops.h, LstmOp). `gates` holds the pre-activations of
// i, f, g and o, `stride` apart (the layer's hidden size), and becomes their activations: sigmoid
// as 1 / (1 + e^-x) (within 4 ulp), tanh as 1 - 2 / (1 + e^2x) (within 9 u absolute), from the
// polynomial e^x. Then c = f c_prev + i g (c_prev null: 0), tc = tanh(c) and h = o tc.
void lstmCellForward(float* gates, std::int64_t stride, const float* c_prev, float* c, float* tc,
                     float* h, std::int64_t n);
// Its backward: dh is the step's whole output gradient, dc holds the next step's gradient of this
// step's c on entry and this step's of c_prev (dc f) on return; dgates gets the gradients of the
// pre-activations (laid out as gates).
void lstmCellBackward(const float* gates, std::int64_t stride, const float* c_prev, const float* tc,
                      const float* dh, float* dc, float* dgates, std::int64_t n);

// 2x2 stride-2 max pooling of one [h, w] plane (h, w even) into [h/2, w/2], recording each
// window's arg max as an index into the plane.
void maxPool2x2(const float* x, float* y, std::int32_t* argmax, std::int64_t h, std::int64_t w);

// Gradient compression (kernels/compression.h). `accumulate`: y += decoded, else y = decoded.
// Half and bfloat16 round to nearest even (a NaN stays a NaN).
void toHalf(const float* x, std::uint16_t* y, std::int64_t n);
void fromHalf(const std::uint16_t* x, float* y, std::int64_t n, bool accumulate);
void toBfloat16(const float* x, std::uint16_t* y, std::int64_t n);
void fromBfloat16(const std::uint16_t* x, float* y, std::int64_t n, bool accumulate);
// MXNet's 2-bit scheme: v = x + residual becomes +threshold, -threshold or 0, and residual keeps
// v minus that; four codes a byte, element i in bits 2(i % 4) and up of byte i / 4 (0: 0,
// 1: +threshold, 2: -threshold).
void quantize2Bit(const float* x, float* residual, float threshold, std::uint8_t* out,
                  std::int64_t n);
void dequantize2Bit(const std::uint8_t* in, float threshold, float* y, std::int64_t n,
                    bool accumulate);

}  // namespace troupe::kernels::cpu::vec
