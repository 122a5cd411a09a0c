// [[layers]] type "conv": a 2-D convolution (Caffe's Convolution).
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(conv, "a 2-D convolution with a bias by default (Caffe's Convolution)",
                  {"num_output", "kernel", "stride 1", "pad 0", "bias true"}) {
  c.args.needSpatial(c.x);
  const std::int64_t one = 1, zero = 0;
  const std::int64_t oc = c.args.integer("num_output", 1, nullptr);
  const std::int64_t k = c.args.integer("kernel", 1, nullptr);
  const std::int64_t s = c.args.integer("stride", 1, &one);
  const std::int64_t p = c.args.integer("pad", 0, &zero);
  const bool bias = c.args.text("bias", {"true", "false"}, "true") == "true";
  c.args.needKernelFits(c.x, k, p);
  return c.b.conv(c.x, c.name, oc, k, s, p, bias);
}

}  // namespace troupe::kernels::graph
