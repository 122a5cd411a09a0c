// [[layers]] type "residual": a residual block of He et al. made of the other layers, as the
// built-in ResNets make theirs (graph::residualBlock): basic (two 3x3 convolutions) or bottleneck
// (1x1, 3x3, 1x1 to four times the width), batch norms, a projection shortcut where the shape
// changes, the add and a ReLU. Its layers are named NAME.conv1, NAME.bn1, ... NAME.add, and
// the ReLU NAME.relu2 (a bottleneck's NAME.relu3); no other layer of the net may take these.
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(residual,
                  "a ResNet block: convolutions, batch norms, a shortcut, the add and a ReLU",
                  {"width", "stride 1", "bottleneck false (true: 1x1, 3x3, 1x1 to 4 x width)",
                   "gamma 1: the last batch norm's first scale (0: zero-init residuals)"}) {
  c.args.needSpatial(c.x);
  const std::int64_t one = 1;
  const std::int64_t width = c.args.integer("width", 1, nullptr);
  const std::int64_t stride = c.args.integer("stride", 1, &one);
  BlockStyle style = kCifarBlock;
  style.bottleneck = c.args.text("bottleneck", {"true", "false"}, "false") == "true";
  if (style.bottleneck) style.relu = ".relu3";  // after relu1 and relu2 inside
  style.gamma = c.args.real("gamma", -1e6f, 1e6f, 1.0f);
  return residualBlock(c.b, c.x, c.name, width, stride, style);
}

}  // namespace troupe::kernels::graph
