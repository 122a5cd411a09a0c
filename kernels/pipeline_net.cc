// A net whose layers run as pipeline stages (NetOptions::pipeline): GPipe's micro-batches
// under PipeDream-Flush's one-forward-one-backward schedule (1F1B), each stage a thread of its own
// with its share of the backend's threads, the stages passing activations forward and their
// gradients back. To its caller it is one Net over the flat weights and gradients of the whole
// model, so every schedule, checkpoint and launcher trains it as it trains any other.
//
// Stage s keeps min(K - s, M) copies of its layers (Net::runLayers), one for each micro-batch it
// may hold between its forward and its backward under 1F1B, all reading the one weights tensor
// and writing one gradients tensor of their own stage's parameters and the tied weights they read
// (NetOptions::stage_grads). Each backward's gradients are added, micro-batch by micro-batch in
// order, into the flat gradients; a stage's ranges are handed on (GradReadyFn) once its last
// backward is done, the last stage's first, so their reduction overlaps the earlier stages'
// backward.
//
// Stages in processes of their own (PipelineOptions::link): each process's net runs its stage's
// thread alone, the activations and gradients that cross to another stage travel through the
// link, and every wait on another process ends after the link's timeout, naming it. The net hands
// on its own stage's gradients only; its weights' other ranges are the other stages', which its
// updater does not keep current. Tied weights that its stage reads from another's come from
// their owner at each step's start, written over its copy of them, and its part of their
// gradient goes to the owner at the step's end, which adds it to its own before handing them on.
// The other stages' layers are not kept here: an evaluation runs through the stages' processes
// as a step's forward does, each stage's layers in its own, the last scoring the batch.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/flat_params.h"
#include "kernels/net.h"
#include "kernels/random.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

// A tensor's rows [begin, end) (its first dimension), sharing its storage.
Tensor rows(const Tensor& t, std::int64_t begin, std::int64_t end) {
  const std::int64_t per = t.numel() / t.dim(0);
  Shape shape = t.shape();
  shape[0] = end - begin;
  return t.slice(begin * per, end * per).view(std::move(shape));
}

// Thrown in a stage that waits when another stage failed: the step ends with that one's error.
struct Aborted {};

// What one stage receives, by micro-batch: activations from the stage before, their gradient from
// the stage after, and parts of its tied weights' gradient from the stages that read them. From
// stages in other processes, by sending stage, once a step: the parts of its tied weights'
// gradient, or the values of the tied weights it reads.
struct Inbox {
  std::map<std::int64_t, Tensor> activations, gradients;
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, Tensor>>> tied;
  std::map<int, Tensor> tied_gradients, tied_weights;
};

using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

class PipelineNet final : public Net {
 public:
  PipelineNet(Backend& backend, const NetOptions& options) : backend_(backend), options_(options) {
    NetOptions one = options;
    one.pipeline = {};
    NetOptions shape = one;
    shape.max_batch = 1;       // its weights, and its shape (params, layers, cuts); it runs nothing
    shape.given_grads = true;  // it has none: the pipeline's sums are its own
    whole_ = makeNet(backend, shape);
    stages_ = options.pipeline.stages;
    micro_batches_ = options.pipeline.microBatches();
    checkPipeline(*whole_, options, backend.device());
    bounds_ = pipelineBounds(*whole_, stages_);
    micro_rows_ = (options.max_batch + micro_batches_ - 1) / micro_batches_;
    metrics_ = backend.empty({2});
    one.max_batch = micro_rows_;
    link_ = options.pipeline.link;
    one.given_weights = one.given_grads = one.stage_grads = true;
    one.stage_weights = link_ != nullptr;  // the others' weights are theirs
    local_ = link_ ? options.pipeline.stage : -1;
    TROUPE_ENFORCE(!link_ || (local_ >= 0 && local_ < stages_), "stage ", local_, " of ", stages_);
    // In a process of its own a stage has all of the process's threads.
    const int threads = link_ ? backend.threads() : std::max(1, backend.threads() / stages_);
    for (const PipelineCut& cut : whole_->pipelineCuts())
      cut_shapes_[cut.layer] = cut.shape;
    for (int s = 0; s < stages_; ++s) {
      Stage& stage = stage_list_.emplace_back();
      // Its layers' parameters, and the tied weights they read (from the shape net, cut there).
      whole_->runLayers(bounds_[static_cast<std::size_t>(s)],
                        bounds_[static_cast<std::size_t>(s) + 1]);
      stage.own = whole_->gradRanges();
      stage.tied = whole_->tiedRanges();
      if (!runsHere(s)) continue;  // another process's: it evaluates its layers there
      stage.backend = makeCpuBackend(threads);
      const int copies = std::min(stages_ - s, micro_batches_);
      stage.held.resize(static_cast<std::size_t>(copies));
      // Each copy's memory planned for the stage's layers from the start (not for every layer
      // first, which a process of a model too large for it would not hold even for a moment).
      one.layers = {bounds_[static_cast<std::size_t>(s)], bounds_[static_cast<std::size_t>(s) + 1]};
      for (int copy = 0; copy < copies; ++copy) {
        Net& net = *stage.nets.emplace_back(makeNet(*stage.backend, one));
        // The copies share the gradients of the stage's own weights and the tied ones it reads
        // (one backward at a time, each added on at once).
        if (copy == 0) {
          const auto window = net.gradWindow();
          stage.grad_values = stage.backend->empty({FlatParams::count(window)});
          stage.grads = FlatParams(stage.grad_values, window);
        }
        net.useGrads(stage.grad_values);
        // Every stage's batch norms update their own ranges of the shape net's buffers.
        net.useBuffers(whole_->buffers());
      }
    }
    // The micro-batches' sums: of every stage's gradients, or in a process of its own, of its
    // stage's and of the tied weights it reads (the others' are not kept here).
    const Ranges window = link_
                              ? stage_list_[static_cast<std::size_t>(local_)].nets[0]->gradWindow()
                              : Ranges{{0, whole_->numParams()}};
    const std::int64_t count = FlatParams::count(window);
    grad_values_ = backend.empty({count});
    grads_ = FlatParams(grad_values_, window);
    weight_count_ = count;  // in a process of its own, its weights are those of the same ranges
    whole_->runLayers(0, whole_->layers().size());
    routeTiedWeights();
    inboxes_.resize(static_cast<std::size_t>(stages_));
    if (!options.given_weights) {
      Tensor weights = whole_->weights();
      if (link_) {  // its ranges of the shape net's initial weights
        weights = backend.empty({count});
        const FlatParams held(weights, window);
        for (const auto& [begin, end] : window)
          backend.copy(whole_->weights().slice(begin, end), held.slice(begin, end));
      }
      useWeights(weights);
    }
    if (link_) {
      backend.fill(metrics_, 0);  // a stage without the loss scores nothing
      link_->onAbort([this] { abort(); });
      link_->receiveBy([this](StageTensor t) { receive(std::move(t)); });
    }
    for (int s = 0; s < stages_; ++s) {
      if (!runsHere(s)) continue;
      stage_list_[static_cast<std::size_t>(s)].thread = std::thread([this, s] { serve(s); });
      ++running_;
    }
  }

