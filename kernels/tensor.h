// Tensors: a shape, a dtype and a view into memory that a Backend owns.
//
// A Tensor is a cheap handle (shared ownership of its storage); copying it never copies data.
// Views (slice, view) share the storage of the tensor they come from. A tensor's memory lives on
// the device of the backend that allocated it; data() of a CUDA tensor is a device pointer. Thread
// safety: a Tensor handle may be copied from any thread; reading and writing its elements is the
// caller's business (actors hand tensors over, they never write one concurrently).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe::kernels {

// kUInt8: raw bytes (compressed gradients, kernels/compression.h). kFloat16 (IEEE binary16) and
// kBFloat16 (float32's top half): the activations of a net computing in reduced precision
// (NetOptions::precision); a device backend computes on them, the CPU one only casts them.
enum class DType : std::uint8_t { kFloat32, kInt32, kUInt8, kFloat16, kBFloat16 };
enum class DeviceKind : std::uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  // Written out: nvcc compiles this header as C++17 (kernels/cuda/kernels.h).
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

using Shape = std::vector<std::int64_t>;

std::int64_t numelOf(const Shape& shape);
std::string toString(const Shape& shape);
std::string toString(const Device& device);  // "cpu", "cuda:1"
std::size_t sizeOf(DType dtype);
std::string toString(DType dtype);  // "float32", "float16", "bfloat16", ...

// float32 to and from the 16-bit formats on the host, rounding to nearest even (as the device's
// conversions do); a float32 beyond float16's range becomes inf, NaN stays NaN.
std::uint16_t toFloat16(float value);
float fromFloat16(std::uint16_t bits);
std::uint16_t toBFloat16(float value);
float fromBFloat16(std::uint16_t bits);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<void> storage, void* data, Shape shape, DType dtype, Device device);

  // A tensor in plain host memory (64-byte aligned), zero-filled.
  static Tensor host(Shape shape, DType dtype = DType::kFloat32);
  // The same without the zero fill, for buffers about to be overwritten whole.
  static Tensor hostUninitialized(Shape shape, DType dtype = DType::kFloat32);

  // False only for a default-constructed tensor (a handle to nothing); an empty tensor made with
  // a shape of zero elements is defined.
  bool defined() const { return defined_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::size_t rank() const { return shape_.size(); }
  std::int64_t numel() const { return numel_; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel_) * sizeOf(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // The memory where it lives: a device pointer for a tensor on a device.
  void* raw() const { return data_; }
  // Host access: enforce the dtype and a tensor on the CPU.
  float* f32() const;
  std::int32_t* i32() const;

  // A flat view of elements [begin, end) sharing this tensor's storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // The same elements under another shape with the same element count.
  Tensor view(Shape shape) const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_;
  bool defined_ = false;
};

}  // namespace troupe::kernels
