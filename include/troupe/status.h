// Errors as values, for the library's API: a Status says whether a call worked and, if not, which
// kind of error it was and one line naming the culprit (the message troupe::Error would carry).
// Result<T> is a value or the Status of why there is none. Nothing in the API throws at a caller
// or ends the process: this, not troupe/error.h's exceptions (the library's inside), is what a
// program handles.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace troupe {

enum class ErrorKind {
  kOk,
  kInput,      // the caller's input: a setting, a file, a key, a shape
  kIo,         // the system: a file or socket operation
  kTimeout,    // a wait ran out; the message names whom it waited for
  kResource,   // memory
  kNumeric,    // inf or NaN: the run diverged
  kPeer,       // another process of the run is gone or hung
  kInvariant,  // a bug: a condition troupe relies on does not hold
  kInternal,   // anything else
};

// "ok", "input", "io", "timeout", "resource", "numeric", "peer", "invariant", "internal": the
// kind as Python's troupe.Error names it.
const char* errorKindName(ErrorKind kind);

class Status {
 public:
  Status() = default;  // ok
  Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool isOk() const { return kind_ == ErrorKind::kOk; }
  explicit operator bool() const { return isOk(); }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_ = ErrorKind::kOk;
  std::string message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: a value converts to its Result
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: so does an error
  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  T* operator->() { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace troupe
