// [[layers]] type "dropout".
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(dropout, "zeroes each input with probability ratio in training, scaling the rest",
                  {"ratio 0.5"}) {
  return c.b.dropout(c.x, c.name, c.args.real("ratio", 0.0f, 1.0f, 0.5f));
}

}  // namespace troupe::kernels::graph
