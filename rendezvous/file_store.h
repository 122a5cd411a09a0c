// A Store on a folder every process can see (local disk for one machine, NFS across machines),
// as Caffe2's FileStore: one file per key.
//
// set() writes a temporary file and renames it over the key's file, so readers see the whole old
// value or the whole new one. get() and wait() poll with a short backoff (1 ms doubling to 32 ms).
// add() holds an open-file-description lock (fcntl F_OFD_SETLKW) on a per-key lock file while it
// reads and rewrites the counter, which serialises threads and processes, NFS clients included
// (NFSv4, or v3 with lockd). On NFS, new files show up after the client's attribute-cache delay,
// so mount with a small `actimeo` or `lookupcache=positive` for quick rendezvous. Keys become
// file names with every byte outside [A-Za-z0-9_-] percent-encoded; an encoded key over 200
// characters is an InputError. The folder is never cleaned up by the store: use a fresh one per
// run, or a prefix store.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace troupe::rendezvous {

// Opens the store in `dir`, creating the folder (and its parents) if needed; IoError when it
// cannot. The store keeps no state but the path: any number may share a folder.
std::unique_ptr<Store> openFileStore(const std::string& dir);

}  // namespace troupe::rendezvous
