// oneDNN plumbing shared by the CPU ops that run oneDNN primitives (private to kernels/cpu).
//
// oneDNN (built with its OpenMP runtime) computes with the calling thread's OpenMP thread count,
// so ops call useThreads() before executing a primitive. Primitives are created once per op (one
// fixed geometry) and run with a user-owned scratchpad: no allocation per call.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <vector>

namespace troupe::kernels::cpu {

// One CPU engine and its stream; a backend owns one and lends it to the ops it makes.
struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// A primitive attribute asking for a user-provided scratchpad.
inline dnnl::primitive_attr userScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A tensor that a primitive wants in its own layout (`inner`) while the caller holds it in the
// plain row-major layout (`user`). When the layouts agree the caller's memory is used directly;
// otherwise a buffer owned here and a reorder, both made once.
class Relayout {
 public:
  Relayout() = default;
  Relayout(const dnnl::memory::desc& user, const dnnl::memory::desc& inner,
           const dnnl::engine& engine)
      : same_(user == inner), user_(user, engine, DNNL_MEMORY_NONE) {
    if (same_) {
      inner_ = dnnl::memory(inner, engine, DNNL_MEMORY_NONE);
    } else {
      inner_ = dnnl::memory(inner, engine);
      to_inner_ = dnnl::reorder(user_, inner_);
      to_user_ = dnnl::reorder(inner_, user_);
    }
  }

  // The primitive's view of `data` (an input in the user layout), reordered if need be.
  const dnnl::memory& in(const float* data, dnnl::stream& stream) {
    user_.set_data_handle(const_cast<float*>(data));
    if (same_) {
      inner_.set_data_handle(const_cast<float*>(data));
    } else {
      to_inner_.execute(stream, user_, inner_);
    }
    return inner_;
  }

  // The primitive's view of what the last in() was given, as in() made it; for another primitive
  // that wants the same input in the same layout (see sameInner()), without a second reorder.
  const dnnl::memory& last() const { return inner_; }
  bool sameInner(const Relayout& other) const {
    return inner_.get_desc() == other.inner_.get_desc();
  }

  // Memory for the primitive to write an output into; finish() then brings it to `data`.
  const dnnl::memory& out(float* data) {
    if (same_) inner_.set_data_handle(data);
    return inner_;
  }
  void finish(float* data, dnnl::stream& stream) {
    if (same_) return;
    user_.set_data_handle(data);
    to_user_.execute(stream, inner_, user_);
  }

 private:
  bool same_ = true;
  dnnl::memory user_, inner_;
  dnnl::reorder to_inner_, to_user_;
};

// A plain (row-major, dense) f32 memory descriptor.
inline dnnl::memory::desc plainDesc(const dnnl::memory::dims& dims) {
  using tag = dnnl::memory::format_tag;
  static constexpr tag kTags[] = {tag::undef, tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde};
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, kTags[dims.size()]);
}

// A memory descriptor letting the primitive choose the layout.
inline dnnl::memory::desc anyDesc(const dnnl::memory::dims& dims) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

}  // namespace troupe::kernels::cpu
