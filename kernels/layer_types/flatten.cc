// [[layers]] type "flatten": an image as a vector (no layer runs; the blob is read so).
#include "kernels/net_graph.h"

namespace troupe::kernels::graph {

TROUPE_LAYER_TYPE(flatten, "the input as one vector per sample (no computation)", {}) {
  return Builder::flatten(c.x);
}

}  // namespace troupe::kernels::graph
