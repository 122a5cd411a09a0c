// troupe's one error policy.
//
// Expected failures (a missing file, a corrupt record, a bad config key, a peer that is gone) throw
// troupe::Error or one of its kinds, carrying one line that names the culprit. Broken invariants
// use TROUPE_ENFORCE / TROUPE_ENFORCE_EQ, which record the values, the file and the line. Nothing
// in troupe calls abort(): errors travel to the actor system, which ends the run and reports them.
//
// Which one a program sees: these exceptions are the library's own and the command line's. The
// API a program calls (Trainer, KVStore, Model, Observer, the readers) never throws them at it:
// each call returns a troupe::Status or Result (troupe/status.h) of the same kind and message.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe {

// Base of every error troupe throws on purpose; what() is one line fit for the console.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The user's input is wrong: a file, a flag, a config key, a database record.
class InputError : public Error {
 public:
  using Error::Error;
};

// An I/O operation on the system failed (open, write, fsync, rename).
class IoError : public Error {
 public:
  using Error::Error;
};

// A wait ran out of time; the message names whom it waited for.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The host lacks what the run asks of it (memory): the message says how much was asked for.
class ResourceError : public Error {
 public:
  using Error::Error;
};

// A computed value is not finite (inf or NaN): the run diverged. The message names the step or
// the file where it was found.
class NumericError : public Error {
 public:
  using Error::Error;
};

// A condition the code relies on does not hold: a bug, not bad input.
class InvariantError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
[[noreturn]] inline void throwInvariant(const char* file, int line, const std::string& what) {
  throw InvariantError(concat(what, " (", file, ":", line, ")"));
}
}  // namespace detail

}  // namespace troupe

#define TROUPE_ENFORCE(cond, ...)                                                                  \
  do {                                                                                             \
    if (!(cond)) [[unlikely]]                                                                      \
      ::troupe::detail::throwInvariant(                                                            \
          __FILE__, __LINE__,                                                                      \
          ::troupe::detail::concat("'" #cond "' does not hold" __VA_OPT__(, ": ", ) __VA_ARGS__)); \
  } while (0)

#define TROUPE_ENFORCE_CMP_(a, b, op)                                                         \
  do {                                                                                        \
    const auto& troupe_a_ = (a);                                                              \
    const auto& troupe_b_ = (b);                                                              \
    if (!(troupe_a_ op troupe_b_)) [[unlikely]]                                               \
      ::troupe::detail::throwInvariant(                                                       \
          __FILE__, __LINE__,                                                                 \
          ::troupe::detail::concat("expected " #a " " #op " " #b ", got ", troupe_a_, " vs ", \
                                   troupe_b_));                                               \
  } while (0)

#define TROUPE_ENFORCE_EQ(a, b) TROUPE_ENFORCE_CMP_(a, b, ==)
#define TROUPE_ENFORCE_NE(a, b) TROUPE_ENFORCE_CMP_(a, b, !=)
#define TROUPE_ENFORCE_LT(a, b) TROUPE_ENFORCE_CMP_(a, b, <)
#define TROUPE_ENFORCE_LE(a, b) TROUPE_ENFORCE_CMP_(a, b, <=)
#define TROUPE_ENFORCE_GE(a, b) TROUPE_ENFORCE_CMP_(a, b, >=)
#define TROUPE_ENFORCE_GT(a, b) TROUPE_ENFORCE_CMP_(a, b, >)
