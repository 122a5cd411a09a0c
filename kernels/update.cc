#include "kernels/update.h"

#include <algorithm>

#include "troupe/error.h"

namespace troupe::kernels {
namespace {

void checkRanges(const std::vector<ParamRange>& ranges, std::int64_t n, const char* what) {
  std::int64_t after = 0;
  for (const auto& [lo, hi] : ranges) {
    TROUPE_ENFORCE(after <= lo && lo <= hi && hi <= n, what, " range [", lo, ", ", hi,
                   ") out of order or outside ", n, " weights");
    after = hi;
  }
}

}  // namespace

UpdatePlan planUpdate(const UpdateArgs& a, bool layerwise) {
  const std::int64_t n = a.w.numel();
  TROUPE_ENFORCE_EQ(a.g.numel(), n);
  checkRanges(a.no_decay, n, "no-decay");
  checkRanges(a.layers, n, "layer");
  // Cut points: every range's ends.
  std::vector<std::int64_t> cuts{0, n};
  for (const auto& [lo, hi] : a.no_decay)
    cuts.insert(cuts.end(), {lo, hi});
  if (layerwise) {
    for (const auto& [lo, hi] : a.layers)
      cuts.insert(cuts.end(), {lo, hi});
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const auto inside = [](const std::vector<ParamRange>& ranges, std::int64_t at) {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), at,
                               [](std::int64_t x, const ParamRange& r) { return x < r.first; });
    return it != ranges.begin() && at < std::prev(it)->second;
  };
  UpdatePlan plan;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    const std::int64_t b = cuts[i], e = cuts[i + 1];
    plan.pieces.push_back({b, e, -1, !inside(a.no_decay, b)});
  }
  if (!layerwise) return plan;
  // A layer is the listed range holding a piece, or the gap between listed ranges.
  std::size_t at = 0;
  while (at < plan.pieces.size()) {
    const std::int64_t b = plan.pieces[at].begin;
    auto layer = std::find_if(a.layers.begin(), a.layers.end(),
                              [&](const ParamRange& r) { return r.first <= b && b < r.second; });
    std::int64_t e;
    if (layer != a.layers.end()) {
      e = layer->second;
    } else {
      auto next = std::upper_bound(a.layers.begin(), a.layers.end(), b,
                                   [](std::int64_t x, const ParamRange& r) { return x < r.first; });
      e = next == a.layers.end() ? n : next->first;
    }
    std::size_t end = at;
    bool adapted = true;
    while (end < plan.pieces.size() && plan.pieces[end].end <= e) {
      adapted = adapted && plan.pieces[end].decay;
      ++end;
    }
    if (adapted) {
      for (std::size_t k = at; k < end; ++k)
        plan.pieces[k].segment = static_cast<int>(plan.segments.size());
      plan.segments.emplace_back(b, e);
    }
    at = end;
  }
  return plan;
}

}  // namespace troupe::kernels
