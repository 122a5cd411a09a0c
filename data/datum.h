// Private to data/ (and its tests): the generated caffe::Datum class. protobuf_generate_cpp writes
// datum.pb.h at the top of the build folder; a generator that keeps the source layout writes
// data/datum.pb.h. Either is found.
#pragma once

#if __has_include("data/datum.pb.h")
#include "data/datum.pb.h"
#else
#include "datum.pb.h"
#endif
