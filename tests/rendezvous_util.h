// What the rendezvous tests (rendezvous_*_test.cc) wait alike.
#pragma once

#include <chrono>

namespace troupe::testing {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kLong{5000};  // for waits that must succeed
constexpr std::chrono::milliseconds kShort{250};  // for waits that must time out

}  // namespace troupe::testing
