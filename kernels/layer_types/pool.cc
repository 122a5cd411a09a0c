// [[layers]] type "pool": max or average pooling (Caffe's Pooling), or Caffe's global_pooling.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {
namespace {

// Caffe's global_pooling: the average of each channel.
Node globalPool(LayerCall& c) {
  for (const char* key : {"kernel", "stride", "pad", "round_mode"})
    if (c.args.has(key)) c.args.fail(key, "is not taken by a global pool");
  if (c.args.text("method", {"max", "ave"}, "ave") != "ave")
    c.args.fail("method", "= max: a global pool averages (method ave)");
  return c.b.globalAvgPool(c.x, c.name);
}

Node pool(LayerCall& c) {
  c.args.needSpatial(c.x);
  if (c.args.text("global", {"true", "false"}, "false") == "true") return globalPool(c);
  const std::int64_t zero = 0;
  const std::int64_t k = c.args.integer("kernel", 1, nullptr);
  const std::int64_t s = c.args.integer("stride", 1, &k);
  const std::int64_t p = c.args.integer("pad", 0, &zero);
  const bool max = c.args.text("method", {"max", "ave"}, "max") == "max";
  if (p >= k) c.args.fail("pad", "must be smaller than the kernel");
  c.args.needKernelFits(c.x, k, p);
  // Caffe's ceil by default; floor as PyTorch's and Caffe2's (torchvision's ResNets).
  const bool ceil = c.args.text("round_mode", {"ceil", "floor"}, "ceil") == "ceil";
  return c.b.pool(c.x, c.name, k, s, p, max ? PoolMethod::kMax : PoolMethod::kAverage, ceil);
}

}  // namespace

TROUPE_LAYER_TYPE(pool,
                  "max or average pooling (Caffe's Pooling); global: the average of each channel",
                  {"kernel", "stride = kernel", "pad 0", "method max or ave",
                   "global false (true: the average of each channel)",
                   "round_mode ceil as Caffe's or floor as PyTorch's"}) {
  return pool(c);
}

}  // namespace troupe::kernels::graph
