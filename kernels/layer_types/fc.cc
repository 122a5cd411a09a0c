// [[layers]] type "fc": an inner product with a bias (Caffe's InnerProduct, torch's Linear).
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(fc, "an inner product with a bias (Caffe's InnerProduct, torch's Linear)",
                  {"num_output"}) {
  return c.b.fc(c.x, c.name, c.args.integer("num_output", 1, nullptr));
}

}  // namespace troupe::kernels::graph
