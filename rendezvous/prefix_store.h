// A Store decorator that puts every key of a run under its run id: key "addr/0" of run "job7" is
// stored as "job7/addr/0", so runs sharing one backend never see each other's keys.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace troupe::rendezvous {

// Wraps `inner`, which the returned store shares; it has the same thread safety and timeouts as
// `inner`. Keys named in its errors are the stored keys, prefix included. InputError when
// `run_id` is empty.
std::unique_ptr<Store> prefixStore(std::shared_ptr<Store> inner, std::string run_id);

}  // namespace troupe::rendezvous
