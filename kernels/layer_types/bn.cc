// [[layers]] type "bn": batch normalization with its scale and shift (Caffe's BatchNorm + Scale).
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(bn, "batch normalization with a scale and a shift (Caffe's BatchNorm and Scale)",
                  {"gamma 1: the scale's first value"}) {
  // The scale's first value: 0 for a residual branch's last batch norm (Goyal et al.).
  return c.b.bn(c.x, c.name, c.args.real("gamma", -1e6f, 1e6f, 1.0f));
}

}  // namespace troupe::kernels::graph