  ~PipelineNet() override {
    if (link_) {
      link_->receiveBy(nullptr);
      link_->onAbort(nullptr);
    }
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (Stage& stage : stage_list_) {
      if (stage.thread.joinable()) stage.thread.join();
    }
  }

  const std::vector<ParamInfo>& params() const override { return whole_->params(); }
  const std::string& channelsLastMisfit() const override { return whole_->channelsLastMisfit(); }
  NetMemory memory() const override {
    NetMemory sum;
    for (const Stage& stage : stage_list_) {
      for (const auto& net : stage.nets) {
        const NetMemory m = net->memory();
        sum.activations += m.activations;
        sum.gradients += m.gradients;
        sum.held += m.held;
        sum.scratch += m.scratch;
      }
    }
    return sum;
  }
  std::int64_t numParams() const override { return whole_->numParams(); }
  std::vector<LayerInfo> layers() const override { return whole_->layers(); }
  double trainingFlopsPerSample() const override { return whole_->trainingFlopsPerSample(); }
  const Tensor& weights() const override { return link_ ? weight_values_ : whole_->weights(); }
  Ranges weightWindow() const override { return link_ ? grads_.window() : whole_->weightWindow(); }
  void useWeights(const Tensor& weights) override {
    if (link_) {
      TROUPE_ENFORCE(weights.numel() == weight_count_, "weights of ", weights.numel(),
                     " values for pipeline stage ", local_, ", which holds ", weight_count_);
      weight_values_ = weights;
    } else {
      whole_->useWeights(weights);
    }
    for (Stage& stage : stage_list_)
      for (auto& net : stage.nets)
        net->useWeights(weights);
  }
  const Tensor& grads() const override { return grad_values_; }
  Ranges gradWindow() const override { return grads_.window(); }
  void useGrads(const Tensor&) override {
    throw InvariantError("useGrads() of a whole pipeline (its gradients are summed in its own)");
  }
  void useBuffers(const Tensor&) override {
    throw InvariantError("useBuffers() of a whole pipeline (its stages share its own)");
  }
  const Tensor& buffers() const override { return whole_->buffers(); }
  Tensor ownInput(const Tensor& images) override { return images; }
  bool convertsImages() const override { return false; }
  const Tensor& metrics() const override { return metrics_; }
  bool scoresBatch() const override { return !link_ || local_ + 1 == stages_; }

  // Training: the batch is kept for backward(), which runs the pipelined step. Evaluation: the
  // batch goes through the stages' first copies in micro-batches, on this thread; a stage in a
  // process of its own evaluates its layers alone (evaluateStage).
  void forward(const Tensor& images, const Tensor& labels, bool train) override {
    TROUPE_ENFORCE(images.dim(0) >= 1 && images.dim(0) <= options_.max_batch, "batch of ",
                   images.dim(0), " with max_batch ", options_.max_batch);
    images_ = images;
    labels_ = labels.view({labels.numel()});
    trained_ = train;
    if (train) return;
    if (link_) return evaluateStage();
    const std::int64_t n = images.dim(0), per_label = labels.numel() / n;
    for (std::int64_t begin = 0; begin < n; begin += micro_rows_) {
      const std::int64_t end = std::min(n, begin + micro_rows_);
      Tensor x = rows(images, begin, end);
      for (Stage& stage : stage_list_) {
        Net& net = *stage.nets[0];
        net.forward(x, labels_.slice(begin * per_label, end * per_label), false);
        if (&stage != &stage_list_.back()) x = net.output();
      }
      addMetrics(stage_list_.back().nets[0]->metrics(), begin == 0);
    }
  }

