// A run's configuration: a TOML file of flat keys (plus [[layers]] for a custom model), any key
// overridable as --key VALUE (ConfigOverrides). The keys are Caffe2's trainer flags where Caffe2
// has one (--train_data, --batch_size, --base_learning_rate ...), and troupe's own otherwise;
// every other flag of Caffe2's resnet50_trainer.py is a key too, which sets a troupe key
// (--redis_host H --redis_port P: rendezvous redis://H:P), is what troupe does anyway (--use_cpu)
// or is refused naming what replaces it (--num_gpus without --use_cpu: replicas); see
// docs/flags.md. Two names for one key from the same source (a file, the flags) are refused.
// Unknown keys, values of the wrong type and numbers out of their key's range are InputErrors
// naming the key and where the value came from (FILE: key 'k', --k, or VAR=VALUE). A config file
// must be a regular file of at most 1 MiB (actors/config/config_file.h). The command line adds a
// --key option per key on top of this (apps/config.h); a service starts a run from a config with
// loadTrainOptions and runTraining.
#pragma once

#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actors/run/trainer.h"

namespace troupe::actors {

// Every key, for --help and for error messages.
struct ConfigKey {
  std::string name;
  std::string kind;     // "integer", "number", "boolean", "string", "list of numbers"
  std::string help;     // ends with the accepted values of a numeric key: "(an integer in [1, 64])"
  std::string summary;  // the help without those values
  std::string accepted;       // what any key accepts: "an integer in [1, 64]", "a string"
  std::string default_value;  // as a run with no file, flag or variable has it
  // A numeric key's values (each element of a list): finite, from min to max, an open end
  // excluding its bound; `range` writes them as "[1, 64]" or "[0, 1)". Other keys: empty range,
  // infinite bounds.
  std::string range;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;
  bool max_open = false;
  // One of Caffe2's resnet50_trainer flags (docs/flags.md): it sets another key, is accepted as
  // what troupe does anyway, or is refused. troupe's own keys named after Caffe2's options
  // (mean_per_channel) are not.
  bool caffe2_flag = false;
  // Changes a step's arithmetic: every process of a run must have the same value (the run is
  // refused at rendezvous otherwise, naming the key and both values).
  bool agree = false;
};
// Any thread (built once).
const std::vector<ConfigKey>& configKeys();

// The variables `troupe launch` (any launcher) sets, each with the key it gives a value:
// {"TROUPE_RANK", "shard_id"} ... TROUPE_NUM_WORKERS=MIN:MAX gives num_workers instead.
const std::vector<std::pair<std::string, std::string>>& launcherVariables();

// docs/config.md: every key (type, accepted values, default, help) in Markdown, after a short
// introduction to config files, flags and environment variables (actors/config/config_doc.cc).
// `troupe docs config` prints it.
std::string configReferenceMarkdown();

// Values given on the command line (or by a service in their place), by key, as text.
using ConfigOverrides = std::map<std::string, std::string>;

// defaults <- file (if not empty) <- the cluster's variables <- MXNet's DMLC_* variables <- troupe
// launch's TROUPE_* variables <- overrides, every value checked against its key's range as it is
// set: flag > TROUPE_* > DMLC_* > cluster variables > config file. Any launcher (local, ssh, mpi,
// slurm) sets TROUPE_*, and a process with TROUPE_ROLE or TROUPE_RANK reads no cluster variables.
// MXNet's (tools/launch.py, ps-lite), for keys no flag or TROUPE_* variable gives: DMLC_ROLE
// (worker or server; scheduler is refused: worker 0 serves the rendezvous itself), DMLC_NUM_WORKER,
// DMLC_NUM_SERVER, DMLC_WORKER_ID or DMLC_SERVER_ID (by role; one of several of its role without
// any rank is refused), DMLC_PS_ROOT_URI with DMLC_PS_ROOT_PORT (rendezvous tcp://URI:PORT, and
// run id dmlc-URI-PORT when none is given) and DMLC_INTERFACE; a process with DMLC_ROLE reads no
// cluster variables either. lr_scaling per256 multiplies base_learning_rate by the global batch
// (batch_size x num_shards) / 256 once all of these are read; TrainOptions::parameters keep the
// rate as given. One started without a
// launcher takes its place from the engine that started it (actors/config/cluster_env.h): Slurm's
// SLURM_PROCID, SLURM_NTASKS and node list (task 0 serves the store on the first node; that run id
// and rendezvous only where the file gives none), a Kubernetes Indexed Job's JOB_COMPLETION_INDEX,
// or Open MPI's OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE. InputError for a bad value, naming
// where it came from. Reads the process's environment (getenv) and the config and secret files:
// call it where no other thread changes the environment.
TrainOptions loadTrainOptions(const std::string& file, const ConfigOverrides& overrides);

}  // namespace troupe::actors
