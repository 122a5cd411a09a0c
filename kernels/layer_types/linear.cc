// [[layers]] type "linear": torch's Linear over each row's last dimension (a token's), with a
// bias; or with `tied`, the weights of the embedding it names (GPT-2's output layer) and no bias,
// or with bias = true a bias of its own (the LSTM examples' tied decoder).
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(
    linear, "an inner product with a bias over each row (torch's Linear on the last dimension)",
    {"num_output", "tied: an embedding's name, whose weights it reads (no bias)",
     "bias false: with tied, a bias of its own"}) {
  if (c.args.has("tied")) {
    if (c.args.has("num_output")) c.args.fail("num_output", "is the tied weights' rows");
    return c.b.tiedLinear(c.x, c.name, c.args.string("tied", nullptr),
                          c.args.text("bias", {"true", "false"}, "false") == "true");
  }
  if (c.args.has("bias")) c.args.fail("bias", "is for a tied linear (this one has one)");
  return c.b.linear(c.x, c.name, c.args.integer("num_output", 1, nullptr), 0.02f);
}

}  // namespace troupe::kernels::graph
