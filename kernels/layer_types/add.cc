// [[layers]] type "add": the residual connection, this input plus an earlier layer's output.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(
    add, "the residual connection: this input plus the output `with` names, of the same shape",
    {"with: the named output added to this input"}) {
  const Node& other =
      c.names.output(c.args.spec(), c.args.index(), "with", c.args.string("with", nullptr));
  if (other.blob == c.x.blob) c.args.fail("with", "names this layer's own input");
  if (other.shape != c.x.shape) {
    c.args.fail("with", "= '" + c.args.spec().args.at("with") + "' gives " + toString(other.shape) +
                            " per sample, the input " + toString(c.x.shape));
  }
  return c.b.sum(c.x, other, c.name);
}

}  // namespace troupe::kernels::graph
