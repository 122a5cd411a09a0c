// The "troupe" torch.distributed backend in C++: a c10d backend (c10d::Backend in torch 2, the
// ProcessGroup itself in Debian's 1.13) whose collectives run on troupe's ring store through
// troupe._troupe's C API (troupe_c_api.h). troupe.torch builds it against the installed torch
// with torch's cpp_extension when first imported, and registers it as "troupe".
//
// Every call is queued, in call order, to one thread of the backend's own, and returns at once
// with a Work that the caller (DDP's reducer, torch.distributed's functions, functional
// collectives) waits on: the ring sees every rank's calls in one order, DDP's bucket sums overlap
// the backward pass, and no collective holds the GIL. A call made on that thread (a DDP hook's
// callback, run when its sum is done) runs there at once.
//
// What runs where:
// - SUM and AVG of float tensors (float32; float16 and bfloat16 summed in float32): the ring's
//   allreduce and reduce-scatter, float32 host tensors summed where they lie.
// - broadcast and scatter: the root's bytes by the ring's broadcast, along the ring from the root
//   (a scatter's every part, each rank keeping its own).
// - Everything else (other dtypes, MIN/MAX/PRODUCT and the bitwise reductions, gather, alltoall):
//   every rank's bytes by the ring's allgather, bit for bit, then reduced or picked on each rank,
//   the same on every rank. A first version: their traffic is the world's tensors, not one's own.
// - send and recv: through torch's store (which rank 0 serves), each message under its own key;
//   a recv polls for it on a thread of its own, at most the group's timeout.
// - CUDA tensors go through host memory.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "troupe_c_api.h"

namespace py = pybind11;

namespace {

#if TORCH_VERSION_MAJOR >= 2
using Base = c10d::Backend;  // torch wraps it in a ProcessGroup for the CPU and CUDA devices
#else
using Base = c10d::ProcessGroup;  // Debian's 1.13: a plugin's creator returns the group itself
#endif

using Tensors = std::vector<at::Tensor>;
using RedOp = c10d::ReduceOp::RedOpType;

const TroupeCApi* api() {
  static const TroupeCApi* table = [] {
    auto* got = static_cast<const TroupeCApi*>(PyCapsule_Import(TROUPE_C_API_CAPSULE, 0));
    if (!got) throw py::error_already_set();
    TORCH_CHECK(got->version == TROUPE_C_API_VERSION, "troupe backend: troupe._troupe's C API is ",
                "version ", got->version, ", this backend was built for ", TROUPE_C_API_VERSION,
                ": rebuild it (remove torch's extension cache)");
    return got;
  }();
  return table;
}

// A ring call's outcome: its error message becomes the Work's error.
void ring(const char* error) {
  if (error) throw std::runtime_error(error);
}

bool isFloat(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf ||
         t.scalar_type() == at::kBFloat16;
}

// Whether the ring can read and write t's values where they lie.
bool inPlace(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

float* floats(const at::Tensor& t) {
  return static_cast<float*>(t.data_ptr());
}

// t's values as a flat float32 host tensor of its own (a copy: the caller writes into it).
at::Tensor hostCopy(const at::Tensor& t) {
  return t.detach().to(at::kCPU, at::kFloat, false, true).reshape({-1});
}

// t's values as a flat contiguous host tensor of t's dtype (t itself where it is one).
at::Tensor host(const at::Tensor& t) {
  return t.detach().to(at::kCPU).contiguous().reshape({-1});
}

std::string opName(RedOp op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return std::to_string(static_cast<int>(op));
  }
}

// Checks a tensor a collective is given: dense, on the CPU or a GPU.
void checkTensor(const char* what, const at::Tensor& t) {
  TORCH_CHECK_TYPE(!t.is_sparse(), "troupe backend: ", what, " of a sparse tensor");
  TORCH_CHECK_TYPE(t.device().is_cpu() || t.device().is_cuda(), "troupe backend: ", what,
                   " of a tensor on ", t.device().str(), ": CPU and CUDA tensors only");
}

// Checks that a reduction `op` applies to tensors of `dtype`.
void checkReduction(const char* what, RedOp op, at::ScalarType dtype) {
  const bool floating = at::isFloatingType(dtype);
  const bool bitwise =
      op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
  TORCH_CHECK_VALUE(op != c10d::ReduceOp::PREMUL_SUM, "troupe backend: ", what,
                    " with ReduceOp.PREMUL_SUM is not supported (SUM, AVG, PRODUCT, MIN, MAX and "
                    "the bitwise ones are)");
  TORCH_CHECK_VALUE(!(bitwise && floating), "troupe backend: ", what, " with ReduceOp.", opName(op),
                    " of a ", c10::toString(dtype),
                    " tensor: the bitwise reductions take integers and bools");
  TORCH_CHECK_VALUE(!(op == c10d::ReduceOp::AVG && !floating), "troupe backend: ", what,
                    " with ReduceOp.AVG of a ", c10::toString(dtype),
                    " tensor: AVG takes floating-point tensors");
  TORCH_CHECK_TYPE(!at::isComplexType(dtype), "troupe backend: ", what, " of a ",
                   c10::toString(dtype), " tensor");
}

// The reduction over the ranks (dimension 0 of `everyone`), in `everyone`'s dtype, taken alike on
// every rank.
at::Tensor reduced(const at::Tensor& everyone, RedOp op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return everyone.sum(0, false, everyone.scalar_type());
    case c10d::ReduceOp::AVG:
      return everyone.sum(0).div_(everyone.size(0));
    case c10d::ReduceOp::PRODUCT:
      return everyone.prod(0, false, everyone.scalar_type());
    case c10d::ReduceOp::MIN:
      return std::get<0>(everyone.min(0));
    case c10d::ReduceOp::MAX:
      return std::get<0>(everyone.max(0));
    default: {
      at::Tensor out = everyone[0].clone();
      for (int64_t r = 1; r < everyone.size(0); ++r) {
        if (op == c10d::ReduceOp::BAND) out.bitwise_and_(everyone[r]);
        if (op == c10d::ReduceOp::BOR) out.bitwise_or_(everyone[r]);
        if (op == c10d::ReduceOp::BXOR) out.bitwise_xor_(everyone[r]);
      }
      return out;
    }
  }
}

