// The CUDA plugin's NCCL communicator (kernels/communicator.h), for its plugin table.
#pragma once

#include <memory>
#include <string>

#include "kernels/communicator.h"

namespace troupe::kernels::cuda {

// ncclGetUniqueId's id, as hex text.
std::string ncclId();
std::unique_ptr<Communicator> makeCommunicator(const CommunicatorSpec& spec);

}  // namespace troupe::kernels::cuda
