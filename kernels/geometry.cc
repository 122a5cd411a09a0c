// Output sizes of the op geometries (kernels/ops.h), shared by every backend.
#include "kernels/ops.h"

#include "kernels/backend.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

std::int64_t pooledSize(std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                        bool ceil_mode) {
  std::int64_t out = (in + 2 * pad - kernel + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (pad > 0 && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace

void ConvOp::backwardAddingToDx(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&) {
  throw InvariantError("this backend's convolution adds nothing to dx (addsToDx() is false)");
}

NormaliseShape normaliseShape(const Tensor& bytes, const Tensor& out,
                              const std::vector<float>& mean, const std::vector<float>& scale) {
  TROUPE_ENFORCE(bytes.dtype() == DType::kUInt8 && out.dtype() == DType::kFloat32,
                 "normalise takes uint8 images to float32");
  TROUPE_ENFORCE_EQ(bytes.rank(), 4u);
  TROUPE_ENFORCE_EQ(bytes.numel(), out.numel());
  NormaliseShape s{bytes.dim(0), bytes.dim(1), bytes.dim(2) * bytes.dim(3)};
  for (const auto* v : {&mean, &scale}) {
    TROUPE_ENFORCE(v->size() == 1 || static_cast<std::int64_t>(v->size()) == s.channels,
                   "normalise: ", v->size(), " values for ", s.channels, " channels");
  }
  TROUPE_ENFORCE_LE(s.channels, Backend::kMaxChannels);
  return s;
}

std::int64_t PoolGeometry::outHeight() const {
  return pooledSize(height, kernel, stride, pad, ceil_mode);
}
std::int64_t PoolGeometry::outWidth() const {
  return pooledSize(width, kernel, stride, pad, ceil_mode);
}

}  // namespace troupe::kernels
