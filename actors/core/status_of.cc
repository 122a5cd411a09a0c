#include "actors/core/status_of.h"

#include <new>

#include "actors/core/peer.h"
#include "kernels/named.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// The kind of `e`: its own, or that of the first typed error nested in it (the actor system
// rethrows an actor's error nested in one that names the actor). A peer that is gone or hung is
// kPeer whatever carried it.
ErrorKind kindOf(const std::exception& error) {
  ErrorKind kind = ErrorKind::kInternal;
  visitNested(error, [&](const std::exception& e) {
    if (dynamic_cast<const InputError*>(&e)) {
      kind = ErrorKind::kInput;
    } else if (dynamic_cast<const IoError*>(&e)) {
      kind = ErrorKind::kIo;
    } else if (dynamic_cast<const TimeoutError*>(&e)) {
      kind = ErrorKind::kTimeout;
    } else if (dynamic_cast<const ResourceError*>(&e) || dynamic_cast<const std::bad_alloc*>(&e)) {
      kind = ErrorKind::kResource;
    } else if (dynamic_cast<const NumericError*>(&e)) {
      kind = ErrorKind::kNumeric;
    } else if (dynamic_cast<const InvariantError*>(&e)) {
      kind = ErrorKind::kInvariant;
    }
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
  switch (status.kind()) {
    case ErrorKind::kOk:
      return;
    case ErrorKind::kInput:
      throw InputError(status.message());
    case ErrorKind::kIo:
      throw IoError(status.message());
    case ErrorKind::kTimeout:
      throw TimeoutError(status.message());
    case ErrorKind::kResource:
      throw ResourceError(status.message());
    case ErrorKind::kNumeric:
      throw NumericError(status.message());
    case ErrorKind::kInvariant:
      throw InvariantError(status.message());
    default:
      throw Error(status.message());
  }
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
