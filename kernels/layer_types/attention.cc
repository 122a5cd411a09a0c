// [[layers]] type "attention": causal self-attention of n_head heads over rows of q, k and v side
// by side ([t, 3 C], a linear layer's output), giving [t, C].
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(
    attention,
    "causal self-attention over rows of q, k, v side by side (after a linear of 3 x width)",
    {"n_head: heads, each width / n_head wide"}) {
  const std::int64_t heads = c.args.integer("n_head", 1, nullptr);
  if (c.x.shape.size() != 2 || c.x.shape[1] % (3 * heads) != 0) {
    throw InputError(c.args.where() + " needs rows of q, k and v, 3 x n_head x a head's " +
                     "width wide, got " + toString(c.x.shape));
  }
  return c.b.attention(c.x, c.name, heads);
}

}  // namespace troupe::kernels::graph
