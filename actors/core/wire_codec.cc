// Every message is encoded and decoded from its wire::Form (actors/core/wire_form.h, declared in
// messages.h) through Cap'n Proto's dynamic API: its fields are looked up in wire.capnp's schema
// once per message type, and each is then set or read by that schema field.
#include "actors/core/wire_codec.h"

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <fmt/format.h>

#include <typeindex>
#include <unordered_map>
#include <vector>

#include "actors/core/messages.h"
#include "transport/message.h"
#include "troupe/error.h"

namespace troupe::actors {

void checkDecoded(const Subscribe& s, std::uint32_t from_node) {
  if (s.every < 1 || s.node != from_node) {
    throw InputError(fmt::format("node {} subscribed node {} to the weights every {} steps",
                                 from_node, s.node, s.every));
  }
}

namespace {

using capnp::DynamicStruct;
using capnp::DynamicValue;
using capnp::StructSchema;
namespace schema = transport::wire;

// A message type's place in the schema, looked up once: the Frame member that carries it and the
// schema field of each of its form's fields, in the form's order.
struct Layout {
  StructSchema::Field member;
  std::vector<StructSchema::Field> fields;
  bool compressed = false;  // the struct has a `compressed` flag for its tensor
};

template <typename M>
const Layout& layoutOf() {
  static const Layout layout = [] {
    constexpr auto& form = wire::kForm<M>;
    const auto frame = capnp::Schema::from<schema::Frame>();
    Layout l{
        frame.getFieldByName(kj::StringPtr(form.frame_member.data(), form.frame_member.size())),
        {}};
    const bool is_struct = l.member.getType().isStruct();
    const StructSchema body = is_struct ? l.member.getType().asStruct() : StructSchema();
    std::vector<bool> filled(is_struct ? body.getFields().size() : 0);
    wire::eachField<M>(form.fields, [&](std::string_view name, auto) {
      if (name.empty()) {
        l.fields.push_back(l.member);
        return;
      }
      kj::Maybe<StructSchema::Field> found;
      if (is_struct) found = body.findFieldByName(kj::StringPtr(name.data(), name.size()));
      KJ_IF_MAYBE (f, found) {
        l.fields.push_back(*f);
        filled[f->getIndex()] = true;
      } else {
        throw InvariantError(
            fmt::format("wire.capnp's {} has no field {} (messages.h's form of {})",
                        form.frame_member, name, messageName(typeid(M))));
      }
    });
    if (!is_struct) return l;
    for (const auto f : body.getFields()) {
      const auto name = f.getProto().getName();
      if (name == "compressed") {
        l.compressed = true;
      } else if (!filled[f.getIndex()] && !name.startsWith("obsolete")) {
        throw InvariantError(fmt::format("wire.capnp's {}.{} is filled by no member of {}",
                                         form.frame_member, name.cStr(), messageName(typeid(M))));
      }
    }
    return l;
  }();
  return layout;
}

// Compressed gradients travel as bytes (kernels/compression.h), others as float32.
kernels::DType dtypeOf(bool compressed) {
  return compressed ? kernels::DType::kUInt8 : kernels::DType::kFloat32;
}

template <typename T>
void put(transport::OutgoingMessage& out, DynamicStruct::Builder s, StructSchema::Field field,
         const T& value) {
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    out.setTensor(s.init(field).as<DynamicStruct>().as<schema::TensorData>(), value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    s.set(field, capnp::Text::Reader(value.data(), value.size()));
  } else if constexpr (std::is_enum_v<T>) {
    s.set(field, capnp::DynamicEnum(field.getType().asEnum(), static_cast<std::uint16_t>(value)));
  } else {
    s.set(field, value);
  }
}

template <typename T>
void take(const transport::IncomingMessage& in, DynamicStruct::Reader s, StructSchema::Field field,
          bool compressed, T& into) {
  const DynamicValue::Reader value = s.get(field);
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    into = in.tensor(value.as<DynamicStruct>().as<schema::TensorData>(), {}, dtypeOf(compressed));
  } else if constexpr (std::is_same_v<T, std::string>) {
    const auto text = value.as<capnp::Text>();
    if (text.size() > 0) into.assign(text.cStr(), text.size());
  } else if constexpr (std::is_enum_v<T>) {
    const auto e = value.as<capnp::DynamicEnum>();
    if (e.getEnumerant() == nullptr) {
      throw InputError(fmt::format("{} {} is not one of its values",
                                   field.getProto().getName().cStr(), e.getRaw()));
    }
    into = static_cast<T>(e.getRaw());
  } else {
    into = value.as<T>();
  }
}

template <typename M>
void encodeAs(transport::OutgoingMessage& out, M& m) {
  constexpr auto& form = wire::kForm<M>;
  const Layout& l = layoutOf<M>();
  if constexpr (requires { m.ready.wait(); }) {
    m.ready.wait();  // the transport reads the tensors on the host: once they are final
  }
  auto frame = capnp::toDynamic(out.frame());
  if (l.member.getType().isVoid()) {
    frame.set(l.member, capnp::VOID);
    return;
  }
  DynamicStruct::Builder body =
      l.member.getType().isStruct() ? frame.init(l.member).as<DynamicStruct>() : frame;
  std::size_t i = 0;
  bool compressed = false;
  wire::eachField<M>(form.fields, [&](std::string_view, auto get) {
    const auto& value = get(m);
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, kernels::Tensor>) {
      compressed = compressed || value.dtype() == kernels::DType::kUInt8;
    }
    put(out, body, l.fields[i++], value);
  });
  if (l.compressed) body.set("compressed", compressed);
  if constexpr (requires { wireLane(m); }) out.setLane(wireLane(m));
}

