// The optimizers' rules (kernels/optimizers/rules.h) as CUDA kernels: one block per chunk of an
// update, a layerwise rule's sums per chunk and then per segment in chunk order (a run repeats to
// the bit). A new optimizer's rule is one row of kRules.
#include <cstring>

#include "kernels/cuda/kernels.h"
#include "kernels/optimizers/rules.h"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Sums a and b over the block; thread 0 gets the totals.
__device__ void blockSum(double& a, double& b) {
  __shared__ double sa[kThreads], sb[kThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sa[threadIdx.x] += sa[threadIdx.x + half];
      sb[threadIdx.x] += sb[threadIdx.x + half];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
  __syncthreads();  // every thread has read the totals before a next call writes the arrays
}

template <typename Rule>
__global__ void probeKernel(RuleLaunch l) {
  const UpdateChunk ch = l.chunks[blockIdx.x];
  double ww = 0, pp = 0;
  if (ch.segment >= 0) {
    const float decay = ch.decay ? l.scalars.weight_decay : 0.0f;
    for (std::int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      const double p =
          Rule::probe(l.w[i], l.g[i], StateRef{l.state + i, l.stride}, l.scalars, decay);
      ww += static_cast<double>(l.w[i]) * l.w[i];
      pp += p * p;
    }
  }
  blockSum(ww, pp);
  if (threadIdx.x == 0) {
    l.partials[2 * blockIdx.x] = ww;
    l.partials[2 * blockIdx.x + 1] = pp;
  }
}

template <typename Rule>
__global__ void ratioKernel(RuleLaunch l) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= l.num_segments) return;
  double ww = 0, pp = 0;
  for (std::int64_t k = l.segments[2 * s]; k < l.segments[2 * s + 1]; ++k) {
    ww += l.partials[2 * k];
    pp += l.partials[2 * k + 1];
  }
  l.ratios[s] = Rule::ratio(static_cast<float>(sqrt(ww)), static_cast<float>(sqrt(pp)), l.scalars,
                            l.scalars.weight_decay);
}

template <typename Rule>
__global__ void updateKernel(RuleLaunch l) {
  const UpdateChunk ch = l.chunks[blockIdx.x];
  const float decay = ch.decay ? l.scalars.weight_decay : 0.0f;
  const float ratio = ch.segment >= 0 ? l.ratios[ch.segment] : 1.0f;
  bool finite = true;
  for (std::int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
    const float w =
        Rule::update(l.w[i], l.g[i], StateRef{l.state + i, l.stride}, l.scalars, decay, ratio);
    l.w[i] = w;
    finite = finite && isfinite(w);
  }
  if (__syncthreads_or(!finite) && threadIdx.x == 0) *l.bad = 1;
}

template <typename Rule>
void run(const RuleLaunch& l, cudaStream_t stream) {
  if (l.num_chunks == 0) return;
  if constexpr (Rule::kLayerwise) {
    if (l.num_segments > 0) {
      probeKernel<Rule><<<l.num_chunks, kThreads, 0, stream>>>(l);
      checkLaunch("probeKernel", __FILE__, __LINE__);
      ratioKernel<Rule><<<(l.num_segments + kThreads - 1) / kThreads, kThreads, 0, stream>>>(l);
      checkLaunch("ratioKernel", __FILE__, __LINE__);
    }
  }
  updateKernel<Rule><<<l.num_chunks, kThreads, 0, stream>>>(l);
  checkLaunch("updateKernel", __FILE__, __LINE__);
}

struct RuleRow {
  const char* name;
  void (*run)(const RuleLaunch&, cudaStream_t);
};
template <typename Rule>
constexpr RuleRow row() {
  return {Rule::kName, run<Rule>};
}
constexpr RuleRow kRules[] = {row<AdamRule>(), row<SquareSumRule>(), row<LarsRule>(),
                              row<LambRule>()};

__global__ void squaresKernel(const float* p, std::int64_t n, double* partials) {
  double sum = 0, unused = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    sum += static_cast<double>(p[i]) * p[i];
  blockSum(sum, unused);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

}  // namespace

bool ruleUpdate(const char* name, const RuleLaunch& launch, cudaStream_t stream) {
  for (const RuleRow& row : kRules) {
    if (std::strcmp(row.name, name) == 0) {
      row.run(launch, stream);
      return true;
    }
  }
  return false;
}

void sumSquares(const float* p, std::int64_t n, double* partials, cudaStream_t stream) {
  squaresKernel<<<kSquareBlocks, kThreads, 0, stream>>>(p, n, partials);
  checkLaunch("squaresKernel", __FILE__, __LINE__);
}

}  // namespace troupe::kernels::cuda
