// A config's [[layers]] tables, built into a graph through the layer types' table (layerTable():
// one file of kernels/layer_types/ a type, listed by the build, cmake/registry.cmake).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kernels/net.h"
#include "kernels/net_graph.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace graph {

Node buildFromSpec(Builder& b, Node x, const std::vector<LayerSpec>& layers) {
  LayerNames names(x);
  std::map<std::string, std::size_t> built;  // every layer's name, and the spec that added it
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    const std::string name = names.claim(spec, i);
    if (const auto input = spec.args.find("input"); input != spec.args.end())
      x = names.output(spec, i, "input", input->second);
    const auto& table = layerTable();
    const auto type = std::find_if(table.begin(), table.end(),
                                   [&](const LayerType& t) { return t.info.name == spec.type; });
    if (type == table.end()) {
      std::vector<std::string> known;
      for (const auto& t : table)
        known.push_back(t.info.name);
      throw InputError("layer " + std::to_string(i) + " has unknown type '" + spec.type +
                       "' (known: " + join(known) + ")");
    }
    std::vector<std::string> keys;
    for (const auto& arg : type->info.args)
      keys.push_back(arg.key);
    SpecArgs args(spec, i, std::move(keys));
    LayerCall call{b, x, name, args, names};
    const std::size_t before = b.layerNames().size();
    x = type->build(call);
    // A type may add several layers (a residual block's NAME.conv1 ...): each named apart.
    for (std::size_t k = before; k < b.layerNames().size(); ++k) {
      const std::string& added = b.layerNames()[k];
      if (const auto [it, fresh] = built.emplace(added, i); !fresh) {
        throw InputError(layerWhere(spec, i) + ": its layer '" + added + "' has the name of " +
                         (it->second == i ? std::string("another of its own")
                                          : "a layer of layer " + std::to_string(it->second)));
      }
    }
    names.built(spec, name, x);
  }
  return x;
}

}  // namespace graph

std::vector<LayerTypeInfo> layerTypes() {
  std::vector<LayerTypeInfo> out;
  for (const auto& type : graph::layerTable())
    out.push_back(type.info);
  return out;
}

}  // namespace troupe::kernels
