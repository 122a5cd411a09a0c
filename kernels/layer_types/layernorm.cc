// [[layers]] type "layernorm": layer norm over each row's last dimension (torch's LayerNorm), with
// a scale and a shift.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(layernorm, "layer norm over each row (a token's), with a scale and a shift", {}) {
  return c.b.layerNorm(c.x, c.name);
}

}  // namespace troupe::kernels::graph
