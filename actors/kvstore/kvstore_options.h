// What every KVStore type checks of its optimizer and gradient compression settings
// (troupe/kvstore.h), defined in actors/kvstore/kvstore.cc.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/compression.h"
#include "kernels/optimizer.h"
#include "troupe/kvstore.h"

namespace troupe::actors {

// troupe's optimizer settings from MXNet's (nag: sgd with nesterov); kInput naming the bad one
// (an unknown optimizer, with the known ones; a learning rate or rescale_grad not finite and
// >= 0; a setting out of the optimizer's range).
Result<kernels::OptimizerSettings> optimizerOf(const OptimizerSpec& optimizer);

// init()'s checks of every type: a key >= 0, not inited yet (`inited`), a value of some size.
Status checkInit(int key, std::size_t values, bool inited);

// "none", "fp16", "bf16" or "2bit" (threshold > 0); kInput naming the bad one.
Result<kernels::CompressionSpec> compressionSpecOf(const std::string& type, float threshold);

}  // namespace troupe::actors
