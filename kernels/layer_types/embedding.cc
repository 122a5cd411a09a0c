// [[layers]] type "embedding": each token of the input's sequences becomes a row of its token
// embedding plus its position's (GPT-2's wte and wpe; Caffe's Embed takes num_output and
// input_dim too). Its parameters are NAME.weight [input_dim, num_output] and NAME.position, drawn
// N(0, 0.02^2); with positions = false, NAME.weight alone, drawn U(-0.1, 0.1) (the LSTM
// examples' encoder).
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(
    embedding, "token and position embedding of the input's token sequences (GPT-2's wte and wpe)",
    {"num_output: the width of a row", "input_dim: the vocabulary (vocab_size)",
     "positions true: add a position embedding (false: tokens alone)"}) {
  if (!c.b.isTokens(c.x)) {
    throw InputError(c.args.where() + " reads the input's token sequences (block_size), got " +
                     toString(c.x.shape));
  }
  const std::int64_t vocab = c.args.integer("input_dim", 2, nullptr);
  const std::int64_t width = c.args.integer("num_output", 1, nullptr);
  if (c.args.text("positions", {"true", "false"}, "true") == "false")
    return c.b.embedding(c.x, c.name, c.name + ".weight", "", vocab, width, Init{false, 0.1f});
  return c.b.embedding(c.x, c.name, c.name + ".weight", c.name + ".position", vocab, width);
}

}  // namespace troupe::kernels::graph