  void backward(float grad_scale, const GradReadyFn& on_ready) override {
    TROUPE_ENFORCE(trained_, "backward() after a forward() that was not training");
    trained_ = false;
    const std::int64_t n = images_.dim(0);
    const std::int64_t count = std::min<std::int64_t>(micro_batches_, n);
    // This stage's parts of another process's stage's tied weights' gradients are summed there
    // over the micro-batches, from zeros.
    for (const TiedLink& link : tied_owners_)
      for (const auto& [begin, end] : link.ranges)
        backend_.fill(grads_.slice(begin, end), 0);
    {
      std::lock_guard lock(mutex_);
      if (aborted_) throw stoppedError();
      step_ = Step{};
      step_.id = ++steps_;
      step_.grad_scale = grad_scale;
      for (std::int64_t m = 0; m <= count; ++m)  // rows [offsets[m], offsets[m + 1])
        step_.offsets.push_back(m * (n / count) + std::min(m, n % count));
      step_.done.assign(static_cast<std::size_t>(stages_), false);
      for (auto& inbox : inboxes_)
        inbox = Inbox{};
      // What the other processes' stages sent for this step before it began here.
      const auto early = early_.find(step_.id);
      if (early != early_.end()) {
        for (StageTensor& t : early->second)
          place(std::move(t));
        early_.erase(early);
      }
    }
    changed_.notify_all();
    // The tied weights that stages in other processes read, as they are this step.
    for (const TiedLink& link : tied_readers_) {
      const Tensor values = joined(weightsHeld(), link, backend_);
      backend_.synchronize();
      sendTo(link.stage, StageTensor::kTiedWeights, 0, values);
    }
    // Each stage's ranges once its last backward is done, the last stage's first (reverse layer
    // order over the layout, as GradReadyFn wants); in a process of its own, its own stage's
    // alone, with the other processes' parts of its tied weights' gradients added.
    for (int s = stages_; s-- > 0;) {
      if (!runsHere(s)) continue;
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return step_.done[static_cast<std::size_t>(s)] || step_.error; });
      if (step_.error) {
        changed_.wait(lock, [&] { return step_.finished == running_; });
        std::rethrow_exception(step_.error);
      }
      lock.unlock();
      if (link_) addTiedGradients();
      if (!on_ready) continue;
      const auto& ranges = stage_list_[static_cast<std::size_t>(s)].own;
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it)
        on_ready(it->first, it->second, nullptr);
    }
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return step_.finished == running_; });
  }

  void trainStep(const Tensor& images, const Tensor& labels, float grad_scale,
                 const GradReadyFn& on_ready) override {
    forward(images, labels, true);
    backward(grad_scale, on_ready);
  }
  StepGraphStats graphStats() const override {
    StepGraphStats s;
    s.off = "the net runs as pipeline stages (pipeline_stages)";
    return s;
  }
  void setProfiling(bool on) override {
    profiling_ = on;
    for (Stage& stage : stage_list_) {
      stage.busy_forward = stage.busy_backward = 0;
      stage.micro_batches = 0;
      for (auto& net : stage.nets)
        net->setProfiling(on);
    }
    profiled_from_ = steps_;
  }
  // The stages' rows added up by kind (their times overlap: they ran at once), then a row for
  // each stage, "pipeline stage S": the seconds it computed, its waits left out (its bubble is
  // the rest of the steps' time).
  StepProfile profile() override {
    StepProfile sum;
    for (Stage& stage : stage_list_) {
      for (auto& net : stage.nets) {
        const StepProfile p = net->profile();
        for (const auto& row : p.rows) {
          auto it = std::find_if(sum.rows.begin(), sum.rows.end(),
                                 [&](const StepProfile::Row& r) { return r.kind == row.kind; });
          if (it == sum.rows.end()) it = sum.rows.insert(it, StepProfile::Row{row.kind});
          it->forward += row.forward;
          it->backward += row.backward;
          it->calls += row.calls;
        }
      }
    }
    for (std::size_t s = 0; s < stage_list_.size(); ++s) {
      Stage& stage = stage_list_[s];
      sum.rows.push_back({fmt::format("pipeline stage {}", s), stage.busy_forward,
                          stage.busy_backward, stage.micro_batches});
      stage.busy_forward = stage.busy_backward = 0;
      stage.micro_batches = 0;
    }
    sum.steps = steps_ - profiled_from_;
    profiled_from_ = steps_;
    return sum;
  }
  void reseed(std::uint64_t seed) override {
    seed_ = seed;
    seeded_at_ = steps_;
  }

  StageTimes stageTimes() override {
    if (!link_) return {};
    return std::exchange(stage_list_[static_cast<std::size_t>(local_)].times, StageTimes{});
  }

  std::vector<PipelineCut> pipelineCuts() const override { return {}; }
  void runLayers(std::size_t, std::size_t) override {
    throw InvariantError("a net of pipeline stages is not cut again");
  }
  Tensor output() override { throw InvariantError("output() of a whole pipeline"); }
  void setOutputGrad(const Tensor&) override {
    throw InvariantError("setOutputGrad() of a whole pipeline");
  }
  Tensor inputGrad() override { throw InvariantError("inputGrad() of a whole pipeline"); }
  std::vector<std::pair<std::int64_t, std::int64_t>> gradRanges() const override {
    return {{0, whole_->numParams()}};
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> bufferRanges() const override {
    return {{0, whole_->buffers().numel()}};
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> tiedRanges() const override { return {}; }
  void setTiedGrad(std::int64_t, const Tensor&) override {
    throw InvariantError("setTiedGrad() of a whole pipeline");
  }

 private:
  struct Stage {
    std::unique_ptr<Backend> backend;
    // The ranges of the flat parameters its layers own (Net::gradRanges), and those of another
    // stage's that they read (Net::tiedRanges).
    Ranges own, tied;
    // Its copies, micro-batch m on m % size; none for another process's stage.
    std::vector<std::unique_ptr<Net>> nets;
    // The copies' gradients (in a process of its own, none but its own stage's), and the same
    // taken by their place in the whole model's.
    Tensor grad_values;
    FlatParams grads;
    // Each copy's input, kept until the copy's next forward (its backward reads it, and one that
    // came from another process lives in the link's receive buffer).
    std::vector<Tensor> held;
    std::thread thread;
    // Tied weights: where this stage's part of a tied range goes (the owner's stage), how many
    // parts come to it each micro-batch, and the zeros it takes for a part that another process
    // adds (by the range's first element).
    std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, int>> tied_to;
    int tied_parts = 0;
    std::vector<std::pair<std::int64_t, Tensor>> tied_zeros;
    // Since stageTimes() last read them: the steps' pipelined seconds and those computing.
    StageTimes times;
    // While profiling: seconds computing, and micro-batches gone through.
    double busy_forward = 0, busy_backward = 0;
    std::int64_t micro_batches = 0;
  };
  struct Step {
    std::int64_t id = 0;
    float grad_scale = 1.0f;
    std::vector<std::int64_t> offsets;  // micro-batch m: rows [offsets[m], offsets[m + 1])
    std::vector<bool> done;             // a stage's last backward is done
    int finished = 0;                   // stages that ended the step, done or failing
    std::exception_ptr error;           // the first stage's that failed
  };

  // Between this process's stage and another process's that reads the other's weights (tied):
  // that stage, and the ranges, which travel one after another in one message.
  struct TiedLink {
    int stage = 0;
    Ranges ranges;
    std::int64_t size = 0;
  };

  // Each range a stage's layer reads from another stage's weights: the part goes to the stage
  // whose layers own it. Between processes, a part for a stage in another one is summed over the
  // step's micro-batches in this process's gradients over its range, and sent to the owner at the
  // step's end; the owner's copies take zeros for it, and it adds the part once its own backward
  // is done.
  void routeTiedWeights() {
    const auto link = [](std::vector<TiedLink>& links, int stage,
                         std::pair<std::int64_t, std::int64_t> range) {
      auto it = std::find_if(links.begin(), links.end(),
                             [stage](const TiedLink& l) { return l.stage == stage; });
      if (it == links.end()) it = links.insert(links.end(), TiedLink{stage, {}, 0});
      it->ranges.push_back(range);
      it->size += range.second - range.first;
    };
    for (int r = 0; r < stages_; ++r) {
      Stage& reader = stage_list_[static_cast<std::size_t>(r)];
      for (const auto& range : reader.tied) {
        for (int o = 0; o < stages_; ++o) {
          Stage& owner = stage_list_[static_cast<std::size_t>(o)];
          for (const auto& [begin, end] : owner.own) {
            if (begin > range.first || range.second > end) continue;
            if (runsHere(r)) reader.tied_to.push_back({range, o});
            if (runsHere(r) && runsHere(o)) ++owner.tied_parts;
            if (runsHere(r) && !runsHere(o)) link(tied_owners_, o, range);
            if (!runsHere(r) && runsHere(o)) {
              const Tensor zeros = owner.backend->empty({range.second - range.first});
              owner.backend->fill(zeros, 0);
              owner.tied_zeros.emplace_back(range.first, zeros);
              link(tied_readers_, r, range);
            }
          }
        }
      }
    }
  }

  bool runsHere(int s) const { return local_ < 0 || s == local_; }

  // The weights, taken by their place in the whole model's.
  FlatParams weightsHeld() const {
    return link_ ? FlatParams(weight_values_, grads_.window()) : FlatParams(whole_->weights());
  }

  // fn(range, part): each range `link` names with its part of their message (the ranges one
  // after another).
  template <typename Fn>
  static void eachRange(const TiedLink& link, const Tensor& message, Fn fn) {
    std::int64_t at = 0;
    for (const auto& [begin, end] : link.ranges) {
      fn(std::pair{begin, end}, message.slice(at, at + end - begin));
      at += end - begin;
    }
  }

  // The ranges of `from` that `link` names, one after another, in a tensor of their own.
  static Tensor joined(const FlatParams& from, const TiedLink& link, Backend& backend) {
    Tensor out = backend.empty({link.size});
    eachRange(link, out, [&](auto range, const Tensor& part) {
      backend.copy(from.slice(range.first, range.second), part);
    });
    return out;
  }

  // The message of `kind` this step from link.stage, once it is in `box` (of an inbox), taken.
  Tensor takeTied(std::map<int, Tensor>& box, const TiedLink& link, StageTensor::Kind kind) {
    await([&] { return box.count(link.stage) > 0; }, link.stage, kind);
    Tensor message;
    post([&] { message = std::move(box.extract(link.stage).mapped()); });
    return message;
  }

  // The stage that owns tied weights, in a process of its own, once its last backward is done:
  // each other process's reader stage's part of their gradient, added to its own. On this
  // (the caller's) thread, whose wait ends as a stage thread's would.
  void addTiedGradients() {
    Inbox& inbox = inboxes_[static_cast<std::size_t>(local_)];
    try {
      for (const TiedLink& link : tied_readers_) {
        const Tensor parts = takeTied(inbox.tied_gradients, link, StageTensor::kTiedGradients);
        eachRange(link, parts, [&](auto range, const Tensor& part) {
          backend_.axpy(1.0f, part, grads_.slice(range.first, range.second));
        });
      }
    } catch (const Aborted&) {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return step_.finished == running_; });
      std::rethrow_exception(step_.error ? step_.error : std::make_exception_ptr(stoppedError()));
    }
  }

  // A stage that reads another process's stage's weights (tied), before its step's first forward:
  // their values this step, from their owner, written over this process's copy of them in the
  // weights the net was given (whose updater keeps only its own stage's ranges current, and
  // writes no other).
  void takeTiedWeights(int s) {
    Inbox& inbox = inboxes_[static_cast<std::size_t>(s)];
    Backend& backend = *stage_list_[static_cast<std::size_t>(s)].backend;
    for (const TiedLink& link : tied_owners_) {
      const Tensor values = takeTied(inbox.tied_weights, link, StageTensor::kTiedWeights);
      eachRange(link, values, [&](auto range, const Tensor& part) {
        backend.copy(part, weightsHeld().slice(range.first, range.second));
      });
    }
  }

  // From the link's thread: a message of another process's stage, into this stage's inbox, or
  // kept for its step if that has not begun here.
  void receive(StageTensor t) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_ || aborted_) return;
      if (t.step < 0) {
        placeEvaluation(std::move(t));
      } else if (t.step > step_.id) {
        early_[t.step].push_back(std::move(t));
      } else {
        place(std::move(t));
      }
    }
    changed_.notify_all();
  }

  // Under the lock: a message of this step into this stage's inbox, checked against what the
  // step can receive (InputError naming the sender).
  void place(StageTensor t) {
    const std::string from = fmt::format("stage {} ({})", t.from, link_->nameOf(t.from));
    if (t.kind == StageTensor::kTiedGradients || t.kind == StageTensor::kTiedWeights) {
      placeTied(std::move(t), from);
      return;
    }
    const bool forward = t.kind == StageTensor::kActivations;
    const int expected = forward ? local_ - 1 : local_ + 1;
    if (t.from != expected || expected < 0 || expected >= stages_) {
      std::string takes;
      if (local_ > 0) takes = fmt::format("activations from stage {}", local_ - 1);
      if (local_ + 1 < stages_) {
        takes += fmt::format("{}gradients from stage {}", takes.empty() ? "" : " and ", local_ + 1);
      }
      throw InputError(fmt::format("pipeline stage {} got {} from {}: it takes {} only", local_,
                                   kindName(t.kind), from, takes));
    }
    if (t.step != step_.id) {
      throw InputError(fmt::format("pipeline stage {} got {} of step {} from {} during step {}",
                                   local_, kindName(t.kind), t.step, from, step_.id));
    }
    const auto count = static_cast<std::int64_t>(step_.offsets.size()) - 1;
    const std::int64_t m = t.micro_batch;
    if (m < 0 || m >= count) {
      throw InputError(
          fmt::format("pipeline stage {} got {} of micro-batch {} from {}, of a step "
                      "of {} micro-batches",
                      local_, kindName(t.kind), m, from, count));
    }
    Shape shape = cut_shapes_.at(bounds_[static_cast<std::size_t>(forward ? local_ : local_ + 1)]);
    shape.insert(shape.begin(), step_.offsets[static_cast<std::size_t>(m) + 1] -
                                    step_.offsets[static_cast<std::size_t>(m)]);
    if (!t.values.defined() || t.values.numel() != numelOf(shape) ||
        t.values.dtype() != DType::kFloat32) {
      throw InputError(fmt::format(
          "pipeline stage {} got {} of micro-batch {} from {} holding {} values, not the {} of "
          "{} float32 values",
          local_, kindName(t.kind), m, from, t.values.defined() ? t.values.numel() : 0,
          toString(shape), numelOf(shape)));
    }
    Inbox& inbox = inboxes_[static_cast<std::size_t>(local_)];
    auto& box = forward ? inbox.activations : inbox.gradients;
    if (!box.emplace(m, t.values.view(std::move(shape))).second) {
      throw InputError(fmt::format("pipeline stage {} got {} of micro-batch {} twice from {}",
                                   local_, kindName(t.kind), m, from));
    }
  }

  // Under the lock: activations that the stage before sent for an evaluation (their step is
  // minus the number of the evaluation's micro-batch, counted alike in every stage's process),
  // checked as place() checks a step's, their rows once this stage takes them.
  void placeEvaluation(StageTensor t) {
    const std::string from = fmt::format("stage {} ({})", t.from, link_->nameOf(t.from));
    if (t.kind == StageTensor::kTiedWeights) return placeEvaluationTied(std::move(t), from);
    if (t.kind != StageTensor::kActivations || t.from != local_ - 1 || t.micro_batch != 0) {
      throw InputError(fmt::format(
          "pipeline stage {} got {} of evaluation micro-batch {} (as micro-batch {}) from {}: an "
          "evaluation takes activations from stage {}, each micro-batch's as micro-batch 0",
          local_, kindName(t.kind), -t.step, t.micro_batch, from, local_ - 1));
    }
    const std::int64_t per = numelOf(cut_shapes_.at(bounds_[static_cast<std::size_t>(local_)]));
    if (!t.values.defined() || t.values.dtype() != DType::kFloat32 || t.values.numel() == 0 ||
        t.values.numel() % per != 0 || t.values.numel() / per > micro_rows_) {
      throw InputError(fmt::format(
          "pipeline stage {} got activations of evaluation micro-batch {} from {} holding {} "
          "values, not 1 to {} rows of {} float32 values",
          local_, -t.step, from, t.values.defined() ? t.values.numel() : 0, micro_rows_, per));
    }
    if (!evaluation_inbox_.emplace(-t.step, t.values).second) {
      throw InputError(fmt::format(
          "pipeline stage {} got the activations of evaluation micro-batch {} twice from {}",
          local_, -t.step, from));
    }
  }

  // Before an evaluation in a process of its own (round r of them, counted alike in every stage's
  // process): the tied weights another stage reads go to it as they are now, the pause's last
  // update applied, and those this stage reads come from their owners into its weights, as at a
  // step's start (takeTiedWeights). Their step is minus the round.
  void prepareEvaluation() override {
    if (!link_ || (tied_readers_.empty() && tied_owners_.empty())) return;
    const std::int64_t round = ++evaluation_rounds_;
    Backend& backend = *stage_list_[static_cast<std::size_t>(local_)].backend;
    for (const TiedLink& link : tied_readers_) {
      const Tensor values = joined(weightsHeld(), link, backend_);
      backend_.synchronize();
      link_->send(link.stage, StageTensor{-round, 0, static_cast<std::int32_t>(local_),
                                          StageTensor::kTiedWeights, values});
    }
    for (const TiedLink& link : tied_owners_) {
      const std::pair<std::int64_t, int> key{round, link.stage};
      try {
        await([&] { return evaluation_tied_.count(key) > 0; }, link.stage,
              StageTensor::kTiedWeights, round, /*evaluation=*/true);
      } catch (const Aborted&) {
        std::lock_guard lock(mutex_);
        std::rethrow_exception(step_.error ? step_.error : std::make_exception_ptr(stoppedError()));
      }
      Tensor values;
      post([&] { values = std::move(evaluation_tied_.extract(key).mapped()); });
      eachRange(link, values, [&](auto range, const Tensor& part) {
        backend.copy(part, weightsHeld().slice(range.first, range.second));
      });
    }
    backend.synchronize();
  }

  // Evaluation in a process of its own: the batch in micro-batches through this stage's layers,
  // on this thread, each micro-batch's activations from the stage before (through the link) and
  // on to the one after; the last stage scores them. Another stage's failure, or the link's, ends
  // it with that error.
  void evaluateStage() {
    Stage& stage = stage_list_[static_cast<std::size_t>(local_)];
    Net& net = *stage.nets[0];
    const std::int64_t n = images_.dim(0), per_label = labels_.numel() / n;
    for (std::int64_t begin = 0; begin < n; begin += micro_rows_) {
      const std::int64_t end = std::min(n, begin + micro_rows_);
      const std::int64_t id = ++evaluated_;
      Tensor x;
      if (local_ == 0) {
        x = rows(images_, begin, end);
      } else {
        try {
          await([&] { return evaluation_inbox_.count(id) > 0; }, local_ - 1,
                StageTensor::kActivations, id, /*evaluation=*/true);
        } catch (const Aborted&) {
          std::lock_guard lock(mutex_);
          std::rethrow_exception(step_.error ? step_.error
                                             : std::make_exception_ptr(stoppedError()));
        }
        Shape shape = cut_shapes_.at(bounds_[static_cast<std::size_t>(local_)]);
        shape.insert(shape.begin(), end - begin);
        post([&] { x = std::move(evaluation_inbox_.extract(id).mapped()); });
        if (x.numel() != numelOf(shape)) {
          throw InputError(fmt::format(
              "pipeline stage {} got activations of evaluation micro-batch {} from stage {} "
              "({}) holding {} values, not the {} of {} float32 values",
              local_, id, local_ - 1, link_->nameOf(local_ - 1), x.numel(), toString(shape),
              numelOf(shape)));
        }
        x = x.view(std::move(shape));
      }
      net.forward(x, labels_.slice(begin * per_label, end * per_label), false);
      if (local_ + 1 < stages_) {
        // Copied: the next micro-batch's forward writes over the output while the link sends it.
        Backend& backend = *stage.backend;
        Tensor out = backend.empty(net.output().shape(), net.output().dtype());
        backend.copy(net.output(), out);
        backend.synchronize();
        link_->send(local_ + 1, StageTensor{-id, 0, static_cast<std::int32_t>(local_),
                                            StageTensor::kActivations, out.view({out.numel()})});
      } else {
        addMetrics(net.metrics(), begin == 0, stage.backend.get());
      }
    }
  }

  // Under the lock: the tied weights this stage reads, from their owner's stage before an
  // evaluation (prepareEvaluation; their step is minus its round), checked as placeTied checks a
  // step's.
  void placeEvaluationTied(StageTensor t, const std::string& from) {
    const auto link = std::find_if(tied_owners_.begin(), tied_owners_.end(),
                                   [&](const TiedLink& l) { return l.stage == t.from; });
    if (link == tied_owners_.end()) {
      throw InputError(fmt::format(
          "pipeline stage {} got tied weights for evaluation {} from {}: it reads none of that "
          "stage's weights",
          local_, -t.step, from));
    }
    if (!t.values.defined() || t.values.numel() != link->size ||
        t.values.dtype() != DType::kFloat32 || t.micro_batch != 0) {
      throw InputError(fmt::format(
          "pipeline stage {} got tied weights for evaluation {} from {} holding {} values (as "
          "micro-batch {}), not the {} float32 values of their ranges (as micro-batch 0)",
          local_, -t.step, from, t.values.defined() ? t.values.numel() : 0, t.micro_batch,
          link->size));
    }
    if (!evaluation_tied_.emplace(std::pair{-t.step, t.from}, t.values).second) {
      throw InputError(
          fmt::format("pipeline stage {} got the tied weights for evaluation {} twice from {}",
                      local_, -t.step, from));
    }
  }

  // Under the lock: a step's tied weights' gradients or values from another process's stage,
  // checked as place() checks the others.
  void placeTied(StageTensor t, const std::string& from) {
    const bool gradients = t.kind == StageTensor::kTiedGradients;
    const auto& links = gradients ? tied_readers_ : tied_owners_;
    const auto link = std::find_if(links.begin(), links.end(),
                                   [&](const TiedLink& l) { return l.stage == t.from; });
    if (link == links.end()) {
      std::vector<int> stages;
      for (const TiedLink& l : links)
        stages.push_back(l.stage);
      throw InputError(fmt::format(
          "pipeline stage {} got {} from {}: it takes them {}", local_, kindName(t.kind), from,
          stages.empty() ? std::string("from no stage")
                         : fmt::format("from stage {} only", fmt::join(stages, ", "))));
    }
    if (t.step != step_.id || t.micro_batch != 0) {
      throw InputError(fmt::format(
          "pipeline stage {} got {} of step {}, micro-batch {}, from {} during step {} (they come "
          "once a step, as micro-batch 0)",
          local_, kindName(t.kind), t.step, t.micro_batch, from, step_.id));
    }
    if (!t.values.defined() || t.values.numel() != link->size ||
        t.values.dtype() != DType::kFloat32) {
      throw InputError(fmt::format(
          "pipeline stage {} got {} from {} holding {} values, not the {} float32 values of their "
          "ranges",
          local_, kindName(t.kind), from, t.values.defined() ? t.values.numel() : 0, link->size));
    }
    Inbox& inbox = inboxes_[static_cast<std::size_t>(local_)];
    if (!(gradients ? inbox.tied_gradients : inbox.tied_weights).emplace(t.from, t.values).second)
      throw InputError(fmt::format("pipeline stage {} got {} of step {} twice from {}", local_,
                                   kindName(t.kind), t.step, from));
  }

  // The run is failing: every wait here ends.
  void abort() {
    post([&] {
      aborted_ = true;
      if (!step_.error) step_.error = std::make_exception_ptr(stoppedError());
    });
  }
  Error stoppedError() const {
    return Error(fmt::format("pipeline stage {}: stopped, the run is failing", local_));
  }

  // Stage s's thread: each step's 1F1B schedule, its warm-up forwards first.
  void serve(int s) {
    std::int64_t served = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || step_.id > served; });
        if (stopping_) return;
        served = step_.id;
      }
      std::exception_ptr error;
      const auto began = std::chrono::steady_clock::now();
      try {
        const auto count = static_cast<std::int64_t>(step_.offsets.size()) - 1;
        const std::int64_t warm_up = std::min<std::int64_t>(stages_ - s - 1, count);
        std::int64_t forwards = 0, backwards = 0;
        takeTiedWeights(s);
        while (forwards < warm_up)
          forwardOf(s, forwards++);
        while (forwards < count) {
          forwardOf(s, forwards++);
          backwardOf(s, backwards++, count);
        }
        while (backwards < count)
          backwardOf(s, backwards++, count);
        StageTimes& times = stage_list_[static_cast<std::size_t>(s)].times;
        times.pipelined +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
        ++times.steps;
      } catch (const Aborted&) {
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        if (error && !step_.error) step_.error = error;
        ++step_.finished;
      }
      changed_.notify_all();
    }
  }

  // Waits for what `ready` finds in a stage's inbox (another stage's failure, the net's end:
  // Aborted), sent by stage `from`: in another process, for the link's timeout at most
  // (TimeoutError naming it), reporting the stall to the link at its stallWarning().
  template <typename Ready>
  void await(Ready ready, int from = -1, StageTensor::Kind kind = StageTensor::kActivations,
             std::int64_t m = 0, bool evaluation = false) {
    std::unique_lock lock(mutex_);
    const auto settled = [&] { return ready() || step_.error || stopping_; };
    if (from < 0 || runsHere(from)) {
      changed_.wait(lock, settled);
    } else {
      const auto seconds = [](std::chrono::milliseconds t) {
        return std::chrono::duration<double>(t).count();
      };
      const bool once = kind == StageTensor::kTiedGradients || kind == StageTensor::kTiedWeights;
      const std::string awaited =
          evaluation ? fmt::format("the {} of evaluation {}{} from stage {} ({})", kindName(kind),
                                   once ? "" : "micro-batch ", m, from, link_->nameOf(from))
                     : fmt::format("the {} of {}step {} from stage {} ({})", kindName(kind),
                                   once ? "" : fmt::format("micro-batch {} of ", m), step_.id, from,
                                   link_->nameOf(from));
      const auto timeout = link_->timeout();
      const auto warn_after = std::min(link_->stallWarning(), timeout);
      bool came = changed_.wait_for(lock, warn_after, settled);
      if (!came && warn_after < timeout) {
        link_->warn(fmt::format(
            "stall: pipeline stage {} has waited {:g} s for {}; the run fails after {:g} s "
            "(peer_timeout)",
            local_, seconds(warn_after), awaited, seconds(timeout)));
        came = changed_.wait_for(lock, timeout - warn_after, settled);
      }
      if (!came) {
        throw TimeoutError(fmt::format("pipeline stage {} waited {:g} s for {} (peer_timeout)",
                                       local_, seconds(timeout), awaited));
      }
    }
    if (step_.error || stopping_) throw Aborted{};
  }

  void forwardOf(int s, std::int64_t m) {
    Stage& stage = stage_list_[static_cast<std::size_t>(s)];
    Inbox& inbox = inboxes_[static_cast<std::size_t>(s)];
    Net& net = *stage.nets[static_cast<std::size_t>(m) % stage.nets.size()];
    const std::int64_t begin = step_.offsets[static_cast<std::size_t>(m)];
    const std::int64_t end = step_.offsets[static_cast<std::size_t>(m) + 1];
    Tensor x;
    if (s == 0) {
      x = rows(images_, begin, end);
    } else {
      await([&] { return inbox.activations.count(m) > 0; }, s - 1, StageTensor::kActivations, m);
      post([&] {
        x = std::move(inbox.activations[m]);
        inbox.activations.erase(m);
      });
    }
    stage.held[static_cast<std::size_t>(m) % stage.held.size()] = x;
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t per_label = labels_.numel() / images_.dim(0);
    net.reseed(randomBits(seed_, static_cast<std::uint64_t>(step_.id - seeded_at_),
                          static_cast<std::uint64_t>(m)));
    net.forward(x, labels_.slice(begin * per_label, end * per_label), true);
    if (s + 1 < stages_) {
      // Read where it lies (or sent from where it lies): this copy runs micro-batch m + copies
      // only after m's backward, for which the next stage has done with it.
      if (runsHere(s + 1)) {
        post([&] { inboxes_[static_cast<std::size_t>(s) + 1].activations[m] = net.output(); });
      } else {
        sendTo(s + 1, StageTensor::kActivations, m, net.output());
      }
    } else {
      addMetrics(net.metrics(), m == 0, stage.backend.get());
    }
    const double busy =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stage.times.busy += busy;
    if (profiling_) {
      stage.busy_forward += busy;
      ++stage.micro_batches;
    }
  }

  void backwardOf(int s, std::int64_t m, std::int64_t count) {
    Stage& stage = stage_list_[static_cast<std::size_t>(s)];
    Inbox& inbox = inboxes_[static_cast<std::size_t>(s)];
    Net& net = *stage.nets[static_cast<std::size_t>(m) % stage.nets.size()];
    Backend& backend = *stage.backend;
    auto waited = std::chrono::steady_clock::duration::zero();
    const auto start = std::chrono::steady_clock::now();
    if (s + 1 < stages_) {
      await([&] { return inbox.gradients.count(m) > 0; }, s + 1, StageTensor::kGradients, m);
      waited += std::chrono::steady_clock::now() - start;
      Tensor dy;
      post([&] {
        dy = std::move(inbox.gradients[m]);
        inbox.gradients.erase(m);
      });
      net.setOutputGrad(dy);
    }
    if (stage.tied_parts > 0) {
      const auto before = std::chrono::steady_clock::now();
      await([&] { return static_cast<int>(inbox.tied[m].size()) == stage.tied_parts; });
      waited += std::chrono::steady_clock::now() - before;
      std::vector<std::pair<std::int64_t, Tensor>> parts;
      post([&] {
        parts = std::move(inbox.tied[m]);
        inbox.tied.erase(m);
      });
      for (const auto& [begin, part] : parts)
        net.setTiedGrad(begin, part);
    }
    for (const auto& [begin, zeros] : stage.tied_zeros)
      net.setTiedGrad(begin, zeros);
    net.backward(step_.grad_scale, nullptr);
    // What leaves is copied: this copy of the stage may run its next micro-batch before the
    // other stage has read it.
    if (s > 0) {
      Tensor dx = backend.empty(net.inputGrad().shape(), net.inputGrad().dtype());
      backend.copy(net.inputGrad(), dx);
      if (runsHere(s - 1)) {
        post([&] { inboxes_[static_cast<std::size_t>(s) - 1].gradients[m] = dx; });
      } else {
        sendTo(s - 1, StageTensor::kGradients, m, dx);
      }
    }
    for (const auto& route : stage.tied_to) {
      const auto [from, to] = route.first;
      if (!runsHere(route.second)) {  // zeros there at the step's start (backward())
        backend.axpy(1.0f, stage.grads.slice(from, to), grads_.slice(from, to));
        continue;
      }
      Tensor part = backend.empty({to - from});
      backend.copy(stage.grads.slice(from, to), part);
      post([&] {
        inboxes_[static_cast<std::size_t>(route.second)].tied[m].emplace_back(from, part);
      });
    }
    for (const auto& [begin, end] : net.gradRanges()) {
      if (m == 0) {
        backend.copy(stage.grads.slice(begin, end), grads_.slice(begin, end));
      } else {
        backend.axpy(1.0f, stage.grads.slice(begin, end), grads_.slice(begin, end));
      }
    }
    const double busy =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start - waited).count();
    stage.times.busy += busy;
    if (profiling_) stage.busy_backward += busy;
    if (m + 1 == count) {
      // This stage's parts of another process's stage's tied weights' gradients, summed over
      // the step's micro-batches, go there (copied: the next step starts from zeros here).
      std::vector<std::pair<int, Tensor>> parts;
      for (const TiedLink& link : tied_owners_)
        parts.emplace_back(link.stage, joined(grads_, link, backend));
      backend.synchronize();
      for (const auto& [to, part] : parts)
        sendTo(to, StageTensor::kTiedGradients, 0, part);
      post([&] { step_.done[static_cast<std::size_t>(s)] = true; });
    }
  }

  // To stage `to` in another process, through the link.
  void sendTo(int to, StageTensor::Kind kind, std::int64_t m, const Tensor& values) {
    link_->send(
        to, StageTensor{step_.id, static_cast<std::int32_t>(m), static_cast<std::int32_t>(local_),
                        kind, values.view({values.numel()})});
  }

  // Changes what the stages wait on, under the lock, and wakes them.
  template <typename Change>
  void post(Change change) {
    {
      std::lock_guard lock(mutex_);
      change();
    }
    changed_.notify_all();
  }

  // The last stage's metrics of a micro-batch into the step's sums (the first: copied).
  void addMetrics(const Tensor& m, bool first, Backend* backend = nullptr) {
    Backend& b = backend ? *backend : backend_;
    if (first) {
      b.copy(m, metrics_);
    } else {
      b.axpy(1.0f, m, metrics_);
    }
  }

  Backend& backend_;
  NetOptions options_;
  std::unique_ptr<Net> whole_;
  int stages_ = 1, micro_batches_ = 1;
  std::vector<std::size_t> bounds_;  // stage s: layers [bounds_[s], bounds_[s + 1])
  std::int64_t micro_rows_ = 1;
  // The micro-batches' sums of the gradients (grads(), gradWindow()), and the same taken by
  // their place in the whole model's.
  Tensor grad_values_;
  FlatParams grads_;
  // In a process of its own: the weights it was given, of the same ranges (weightWindow).
  Tensor weight_values_;
  std::int64_t weight_count_ = 0;
  Tensor metrics_;
  Tensor images_, labels_;  // the training batch, labels flat
  // A stage in a process of its own: its evaluation's micro-batches so far, and the activations
  // of those not yet taken, by number (placeEvaluation).
  std::int64_t evaluated_ = 0;
  std::map<std::int64_t, Tensor> evaluation_inbox_;
  // Before each evaluation (prepareEvaluation): its round, and the tied weights this stage reads,
  // by round and sending stage.
  std::int64_t evaluation_rounds_ = 0;
  std::map<std::pair<std::int64_t, int>, Tensor> evaluation_tied_;
  bool trained_ = false;
  bool profiling_ = false;
  std::int64_t profiled_from_ = 0;  // steps_ when profiling began, or profile() last read
  std::uint64_t seed_ = 0;
  std::int64_t seeded_at_ = 0;  // steps_ at reseed()
  std::vector<Stage> stage_list_;
  // Stages in processes of their own: the link to the others, and the stage run here (else -1);
  // the stage threads this process runs.
  std::shared_ptr<StageLink> link_;
  int local_ = -1;
  int running_ = 0;
  std::map<std::size_t, Shape> cut_shapes_;  // per sample, by the layer a cut is before
  // The stages' shared state: the step, their inboxes; changed_ wakes whoever waits on it.
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool aborted_ = false;  // the run is failing (StageLink::abort)
  std::int64_t steps_ = 0;
  Step step_;
  std::vector<Inbox> inboxes_;
  std::map<std::int64_t, std::vector<StageTensor>> early_;  // for steps not begun here, by step
  // Tied weights between this process's stage and other processes' stages: those it reads from
  // them (by owner) and those they read from it (by reader).
  std::vector<TiedLink> tied_owners_, tied_readers_;
};

}  // namespace

