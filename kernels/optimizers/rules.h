// The optimizers' element-wise rules (kernels/optimizers/rule.h), one struct each: what the CPU's
// loops (kernels/cpu/update_loop.h) and the CUDA kernels (kernels/cuda/update_kernels.cu) compile.
// Each optimizer's file in this folder makes its table row from its rule.
#pragma once

#include <cmath>

#include "kernels/optimizers/rule.h"

namespace troupe::kernels {

// Adam and AdamW's update rule, as torch.optim's: with g' the
// gradient (Adam: plus decay * w; AdamW: w first shrinks by lr * decay),
//   m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;
//   w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// Scalars: c[0] b1, c[1] b2, c[2] eps, c[3] lr / (1 - b1^t), c[4] 1 / sqrt(1 - b2^t),
// c[5] 1 for AdamW's decoupled decay.
struct AdamRule {
  static constexpr const char* kName = "adam";  // as backends know the rule
  static constexpr int kStates = 2;             // exp_avg, exp_avg_sq
  static constexpr bool kLayerwise = false;
  TROUPE_HD static float update(float w, float g, StateRef s, const UpdateScalars& c, float decay,
                                float) {
    // Without a branch, so that the loop vectorises: with c[5] 0 the factor is 1 and the decay
    // goes into the gradient, with c[5] 1 the other way round (each product by 1 or 0 exact).
    const float grad = g + (1.0f - c.c[5]) * decay * w;
    w *= 1.0f - c.c[5] * c.lr * decay;
    const float m = c.c[0] * s[0] + (1.0f - c.c[0]) * grad;
    const float v = c.c[1] * s[1] + (1.0f - c.c[1]) * grad * grad;
    s[0] = m;
    s[1] = v;
    return w - c.c[3] * m / (std::sqrt(v) * c.c[4] + c.c[2]);
  }
};

// RMSProp's and Adagrad's update rule, a weighted running sum of squared gradients:
//   g' = g + decay * w;  v = a v + b g'^2;  w -= lr g' / (sqrt(v) + eps).
// RMSProp, as torch.optim.RMSprop without momentum or centering (MXNet's RMSProp,
// centered=False): a = rho, b = 1 - rho. Adagrad, as torch.optim.Adagrad (lr_decay 0): a = b = 1,
// whose products by 1 are exact, so v is the sum v + g'^2 to the bit.
// Scalars: c[0] a, c[1] eps, c[2] b.
struct SquareSumRule {
  static constexpr const char* kName = "square_sum";  // as backends know the rule
  static constexpr int kStates = 1;                   // square_avg, or sum
  static constexpr bool kLayerwise = false;
  TROUPE_HD static float update(float w, float g, StateRef s, const UpdateScalars& c, float decay,
                                float) {
    const float grad = g + decay * w;
    const float v = c.c[0] * s[0] + c.c[2] * grad * grad;
    s[0] = v;
    return w - c.lr * grad / (std::sqrt(v) + c.c[1]);
  }
};

// LARS's update rule: You, Gitman and Ginsburg 2017, "Large Batch
// Training of Convolutional Networks", as MLPerf's ResNet-50 reference runs it. Per layer,
//   trust = eta ||w|| / (||g|| + decay ||w|| + eps)   (1 where either norm is 0)
//   v = momentum v + lr trust (g + decay w);  w -= v.
// Layers without decay (biases and batch-norm parameters with no_wd) get trust 1: momentum SGD.
// Scalars: c[0] momentum, c[1] eta, c[2] eps.
struct LarsRule {
  static constexpr const char* kName = "lars";  // as backends know the rule
  static constexpr int kStates = 1;             // momentum
  static constexpr bool kLayerwise = true;
  TROUPE_HD static float probe(float, float g, StateRef, const UpdateScalars&, float) { return g; }
  TROUPE_HD static float ratio(float w_norm, float g_norm, const UpdateScalars& c, float decay) {
    if (!(w_norm > 0.0f) || !(g_norm > 0.0f)) return 1.0f;
    return c.c[1] * w_norm / (g_norm + decay * w_norm + c.c[2]);
  }
  TROUPE_HD static float update(float w, float g, StateRef s, const UpdateScalars& c, float decay,
                                float ratio) {
    const float v = c.c[0] * s[0] + c.lr * ratio * (g + decay * w);
    s[0] = v;
    return w - v;
  }
};

// LAMB's update rule: You et al. 2019, "Large Batch Optimization for
// Deep Learning: Training BERT in 76 minutes" (Algorithm 2, with bias correction, as MXNet's LAMB
// and NVIDIA's FusedLAMB):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + decay w;
//   w -= lr (||w|| / ||r||) r   per layer (trust 1 where either norm is 0, or the layer has no
//   decay: biases and normalisation parameters with no_wd).
// Scalars: c[0] b1, c[1] b2, c[2] eps, c[3] 1 / (1 - b1^t), c[4] 1 / (1 - b2^t).
struct LambRule {
  static constexpr const char* kName = "lamb";  // as backends know the rule
  static constexpr int kStates = 2;             // exp_avg, exp_avg_sq
  static constexpr bool kLayerwise = true;
  TROUPE_HD static float direction(float w, float m, float v, const UpdateScalars& c, float decay) {
    return m * c.c[3] / (std::sqrt(v * c.c[4]) + c.c[2]) + decay * w;
  }
  TROUPE_HD static float probe(float w, float g, StateRef s, const UpdateScalars& c, float decay) {
    const float m = c.c[0] * s[0] + (1.0f - c.c[0]) * g;
    const float v = c.c[1] * s[1] + (1.0f - c.c[1]) * g * g;
    return direction(w, m, v, c, decay);
  }
  TROUPE_HD static float ratio(float w_norm, float r_norm, const UpdateScalars&, float) {
    if (!(w_norm > 0.0f) || !(r_norm > 0.0f)) return 1.0f;
    return w_norm / r_norm;
  }
  TROUPE_HD static float update(float w, float g, StateRef s, const UpdateScalars& c, float decay,
                                float ratio) {
    const float m = c.c[0] * s[0] + (1.0f - c.c[0]) * g;
    const float v = c.c[1] * s[1] + (1.0f - c.c[1]) * g * g;
    s[0] = m;
    s[1] = v;
    return w - c.lr * ratio * direction(w, m, v, c, decay);
  }
};

}  // namespace troupe::kernels
