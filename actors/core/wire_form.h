// How a message looks on the wire, declared once, beside the message (messages.h): the member of
// wire.capnp's Frame union that carries it, and which schema field each of its members fills.
// actors/core/wire_codec.cc encodes and decodes every message from its form alone, and checks the
// form against wire.capnp once per message type (a schema field that no member fills, or a name
// the schema lacks, is an InvariantError at that type's first message); the frame fuzzer walks
// the schema itself. So a message is its struct, its schema and this form: nothing else is
// written per message.
//
// The codec's rules, the same for every message:
//   - an integer, float or bool member fills a scalar field (a value out of the field's range
//     is refused on decode);
//   - an enum member fills an enum field by its value (an unknown value is refused on decode);
//   - a std::string fills a Text field; an empty Text decodes as the member's default;
//   - a pointer to a row of a table of named rows (NamedRow<Row> specialised) fills a Text field
//     with the row's name; an unknown name is refused on decode, an empty one decodes as the
//     member's default;
//   - a Tensor fills a TensorData field. Where the schema struct has a bool field `compressed`,
//     it says whether the tensor is bytes of the run's gradient compression (uint8) or float32;
//   - a message with an Event `ready` is encoded once the event is done (the transport reads its
//     tensors on the host);
//   - a member named "" is the union member itself (a Frame member that is a scalar);
//   - a member that is a struct of its own can be flattened into the message's fields (nested);
//   - where an overload wireLane(const M&) exists, it picks the link's connection the message
//     takes (0: the first, in order with everything else); where checkDecoded(const M&,
//     from_node) exists, it may refuse a decoded message (InputError).
#pragma once

#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace troupe::actors::wire {

// For a member `const Row*` that points into a table of named rows (an optimizer's row), a
// specialisation gives `static std::string_view name(const Row*)` (a null member's: the default
// row's name) and `static const Row* find(std::string_view)` (null for a name the table lacks).
template <typename Row>
struct NamedRow;

template <typename T>
concept NamedRowPointer = std::is_pointer_v<T> && requires(std::string_view name) {
  NamedRow<std::remove_cv_t<std::remove_pointer_t<T>>>::find(name);
};

// Member `member` of M fills the schema field `name`.
template <typename M, typename T>
struct Field {
  std::string_view name;
  T M::*member;
};

template <typename M, typename T>
constexpr Field<M, T> field(std::string_view name, T M::*member) {
  return {name, member};
}

// The fields of member `member` (a struct N), written into the message's own fields.
template <typename M, typename N, typename... F>
struct Nested {
  N M::*member;
  std::tuple<F...> fields;
};

template <typename M, typename N, typename... F>
constexpr Nested<M, N, F...> nested(N M::*member, F... fields) {
  return {member, {fields...}};
}

template <typename M, typename... F>
struct Form {
  std::string_view frame_member;  // of wire.capnp's Frame union: "gradBucket"
  std::tuple<F...> fields;
};

template <typename M, typename... F>
constexpr Form<M, F...> form(std::string_view frame_member, F... fields) {
  return {frame_member, {fields...}};
}

// Calls visit(name, get) for each field of `fields` in order, where get(message) is the member
// it fills; a nested struct's fields are visited in its place.
template <typename M, typename Fields, typename Visit>
void eachField(const Fields& fields, Visit&& visit);

template <typename M, typename T, typename Visit>
void visitOne(const Field<M, T>& f, Visit& visit) {
  const auto member = f.member;
  visit(
      f.name, [=](auto& m) -> auto& { return m.*member; });
}

template <typename M, typename N, typename... F, typename Visit>
void visitOne(const Nested<M, N, F...>& n, Visit& visit) {
  eachField<N>(n.fields, [&](std::string_view name, auto get) {
    const auto member = n.member;
    visit(
        name, [=](auto& m) -> auto& { return get(m.*member); });
  });
}

template <typename M, typename Fields, typename Visit>
void eachField(const Fields& fields, Visit&& visit) {
  std::apply([&](const auto&... f) { (visitOne<M>(f, visit), ...); }, fields);
}

// Specialised beside each message that crosses processes (messages.h).
template <typename M>
inline constexpr auto kForm = nullptr;

}  // namespace troupe::actors::wire
