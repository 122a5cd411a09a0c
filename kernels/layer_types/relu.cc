// [[layers]] type "relu".
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(relu, "max(x, 0), in place where nothing else reads its input", {}) {
  return c.b.relu(c.x, c.name);
}

}  // namespace troupe::kernels::graph
