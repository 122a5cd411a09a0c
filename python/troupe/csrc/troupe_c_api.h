// troupe._troupe's C API: the ring store's collectives for C++ code built apart from troupe (the
// torch.distributed backend in c10d.cc, which torch's cpp_extension builds against the installed
// torch). A capsule holds the table, as numpy's C API does: no symbol of troupe's library is
// linked, so the two builds need not share a compiler's flags or troupe's dependencies.
//
//   auto* api = static_cast<const TroupeCApi*>(PyCapsule_Import(TROUPE_C_API_CAPSULE, 0));
//
// A store is a troupe._troupe.KVStore (troupe.kv.create(...)._store): store_of() takes it (with
// the GIL; the caller keeps a reference to the object while it uses the store). The collectives
// run without the GIL and return nullptr, or the error's message (valid until the calling
// thread's next call), which names the peer or the setting at fault.
#ifndef TROUPE_C_API_H_
#define TROUPE_C_API_H_

#include <Python.h>

#include <cstddef>

#define TROUPE_C_API_CAPSULE "troupe._troupe._C_API"
#define TROUPE_C_API_VERSION 2

extern "C" {

struct TroupeCApi {
  int version;  // TROUPE_C_API_VERSION of the module that filled the table
  // The store of a troupe._troupe.KVStore, or nullptr with a Python error set.
  void* (*store_of)(PyObject* kvstore);
  int (*rank)(void* store);
  int (*num_workers)(void* store);
  // `values` (n floats) summed over the workers, in place.
  const char* (*allreduce)(void* store, float* values, std::size_t n);
  // Every worker's `mine` (n floats each) into `all` (n * workers floats), in rank order, bit for
  // bit.
  const char* (*allgather)(void* store, const float* mine, std::size_t n, float* all);
  // The same into `parts[r]` (n floats each), one a worker, written where they lie.
  const char* (*allgather_parts)(void* store, const float* mine, std::size_t n,
                                 float* const* parts);
  // The sum over the workers of their `all`'s rank-th part (n floats of n * workers) into `mine`.
  const char* (*reduce_scatter)(void* store, const float* all, std::size_t n, float* mine);
  const char* (*barrier)(void* store);
  // Version 2: every worker's `values` (n floats) become worker `root`'s, bit for bit, in place.
  const char* (*broadcast)(void* store, float* values, std::size_t n, int root);
};
}

#endif  // TROUPE_C_API_H_
