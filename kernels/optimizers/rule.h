// What an optimizer's element-wise update rule is made of, shared by the CPU loops and the CUDA
// kernels (kernels/cuda/update_kernels.cu compiles the same rules): plain C++17, no troupe types.
//
// A rule is a struct with
//   static constexpr const char* kName;  // the backends' name of it (CUDA: update_kernels.cu)
//   static constexpr int kStates;        // state values per weight (Adam's two moments)
//   static constexpr bool kLayerwise;    // a trust ratio per layer (LARS, LAMB)
//   TROUPE_HD static float update(float w, float g, StateRef s, const UpdateScalars& c,
//                                 float decay, float ratio);
//     the new weight; updates the element's state in place. `decay` is the weight decay of this
//     element (0 where the run exempts it), `ratio` its layer's trust ratio (1 where none).
// Its scalars (UpdateScalars::c) are the settings its table row lists, in that order, then what
// the row's at_step adds (kernels/optimizers/rule_optimizer.h). And, for a layerwise rule,
//   TROUPE_HD static float probe(float w, float g, StateRef s, const UpdateScalars& c,
//                                float decay);
//     the value whose norm over a layer enters its trust ratio (state not changed);
//   TROUPE_HD static float ratio(float w_norm, float probe_norm, const UpdateScalars& c,
//                                float decay);
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TROUPE_HD __host__ __device__ __forceinline__
#else
#define TROUPE_HD inline
#endif

namespace troupe::kernels {

// The scalars of one update, the same for every element: the learning rate and weight decay of
// the step, and the rule's own (betas, epsilon, bias corrections), in an order the rule defines.
struct UpdateScalars {
  float lr = 0;
  float weight_decay = 0;
  float c[6] = {0, 0, 0, 0, 0, 0};
};

// The state of one element: value k is at p[k * stride] (the optimizer's state is k rows of its
// weights' size).
struct StateRef {
  float* p;
  std::int64_t stride;
  TROUPE_HD float& operator[](int k) const { return p[k * stride]; }
};

}  // namespace troupe::kernels
