// Checkpoints: everything a run needs to continue exactly where it stopped.
//
// A checkpoint file is written atomically (a temporary file in the same folder, fsync, rename,
// fsync of the folder), so a crash leaves either the previous file or the new one, never a torn
// one. It ends with a CRC-32 of its contents; loading a truncated or corrupted file throws
// InputError naming it, and nothing is half-loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace troupe::actors {

struct Checkpoint {
  // Free-form facts: model name, step, cumulative counters ... (text, no '=' or newline in keys).
  std::map<std::string, std::string> meta;
  kernels::Tensor weights;  // host float
  // host float: the optimizer's state rows (meta optimizer_state names them; none: SGD's
  // momentum_buffer, as checkpoints before troupe had other optimizers), each of weights' size
  kernels::Tensor state;
  // To save: with `state` undefined, the state's floats are read from this file instead (raw,
  // rows one after another: a sharded run's, put together on disk by the coordinator), so that
  // no process holds them all.
  std::string state_file;
  // To save: with `weights` undefined, the weights' floats from this file (raw: pipeline stages'
  // workers' ranges, put together on disk by the coordinator) likewise.
  std::string weights_file;
  kernels::Tensor buffers;  // host float, may be empty

  std::int64_t metaInt(const std::string& key) const;
  // The optimizer that wrote the state (meta `optimizer`), and its state rows' names (meta
  // `optimizer_state`, comma separated): "sgd" and {"momentum_buffer"} in a checkpoint written
  // before troupe named them.
  std::string optimizer() const;
  std::vector<std::string> stateNames() const;
  double metaDouble(const std::string& key) const;
};

// Writes path atomically, streaming the tensors (nothing of the file is put together in memory).
// Refuses (IoError) to replace a file that exists, also when another process publishes the same
// name meanwhile (renameat2 RENAME_NOREPLACE, else link()), and refuses (NumericError) tensors
// holding inf or NaN: no diverged state is ever saved. The temporary file is `path.tmp.PID` (PID of
// the writer), left behind only when the writer dies mid-save.
void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint);
// Loads path: its checksum checked over the whole file first, then each part read straight into
// its tensor. With `state_columns` [begin, end), `state` holds only those columns of each of its
// rows, one row after another (a ZeRO worker's shard, a parameter server's keys), and
// the rest of the state is never held.
Checkpoint loadCheckpoint(
    const std::string& path,
    std::optional<std::pair<std::int64_t, std::int64_t>> state_columns = std::nullopt);
// Only the meta of `path`, read from its head: no checksum is verified (loadCheckpoint does that).
// InputError naming the file when it is no troupe checkpoint or its head is cut short.
std::map<std::string, std::string> loadCheckpointMeta(const std::string& path);

// A checkpoint's optimizer state put together on disk from column shards (a ZeRO run's: each
// worker holds the state of columns [begin, end) of every row): `rows` rows of `columns` floats,
// raw, in `path`, which the checkpoint is then written from (Checkpoint::state_file). The file is
// made empty (the holes read as zeros) and removed when this goes; name it as a temporary of the
// checkpoint folder (`*.ckpt.tmp.PID`) so that a crash's leftover is cleaned up.
class StateFile {
 public:
  StateFile(std::string path, std::int64_t rows, std::int64_t columns);
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // Elements [offset, offset + n) of the shard of columns [begin, end), its rows one after
  // another, written where they go.
  void write(std::int64_t begin, std::int64_t end, std::int64_t offset, const float* values,
             std::int64_t n);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::int64_t rows_, columns_;
  int fd_;
};

// Removes the temporaries (`*.ckpt.tmp.PID`) of saves in `dir` whose writer, a process of this
// host, no longer runs, and returns their paths. Checkpoints and the temporaries of live writers
// are left alone; a missing folder has none.
std::vector<std::string> removeStaleTemporaries(const std::string& dir);

// The newest complete checkpoint among the `*.ckpt` files of `dir` that `accept` takes (it returns
// an empty string to take a checkpoint's meta, else why not): the highest `step`, then the latest
// modification time, then the greatest name. Complete means loadCheckpoint succeeds; a file that
// fails is passed over with a warning naming it, as is one `accept` refuses with a reason.
// nullopt when there is none (or no folder). The checkpoint comes loaded (with `state_columns`, as
// loadCheckpoint loads them).
struct FoundCheckpoint {
  std::string path;
  Checkpoint checkpoint;
};
std::optional<FoundCheckpoint> findLatestCheckpoint(
    const std::string& dir,
    const std::function<std::string(const std::map<std::string, std::string>& meta)>& accept,
    std::optional<std::pair<std::int64_t, std::int64_t>> state_columns = std::nullopt);

}  // namespace troupe::actors
