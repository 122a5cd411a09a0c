// Output sizes of the op geometries (kernels/ops.h), shared by every backend.
#include "kernels/ops.h"

namespace troupe::kernels {
namespace {

std::int64_t pooledSize(std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                        bool ceil_mode) {
  std::int64_t out = (in + 2 * pad - kernel + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (pad > 0 && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace

std::int64_t PoolGeometry::outHeight() const {
  return pooledSize(height, kernel, stride, pad, ceil_mode);
}
std::int64_t PoolGeometry::outWidth() const {
  return pooledSize(width, kernel, stride, pad, ceil_mode);
}

}  // namespace troupe::kernels
