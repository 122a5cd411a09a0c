#include "kernels/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/host_memory.h"
#include "kernels/named.h"
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
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 4;
}

std::string toString(DType dtype) {
  static constexpr Named<DType> kNames[] = {{"float32", DType::kFloat32},
                                            {"int32", DType::kInt32},
                                            {"uint8", DType::kUInt8},
                                            {"float16", DType::kFloat16},
                                            {"bfloat16", DType::kBFloat16}};
  return nameIn(kNames, dtype);
}

std::uint16_t toFloat16(float value) {
  const auto f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t magnitude = f & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf, NaN (kept quiet)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  if (magnitude >= 0x477ff000u)
    return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal float16 (or zero)
    // Scale so that float16's subnormal step 2^-24 is 1, and let the float unit round to even.
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;  // 2^24, exact
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest even.
  const std::uint32_t rebased = magnitude - 0x38000000u;
  const std::uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

float fromFloat16(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float v = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

std::uint16_t toBFloat16(float value) {
  const auto f = std::bit_cast<std::uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x40u);
  return static_cast<std::uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

float fromBFloat16(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

Tensor::Tensor(std::shared_ptr<void> storage, void* data, Shape shape, DType dtype, Device device)
    : storage_(std::move(storage)),
      data_(data),
      shape_(std::move(shape)),
      numel_(numelOf(shape_)),
      dtype_(dtype),
      device_(device),
      defined_(true) {}

namespace {

std::atomic<std::int64_t> host_in_use{0}, host_peak{0}, host_limit{0};
// HostTensorMemory::setLimit's `named`; read only when an allocation fails, so rarely written.
std::mutex limit_mu;
std::string limit_named;

// Counts `bytes` more of the host's tensors (a tensor of `shape`), or throws ResourceError when
// they would pass the limit, counting nothing.
void countHostBytes(std::int64_t bytes, const Shape& shape) {
  const std::int64_t now = host_in_use.fetch_add(bytes) + bytes;
  if (const std::int64_t limit = host_limit.load(); limit > 0 && now > limit) {
    host_in_use.fetch_sub(bytes);
    std::string named;
    {
      std::lock_guard lock(limit_mu);
      named = limit_named;
    }
    throw ResourceError(fmt::format(
        "this process's tensors would hold {} bytes ({:.1f} MiB) with a tensor of shape {} ({} "
        "bytes), more than {}",
        now, static_cast<double>(now) / (1 << 20), toString(shape), bytes, named));
  }
  std::int64_t peak = host_peak.load();
  while (now > peak && !host_peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

std::int64_t HostTensorMemory::inUse() {
  return host_in_use.load();
}
std::int64_t HostTensorMemory::peak() {
  return host_peak.load();
}
void HostTensorMemory::resetPeak() {
  host_peak.store(host_in_use.load());
}
void HostTensorMemory::setLimit(std::int64_t bytes, std::string named) {
  {
    std::lock_guard lock(limit_mu);
    limit_named = std::move(named);
  }
  host_limit.store(std::max<std::int64_t>(bytes, 0));
}

Tensor Tensor::hostUninitialized(Shape shape, DType dtype) {
  const std::size_t bytes = static_cast<std::size_t>(numelOf(shape)) * sizeOf(dtype);
  const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  const auto counted = static_cast<std::int64_t>(rounded);
  countHostBytes(counted, shape);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) {
    host_in_use.fetch_sub(counted);
    throw ResourceError("out of memory: cannot allocate " + std::to_string(rounded) +
                        " bytes for a tensor of shape " + toString(shape) +
                        " (a smaller batch_size, or fewer replicas, needs less)");
  }
  std::shared_ptr<void> storage(p, [counted](void* q) {
    std::free(q);
    host_in_use.fetch_sub(counted);
  });
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
