// troupe::Status from the library's exceptions, at the border of the public API.
#pragma once

#include <exception>

#include "troupe/status.h"

namespace troupe::actors {

// The Status of an error: its message, and the kind of the error or of the first typed error
// nested in it (the actor system rethrows an actor's error nested in one that names the actor).
// A peer that is gone or hung is ErrorKind::kPeer whatever carried it.
Status statusOf(const std::exception& error);

// The other way, inside troupe: throws the troupe::Error of `status`'s kind (InputError for
// kInput, ...; a plain Error for kPeer and kInternal) carrying its message; nothing when ok.
void throwIfError(const Status& status);

}  // namespace troupe::actors
