// [[layers]] type "gelu": GPT-2's GELU, in its tanh form.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

LayerType geluLayerType() {
  return {{"gelu", "GELU in GPT-2's tanh form (torch's gelu(approximate='tanh'))", {}},
          [](LayerCall& c) { return c.b.gelu(c.x, c.name); }};
}

}  // namespace troupe::kernels::graph
