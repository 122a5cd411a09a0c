// [[layers]] type "transformer": GPT-2's block (graph::transformerBlock): layer norm, causal
// self-attention and its projection, the residual add, layer norm, an MLP four times as wide with
// a GELU, the residual add. Its layers are named NAME.ln_1 ... NAME.add_2, as nanoGPT's modules.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(
    transformer, "GPT-2's block: layer norms, causal self-attention, a GELU MLP, two residual adds",
    {"n_head",
     "n_layer 1: the blocks of the net (its projections start at "
     "0.02 / sqrt(2 n_layer))"}) {
  const std::int64_t one = 1;
  const std::int64_t heads = c.args.integer("n_head", 1, nullptr);
  if (c.x.shape.size() != 2 || c.x.shape[1] % heads != 0) {
    throw InputError(c.args.where() + " needs rows n_head x a head's width wide, got " +
                     toString(c.x.shape));
  }
  return transformerBlock(c.b, c.x, c.name, heads, c.args.integer("n_layer", 1, &one));
}

}  // namespace troupe::kernels::graph
