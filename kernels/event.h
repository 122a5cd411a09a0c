// An Event marks a point in a backend's queue of work (kernels/backend.h): it is done once all the
// work queued before it is. Messages that hand over memory a device is still writing carry one,
// so the receiver waits for exactly that work, on its own device where it can, and no one waits
// for a whole device.
//
// A default Event is done: the CPU backend's work is done when its call returns. Copying an Event
// copies a handle. Thread safety: any thread may query or wait on an event, at any time.
#pragma once

#include <memory>

namespace troupe::kernels {

// A backend's kind of event (a CUDA event on its stream).
class EventImpl {
 public:
  virtual ~EventImpl() = default;
  // Whether the work before it is done; never blocks.
  virtual bool done() const = 0;
  // Blocks the calling thread until it is done; rethrows a failure of that work.
  virtual void wait() const = 0;
};

class Event {
 public:
  Event() = default;  // done
  explicit Event(std::shared_ptr<const EventImpl> impl) : impl_(std::move(impl)) {}

  bool done() const { return !impl_ || impl_->done(); }
  // A host wait: only where the host itself reads what the event guards.
  void wait() const {
    if (impl_) impl_->wait();
  }
  // The backend's own event, for Backend::waitFor; null when done from the start.
  const EventImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<const EventImpl> impl_;
};

}  // namespace troupe::kernels
