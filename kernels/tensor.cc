#include "kernels/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "troupe/error.h"

namespace troupe::kernels {

std::int64_t numelOf(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    TROUPE_ENFORCE_GE(d, 0);
    n *= d;
  }
  return n;
}

std::string toString(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::size_t sizeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kUInt8:
      return 1;
  }
  return 4;
}

Tensor::Tensor(std::shared_ptr<void> storage, void* data, Shape shape, DType dtype, Device device)
    : storage_(std::move(storage)),
      data_(data),
      shape_(std::move(shape)),
      numel_(numelOf(shape_)),
      dtype_(dtype),
      device_(device) {}

Tensor Tensor::hostUninitialized(Shape shape, DType dtype) {
  const std::size_t bytes = static_cast<std::size_t>(numelOf(shape)) * sizeOf(dtype);
  const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) {
    throw ResourceError("out of memory: cannot allocate " + std::to_string(rounded) +
                        " bytes for a tensor of shape " + toString(shape) +
                        " (a smaller batch_size, or fewer replicas, needs less)");
  }
  std::shared_ptr<void> storage(p, [](void* q) { std::free(q); });
  return Tensor(std::move(storage), p, std::move(shape), dtype, Device{});
}

Tensor Tensor::host(Shape shape, DType dtype) {
  Tensor t = hostUninitialized(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.bytes());
  return t;
}

std::string toString(const Device& device) {
  return device.kind == DeviceKind::kCpu ? "cpu" : "cuda:" + std::to_string(device.index);
}

float* Tensor::f32() const {
  TROUPE_ENFORCE(dtype_ == DType::kFloat32, "tensor of shape ", toString(shape_),
                 " is not float32");
  TROUPE_ENFORCE(device_.kind == DeviceKind::kCpu, "host access to a tensor of shape ",
                 toString(shape_), " on ", toString(device_));
  return static_cast<float*>(data_);
}

std::int32_t* Tensor::i32() const {
  TROUPE_ENFORCE(dtype_ == DType::kInt32, "tensor of shape ", toString(shape_), " is not int32");
  TROUPE_ENFORCE(device_.kind == DeviceKind::kCpu, "host access to a tensor of shape ",
                 toString(shape_), " on ", toString(device_));
  return static_cast<std::int32_t*>(data_);
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  TROUPE_ENFORCE(0 <= begin && begin <= end && end <= numel_, "slice [", begin, ",", end,
                 ") of a tensor with ", numel_, " elements");
  auto* base = static_cast<char*>(data_) + static_cast<std::size_t>(begin) * sizeOf(dtype_);
  return Tensor(storage_, base, Shape{end - begin}, dtype_, device_);
}

Tensor Tensor::view(Shape shape) const {
  TROUPE_ENFORCE_EQ(numelOf(shape), numel_);
  return Tensor(storage_, data_, std::move(shape), dtype_, device_);
}

}  // namespace troupe::kernels