std::vector<std::size_t> pipelineBounds(const Net& whole, int stages) {
  const auto cuts = whole.pipelineCuts();
  TROUPE_ENFORCE(static_cast<int>(cuts.size()) + 1 >= stages, stages, " stages of a net with ",
                 cuts.size(), " cuts");
  const double total = whole.trainingFlopsPerSample() / 3;
  std::vector<std::size_t> bounds{0};
  std::size_t next = 0;  // the first cut still free
  for (int s = 1; s < stages; ++s) {
    const double target = total * s / stages;
    const std::size_t last = cuts.size() - static_cast<std::size_t>(stages - s);
    std::size_t best = next;
    for (std::size_t i = next; i <= last; ++i) {
      if (std::abs(cuts[i].flops_before - target) < std::abs(cuts[best].flops_before - target))
        best = i;
    }
    bounds.push_back(cuts[best].layer);
    next = best + 1;
  }
  bounds.push_back(whole.layers().size());
  return bounds;
}

std::int64_t pipelineHeld(Net& whole, const PipelineOptions& pipeline, std::int64_t batch) {
  const auto bounds = pipelineBounds(whole, pipeline.stages);
  const int micro = pipeline.microBatches();
  const std::int64_t rows = (batch + micro - 1) / micro;
  // The whole model's net at a batch of 1, which the pipeline keeps for its shape and sums.
  const NetMemory one = whole.memory();
  std::int64_t held = one.held + one.scratch;
  for (int s = 0; s < pipeline.stages; ++s) {
    whole.runLayers(bounds[static_cast<std::size_t>(s)], bounds[static_cast<std::size_t>(s) + 1]);
    const NetMemory m = whole.memory();
    // A stage of another process's: none (each process evaluates its own stage's layers).
    const int copies =
        pipeline.stage < 0 || pipeline.stage == s ? std::min(pipeline.stages - s, micro) : 0;
    held += copies * (m.held + m.scratch) * rows;
    if (pipeline.stage != s) continue;
    // In a process of its own, what crosses its cuts lies in messages: the activations each copy
    // keeps for its backward and the copy of their gradient on its way back, and a gradient come
    // from the stage after.
    const auto crossing = [&](std::size_t layer) -> std::int64_t {
      for (const PipelineCut& cut : whole.pipelineCuts())
        if (cut.layer == layer) return 4 * numelOf(cut.shape) * rows;
      return 0;  // the input, or the loss: nothing crosses
    };
    held += (copies + 1) * crossing(bounds[static_cast<std::size_t>(s)]) +
            crossing(bounds[static_cast<std::size_t>(s) + 1]);
  }
  // In a process of its own, the tied weights that its stage reads come in a message each step
  // and before each evaluation; those of its own that another stage reads go out in a copy.
  if (pipeline.stage >= 0) {
    std::vector<Ranges> reads, owns;
    for (int s = 0; s < pipeline.stages; ++s) {
      whole.runLayers(bounds[static_cast<std::size_t>(s)], bounds[static_cast<std::size_t>(s) + 1]);
      reads.push_back(whole.tiedRanges());
      owns.push_back(whole.gradRanges());
    }
    const auto stage = static_cast<std::size_t>(pipeline.stage);
    for (std::size_t s = 0; s < reads.size(); ++s) {
      for (const auto& [begin, end] : reads[s]) {
        const bool mine = std::any_of(owns[stage].begin(), owns[stage].end(), [&](const auto& r) {
          return r.first <= begin && end <= r.second;
        });
        if (s == stage || mine) held += 4 * (end - begin);
      }
    }
  }
  whole.runLayers(0, whole.layers().size());
  return held;
}

