// Helpers shared by the CPU ops: thread budgets, row-major sgemm, work splitting, element-wise ops.
#pragma once

#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/tensor.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {

// Flushes denormal floats to zero (FTZ and DAZ in MXCSR) on the calling thread and the OpenMP
// threads it computes with; once per calling thread. Denormals (tiny gradients late in training)
// otherwise slow float arithmetic on some CPUs by 10-100x.
inline void flushDenormals(int threads) {
  thread_local int done = 0;
  if (done >= threads) return;
  _mm_setcsr(_mm_getcsr() | 0x8040);
#pragma omp parallel num_threads(threads)
  _mm_setcsr(_mm_getcsr() | 0x8040);
  done = threads;
}

// Applies a backend's thread budget to libraries that read the calling thread's OpenMP setting
// (oneDNN's sgemm); the setting is per calling thread, so concurrent backends do not interfere.
inline void useThreads(int threads) {
  flushDenormals(threads);
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C. Inside an OpenMP parallel region
// it runs on the calling thread only; outside it uses the calling thread's OpenMP thread count.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc);

// The share [begin, end) of `total` items that thread `rank` of `count` takes.
inline void splitRange(std::int64_t total, int rank, int count, std::int64_t& begin,
                       std::int64_t& end) {
  const std::int64_t base = total / count, extra = total % count;
  begin = rank * base + std::min<std::int64_t>(rank, extra);
  end = begin + base + (rank < extra ? 1 : 0);
}

// Splits [0, total) among `count` threads in multiples of 16 floats (a cache line), so that no
// two threads write one line; [begin, end) is the share of thread `rank`.
inline void splitAligned(std::int64_t total, int rank, int count, std::int64_t& begin,
                         std::int64_t& end) {
  constexpr std::int64_t kLine = 16;
  const std::int64_t lines = (total + kLine - 1) / kLine;
  splitRange(lines, rank, count, begin, end);
  begin = std::min(total, begin * kLine);
  end = std::min(total, end * kLine);
}

// Below this many multiply-adds a pass of sgemm calls runs on one thread: waking a team costs
// more.
constexpr std::int64_t kParallelMacs = std::int64_t{1} << 20;

// Runs fn(rank, count) on every thread of a team of `threads`, each computing its own share with
// single-threaded sgemm calls; or once, as rank 0 of 1, on the calling thread alone.
template <typename Fn>
void onTeam(int threads, const Fn& fn) {
  if (threads <= 1) {
    useThreads(1);
    fn(0, 1);
    return;
  }
  flushDenormals(threads);
#pragma omp parallel num_threads(threads)
  fn(omp_get_thread_num(), omp_get_num_threads());
}

// Runs fn(begin, end) over [0, total) split into equal contiguous ranges, one per thread, or on
// the calling thread alone below `grain` items (waking a team costs more than it saves).
template <typename Fn>
void forRanges(std::int64_t total, int threads, std::int64_t grain, const Fn& fn) {
  if (threads <= 1 || total <= grain) {
    fn(std::int64_t{0}, total);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    std::int64_t begin, end;
    splitRange(total, omp_get_thread_num(), omp_get_num_threads(), begin, end);
    fn(begin, end);
  }
}

// As forRanges, with the index of the range (0 when on one thread; below `threads`), so that
// per-range partial results can be combined in a fixed order.
template <typename Fn>
void forRangesIndexed(std::int64_t total, int threads, std::int64_t grain, const Fn& fn) {
  if (threads <= 1 || total <= grain) {
    fn(0, std::int64_t{0}, total);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    std::int64_t begin, end;
    splitRange(total, omp_get_thread_num(), omp_get_num_threads(), begin, end);
    fn(omp_get_thread_num(), begin, end);
  }
}

// Float pointer of an optional tensor: nullptr when not defined or empty.
inline float* optionalF32(const Tensor& t) {
  return t.raw() ? t.f32() : nullptr;
}

// The float pointers of several tensors for one structured binding, `const auto [xp, wp] =
// f32s(x, w);`, and of optional ones (each as optionalF32), `const auto [dxp, dwp] =
// optionalF32s(dx, dw);`.
template <class... T>
std::array<const float*, sizeof...(T)> f32s(const T&... t) {
  return {t.f32()...};
}
template <class... T>
std::array<float*, sizeof...(T)> optionalF32s(const T&... t) {
  return {optionalF32(t)...};
}

// An element-wise op `Op` (ReLU, GELU) of `numel` floats: y = kForward(x); dx = kBackward(saved,
// dy), `saved` being what Op's backward reads (ReLU's y, GELU's x). The threads share ranges of
// at least `grain` elements.
template <class Op, void (*kForward)(const float*, float*, std::int64_t),
          void (*kBackward)(const float*, const float*, float*, std::int64_t)>
class Elementwise final : public Op {
 public:
  Elementwise(std::int64_t numel, int threads, std::int64_t grain)
      : numel_(numel), threads_(threads), grain_(grain) {}
  void forward(const Tensor& x, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), numel_);
    const float* in = x.f32();
    float* out = y.f32();
    forRanges(numel_, threads_, grain_,
              [&](std::int64_t b, std::int64_t e) { kForward(in + b, out + b, e - b); });
  }
  void backward(const Tensor& saved, const Tensor& dy, const Tensor& dx) override {
    TROUPE_ENFORCE_EQ(dy.numel(), numel_);
    const float* s = saved.f32();
    const float* d = dy.f32();
    float* out = dx.f32();
    forRanges(numel_, threads_, grain_,
              [&](std::int64_t b, std::int64_t e) { kBackward(s + b, d + b, out + b, e - b); });
  }

 private:
  std::int64_t numel_;
  int threads_;
  std::int64_t grain_;
};

}  // namespace troupe::kernels::cpu
