// [[layers]] type "lstm": PyTorch's nn.LSTM (batch first, from a zero state) over the rows of its
// input: num_layers layers of num_output hidden units (Caffe's LSTM names the width num_output
// too), with dropout between them as nn.LSTM's `dropout`. Its parameters are named as nn.LSTM's
// in a module called NAME: NAME.weight_ih_l0, NAME.weight_hh_l0, NAME.bias_ih_l0, ...
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(
    lstm, "LSTM layers over a sequence's rows (torch.nn.LSTM), each step's state from the last",
    {"num_output: hidden units of each layer", "num_layers 1",
     "dropout 0: between the layers, as nn.LSTM's"}) {
  const std::int64_t one = 1;
  if (c.x.shape.size() != 2) {
    throw InputError(c.args.where() + " needs a sequence of rows [t, width], got " +
                     toString(c.x.shape));
  }
  const std::int64_t hidden = c.args.integer("num_output", 1, nullptr);
  const std::int64_t layers = c.args.integer("num_layers", 1, &one);
  const float dropout = c.args.real("dropout", 0.0f, 1.0f, 0.0f);
  Node h = c.x;
  for (std::int64_t l = 0; l < layers; ++l) {
    if (l > 0 && dropout > 0.0f)
      h = c.b.dropout(h, c.name + ".drop.l" + std::to_string(l - 1), dropout);
    h = c.b.lstm(h, c.name, l, hidden);
  }
  return h;
}

}  // namespace troupe::kernels::graph