// A collective's Work: done by the backend's thread, with its output tensors or its error.
class TroupeWork : public c10d::Work {
 public:
  TroupeWork(Tensors outputs, c10d::OpType type)
      : c10d::Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  Tensors result() override { return outputs_; }
  c10::intrusive_ptr<at::ivalue::Future> getFuture() override { return future_; }

  // Ends the Work: its waiters wake, then its future's callbacks run, on this thread.
  void done(std::exception_ptr error) {
    finish(error);
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

 private:
  Tensors outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

class TroupeBackend : public Base {
 public:
  TroupeBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                std::chrono::milliseconds timeout, py::object kvstore)
      : Base(rank, size), store_(std::move(store)), timeout_(timeout) {
    ring_ = api()->store_of(kvstore.ptr());
    if (!ring_) throw py::error_already_set();
    TORCH_CHECK_VALUE(api()->rank(ring_) == rank && api()->num_workers(ring_) == size,
                      "troupe backend: a group's rank ", rank, " of ", size, " on a ring whose ",
                      "rank is ", api()->rank(ring_), " of ", api()->num_workers(ring_));
    kvstore_ = kvstore.release().ptr();  // dropped, with the GIL, when the backend goes
    thread_ = std::thread([this] { serve(); });
  }

  ~TroupeBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) {
      if (Py_IsInitialized() && PyGILState_Check()) {  // a job may need the GIL (a DDP hook's)
        py::gil_scoped_release free;
        thread_.join();
      } else {
        thread_.join();
      }
    }
    // The ring's store is closed at exit with troupe's other stores, in the order they were made
    // (troupe/kv.py): a ring's close waits for its members, and groups go in an order of torch's
    // and Python's own, which another rank need not share (two subgroups, each waiting on the
    // other's close, would wait for each other).
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      Py_XDECREF(kvstore_);
    }
  }

  const std::string getBackendName() const override { return "troupe"; }

  c10::intrusive_ptr<c10d::Work> allreduce(Tensors& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const RedOp op = opts.reduceOp.op_;
    TORCH_CHECK_VALUE(!tensors.empty(), "troupe backend: allreduce of no tensor");
    for (const auto& t : tensors) {
      checkTensor("allreduce", t);
      checkReduction("allreduce", op, t.scalar_type());
      TORCH_CHECK_VALUE(
          t.numel() == tensors[0].numel() && t.scalar_type() == tensors[0].scalar_type(),
          "troupe backend: allreduce of tensors of other sizes or types in one call");
    }
    return post(tensors, c10d::OpType::ALLREDUCE, [this, tensors, op] {
      const at::Tensor& t = tensors[0];
      if (isFloat(t) && (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG)) {
        const bool direct = tensors.size() == 1 && inPlace(t);  // summed where it lies
        at::Tensor sum = direct ? t.view({-1}) : hostCopy(t);
        for (std::size_t i = 1; i < tensors.size(); ++i)
          sum.add_(hostCopy(tensors[i]));
        ring(api()->allreduce(ring_, floats(sum), sum.numel()));
        if (op == c10d::ReduceOp::AVG) sum.div_(size_);
        if (!direct)
          for (const auto& out : tensors)
            out.copy_(sum.view(out.sizes()));
        return;
      }
      at::Tensor mine = host(t).clone();
      for (std::size_t i = 1; i < tensors.size(); ++i)
        mine = reduced(at::stack({mine, host(tensors[i])}), op);
      const at::Tensor result = reduced(at::stack(everyones(mine)), op);
      for (const auto& out : tensors)
        out.copy_(result.view(out.sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const RedOp op = opts.reduceOp.op_;
    for (const auto& t : tensors) {
      checkTensor("allreduce_coalesced", t);
      checkReduction("allreduce_coalesced", op, t.scalar_type());
      TORCH_CHECK_TYPE(isFloat(t) && (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG),
                       "troupe backend: allreduce_coalesced sums float tensors, not ",
                       c10::toString(t.scalar_type()), " with ReduceOp.", opName(op));
    }
    return post(tensors, c10d::OpType::ALLREDUCE_COALESCED, [this, tensors, op] {
      Tensors parts;
      for (const auto& t : tensors)
        parts.push_back(t.detach().to(at::kCPU, at::kFloat).reshape({-1}));
      at::Tensor flat = at::cat(parts);
      ring(api()->allreduce(ring_, floats(flat), flat.numel()));
      if (op == c10d::ReduceOp::AVG) flat.div_(size_);
      int64_t offset = 0;
      for (const auto& t : tensors) {
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(Tensors& tensors,
                                        const c10d::ReduceOptions& opts) override {
    TORCH_CHECK_VALUE(tensors.size() == 1, "troupe backend: reduce of ", tensors.size(),
                      " tensors: one a call");
    checkTensor("reduce", tensors[0]);
    const RedOp op = opts.reduceOp.op_;
    checkReduction("reduce", op, tensors[0].scalar_type());
    const int64_t root = opts.rootRank;
    return post(tensors, c10d::OpType::REDUCE, [this, tensors, op, root] {
      const at::Tensor result = reduced(at::stack(everyones(host(tensors[0]))), op);
      if (rank_ == root) tensors[0].copy_(result.view(tensors[0].sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(Tensors& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    for (const auto& t : tensors)
      checkTensor("broadcast", t);
    const int64_t root = opts.rootRank;
    checkRank("broadcast", root);
    return post(tensors, c10d::OpType::BROADCAST, [this, tensors, root] {
      for (const auto& t : tensors)
        fromRoot(t, root);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                                           const c10d::AllgatherOptions&) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "troupe backend: allgather of ",
                      inputs.size(), " inputs into ", outputs.size(), " lists of outputs");
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      checkTensor("allgather", inputs[i]);
      TORCH_CHECK_VALUE(static_cast<int>(outputs[i].size()) == size_,
                        "troupe backend: allgather into ", outputs[i].size(), " tensors, for ",
                        size_, " ranks");
      for (std::size_t r = 0; r < outputs[i].size(); ++r) {
        checkTensor("allgather", outputs[i][r]);
        TORCH_CHECK_VALUE(outputs[i][r].numel() == inputs[i].numel(),
                          "troupe backend: allgather: ", "output ", r, " holds ",
                          outputs[i][r].numel(), " values, the input ", inputs[i].numel());
      }
    }
    Tensors flat_outputs;
    for (const auto& list : outputs)
      flat_outputs.insert(flat_outputs.end(), list.begin(), list.end());
    return post(flat_outputs, c10d::OpType::ALLGATHER, [this, outputs, inputs] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const at::Tensor mine = host(inputs[i]);
        bool direct = inPlace(mine);
        for (const auto& o : outputs[i])
          direct = direct && inPlace(o);
        if (direct) {  // each rank's part written where it lies
          std::vector<float*> parts;
          for (const auto& o : outputs[i])
            parts.push_back(floats(o));
          ring(api()->allgather_parts(ring_, floats(mine), mine.numel(), parts.data()));
          continue;
        }
        const Tensors got = everyones(mine);
        for (int r = 0; r < size_; ++r)
          outputs[i][r].copy_(got[r].view(outputs[i][r].sizes()));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    checkGatherInto("all_gather_into_tensor", output, input);
    return post({output}, c10d::OpType::_ALLGATHER_BASE,
                [this, output, input] { gatherInto(output, input); });
  }

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      Tensors& outputs, Tensors& inputs, const c10d::AllgatherOptions&) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "troupe backend: all_gather_into_tensor of ",
                      inputs.size(), " inputs into ", outputs.size(), " outputs");
    for (std::size_t i = 0; i < inputs.size(); ++i)
      checkGatherInto("all_gather_into_tensor", outputs[i], inputs[i]);
    return post(outputs, c10d::OpType::COALESCED, [this, outputs, inputs] {
      for (std::size_t i = 0; i < inputs.size(); ++i)
        gatherInto(outputs[i], inputs[i]);
    });
  }
#endif

  c10::intrusive_ptr<c10d::Work> gather(std::vector<Tensors>& outputs, Tensors& inputs,
                                        const c10d::GatherOptions& opts) override {
    const int64_t root = opts.rootRank;
    checkRank("gather", root);
    TORCH_CHECK_VALUE(inputs.size() == 1, "troupe backend: gather of ", inputs.size(),
                      " tensors: one a call");
    checkTensor("gather", inputs[0]);
    if (rank_ == root) {
      TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                        "troupe backend: gather into ", outputs.empty() ? 0 : outputs[0].size(),
                        " tensors at the root, for ", size_, " ranks");
      for (const auto& o : outputs[0])
        TORCH_CHECK_VALUE(o.numel() == inputs[0].numel(), "troupe backend: gather: an output of ",
                          o.numel(), " values for inputs of ", inputs[0].numel());
    } else {
      TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(),
                        "troupe backend: gather: only the root (rank ", root, ") takes outputs");
    }
    Tensors mine_out = rank_ == root ? outputs[0] : Tensors{};
    return post(mine_out, c10d::OpType::GATHER, [this, mine_out, inputs] {
      const Tensors got = everyones(host(inputs[0]));
      for (std::size_t r = 0; r < mine_out.size(); ++r)
        mine_out[r].copy_(got[r].view(mine_out[r].sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const int64_t root = opts.rootRank;
    checkRank("scatter", root);
    TORCH_CHECK_VALUE(outputs.size() == 1, "troupe backend: scatter into ", outputs.size(),
                      " tensors: one a call");
    checkTensor("scatter", outputs[0]);
    if (rank_ == root) {
      TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                        "troupe backend: scatter of ", inputs.empty() ? 0 : inputs[0].size(),
                        " tensors at the root, for ", size_, " ranks");
      for (const auto& t : inputs[0])
        TORCH_CHECK_VALUE(
            t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
            "troupe backend: scatter: an input of ", t.numel(), " ", c10::toString(t.scalar_type()),
            " values for outputs of ", outputs[0].numel(), " ",
            c10::toString(outputs[0].scalar_type()));
    }
    Tensors theirs = rank_ == root ? inputs[0] : Tensors{};
    return post(outputs, c10d::OpType::SCATTER, [this, outputs, theirs, root] {
      // Every rank's part of the root's tensors, laid end to end: the root's bytes go to all.
      const at::Tensor& out = outputs[0];
      at::Tensor all = at::empty({size_ * out.numel()}, out.options().device(at::kCPU));
      for (std::size_t r = 0; r < theirs.size(); ++r)
        all.narrow(0, r * out.numel(), out.numel()).copy_(theirs[r].reshape({-1}));
      fromRoot(all, root);
      out.copy_(all.narrow(0, rank_ * out.numel(), out.numel()).view(out.sizes()));
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<Tensors>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const RedOp op = opts.reduceOp.op_;
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "troupe backend: reduce_scatter of ",
                      inputs.size(), " lists into ", outputs.size(), " outputs");
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      checkTensor("reduce_scatter", outputs[i]);
      checkReduction("reduce_scatter", op, outputs[i].scalar_type());
      TORCH_CHECK_VALUE(static_cast<int>(inputs[i].size()) == size_,
                        "troupe backend: reduce_scatter of ", inputs[i].size(), " tensors, for ",
                        size_, " ranks");
      for (std::size_t r = 0; r < inputs[i].size(); ++r) {
        checkTensor("reduce_scatter", inputs[i][r]);
        TORCH_CHECK_VALUE(inputs[i][r].numel() == outputs[i].numel(),
                          "troupe backend: reduce_scatter: input ", r, " holds ",
                          inputs[i][r].numel(), " values, the output ", outputs[i].numel());
      }
    }
    return post(outputs, c10d::OpType::REDUCE_SCATTER, [this, outputs, inputs, op] {
      for (std::size_t i = 0; i < outputs.size(); ++i) {
        Tensors flat;
        for (const auto& t : inputs[i])
          flat.push_back(host(t));
        scatterSum(outputs[i], at::cat(flat), op);
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const RedOp op = opts.reduceOp.op_;
    checkScatterFrom("reduce_scatter_tensor", output, input, op);
    return post({output}, c10d::OpType::_REDUCE_SCATTER_BASE,
                [this, output, input, op] { scatterSum(output, host(input), op); });
  }

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      Tensors& outputs, Tensors& inputs, const c10d::ReduceScatterOptions& opts) override {
    const RedOp op = opts.reduceOp.op_;
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "troupe backend: reduce_scatter_tensor of ",
                      inputs.size(), " inputs into ", outputs.size(), " outputs");
    for (std::size_t i = 0; i < inputs.size(); ++i)
      checkScatterFrom("reduce_scatter_tensor", outputs[i], inputs[i], op);
    return post(outputs, c10d::OpType::COALESCED, [this, outputs, inputs, op] {
      for (std::size_t i = 0; i < inputs.size(); ++i)
        scatterSum(outputs[i], host(inputs[i]), op);
    });
  }
#endif

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    checkTensor("alltoall", input);
    checkTensor("alltoall", output);
    TORCH_CHECK_TYPE(input.scalar_type() == output.scalar_type(), "troupe backend: alltoall from ",
                     c10::toString(input.scalar_type()), " into ",
                     c10::toString(output.scalar_type()));
    const auto ins = splits(input, input_splits, "input");
    const auto outs = splits(output, output_splits, "output");
    return post({output}, c10d::OpType::ALLTOALL_BASE,
                [this, output, input, ins, outs] { exchangeRows(output, input, ins, outs); });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllToAllOptions&) override {
    TORCH_CHECK_VALUE(
        static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
        "troupe backend: alltoall of ", inputs.size(), " inputs into ", outputs.size(),
        " outputs, for ", size_, " ranks");
    for (std::size_t r = 0; r < inputs.size(); ++r) {
      checkTensor("alltoall", inputs[r]);
      checkTensor("alltoall", outputs[r]);
      TORCH_CHECK_TYPE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                           outputs[r].scalar_type() == inputs[0].scalar_type(),
                       "troupe backend: alltoall of tensors of other dtypes");
    }
    return post(outputs, c10d::OpType::ALLTOALL, [this, outputs, inputs] {
      Tensors flat_in;
      std::vector<int64_t> ins, outs;
      for (const auto& t : inputs) {
        flat_in.push_back(host(t));
        ins.push_back(t.numel());
      }
      int64_t total = 0;
      for (const auto& o : outputs) {
        outs.push_back(o.numel());
        total += o.numel();
      }
      at::Tensor flat_out = at::empty({total}, outputs[0].options().device(at::kCPU));
      exchangeRows(flat_out, at::cat(flat_in), ins, outs);
      int64_t offset = 0;
      for (const auto& o : outputs) {
        o.copy_(flat_out.narrow(0, offset, o.numel()).view(o.sizes()));
        offset += o.numel();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return post({}, c10d::OpType::BARRIER, [this] { ring(api()->barrier(ring_)); });
  }

  // Each tensor's bytes under a key of its own in torch's store; sent in call order after the
  // collectives before it.
  c10::intrusive_ptr<c10d::Work> send(Tensors& tensors, int dst, int tag) override {
    checkRank("send", dst);
    std::vector<std::string> keys;
    for (const auto& t : tensors) {
      checkTensor("send", t);
      keys.push_back(nextKey(sent_, rank_, dst, tag));
    }
    return post(tensors, c10d::OpType::SEND, [this, tensors, keys] {
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        const at::Tensor bytes = host(tensors[i]);
        const auto* begin = static_cast<const uint8_t*>(bytes.data_ptr());
        store_->set(keys[i], std::vector<uint8_t>(begin, begin + bytes.nbytes()));
      }
    });
  }

  // Waits on a thread of its own (a recv posted before the send it waits for, in this process
  // or another, must not hold the collectives up) at most the group's timeout, naming the rank.
  c10::intrusive_ptr<c10d::Work> recv(Tensors& tensors, int src, int tag) override {
    checkRank("recv", src);
    std::vector<std::string> keys;
    for (const auto& t : tensors) {
      checkTensor("recv", t);
      keys.push_back(nextKey(received_, src, rank_, tag));
    }
    auto work = c10::make_intrusive<TroupeWork>(tensors, c10d::OpType::RECV);
    std::thread([work, tensors, keys, src, tag, store = store_, timeout = timeout_] {
      std::exception_ptr error;
      try {
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          // Polled, sleeping between looks: a TCPStore's wait holds its client's lock while it
          // waits, and this process's own sends (the one this recv's sender waits for, say)
          // would wait behind it.
          const auto deadline = std::chrono::steady_clock::now() + timeout;
          auto pause = std::chrono::microseconds(500);
          while (!store->check({keys[i]})) {
            if (std::chrono::steady_clock::now() > deadline)
              throw std::runtime_error(c10::str("troupe backend: recv timed out after ",
                                                timeout.count() / 1000.0, " s waiting for rank ",
                                                src, " (tag ", tag, ")"));
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(10000));
          }
          const std::vector<uint8_t> got = store->get(keys[i]);
          store->deleteKey(keys[i]);
          const at::Tensor& t = tensors[i];
          const auto want = static_cast<std::size_t>(t.numel()) * t.element_size();
          if (got.size() != want)
            throw std::runtime_error(c10::str("troupe backend: recv from rank ", src, ": ",
                                              got.size() / t.element_size(),
                                              " values for a tensor of ", t.numel()));
          at::Tensor into = at::empty(t.sizes(), t.options().device(at::kCPU));
          std::memcpy(into.data_ptr(), got.data(), want);
          t.copy_(into);
        }
      } catch (...) {
        error = std::current_exception();
      }
      work->done(error);
    }).detach();
    return work;
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(Tensors&, int) override {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "troupe backend: recv from any source is not supported "
                                "yet (recv from a named rank is)");
  }

 private:
  // ---- the thread ----
  c10::intrusive_ptr<c10d::Work> post(Tensors outputs, c10d::OpType type,
                                      std::function<void()> run) {
    auto work = c10::make_intrusive<TroupeWork>(std::move(outputs), type);
    auto job = [work, run = std::move(run)] {
      std::exception_ptr error;
      try {
        run();
      } catch (...) {
        error = std::current_exception();
      }
      work->done(error);
    };
    if (std::this_thread::get_id() == thread_.get_id()) {  // a callback of a Work done here
      job();
      return work;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
    return work;
  }

  void serve() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every call queued before is done
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  // ---- helpers (on the thread) ----

  // Every rank's `mine` (a flat contiguous host tensor of one size and dtype on every rank), bit
  // for bit, in rank order: its bytes in float32 words through the ring's allgather, which copies
  // the words it is given.
  Tensors everyones(const at::Tensor& mine) {
    const auto bytes = static_cast<std::size_t>(mine.nbytes());
    const std::size_t words = (bytes + 3) / 4;
    at::Tensor sent = inPlace(mine) ? mine : at::zeros({static_cast<int64_t>(words)}, at::kFloat);
    if (!inPlace(mine) && bytes) std::memcpy(sent.data_ptr(), mine.data_ptr(), bytes);
    at::Tensor all = at::empty({static_cast<int64_t>(words) * size_}, at::kFloat);
    ring(api()->allgather(ring_, floats(sent), words, floats(all)));
    Tensors got;
    for (int r = 0; r < size_; ++r) {
      at::Tensor t = at::empty(mine.sizes(), mine.options());
      if (bytes) std::memcpy(t.data_ptr(), floats(all) + r * words, bytes);
      got.push_back(t);
    }
    return got;
  }

  // t becomes the root's, bit for bit, by the ring's broadcast from the root: a float32 host
  // tensor where it lies, anything else as its bytes in float32 words.
  void fromRoot(const at::Tensor& t, int64_t root) {
    const at::Tensor mine = host(t);
    const auto from = static_cast<int>(root);
    if (inPlace(mine)) {
      ring(api()->broadcast(ring_, floats(mine), mine.numel(), from));
    } else {
      const auto bytes = static_cast<std::size_t>(mine.nbytes());
      const auto words = static_cast<int64_t>((bytes + 3) / 4);
      at::Tensor sent =
          rank_ == root ? at::zeros({words}, at::kFloat) : at::empty({words}, at::kFloat);
      if (rank_ == root && bytes) std::memcpy(sent.data_ptr(), mine.data_ptr(), bytes);
      ring(api()->broadcast(ring_, floats(sent), words, from));
      if (rank_ != root && bytes) std::memcpy(mine.data_ptr(), sent.data_ptr(), bytes);
    }
    if (rank_ != root && mine.data_ptr() != t.data_ptr()) t.copy_(mine.view(t.sizes()));
  }

  // output: every rank's input laid end to end, rank by rank.
  void gatherInto(const at::Tensor& output, const at::Tensor& input) {
    const at::Tensor mine = host(input);
    if (inPlace(mine) && inPlace(output)) {
      ring(api()->allgather(ring_, floats(mine), mine.numel(), floats(output)));
      return;
    }
    output.copy_(at::cat(everyones(mine)).view(output.sizes()));
  }

  // output: the reduction over the ranks of their `all`'s rank-th part (as many values as output).
  void scatterSum(const at::Tensor& output, const at::Tensor& all, RedOp op) {
    const int64_t n = output.numel();
    if (isFloat(output) && (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG)) {
      const at::Tensor sent = all.to(at::kFloat).contiguous();
      at::Tensor mine = inPlace(output) ? output : at::empty({n}, at::kFloat);
      ring(api()->reduce_scatter(ring_, floats(sent), n, floats(mine)));
      if (op == c10d::ReduceOp::AVG) mine.div_(size_);
      if (!mine.is_same(output)) output.copy_(mine.view(output.sizes()));
      return;
    }
    Tensors parts;
    for (const auto& theirs : everyones(all))
      parts.push_back(theirs.narrow(0, rank_ * n, n));
    output.copy_(reduced(at::stack(parts), op).view(output.sizes()));
  }

  // alltoall: rank r's input split j lands in rank j's output split r. Every rank's input (of
  // sizes that may differ) goes round the ring, padded to the largest.
  void exchangeRows(const at::Tensor& output, const at::Tensor& input,
                    const std::vector<int64_t>& ins, const std::vector<int64_t>& outs) {
    const int64_t row = input.dim() > 0 && input.size(0) ? input.numel() / input.size(0) : 1;
    const at::Tensor mine_sizes = at::tensor(ins, at::kLong);
    const Tensors sizes = everyones(mine_sizes);
    int64_t most = 0;
    for (const auto& s : sizes)
      most = std::max(most, s.sum().item<int64_t>() * row);
    at::Tensor padded = at::zeros({most}, input.options().device(at::kCPU));
    padded.narrow(0, 0, input.numel()).copy_(input.reshape({-1}));
    const Tensors inputs = everyones(padded);
    Tensors parts;
    for (int r = 0; r < size_; ++r) {
      const auto* theirs = sizes[r].data_ptr<int64_t>();
      int64_t begin = 0;
      for (int j = 0; j < rank_; ++j)
        begin += theirs[j] * row;
      const int64_t count = theirs[rank_] * row;
      if (count != outs[r] * row)
        throw std::invalid_argument(c10::str("troupe backend: alltoall: rank ", r,
                                             " sends this rank ", count / row,
                                             " rows, and its output split holds ", outs[r]));
      parts.push_back(inputs[r].narrow(0, begin, count));
    }
    output.copy_(at::cat(parts).view(output.sizes()));
  }

  // ---- checks (on the caller's thread) ----
  void checkRank(const char* what, int64_t r) const {
    TORCH_CHECK_VALUE(r >= 0 && r < size_, "troupe backend: ", what, " with rank ", r, ", in a ",
                      "group of ", size_);
  }

  void checkGatherInto(const char* what, const at::Tensor& output, const at::Tensor& input) const {
    checkTensor(what, output);
    checkTensor(what, input);
    TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "troupe backend: ", what,
                      ": the output holds ", output.numel(), " values, ", size_, " ranks' inputs ",
                      input.numel(), " each");
    TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "troupe backend: ", what,
                     " from ", c10::toString(input.scalar_type()), " into ",
                     c10::toString(output.scalar_type()));
  }

  void checkScatterFrom(const char* what, const at::Tensor& output, const at::Tensor& input,
                        RedOp op) const {
    checkTensor(what, output);
    checkTensor(what, input);
    checkReduction(what, op, output.scalar_type());
    TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "troupe backend: ", what,
                      ": the input holds ", input.numel(), " values, ", size_, " ranks' parts of ",
                      output.numel());
  }

  std::vector<int64_t> splits(const at::Tensor& t, const std::vector<int64_t>& given,
                              const char* what) const {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    if (!given.empty()) {
      int64_t sum = 0;
      for (auto s : given)
        sum += s;
      TORCH_CHECK_VALUE(static_cast<int>(given.size()) == size_ && sum == rows,
                        "troupe backend: alltoall: ", what, " split sizes ",
                        c10::IntArrayRef(given), " for ", size_, " ranks and ", rows, " rows");
      return given;
    }
    TORCH_CHECK_VALUE(rows % size_ == 0, "troupe backend: alltoall: ", rows, " rows of the ", what,
                      " do not split evenly over ", size_, " ranks");
    return std::vector<int64_t>(size_, rows / size_);
  }

  // The store key of the next message from src to dst with `tag`.
  std::string nextKey(std::map<std::pair<int, int>, int64_t>& counts, int src, int dst, int tag) {
    const int peer = src == rank_ ? dst : src;
    const int64_t count = counts[{peer, tag}]++;
    return c10::str("troupe/p2p/", src, "/", dst, "/", tag, "/", count);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  void* ring_ = nullptr;         // the ring store, behind kvstore_
  PyObject* kvstore_ = nullptr;  // the troupe._troupe.KVStore that owns it
  std::map<std::pair<int, int>, int64_t> sent_, received_;  // (peer, tag) -> messages so far

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");  // the c10d types' Python bindings
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, py::object kvstore) -> c10::intrusive_ptr<Base> {
        return c10::make_intrusive<TroupeBackend>(store, rank, size, timeout, std::move(kvstore));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("kvstore"),
      "The troupe backend of a group: its collectives on `kvstore` (a ring KVStore of the group's "
      "ranks), send and recv through `store`");
}
