#include "actors/core/wire_codec.h"

#include "actors/core/messages.h"
#include "transport/message.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

template <typename M>
M* as(Envelope& e) {
  return e.type() == typeid(M) ? &static_cast<Typed<M>&>(e).value : nullptr;
}

template <typename M>
std::unique_ptr<Envelope> wrap(M m) {
  return std::make_unique<Typed<M>>(std::move(m));
}

// Compressed gradients travel as bytes (kernels/compression.h), others as float32.
kernels::DType dtypeOf(bool compressed) {
  return compressed ? kernels::DType::kUInt8 : kernels::DType::kFloat32;
}

}  // namespace

transport::OutgoingMessage encodeMessage(Address from, Address to, Envelope& e) {
  transport::OutgoingMessage out;
  auto f = out.frame();
  f.setTarget(to.actor);
  f.setSourceActor(from.actor);
  if (auto* m = as<GradBucket>(e)) {
    auto w = f.initGradBucket();
    w.setStep(m->step);
    w.setReplica(m->replica);
    w.setBegin(m->begin);
    w.setEnd(m->end);
    m->ready.wait();  // the transport reads the tensor on the host: once it is final
    out.setTensor(w.initGrads(), m->grads);
  } else if (auto* m = as<Reduced>(e)) {
    auto w = f.initReduced();
    w.setStep(m->step);
    w.setBegin(m->begin);
    w.setEnd(m->end);
    m->ready.wait();
    out.setTensor(w.initGrads(), m->grads);
  } else if (auto* m = as<Weights>(e)) {
    auto w = f.initWeights();
    w.setStep(m->step);
    m->ready.wait();
    out.setTensor(w.initWeights(), m->weights);
    out.setTensor(w.initBuffers(), m->buffers);
    w.setLossScale(m->loss_scale);
  } else if (auto* m = as<StepDone>(e)) {
    auto w = f.initStepDone();
    w.setStep(m->step);
    w.setReplica(m->replica);
    w.setLossSum(m->loss_sum);
    w.setCorrect(m->correct);
    w.setCount(m->count);
    w.setSkipped(m->skipped);
    w.setInputWait(m->input_wait);
    w.setReady(m->ready);
    w.setReadSeconds(m->read_seconds);
    w.setDevicePeak(m->device_peak);
  } else if (auto* m = as<EpochEnd>(e)) {
    auto w = f.initEpochEnd();
    w.setStep(m->step);
    out.setTensor(w.initWeights(), m->weights);
    out.setTensor(w.initState(), m->state);
    w.setLossScale(m->loss_scale);
    w.setOverflowSteps(m->overflow_steps);
  } else if (as<Resume>(e)) {
    f.setResume();
  } else if (auto* m = as<PauseAt>(e)) {
    f.setPauseAt(m->step);
  } else if (auto* m = as<Handover>(e)) {
    auto w = f.initHandover();
    w.setStep(m->step);
    out.setTensor(w.initWeights(), m->weights);
    out.setTensor(w.initState(), m->state);
    out.setTensor(w.initBuffers(), m->buffers);
    w.setLossScale(m->loss_scale);
    w.setOverflowSteps(m->overflow_steps);
  } else if (auto* m = as<Evaluate>(e)) {
    auto w = f.initEvaluate();
    w.setEpoch(m->epoch);
    out.setTensor(w.initWeights(), m->weights);
    out.setTensor(w.initBuffers(), m->buffers);
  } else if (auto* m = as<Evaluated>(e)) {
    auto w = f.initEvaluated();
    w.setReplica(m->replica);
    w.setLossSum(m->loss_sum);
    w.setCorrect(m->correct);
    w.setCount(m->count);
  } else if (as<BuffersRequest>(e)) {
    f.setBuffersRequest();
  } else if (auto* m = as<Buffers>(e)) {
    out.setTensor(f.initBuffers().initBuffers(), m->buffers);
  } else if (auto* m = as<RingChunk>(e)) {
    auto w = f.initAllreduceChunk();
    w.setStep(m->step);
    w.setBucketBegin(m->bucket);
    w.setOffset(m->offset);
    w.setSegment(static_cast<std::uint32_t>(m->segment));
    w.setChunkIndex(static_cast<std::uint32_t>(m->chunk));
    w.setRound(static_cast<std::uint32_t>(m->round));
    w.setPhase(m->phase == RingChunk::kReduceScatter
                   ? transport::wire::AllreduceChunk::Phase::REDUCE_SCATTER
                   : transport::wire::AllreduceChunk::Phase::ALL_GATHER);
    w.setCompressed(m->data.dtype() == kernels::DType::kUInt8);
    w.setRing(m->ring);
    out.setTensor(w.initData(), m->data);
    // Chunks of different segments and rounds need no order among them: spread them over the
    // link's connections.
    out.setLane(m->segment + m->chunk);
  } else if (auto* m = as<Push>(e)) {
    auto w = f.initPush();
    w.setStep(m->step);
    w.setWorker(m->worker);
    w.setKeyBegin(m->key_begin);
    w.setKeyEnd(m->key_end);
    w.setCompressed(m->data.dtype() == kernels::DType::kUInt8);
    out.setTensor(w.initData(), m->data);
  } else if (auto* m = as<Pull>(e)) {
    auto w = f.initPull();
    w.setStep(m->step);
    w.setWorker(m->worker);
    w.setEpochEnd(m->epoch_end);
    w.setKeyBegin(m->key_begin);
    w.setKeyEnd(m->key_end);
    w.setReplyActor(m->reply_actor);
  } else if (auto* m = as<KvInit>(e)) {
    auto w = f.initKvInit();
    w.setId(m->id);
    w.setWorker(m->worker);
    w.setReplyActor(m->reply_actor);
    w.setKeyBegin(m->key_begin);
    w.setKeyEnd(m->key_end);
    out.setTensor(w.initValue(), m->value);
    w.setKey(m->key);
    w.setFirst(m->first);
  } else if (auto* m = as<KvConfigure>(e)) {
    auto w = f.initKvConfigure();
    w.setId(m->id);
    w.setWorker(m->worker);
    w.setReplyActor(m->reply_actor);
    w.setHasOptimizer(m->has_optimizer);
    w.setLearningRate(m->learning_rate);
    w.setRescaleGrad(m->rescale_grad);
    w.setCompression(m->compression);
    w.setThreshold(m->threshold);
    const auto& o = m->optimizer;
    w.setOptimizer(o.name);
    w.setMomentum(o.momentum);
    w.setWeightDecay(o.weight_decay);
    w.setNesterov(o.nesterov);
    w.setBeta1(o.beta1);
    w.setBeta2(o.beta2);
    w.setEpsilon(o.epsilon);
    w.setRho(o.rho);
    w.setEta(o.eta);
    w.setNewOptimizer(m->new_optimizer);
  } else if (auto* m = as<KvAck>(e)) {
    auto w = f.initKvAck();
    w.setId(m->id);
    w.setError(m->error);
  } else if (auto* m = as<KvDone>(e)) {
    f.setKvDone(m->worker);
  } else if (auto* m = as<PullHeld>(e)) {
    auto w = f.initPullHeld();
    w.setStep(m->step);
    w.setKeyBegin(m->key_begin);
    w.setLateWorker(m->late_worker);
    w.setFinal(m->final);
    w.setReason(m->reason);
  } else if (auto* m = as<Subscribe>(e)) {
    auto w = f.initSubscribe();
    w.setNode(m->node);
    w.setActor(m->actor);
    w.setEvery(m->every);
  } else if (auto* m = as<PullReply>(e)) {
    auto w = f.initPullReply();
    w.setStep(m->step);
    w.setKeyBegin(m->key_begin);
    w.setKeyEnd(m->key_end);
    out.setTensor(w.initData(), m->data);
    out.setTensor(w.initState(), m->state);
  } else if (as<Shutdown>(e)) {
    f.setShutdown();
  } else {
    throw InvariantError("message " + messageName(e.type()) + " has no wire form");
  }
  return out;
}

