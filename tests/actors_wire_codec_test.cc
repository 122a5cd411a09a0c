// The wire codec (actors/core/wire_codec.h) as the transport runs it: every message of
// WireMessages, each of its fields set to a value of its own, is encoded, written as the bytes the
// transport sends and parsed as a link parses them; Cap'n Proto's own reader must find each value
// in its schema field, and the decoded message must come back field for field. Encoding each
// message type also checks its form (messages.h) against wire.capnp.
#include <capnp/dynamic.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "actors/core/messages.h"
#include "actors/core/wire_codec.h"
#include "transport/message_state.h"
#include "transport/wire.capnp.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

constexpr std::uint32_t kFromNode = 7;

template <typename M>
Decoded roundTrip(M message) {
  Typed<M> envelope(std::move(message));
  const auto in = transport::loopback(encodeMessage({kFromNode, 3}, {0, 2}, envelope));
  return decodeMessage(kFromNode, in);
}

// A value for the i-th field that no other field of the message has.
template <typename T>
void fillDistinct(T& value, int i, std::string_view name) {
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    value = kernels::Tensor::host({i + 2});
    for (int k = 0; k < i + 2; ++k)
      value.f32()[k] = 0.25f * static_cast<float>(k) - static_cast<float>(i);
  } else if constexpr (std::is_same_v<T, std::string>) {
    value = "field " + std::string(name);
  } else if constexpr (std::is_same_v<T, bool>) {
    value = true;
  } else if constexpr (std::is_enum_v<T>) {
    value = static_cast<T>(1);  // every enum on the wire has a value 1 that is not its default
  } else if constexpr (wire::NamedRowPointer<T>) {
    // The one table whose rows travel by name so far: a row other than the default (SGD).
    value = &kernels::optimizers()[1 + static_cast<std::size_t>(i) %
                                           (kernels::optimizers().size() - 1)];
  } else {
    value = static_cast<T>(100 + i);
  }
}

template <typename T>
void expectSame(const T& sent, const T& received, std::string_view name) {
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    ASSERT_EQ(received.dtype(), sent.dtype()) << name;
    ASSERT_EQ(received.numel(), sent.numel()) << name;
    EXPECT_EQ(std::memcmp(received.raw(), sent.raw(), sent.bytes()), 0) << name;
  } else {
    EXPECT_EQ(received, sent) << name;
  }
}

// What Cap'n Proto's own reader (its dynamic API, by the schema) finds in field `name` of the
// frame's member `member` ("" the member itself) is the member's value.
template <typename T>
void expectOnTheWire(const transport::IncomingMessage& in, std::string_view member,
                     std::string_view name, const T& value) {
  const auto frame = capnp::toDynamic(in.frame());
  const auto k = [](std::string_view n) { return kj::StringPtr(n.data(), n.size()); };
  capnp::DynamicValue::Reader v = frame.get(k(member));
  if (!name.empty()) v = v.as<capnp::DynamicStruct>().get(k(name));
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    const auto t = in.tensor(v.as<capnp::DynamicStruct>().as<transport::wire::TensorData>(), {},
                             value.dtype());
    ASSERT_EQ(t.bytes(), value.bytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), value.raw(), value.bytes()), 0) << name;
  } else if constexpr (std::is_same_v<T, std::string>) {
    EXPECT_EQ(std::string(v.as<capnp::Text>().cStr()), value) << name;
  } else if constexpr (wire::NamedRowPointer<T>) {
    EXPECT_EQ(std::string(v.as<capnp::Text>().cStr()), value->name) << name;
  } else if constexpr (std::is_enum_v<T>) {
    EXPECT_EQ(v.as<capnp::DynamicEnum>().getRaw(), static_cast<std::uint16_t>(value)) << name;
  } else if constexpr (std::is_same_v<T, bool>) {
    EXPECT_EQ(v.as<bool>(), value) << name;
  } else if constexpr (std::is_floating_point_v<T>) {
    EXPECT_EQ(v.as<double>(), static_cast<double>(value)) << name;
  } else if constexpr (std::is_signed_v<T>) {
    EXPECT_EQ(v.as<std::int64_t>(), static_cast<std::int64_t>(value)) << name;
  } else {
    EXPECT_EQ(v.as<std::uint64_t>(), static_cast<std::uint64_t>(value)) << name;
  }
}

template <typename M>
void expectRoundTrip() {
  constexpr auto& form = wire::kForm<M>;
  M sent{};
  int i = 0;
  wire::eachField<M>(form.fields,
                     [&](std::string_view name, auto get) { fillDistinct(get(sent), i++, name); });
  if constexpr (std::is_same_v<M, Subscribe>) sent.node = kFromNode;  // one's own node only
  Typed<M> envelope{M(sent)};
  const auto in = transport::loopback(encodeMessage({kFromNode, 3}, {0, 2}, envelope));
  wire::eachField<M>(form.fields, [&](std::string_view name, auto get) {
    expectOnTheWire(in, form.frame_member, name, get(sent));
  });
  const Decoded d = decodeMessage(kFromNode, in);
  EXPECT_EQ(d.from, (Address{kFromNode, 3}));
  EXPECT_EQ(d.target, 2u);
  ASSERT_EQ(d.message->type(), typeid(M)) << form.frame_member;
  const M& received = static_cast<Typed<M>&>(*d.message).value;
  wire::eachField<M>(form.fields, [&](std::string_view name, auto get) {
    expectSame(get(sent), get(const_cast<M&>(received)), name);
  });
}