std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> pipelineStageWindows(Net& whole,
                                                                                     int stages) {
  const auto bounds = pipelineBounds(whole, stages);
  std::vector<Ranges> windows;
  for (int s = 0; s < stages; ++s) {
    whole.runLayers(bounds[static_cast<std::size_t>(s)], bounds[static_cast<std::size_t>(s) + 1]);
    windows.push_back(stageGradWindow(whole));
  }
  whole.runLayers(0, whole.layers().size());
  return windows;
}

std::int64_t pipelineStageGrads(Net& whole, const PipelineOptions& pipeline) {
  const auto windows = pipelineStageWindows(whole, pipeline.stages);
  std::int64_t held = 0;
  for (int s = 0; s < pipeline.stages; ++s) {
    if (pipeline.stage < 0 || pipeline.stage == s)
      held += FlatParams::count(windows[static_cast<std::size_t>(s)]);
  }
  return held;
}

namespace {

// Each stage's range of `count` flat values, of which `of(whole)` gives the ranges that the
// layers it runs own (Net::gradRanges, Net::bufferRanges): one range after another from 0.
template <typename RangesOf>
Ranges stageRanges(Net& whole, int stages, std::int64_t count, RangesOf of) {
  const auto bounds = pipelineBounds(whole, stages);
  Ranges ranges;
  std::int64_t at = 0;
  for (int s = 0; s < stages; ++s) {
    whole.runLayers(bounds[static_cast<std::size_t>(s)], bounds[static_cast<std::size_t>(s) + 1]);
    const std::int64_t begin = at;
    for (const auto& [first, end] : of(whole)) {
      TROUPE_ENFORCE_EQ(first, at);  // a stage's layers' values follow the stage before's
      at = end;
    }
    ranges.emplace_back(begin, at);
  }
  whole.runLayers(0, whole.layers().size());
  TROUPE_ENFORCE_EQ(at, count);
  return ranges;
}

}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> pipelineParamRanges(Net& whole, int stages) {
  return stageRanges(whole, stages, whole.numParams(),
                     [](const Net& net) { return net.gradRanges(); });
}