Decoded decodeMessage(std::uint32_t from_node, const transport::IncomingMessage& in) {
  using W = transport::wire::Frame;
  const auto f = in.frame();
  Decoded d;
  d.from = Address{from_node, f.getSourceActor()};
  d.target = f.getTarget();
  switch (f.which()) {
    case W::GRAD_BUCKET: {
      auto r = f.getGradBucket();
      d.message = wrap(GradBucket{
          r.getStep(), r.getReplica(), r.getBegin(), r.getEnd(), in.tensor(r.getGrads()), {}});
      break;
    }
    case W::REDUCED: {
      auto r = f.getReduced();
      d.message = wrap(Reduced{r.getStep(), r.getBegin(), r.getEnd(), in.tensor(r.getGrads()), {}});
      break;
    }
    case W::WEIGHTS: {
      auto r = f.getWeights();
      d.message = wrap(Weights{
          r.getStep(), in.tensor(r.getWeights()), in.tensor(r.getBuffers()), {}, r.getLossScale()});
      break;
    }
    case W::STEP_DONE: {
      auto r = f.getStepDone();
      d.message = wrap(StepDone{r.getStep(), r.getReplica(), r.getLossSum(), r.getCorrect(),
                                r.getCount(), r.getSkipped(), r.getInputWait(), r.getReady(),
                                r.getReadSeconds(), r.getDevicePeak()});
      break;
    }
    case W::EPOCH_END: {
      auto r = f.getEpochEnd();
      d.message = wrap(EpochEnd{r.getStep(), in.tensor(r.getWeights()), in.tensor(r.getState()),
                                r.getLossScale(), r.getOverflowSteps()});
      break;
    }
    case W::RESUME:
      d.message = wrap(Resume{});
      break;
    case W::PAUSE_AT:
      d.message = wrap(PauseAt{f.getPauseAt()});
      break;
    case W::HANDOVER: {
      auto r = f.getHandover();
      d.message = wrap(Handover{r.getStep(), in.tensor(r.getWeights()), in.tensor(r.getState()),
                                in.tensor(r.getBuffers()), r.getLossScale(), r.getOverflowSteps()});
      break;
    }
    case W::EVALUATE: {
      auto r = f.getEvaluate();
      d.message =
          wrap(Evaluate{r.getEpoch(), in.tensor(r.getWeights()), in.tensor(r.getBuffers())});
      break;
    }
    case W::EVALUATED: {
      auto r = f.getEvaluated();
      d.message = wrap(Evaluated{r.getReplica(), r.getLossSum(), r.getCorrect(), r.getCount()});
      break;
    }
    case W::BUFFERS_REQUEST:
      d.message = wrap(BuffersRequest{});
      break;
    case W::BUFFERS:
      d.message = wrap(Buffers{in.tensor(f.getBuffers().getBuffers())});
      break;
    case W::ALLREDUCE_CHUNK: {
      auto r = f.getAllreduceChunk();
      RingChunk c;
      c.step = r.getStep();
      c.bucket = r.getBucketBegin();
      c.offset = r.getOffset();
      c.segment = static_cast<std::int32_t>(r.getSegment());
      c.chunk = static_cast<std::int32_t>(r.getChunkIndex());
      c.round = static_cast<std::int32_t>(r.getRound());
      c.phase = r.getPhase() == transport::wire::AllreduceChunk::Phase::REDUCE_SCATTER
                    ? RingChunk::kReduceScatter
                    : RingChunk::kAllGather;
      c.ring = r.getRing();
      c.data = in.tensor(r.getData(), {}, dtypeOf(r.getCompressed()));
      d.message = wrap(std::move(c));
      break;
    }
    case W::PUSH: {
      auto r = f.getPush();
      d.message = wrap(Push{r.getStep(), r.getWorker(), r.getKeyBegin(), r.getKeyEnd(),
                            in.tensor(r.getData(), {}, dtypeOf(r.getCompressed()))});
      break;
    }
    case W::PULL: {
      auto r = f.getPull();
      d.message = wrap(Pull{r.getStep(), r.getWorker(), r.getEpochEnd(), r.getKeyBegin(),
                            r.getKeyEnd(), r.getReplyActor()});
      break;
    }
    case W::KV_INIT: {
      auto r = f.getKvInit();
      d.message = wrap(KvInit{r.getId(), r.getWorker(), r.getReplyActor(), r.getKeyBegin(),
                              r.getKeyEnd(), in.tensor(r.getValue()), r.getKey(), r.getFirst()});
      break;
    }
    case W::KV_CONFIGURE: {
      auto r = f.getKvConfigure();
      kernels::OptimizerSettings o;
      o.name = r.getOptimizer().size() == 0 ? "sgd" : std::string(r.getOptimizer().cStr());
      o.momentum = r.getMomentum();
      o.weight_decay = r.getWeightDecay();
      o.nesterov = r.getNesterov();
      o.beta1 = r.getBeta1();
      o.beta2 = r.getBeta2();
      o.epsilon = r.getEpsilon();
      o.rho = r.getRho();
      o.eta = r.getEta();
      d.message = wrap(KvConfigure{r.getId(), r.getWorker(), r.getReplyActor(), r.getHasOptimizer(),
                                   r.getLearningRate(), r.getRescaleGrad(), r.getCompression(),
                                   r.getThreshold(), std::move(o), r.getNewOptimizer()});
      break;
    }
    case W::KV_ACK: {
      auto r = f.getKvAck();
      d.message = wrap(KvAck{r.getId(), r.getError()});
      break;
    }
    case W::KV_DONE:
      d.message = wrap(KvDone{f.getKvDone()});
      break;
    case W::PULL_HELD: {
      auto r = f.getPullHeld();
      d.message = wrap(
          PullHeld{r.getStep(), r.getKeyBegin(), r.getLateWorker(), r.getFinal(), r.getReason()});
      break;
    }
    case W::SUBSCRIBE: {
      auto r = f.getSubscribe();
      if (r.getEvery() < 1 || r.getNode() != from_node) {
        throw InputError("node " + std::to_string(from_node) + " subscribed node " +
                         std::to_string(r.getNode()) + " to the weights every " +
                         std::to_string(r.getEvery()) + " steps");
      }
      d.message = wrap(Subscribe{r.getNode(), r.getActor(), r.getEvery()});
      break;
    }
    case W::PULL_REPLY: {
      auto r = f.getPullReply();
      d.message = wrap(PullReply{r.getStep(), r.getKeyBegin(), r.getKeyEnd(),
                                 in.tensor(r.getData()), in.tensor(r.getState())});
      break;
    }
    case W::SHUTDOWN:
      d.message = wrap(Shutdown{});
      break;
    default:
      throw InputError("node " + std::to_string(from_node) +
                       " sent a frame that carries no actor message");
  }
  return d;
}

}  // namespace troupe::actors