TEST(WireCodec, EveryMessageComesBackFieldForField) {
  std::apply([](auto... m) { (expectRoundTrip<decltype(m)>(), ...); }, WireMessages{});
}

TEST(WireCodec, CompressedGradientsComeBackAsBytes) {
  Push push{4, 1, 0, 8, kernels::Tensor::host({5}, kernels::DType::kUInt8)};
  for (int k = 0; k < 5; ++k)
    static_cast<std::uint8_t*>(push.data.raw())[k] = static_cast<std::uint8_t>(250 + k);
  const Decoded d = roundTrip(push);
  const auto& got = static_cast<Typed<Push>&>(*d.message).value.data;
  ASSERT_EQ(got.dtype(), kernels::DType::kUInt8);
  EXPECT_EQ(std::memcmp(got.raw(), push.data.raw(), 5), 0);
  // And float32 when not compressed.
  Push plain{4, 1, 0, 2, kernels::Tensor::host({2})};
  plain.data.f32()[0] = 1.5f;
  plain.data.f32()[1] = -2.0f;
  const Decoded p = roundTrip(plain);
  EXPECT_EQ(static_cast<Typed<Push>&>(*p.message).value.data.dtype(), kernels::DType::kFloat32);
}

// An optimizer travels by its name and comes back as the same row of the table; the default
// (none set) is SGD's.
TEST(WireCodec, AnOptimizerTravelsByItsName) {
  KvConfigure c;
  Decoded d = roundTrip(c);
  EXPECT_EQ(static_cast<Typed<KvConfigure>&>(*d.message).value.optimizer.name(), "sgd");
  c.optimizer.kind = &kernels::optimizerInfo("lamb");
  d = roundTrip(c);
  EXPECT_EQ(static_cast<Typed<KvConfigure>&>(*d.message).value.optimizer.kind,
            &kernels::optimizerInfo("lamb"));
}

// A frame built by hand, as a peer that does not run troupe's codec might send it.
template <typename Build>
transport::IncomingMessage handMade(Build&& build) {
  transport::OutgoingMessage out;
  auto f = out.frame();
  f.setTarget(2);
  f.setSourceActor(3);
  build(f);
  return transport::loopback(std::move(out));
}

std::string decodeError(const transport::IncomingMessage& in) {
  try {
    decodeMessage(kFromNode, in);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(WireCodec, AnEnumValueTheSchemaLacksIsAnInputErrorNamingTheField) {
  const auto in = handMade([](auto f) {
    f.initAllreduceChunk().setPhase(static_cast<transport::wire::AllreduceChunk::Phase>(5));
  });
  EXPECT_NE(decodeError(in).find("phase 5"), std::string::npos) << decodeError(in);
}

TEST(WireCodec, AValueOutOfItsMembersRangeIsAnInputErrorNamingTheMessage) {
  // segment is a UInt32 on the wire and an int32 in RingChunk.
  const auto in = handMade([](auto f) { f.initAllreduceChunk().setSegment(4000000000u); });
  const std::string error = decodeError(in);
  EXPECT_NE(error.find("node 7 sent a malformed allreduceChunk"), std::string::npos) << error;
}

TEST(WireCodec, AnOptimizerNameTheTableLacksIsAnInputErrorNamingTheMessage) {
  const auto in = handMade([](auto f) { f.initKvConfigure().setOptimizer("adamax"); });
  const std::string error = decodeError(in);
  EXPECT_NE(error.find("node 7 sent a malformed kvConfigure"), std::string::npos) << error;
  EXPECT_NE(error.find("unknown name 'adamax'"), std::string::npos) << error;
}

TEST(WireCodec, ASubscriptionForAnotherNodeIsRefused) {
  const auto in = handMade([](auto f) {
    auto s = f.initSubscribe();
    s.setNode(kFromNode + 1);
    s.setEvery(1);
  });
  EXPECT_NE(decodeError(in).find("node 7 subscribed node 8"), std::string::npos);
}

TEST(WireCodec, AFrameWithoutActorMessageIsAnInputError) {
  const auto in = handMade([](auto f) { f.initHello().setNode(1); });
  EXPECT_NE(decodeError(in).find("carries no actor message"), std::string::npos);
}

TEST(WireCodec, AMessageWithoutWireFormIsAnInvariantError) {
  Typed<StallCheck> envelope(StallCheck{});
  EXPECT_THROW(encodeMessage({0, 1}, {1, 1}, envelope), InvariantError);
}

}  // namespace
}  // namespace troupe::actors
