// A Communicator sums gradient buckets over a fixed group of GPUs, in this process and in others:
// NCCL's communicator (reducer = nccl), or the emulated GPU's stand-in in the tests. It works on
// streams of its own, one per GPU of this process, beside the replicas' compute streams, so that a
// bucket's sum runs while the backward pass goes on.
//
//   // every process: the same id (rank 0 makes it, the rendezvous store carries it)
//   auto comm = kernels::makeNcclCommunicator({id, ranks, first_rank, {0, 1}, timeout});
//   Event summed = comm->allreduce({bucket_on_gpu0, bucket_on_gpu1}, {ready0, ready1});
//
// Thread safety: one thread calls allreduce; any thread may call error() and abort().
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kernels/event.h"
#include "kernels/tensor.h"

namespace troupe::kernels {

struct CommunicatorSpec {
  std::string id;            // the group's id, the same in every process (newNcclGroupId())
  int ranks = 1;             // GPUs in the group, over every process
  int first_rank = 0;        // the rank of devices[0]; devices[i] is first_rank + i
  std::vector<int> devices;  // this process's GPUs in the group
  // How long the group may take to form (every rank joined) before the constructor throws.
  std::chrono::milliseconds timeout{60000};
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Sums buffers[i] (float32, all of one length, buffers[i] on devices[i]) over every GPU of the
  // group, in place. The sum on devices[i] starts once ready[i] is done; the call returns at once
  // with an event, on devices[0], done once every one of this process's sums is. Every process
  // calls it for the same buffers in the same order, as NCCL requires. With `began`, for traces:
  // *began is reached once the sums may start (every ready[i] done), and both events are timed.
  virtual Event allreduce(const std::vector<Tensor>& buffers, const std::vector<Event>& ready,
                          Event* began = nullptr) = 0;

  // For traces: a timed event reached once the sums queued so far are done, and the seconds
  // between two timed events of this communicator (`from` first; both done).
  virtual Event mark() = 0;
  virtual double elapsed(const Event& from, const Event& to) = 0;

  // What went wrong in the group's work (a peer gone, a network error), or empty; never waits.
  virtual std::string error() = 0;

  // Whether the group failed or was aborted: a sum whose event completed may then have been cut
  // short, its buffer left with part of the sum. Asked once a sum's event is done, false means that
  // sum is whole: an abort, or NCCL's own end of a sum at an error, comes after the flag it reads.
  virtual bool failed() = 0;

  // Ends the group's work, queued or running, so that nothing waits on it for ever (its events
  // complete, their sums undefined); the communicator is of no use after. Safe from any thread.
  virtual void abort() = 0;
};

// A new group id (NCCL's unique id, as text for the rendezvous store); throws InputError when
// there is no CUDA plugin or no device.
std::string newNcclGroupId();

// This process's part of the group `spec` names: blocks until every rank joined, or throws
// TimeoutError after spec.timeout naming the group; InputError without a plugin or device.
std::unique_ptr<Communicator> makeNcclCommunicator(const CommunicatorSpec& spec);

}  // namespace troupe::kernels
