// The emulated GPU's NCCL (kernels/communicator.h), for the tests of reducer = nccl where there
// is no GPU: the ranks of a group, in one process or several on one host, meet in a shared-memory
// segment named by the group's id and sum their buffers there, in rank order, so that every rank
// gets the same sum to the bit (NCCL's is the same on every rank too).
#pragma once

#include <memory>
#include <string>

#include "kernels/communicator.h"

namespace troupe::kernels::emulated {

std::string ncclId();
std::unique_ptr<Communicator> makeCommunicator(const CommunicatorSpec& spec);

}  // namespace troupe::kernels::emulated
