// The number of workers a run has: N, or MIN:MAX for an elastic run (actors/run/elastic.h). Apart
// from the elastic machinery, so that the config loader and the launcher parse it alone.
#pragma once

#include <string_view>

namespace troupe::actors {

// MIN:MAX from "MIN:MAX", both 0 for a plain number N (a fixed world: num_shards N). InputError
// naming the value when it is neither, MIN < 1, or MIN > MAX.
struct WorkerBounds {
  int fixed = 0;  // N, when not elastic
  int min = 0;
  int max = 0;
  bool elastic() const { return max > 0; }
};
WorkerBounds parseNumWorkers(std::string_view text);

}  // namespace troupe::actors
