// [[layers]] type "relu".
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

LayerType reluLayerType() {
  return {{"relu", "max(x, 0), in place where nothing else reads its input", {}},
          [](LayerCall& c) { return c.b.relu(c.x, c.name); }};
}

}  // namespace troupe::kernels::graph
