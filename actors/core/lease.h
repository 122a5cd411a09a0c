// Sending a tensor without copying it: a view whose release says when the transport is done.
//
// A tensor handed to a remote send is read by the transport after send() returns, until its bytes
// are written; the sender must not change it before then. leasedView(t, done) is a view of t that
// keeps t's storage alive and calls done() once nothing holds the view any more: in practice when
// the transport has written the message (or dropped it with a lost link). done() runs on whichever
// thread drops the last reference (a transport I/O thread), must not throw, and should only post a
// message (Runtime::tell) to the actor that owns t.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>

#include "actors/core/system.h"
#include "kernels/tensor.h"

namespace troupe::actors {

inline kernels::Tensor leasedView(const kernels::Tensor& t, std::function<void()> done) {
  class Lease {
   public:
    Lease(kernels::Tensor held, std::function<void()> done)
        : held_(std::move(held)), done_(std::move(done)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      try {
        done_();
      } catch (...) {  // a system that is stopping: nobody waits any more
      }
    }

   private:
    kernels::Tensor held_;
    std::function<void()> done_;
  };
  void* data = t.raw();
  return kernels::Tensor(std::make_shared<Lease>(t, std::move(done)), data, t.shape(), t.dtype(),
                         t.device());
}

// What a float chunk `view` of memory its sender will write again should travel as to `to` (the
// ring's policy, for training and for troupe bench allreduce): copied into memory shared with
// `to`'s process where there is some (a process on this host reads it in place; nothing to wait
// for), else `view` itself, leased: `written` runs once the transport has released it, and the
// sender keeps the memory unchanged until then.
struct Sendable {
  kernels::Tensor data;
  bool leased = false;
};
inline Sendable sendable(const Runtime& system, Address to, const kernels::Tensor& view,
                         std::function<void()> written) {
  if (auto shared = system.sharedBuffer(to, view.shape()); shared.raw() != nullptr) {
    std::copy_n(view.f32(), view.numel(), shared.f32());
    return {std::move(shared), false};
  }
  return {leasedView(view, std::move(written)), true};
}

}  // namespace troupe::actors
