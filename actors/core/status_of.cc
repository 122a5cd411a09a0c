#include "actors/core/status_of.h"

#include <new>

#include "actors/core/peer.h"
#include "kernels/named.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

template <typename E, ErrorKind K>
struct Typed {
  using Type = E;
  static constexpr ErrorKind kKind = K;
};

// The typed errors with their kinds, read both ways: an error's kind (kInternal for none of
// them), and an error of a kind (troupe::Error for another).
template <typename... T>
struct Kinds {
  static ErrorKind kindOf(const std::exception& e) {
    ErrorKind kind = ErrorKind::kInternal;
    (void)((dynamic_cast<const typename T::Type*>(&e) ? (kind = T::kKind, true) : false) || ...);
    return kind;
  }
  [[noreturn]] static void raise(ErrorKind kind, const std::string& message) {
    ((kind == T::kKind ? throw typename T::Type(message) : void()), ...);
    throw Error(message);
  }
};
using TypedErrors =
    Kinds<Typed<InputError, ErrorKind::kInput>, Typed<IoError, ErrorKind::kIo>,
          Typed<TimeoutError, ErrorKind::kTimeout>, Typed<ResourceError, ErrorKind::kResource>,
          Typed<NumericError, ErrorKind::kNumeric>, Typed<InvariantError, ErrorKind::kInvariant>>;

// The kind of `e`: its own, or that of the first typed error nested in it (the actor system
// rethrows an actor's error nested in one that names the actor). A peer that is gone or hung is
// kPeer whatever carried it.
ErrorKind kindOf(const std::exception& error) {
  ErrorKind kind = ErrorKind::kInternal;
  visitNested(error, [&](const std::exception& e) {
    kind = dynamic_cast<const std::bad_alloc*>(&e) ? ErrorKind::kResource : TypedErrors::kindOf(e);
    return kind != ErrorKind::kInternal;
  });
  return kind;
}

}  // namespace

Status statusOf(const std::exception& e) {
  if (findPeerError(e)) return {ErrorKind::kPeer, e.what()};
  return {kindOf(e), e.what()};
}

void throwIfError(const Status& status) {
  if (status.kind() != ErrorKind::kOk) TypedErrors::raise(status.kind(), status.message());
}

}  // namespace troupe::actors

namespace troupe {

const char* errorKindName(ErrorKind kind) {
  static constexpr kernels::Named<ErrorKind> kNames[] = {{"ok", ErrorKind::kOk},
                                                         {"input", ErrorKind::kInput},
                                                         {"io", ErrorKind::kIo},
                                                         {"timeout", ErrorKind::kTimeout},
                                                         {"resource", ErrorKind::kResource},
                                                         {"numeric", ErrorKind::kNumeric},
                                                         {"peer", ErrorKind::kPeer},
                                                         {"invariant", ErrorKind::kInvariant},
                                                         {"internal", ErrorKind::kInternal}};
  return kernels::nameIn(kNames, kind);
}

}  // namespace troupe
