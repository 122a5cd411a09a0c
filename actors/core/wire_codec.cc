// Every message is encoded and decoded from its wire::Form (actors/core/wire_form.h, declared in
// messages.h): its fields are looked up in wire.capnp's schema once per message type (where
// Cap'n Proto lays each out), and then written and read there as the generated accessors do.
#include "actors/core/wire_codec.h"

#include <capnp/any.h>
#include <capnp/schema.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <bit>
#include <cstring>
#include <optional>
#include <typeindex>
#include <unordered_map>
#include <utility>
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

using capnp::AnyStruct;
using capnp::StructSchema;
using Type = capnp::schema::Type;
namespace schema = transport::wire;

// Where a schema field lives in its struct's encoding (Cap'n Proto's layout), looked up once so
// that each message reads and writes its fields as the generated accessors do, without the
// dynamic API's lookups per field.
struct Slot {
  StructSchema::Field field;
  Type::Which type = Type::VOID;
  std::uint32_t offset = 0;        // data: in units of the type's size (bool: bits); else pointer
  std::uint64_t default_bits = 0;  // a data field is stored XOR its default
  std::uint16_t enumerants = 0;    // enum: how many values it has
};

Slot slotOf(StructSchema::Field f) {
  const auto proto = f.getProto();
  if (!proto.isSlot()) throw InvariantError("wire.capnp: a group has no wire form");
  const auto slot = proto.getSlot();
  const auto d = slot.getDefaultValue();
  Slot s{f, f.getType().which(), slot.getOffset()};
  switch (s.type) {
    case Type::BOOL:
      s.default_bits = d.getBool();
      break;
    case Type::INT8:
      s.default_bits = static_cast<std::uint8_t>(d.getInt8());
      break;
    case Type::INT16:
      s.default_bits = static_cast<std::uint16_t>(d.getInt16());
      break;
    case Type::INT32:
      s.default_bits = static_cast<std::uint32_t>(d.getInt32());
      break;
    case Type::INT64:
      s.default_bits = static_cast<std::uint64_t>(d.getInt64());
      break;
    case Type::UINT8:
      s.default_bits = d.getUint8();
      break;
    case Type::UINT16:
      s.default_bits = d.getUint16();
      break;
    case Type::UINT32:
      s.default_bits = d.getUint32();
      break;
    case Type::UINT64:
      s.default_bits = d.getUint64();
      break;
    case Type::FLOAT32:
      s.default_bits = std::bit_cast<std::uint32_t>(d.getFloat32());
      break;
    case Type::FLOAT64:
      s.default_bits = std::bit_cast<std::uint64_t>(d.getFloat64());
      break;
    case Type::ENUM:
      s.default_bits = d.getEnum();
      s.enumerants = static_cast<std::uint16_t>(f.getType().asEnum().getEnumerants().size());
      break;
    default:
      break;  // pointers: no default but null
  }
  return s;
}

// A message type's place in the schema, looked up once: the Frame member that carries it and
// the slot of each of its form's fields, in the form's order.
struct Layout {
  StructSchema::Field member;
  std::uint16_t discriminant = 0;  // the member's in Frame's union
  bool is_struct = false;
  bool is_void = false;
  std::uint32_t pointer = 0;                   // a struct member's pointer in Frame
  std::uint16_t data_words = 0, pointers = 0;  // a struct member's size
  std::vector<Slot> fields;
  std::optional<Slot> compressed;  // the struct's flag for its tensor: compressed bytes
};

// What a C++ member may fill: a schema field of the same kind.
template <typename T>
bool fits(capnp::Type type) {
  const Type::Which w = type.which();
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    return w == Type::STRUCT && type.asStruct() == capnp::Schema::from<schema::TensorData>();
  } else if constexpr (std::is_same_v<T, std::string> || wire::NamedRowPointer<T>) {
    return w == Type::TEXT;
  } else if constexpr (std::is_enum_v<T>) {
    return w == Type::ENUM;
  } else if constexpr (std::is_same_v<T, bool>) {
    return w == Type::BOOL;
  } else if constexpr (std::is_floating_point_v<T>) {
    return w == Type::FLOAT32 || w == Type::FLOAT64;
  } else {
    return w >= Type::INT8 && w <= Type::UINT64;
  }
}