std::vector<std::pair<std::int64_t, std::int64_t>> pipelineBufferRanges(Net& whole, int stages) {
  return stageRanges(whole, stages, whole.buffers().numel(),
                     [](const Net& net) { return net.bufferRanges(); });
}

void checkPipeline(const Net& whole, const NetOptions& options, const Device& device) {
  if (device.kind != DeviceKind::kCpu) {
    throw InputError(
        "pipeline_stages: stages run on the CPU for now (this run's replicas are on a GPU)");
  }
  const auto cuts = whole.pipelineCuts();
  if (static_cast<int>(cuts.size()) + 1 < options.pipeline.stages) {
    throw InputError(fmt::format(
        "pipeline_stages {}: the model can be cut into at most {} stages (between layers that "
        "only one tensor crosses)",
        options.pipeline.stages, cuts.size() + 1));
  }
  const int micro = options.pipeline.microBatches();
  if (micro > options.max_batch) {
    throw InputError(fmt::format("micro_batches {} is more than a replica's batch of {}{}", micro,
                                 options.max_batch,
                                 options.pipeline.micro_batches > 0 ? "" : " (as many as stages)"));
  }
}

std::unique_ptr<Net> makePipelineNet(Backend& backend, const NetOptions& options) {
  return std::make_unique<PipelineNet>(backend, options);
}

}  // namespace troupe::kernels
