// [[layers]] type "gelu": GPT-2's GELU, in its tanh form.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(gelu, "GELU in GPT-2's tanh form (torch's gelu(approximate='tanh'))", {}) {
  return c.b.gelu(c.x, c.name);
}

}  // namespace troupe::kernels::graph