template <typename M>
const Layout& layoutOf() {
  static const Layout layout = [] {
    constexpr auto& form = wire::kForm<M>;
    const auto frame = capnp::Schema::from<schema::Frame>();
    const auto name = [](std::string_view n) { return kj::StringPtr(n.data(), n.size()); };
    Layout l;
    KJ_IF_MAYBE (member, frame.findFieldByName(name(form.frame_member))) {
      l.member = *member;
    } else {
      throw InvariantError(
          fmt::format("wire.capnp's Frame has no member {} (messages.h's form of {})",
                      form.frame_member, messageName(typeid(M))));
    }
    const auto member = l.member.getProto();
    l.discriminant = member.getDiscriminantValue();
    l.is_struct = l.member.getType().isStruct();
    l.is_void = l.member.getType().isVoid();
    l.pointer = member.getSlot().getOffset();
    const StructSchema body = l.is_struct ? l.member.getType().asStruct() : StructSchema();
    if (l.is_struct) {
      l.data_words = body.getProto().getStruct().getDataWordCount();
      l.pointers = body.getProto().getStruct().getPointerCount();
    }
    std::vector<bool> filled(l.is_struct ? body.getFields().size() : 0);
    wire::eachField<M>(form.fields, [&](std::string_view field, auto get) {
      using T = std::decay_t<decltype(get(std::declval<M&>()))>;
      kj::Maybe<StructSchema::Field> found;
      if (field.empty()) {
        found = l.member;
      } else if (l.is_struct) {
        found = body.findFieldByName(name(field));
      }
      KJ_IF_MAYBE (f, found) {
        if (!fits<T>(f->getType())) {
          throw InvariantError(fmt::format("wire.capnp's {}.{} is not of the kind of {}'s member",
                                           form.frame_member, field, messageName(typeid(M))));
        }
        l.fields.push_back(slotOf(*f));
        if (!field.empty()) filled[f->getIndex()] = true;
      } else {
        throw InvariantError(
            fmt::format("wire.capnp's {} has no field {} (messages.h's form of {})",
                        form.frame_member, field, messageName(typeid(M))));
      }
    });
    if (!l.is_struct) return l;
    for (const auto f : body.getFields()) {
      const auto field = f.getProto().getName();
      if (field == "compressed") {
        l.compressed = slotOf(f);
      } else if (!filled[f.getIndex()] && !field.startsWith("obsolete")) {
        throw InvariantError(fmt::format("wire.capnp's {}.{} is filled by no member of {}",
                                         form.frame_member, field.cStr(), messageName(typeid(M))));
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

// A data field's bits (little-endian, as the hosts troupe runs on), XOR its default.
template <typename Bits>
void store(kj::ArrayPtr<capnp::byte> data, const Slot& s, Bits bits) {
  const std::size_t at = std::size_t{s.offset} * sizeof(Bits);
  TROUPE_ENFORCE(at + sizeof(Bits) <= data.size(), "a wire field outside its struct's data");
  bits ^= static_cast<Bits>(s.default_bits);
  std::memcpy(data.begin() + at, &bits, sizeof(Bits));
}

// A field beyond the data the sender wrote (a struct of fewer fields) holds its default.
template <typename Bits>
Bits load(kj::ArrayPtr<const capnp::byte> data, const Slot& s) {
  const std::size_t at = std::size_t{s.offset} * sizeof(Bits);
  Bits bits = 0;
  if (at + sizeof(Bits) <= data.size()) std::memcpy(&bits, data.begin() + at, sizeof(Bits));
  return bits ^ static_cast<Bits>(s.default_bits);
}

// An integer of wire type W from a member's value, which must fit.
template <typename W, typename T>
void storeInteger(kj::ArrayPtr<capnp::byte> data, const Slot& s, T v) {
  TROUPE_ENFORCE(std::in_range<W>(v), "value ", v, " out of the range of wire field ",
                 s.field.getProto().getName().cStr());
  store<std::make_unsigned_t<W>>(data, s, static_cast<std::make_unsigned_t<W>>(static_cast<W>(v)));
}

template <typename W, typename T>
T loadInteger(kj::ArrayPtr<const capnp::byte> data, const Slot& s) {
  const W v = static_cast<W>(load<std::make_unsigned_t<W>>(data, s));
  if (!std::in_range<T>(v)) {
    throw InputError(
        fmt::format("{} {} is out of its range", s.field.getProto().getName().cStr(), v));
  }
  return static_cast<T>(v);
}

template <typename T>
void putScalar(kj::ArrayPtr<capnp::byte> data, const Slot& s, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    const std::size_t byte = s.offset / 8;
    TROUPE_ENFORCE(byte < data.size(), "a wire field outside its struct's data");
    const auto bit = static_cast<capnp::byte>(1u << (s.offset % 8));
    data[byte] =
        (v != static_cast<bool>(s.default_bits)) ? (data[byte] | bit) : (data[byte] & ~bit);
  } else if constexpr (std::is_enum_v<T>) {
    store<std::uint16_t>(data, s, static_cast<std::uint16_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (s.type == Type::FLOAT32) {
      store<std::uint32_t>(data, s, std::bit_cast<std::uint32_t>(static_cast<float>(v)));
    } else {
      store<std::uint64_t>(data, s, std::bit_cast<std::uint64_t>(static_cast<double>(v)));
    }
  } else {
    switch (s.type) {
      case Type::INT8:
        return storeInteger<std::int8_t>(data, s, v);
      case Type::INT16:
        return storeInteger<std::int16_t>(data, s, v);
      case Type::INT32:
        return storeInteger<std::int32_t>(data, s, v);
      case Type::INT64:
        return storeInteger<std::int64_t>(data, s, v);
      case Type::UINT8:
        return storeInteger<std::uint8_t>(data, s, v);
      case Type::UINT16:
        return storeInteger<std::uint16_t>(data, s, v);
      case Type::UINT32:
        return storeInteger<std::uint32_t>(data, s, v);
      default:
        return storeInteger<std::uint64_t>(data, s, v);
    }
  }
}

template <typename T>
T takeScalar(kj::ArrayPtr<const capnp::byte> data, const Slot& s) {
  if constexpr (std::is_same_v<T, bool>) {
    const std::size_t byte = s.offset / 8;
    const bool bit = byte < data.size() && (data[byte] >> (s.offset % 8)) & 1;
    return bit != static_cast<bool>(s.default_bits);
  } else if constexpr (std::is_enum_v<T>) {
    const auto raw = load<std::uint16_t>(data, s);
    if (raw >= s.enumerants) {
      throw InputError(
          fmt::format("{} {} is not one of its values", s.field.getProto().getName().cStr(), raw));
    }
    return static_cast<T>(raw);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (s.type == Type::FLOAT32)
      return static_cast<T>(std::bit_cast<float>(load<std::uint32_t>(data, s)));
    return static_cast<T>(std::bit_cast<double>(load<std::uint64_t>(data, s)));
  } else {
    switch (s.type) {
      case Type::INT8:
        return loadInteger<std::int8_t, T>(data, s);
      case Type::INT16:
        return loadInteger<std::int16_t, T>(data, s);
      case Type::INT32:
        return loadInteger<std::int32_t, T>(data, s);
      case Type::INT64:
        return loadInteger<std::int64_t, T>(data, s);
      case Type::UINT8:
        return loadInteger<std::uint8_t, T>(data, s);
      case Type::UINT16:
        return loadInteger<std::uint16_t, T>(data, s);
      case Type::UINT32:
        return loadInteger<std::uint32_t, T>(data, s);
      default:
        return loadInteger<std::uint64_t, T>(data, s);
    }
  }
}

template <typename T>
void put(transport::OutgoingMessage& out, AnyStruct::Builder s, const Slot& slot, const T& value) {
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    out.setTensor(s.getPointerSection()[slot.offset].initAs<schema::TensorData>(), value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    s.getPointerSection()[slot.offset].setAs<capnp::Text>(
        capnp::Text::Reader(value.data(), value.size()));
  } else if constexpr (wire::NamedRowPointer<T>) {
    const std::string_view name =
        wire::NamedRow<std::remove_cv_t<std::remove_pointer_t<T>>>::name(value);
    s.getPointerSection()[slot.offset].setAs<capnp::Text>(
        capnp::Text::Reader(name.data(), name.size()));
  } else {
    putScalar(s.getDataSection(), slot, value);
  }
}

// A pointer the sender did not write (a struct of fewer fields) is null: the field's default.
capnp::AnyPointer::Reader pointerOf(AnyStruct::Reader s, const Slot& slot) {
  const auto pointers = s.getPointerSection();
  return slot.offset < pointers.size() ? pointers[slot.offset] : capnp::AnyPointer::Reader();
}

template <typename T>
void take(const transport::IncomingMessage& in, AnyStruct::Reader s, const Slot& slot,
          bool compressed, T& into) {
  if constexpr (std::is_same_v<T, kernels::Tensor>) {
    into = in.tensor(pointerOf(s, slot).getAs<schema::TensorData>(), {}, dtypeOf(compressed));
  } else if constexpr (std::is_same_v<T, std::string>) {
    const auto text = pointerOf(s, slot).getAs<capnp::Text>();
    if (text.size() > 0) into.assign(text.cStr(), text.size());
  } else if constexpr (wire::NamedRowPointer<T>) {
    const auto text = pointerOf(s, slot).getAs<capnp::Text>();
    if (text.size() == 0) return;
    const std::string_view name(text.cStr(), text.size());
    into = wire::NamedRow<std::remove_cv_t<std::remove_pointer_t<T>>>::find(name);
    if (!into) throw InputError(fmt::format("unknown name '{}'", name));
  } else {
    into = takeScalar<T>(s.getDataSection(), slot);
  }
}

// Frame's union discriminant, where Cap'n Proto keeps it (16-bit units into the data section).
std::uint32_t discriminantOffset() {
  static const std::uint32_t offset =
      capnp::Schema::from<schema::Frame>().getProto().getStruct().getDiscriminantOffset();
  return offset;
}

template <typename M>
void encodeAs(transport::OutgoingMessage& out, M& m) {
  constexpr auto& form = wire::kForm<M>;
  const Layout& l = layoutOf<M>();
  if constexpr (requires { m.ready.wait(); }) {
    m.ready.wait();  // the transport reads the tensors on the host: once they are final
  }
  AnyStruct::Builder frame(out.frame());
  const Slot which{l.member, Type::UINT16, discriminantOffset()};
  store<std::uint16_t>(frame.getDataSection(), which, l.discriminant);
  if (l.is_void) return;
  AnyStruct::Builder body =
      l.is_struct ? frame.getPointerSection()[l.pointer].initAsAnyStruct(l.data_words, l.pointers)
                  : frame;
  std::size_t i = 0;
  bool compressed = false;
  wire::eachField<M>(form.fields, [&](std::string_view, auto get) {
    const auto& value = get(m);
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, kernels::Tensor>) {
      compressed = compressed || value.dtype() == kernels::DType::kUInt8;
    }
    put(out, body, l.fields[i++], value);
  });
  if (l.compressed) putScalar(body.getDataSection(), *l.compressed, compressed);
  if constexpr (requires { wireLane(m); }) out.setLane(wireLane(m));
}

// Fields a peer wrote that its message cannot take (a value out of range, a pointer of the
// wrong kind, a malformed tensor).
InputError malformed(std::uint32_t from_node, const Layout& l, std::string_view why) {
  return InputError(fmt::format("node {} sent a malformed {}: {}", from_node,
                                l.member.getProto().getName().cStr(), why));
}

template <typename M>
std::unique_ptr<Envelope> decodeAs(const transport::IncomingMessage& in, AnyStruct::Reader frame,
                                   std::uint32_t from_node) {
  constexpr auto& form = wire::kForm<M>;
  const Layout& l = layoutOf<M>();
  M m{};
  if (!l.is_void) {
    try {
      const AnyStruct::Reader body =
          l.is_struct ? pointerOf(frame, Slot{l.member, Type::STRUCT, l.pointer}).getAs<AnyStruct>()
                      : frame;
      const bool compressed =
          l.compressed && takeScalar<bool>(body.getDataSection(), *l.compressed);
      std::size_t i = 0;
      wire::eachField<M>(form.fields, [&](std::string_view, auto get) {
        take(in, body, l.fields[i++], compressed, get(m));
      });
    } catch (const kj::Exception& e) {
      throw malformed(from_node, l, e.getDescription().cStr());
    } catch (const InputError& e) {
      throw malformed(from_node, l, e.what());
    }
  }
  if constexpr (requires { checkDecoded(m, from_node); }) checkDecoded(m, from_node);
  return std::make_unique<Typed<M>>(std::move(m));
}

using Encode = void (*)(transport::OutgoingMessage&, Envelope&);
using Decode = std::unique_ptr<Envelope> (*)(const transport::IncomingMessage&, AnyStruct::Reader,
                                             std::uint32_t);

// The codec of every message in WireMessages, by C++ type and by Frame's union discriminant.
struct Codecs {
  std::unordered_map<std::type_index, Encode> encode;
  std::vector<Decode> decode;  // null: no actor message

  Codecs() {
    decode.resize(capnp::Schema::from<schema::Frame>().getUnionFields().size());
    std::apply([&](auto... m) { (add(m), ...); }, WireMessages{});
  }

  template <typename M>
  void add(const M&) {
    encode[typeid(M)] = [](transport::OutgoingMessage& out, Envelope& e) {
      encodeAs(out, static_cast<Typed<M>&>(e).value);
    };
    Decode& slot = decode.at(layoutOf<M>().discriminant);
    TROUPE_ENFORCE(slot == nullptr, "two messages of WireMessages are carried by Frame member ",
                   layoutOf<M>().member.getProto().getName().cStr());
    slot = decodeAs<M>;
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
  const auto which = static_cast<std::size_t>(f.which());
  const auto& decode = codecs().decode;
  if (which >= decode.size() || !decode[which]) {
    throw InputError("node " + std::to_string(from_node) +
                     " sent a frame that carries no actor message");
  }
  d.message = decode[which](in, AnyStruct::Reader(f), from_node);
  return d;
}

}  // namespace troupe::actors
