// Caffe2's resnet50_trainer.py flags that troupe's own keys do not already cover, as keys of the
// table (config_keys.h): each maps onto a troupe key, is accepted as what troupe does anyway, or
// is refused naming what replaces it. docs/flags.md lists every flag of the script and what troupe
// does with it (tests/apps_flags_test.cc holds the table to the code). Private to the config
// loader (config_keys.cc, train_config.cc). Any thread: nothing here keeps state.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "actors/config/config_keys.h"

namespace troupe::actors::config {

// The flags, in the script's order: gpus, num_gpus, model_parallel, cudnn_workspace_limit_mb,
// gpu_engine_workspace_limit_mb, redis_host, redis_port, file_store_path, save_model_name,
// load_model_path, use_cpu, use_nccl, use_ideep, dtype, float16_compute, enable_tensor_core,
// distributed_transport, distributed_interfaces, num_layers, resnext_num_groups,
// resnext_width_per_group, image_mean_per_channel, image_std_per_channel, test_epoch_size,
// first_iter_timeout, timeout. (train_data, test_data, db_type, num_channels, image_size,
// num_labels, batch_size, epoch_size, num_epochs, base_learning_rate, weight_decay, num_shards,
// shard_id, run_id and model are troupe's keys of the same name.)
std::vector<Key> caffe2Keys();

// What the flags defer until every source is read, applied where the flag is the last to give
// its key (`s.given`): redis_host (with redis_port, default 6379) as rendezvous
// redis://HOST:PORT, file_store_path as file://DIR (made absolute), and num_gpus or gpus as
// replicas, one on each GPU (TrainOptions::gpus) or, with use_cpu, on the CPU (Caffe2's CPU
// devices); use_cpu false alone is one replica on GPU 0. InputError naming the flag: redis_port
// without redis_host.
void resolveCaffe2Flags(Settings& s);

// What lr_scaling multiplies base_learning_rate by for a step of `global_batch` inputs over all
// workers: per256, global_batch / 256 (Caffe2's ImageNet runs, Goyal et al. 2017); none, 1.
double lrScale(std::string_view scaling, std::int64_t global_batch);

// Applies lr_scaling to `s.options.base_learning_rate`, the global batch being batch_size x
// num_shards (as the run's plan forms it). InputError when the rate leaves its range, or with
// per256 in an elastic run (its global batch changes as workers come and go).
void applyLrScaling(Settings& s);

}  // namespace troupe::actors::config
