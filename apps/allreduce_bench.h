// The allreduce benchmark: troupe's own ring allreduce (actors::RingAllreduce driven by an actor,
// chunks crossing processes through actors::joinCluster's transport, as in training), timed the
// way nccl-tests times its all_reduce_perf.
//
// Sizes are in MB of float32 (1 MB = 1e6 bytes, nccl-tests' convention). For each size every rank
// runs `warmup` untimed and then `iters` timed sum-allreduces; each one starts right after a
// barrier (a one-element-per-rank ring allreduce over the same links), and its time runs from
// there to the moment this rank holds the whole sum. A rank fills its buffer with rank-dependent
// values before each allreduce and checks every element of the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/run/trainer.h"

namespace troupe::apps {

struct AllreduceBenchOptions {
  std::vector<double> sizes_mb{1, 25, 100};
  int iters = 20;
  int warmup = 5;
  std::int64_t segment_bytes = 0;  // 0: ReducerConfig's default
  // TCP connections to a process on another host (TrainOptions::connections_per_peer).
  int connections = actors::TrainOptions{}.connections_per_peer;
  // What happens to a chunk before it is sent. kSendBuffer does what the training reducer does:
  // into shared memory for a process on this host, else straight from the buffer, done once the
  // transport has written it (actors/core/lease.h). kAlloc copies
  // into a fresh host tensor (all bytes then cross the socket), kPool into buffers the transport
  // hands back once written (no allocation, page faults or zero-fill per chunk). kNone sends the
  // buffer itself: the benchmark leaves its buffers alone until every rank is done with them, so
  // it can measure the ring over sockets without a copy.
  enum class ChunkCopy { kSendBuffer, kAlloc, kPool, kNone };
  ChunkCopy copy = ChunkCopy::kSendBuffer;
  std::string interface;  // empty: TROUPE_INTERFACE or any
};

struct AllreduceBenchRow {
  double size_mb = 0;
  std::int64_t count = 0;  // floats
  double time_ms = 0;      // mean over the timed iterations; the slowest rank's mean
  double min_ms = 0;       // the fastest single iteration of any rank
  std::int64_t wrong = 0;  // elements with a wrong sum, over all ranks and iterations
};

// One worker process of the benchmark: joins the run described by TROUPE_RANK,
// TROUPE_NUM_WORKERS, TROUPE_RUN_ID and TROUPE_RENDEZVOUS (what apps::launch sets), runs every
// size, and returns the rows (the same on every rank). Throws troupe::Error when the run cannot be
// joined or a peer fails.
std::vector<AllreduceBenchRow> runAllreduceWorker(const AllreduceBenchOptions& options);

// The rows as a text table (nccl-tests' columns plus a check column); `world` gives busbw's
// factor 2(n-1)/n.
std::string formatAllreduceTable(const std::vector<AllreduceBenchRow>& rows, int world);

// Rows to and from the one-line-per-size text a worker hands its launcher.
std::string encodeAllreduceRows(const std::vector<AllreduceBenchRow>& rows);
std::vector<AllreduceBenchRow> decodeAllreduceRows(const std::string& text);

}  // namespace troupe::apps
