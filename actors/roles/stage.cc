// Pipeline stages in processes of their own (pipeline_across processes): the link of a replica's
// stage to the other processes' (kernels::StageLink), and the stage actor that takes what they
// send. The replica's net sends from its stage thread, outside any actor; what arrives is handed
// to the net on the transport's thread (the actor's handlers are inline), since the replica's own
// thread waits inside the net's step for exactly these messages.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "actors/core/messages.h"
#include "actors/roles/roles.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

class RuntimeStageLink final : public kernels::StageLink {
 public:
  RuntimeStageLink(Runtime& runtime, std::vector<Address> stages, std::vector<int> workers,
                   std::chrono::milliseconds timeout, std::chrono::milliseconds stall_warning)
      : runtime_(runtime),
        stages_(std::move(stages)),
        workers_(std::move(workers)),
        timeout_(timeout),
        stall_warning_(stall_warning) {}

  void send(int to, kernels::StageTensor message) override {
    runtime_.tell(stages_.at(static_cast<std::size_t>(to)), std::move(message));
  }
  std::string nameOf(int stage) const override {
    if (stage < 0 || stage >= static_cast<int>(workers_.size()))
      return fmt::format("no stage of the {}", workers_.size());
    return fmt::format("worker {}", workers_[static_cast<std::size_t>(stage)]);
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::chrono::milliseconds stallWarning() const override { return stall_warning_; }
  void warn(const std::string& report) override { spdlog::warn("{}", report); }

 private:
  Runtime& runtime_;
  std::vector<Address> stages_;
  std::vector<int> workers_;
  std::chrono::milliseconds timeout_, stall_warning_;
};

class Stage final : public Actor {
 public:
  Stage(std::string name, std::shared_ptr<kernels::StageLink> link)
      : Actor(std::move(name)), link_(std::move(link)) {
    on<kernels::StageTensor>([this](kernels::StageTensor& t) {
      if (!link_) {
        throw InputError(fmt::format(
            "{}: {} of pipeline stage {} came, but this run's stages are not processes of their "
            "own (pipeline_across)",
            this->name(), kernels::kindName(t.kind), t.from));
      }
      link_->deliver(std::move(t));
    });
  }

 private:
  std::shared_ptr<kernels::StageLink> link_;
};

}  // namespace

std::shared_ptr<kernels::StageLink> makeStageLink(Runtime& runtime, std::vector<Address> stages,
                                                  std::vector<int> workers,
                                                  std::chrono::milliseconds peer_timeout,
                                                  std::chrono::milliseconds stall_warning) {
  return std::make_shared<RuntimeStageLink>(runtime, std::move(stages), std::move(workers),
                                            peer_timeout, stall_warning);
}

std::unique_ptr<Actor> makeStage(std::string name, std::shared_ptr<kernels::StageLink> link) {
  return std::make_unique<Stage>(std::move(name), std::move(link));
}

}  // namespace troupe::actors