template <typename M>
std::unique_ptr<Envelope> decodeAs(const transport::IncomingMessage& in,
                                   DynamicStruct::Reader frame, std::uint32_t from_node) {
  constexpr auto& form = wire::kForm<M>;
  const Layout& l = layoutOf<M>();
  M m{};
  if (!l.member.getType().isVoid()) {
    const DynamicStruct::Reader body =
        l.member.getType().isStruct() ? frame.get(l.member).as<DynamicStruct>() : frame;
    const bool compressed = l.compressed && body.get("compressed").as<bool>();
    std::size_t i = 0;
    wire::eachField<M>(form.fields, [&](std::string_view, auto get) {
      take(in, body, l.fields[i++], compressed, get(m));
    });
  }
  if constexpr (requires { checkDecoded(m, from_node); }) checkDecoded(m, from_node);
  return std::make_unique<Typed<M>>(std::move(m));
}

using Encode = void (*)(transport::OutgoingMessage&, Envelope&);
using Decode = std::unique_ptr<Envelope> (*)(const transport::IncomingMessage&,
                                             DynamicStruct::Reader, std::uint32_t);

// The codec of every message in WireMessages, by C++ type and by Frame member.
struct Codecs {
  std::unordered_map<std::type_index, Encode> encode;
  std::vector<Decode> decode;  // by the Frame member's index; null: no actor message
  std::vector<std::string_view> names;

  Codecs() {
    const auto frame = capnp::Schema::from<schema::Frame>();
    decode.resize(frame.getFields().size());
    std::apply([&](auto... m) { (add(m), ...); }, WireMessages{});
  }

  template <typename M>
  void add(const M&) {
    encode[typeid(M)] = [](transport::OutgoingMessage& out, Envelope& e) {
      encodeAs(out, static_cast<Typed<M>&>(e).value);
    };
    decode[layoutOf<M>().member.getIndex()] = decodeAs<M>;
  }
};

const Codecs& codecs() {
  static const Codecs c;
  return c;
}

}  // namespace

transport::OutgoingMessage encodeMessage(Address from, Address to, Envelope& e) {
  transport::OutgoingMessage out;
  auto f = out.frame();
  f.setTarget(to.actor);
  f.setSourceActor(from.actor);
  const auto& encode = codecs().encode;
  const auto found = encode.find(e.type());
  if (found == encode.end()) {
    throw InvariantError("message " + messageName(e.type()) + " has no wire form");
  }
  found->second(out, e);
  return out;
}

Decoded decodeMessage(std::uint32_t from_node, const transport::IncomingMessage& in) {
  const auto f = in.frame();
  Decoded d;
  d.from = Address{from_node, f.getSourceActor()};
  d.target = f.getTarget();
  const auto frame = capnp::toDynamic(f);
  const auto& decode = codecs().decode;
  KJ_IF_MAYBE (member, frame.which()) {
    if (member->getIndex() < decode.size() && decode[member->getIndex()]) {
      try {
        d.message = decode[member->getIndex()](in, frame, from_node);
      } catch (const kj::Exception& e) {
        throw InputError(fmt::format("node {} sent a malformed {}: {}", from_node,
                                     member->getProto().getName().cStr(),
                                     e.getDescription().cStr()));
      }
      return d;
    }
  }
  throw InputError("node " + std::to_string(from_node) +
                   " sent a frame that carries no actor message");
}

}  // namespace troupe::actors
