// troupe._troupe: the C++ library's KVStore (include/troupe/kvstore.h) for Python, over float32
// numpy arrays. python/troupe/kv.py gives it MXNet's API (mx.kv) on top: keys and lists of keys,
// torch tensors, optimizers by name. A call's error Status becomes troupe.Error (its kind and
// message); the calls that wait (for servers, for other workers) let other Python threads run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/compression.h"
#include "troupe/kvstore.h"
#include "troupe/version.h"
#include "troupe_c_api.h"

namespace py = pybind11;

namespace {

using FloatArray = py::array_t<float, py::array::c_style>;

// troupe.Error, with the Status's kind ("input", "timeout", "peer", ...) as its `kind`.
py::object& errorType() {
  static py::object type;
  return type;
}

void check(const troupe::Status& s) {
  if (s) return;
  py::object error = errorType()(s.message());
  error.attr("kind") = troupe::errorKindName(s.kind());
  PyErr_SetObject(errorType().ptr(), error.ptr());
  throw py::error_already_set();
}

// Runs `call` (a troupe call that may wait on other processes) with the GIL released, so that
// other Python threads run meanwhile, and raises its error Status.
template <typename Call>
void released(Call&& call) {
  troupe::Status s;
  {
    py::gil_scoped_release free;
    s = call();
  }
  check(s);
}

// A float32 array's values, read in place: numpy arrays of another type or layout are refused
// (kv.py converts), so that no copy is made behind the caller's back.
std::span<const float> values(const FloatArray& a) {
  return {a.data(), static_cast<std::size_t>(a.size())};
}

class PyKVStore {
 public:
  explicit PyKVStore(std::unique_ptr<troupe::KVStore> store) : store_(std::move(store)) {}

  // Every call goes through store(), which refuses a closed store (troupe.Error).
  std::string type() { return store().type(); }
  int rank() { return store().rank(); }
  int numWorkers() { return store().numWorkers(); }

  void init(int key, const FloatArray& value) {
    const auto v = values(value);
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.init(key, v); });
  }

  // The sum of `arrays` (each the key's size) pushed for `key`.
  void push(int key, const std::vector<FloatArray>& arrays, int priority) {
    std::vector<std::span<const float>> spans;
    for (const auto& a : arrays)
      spans.push_back(values(a));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.push(key, spans, priority); });
  }

  // One array a key, the keys sent together.
  void pushMany(const std::vector<int>& keys, const std::vector<FloatArray>& arrays, int priority) {
    std::vector<std::span<const float>> spans;
    for (const auto& a : arrays)
      spans.push_back(values(a));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.push(keys, spans, priority); });
  }

  void pull(int key, FloatArray& out, int priority) {
    std::span<float> into(out.mutable_data(), static_cast<std::size_t>(out.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.pull(key, into, priority); });
  }

  void pullMany(const std::vector<int>& keys, std::vector<FloatArray>& outs, int priority) {
    std::vector<std::span<float>> spans;
    for (auto& o : outs)
      spans.emplace_back(o.mutable_data(), static_cast<std::size_t>(o.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.pull(keys, spans, priority); });
  }

  // `values` summed over the workers, in place (KVStore::allreduce).
  void allreduce(FloatArray& values) {
    std::span<float> in_place(values.mutable_data(), static_cast<std::size_t>(values.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.allreduce(in_place); });
  }

  // `values` become worker `root`'s, in place (KVStore::broadcast).
  void broadcast(FloatArray& values, int root) {
    std::span<float> in_place(values.mutable_data(), static_cast<std::size_t>(values.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.broadcast(in_place, root); });
  }

  // Every worker's `mine` into `all`, in rank order (KVStore::allgather).
  void allgather(const FloatArray& mine, FloatArray& all) {
    const auto from = values(mine);
    std::span<float> into(all.mutable_data(), static_cast<std::size_t>(all.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.allgather(from, into); });
  }

  // Every worker's `mine` into its array of `parts`, written where they lie (KVStore::allgather).
  void allgatherParts(const FloatArray& mine, std::vector<FloatArray>& parts) {
    const auto from = values(mine);
    std::vector<std::span<float>> into;
    for (auto& p : parts)
      into.emplace_back(p.mutable_data(), static_cast<std::size_t>(p.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.allgather(from, into); });
  }

  // The sum over the workers of their `all`'s rank-th part into `mine` (KVStore::reduceScatter).
  void reduceScatter(const FloatArray& all, FloatArray& mine) {
    const auto from = values(all);
    std::span<float> into(mine.mutable_data(), static_cast<std::size_t>(mine.size()));
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.reduceScatter(from, into); });
  }

  void setOptimizer(const troupe::OptimizerSpec& spec) { check(store().setOptimizer(spec)); }

  void setGradientCompression(const std::string& type, float threshold) {
    check(store().setGradientCompression(type, threshold));
  }

  void saveOptimizerStates(const std::string& path) {
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.saveOptimizerStates(path); });
  }
  void loadOptimizerStates(const std::string& path) {
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.loadOptimizerStates(path); });
  }

  void barrier() {
    troupe::KVStore& kv = store();  // with the GIL: a closed store raises
    released([&] { return kv.barrier(); });
  }

  // Tells the servers this worker is done and waits for the others (the C++ store's destructor):
  // at close() or when the object goes.
  void close() {
    py::gil_scoped_release free;
    store_.reset();
  }

  bool closed() const { return !store_; }

  // The store for the C API (troupe_c_api.h), or nullptr once closed.
  troupe::KVStore* open() { return store_.get(); }

 private:
  troupe::KVStore& store() {
    if (!store_) check(troupe::Status(troupe::ErrorKind::kInput, "this KVStore was closed"));
    return *store_;
  }

  std::unique_ptr<troupe::KVStore> store_;
};

// ---- the C API (troupe_c_api.h): the ring's collectives for the torch backend (c10d.cc) ----

// The message of a failed call, valid until the calling thread's next call.
const char* failed(const std::string& message) {
  thread_local std::string last;
  last = message;
  return last.c_str();
}

const char* outcome(const troupe::Status& s) {
  return s ? nullptr : failed(s.message());
}

// Runs `call` on the store, or fails naming a closed one.
template <typename Call>
const char* onStore(void* store, Call&& call) {
  troupe::KVStore* kv = static_cast<PyKVStore*>(store)->open();
  if (!kv) return failed("troupe backend: its KVStore was closed");
  return outcome(call(*kv));
}

const TroupeCApi kCApi = {
    TROUPE_C_API_VERSION,
    [](PyObject* kvstore) -> void* {
      try {
        return py::handle(kvstore).cast<PyKVStore*>();
      } catch (const py::cast_error&) {
        PyErr_Format(PyExc_TypeError, "a troupe._troupe.KVStore, not %s",
                     Py_TYPE(kvstore)->tp_name);
        return nullptr;
      }
    },
    [](void* store) {
      troupe::KVStore* kv = static_cast<PyKVStore*>(store)->open();
      return kv ? kv->rank() : -1;
    },
    [](void* store) {
      troupe::KVStore* kv = static_cast<PyKVStore*>(store)->open();
      return kv ? kv->numWorkers() : -1;
    },
    [](void* store, float* values, std::size_t n) {
      return onStore(store, [&](troupe::KVStore& kv) { return kv.allreduce({values, n}); });
    },
    [](void* store, const float* mine, std::size_t n, float* all) {
      return onStore(store, [&](troupe::KVStore& kv) {
        return kv.allgather({mine, n}, {all, n * static_cast<std::size_t>(kv.numWorkers())});
      });
    },
    [](void* store, const float* mine, std::size_t n, float* const* parts) {
      return onStore(store, [&](troupe::KVStore& kv) {
        std::vector<std::span<float>> into;
        for (int r = 0; r < kv.numWorkers(); ++r)
          into.emplace_back(parts[r], n);
        return kv.allgather({mine, n}, into);
      });
    },
    [](void* store, const float* all, std::size_t n, float* mine) {
      return onStore(store, [&](troupe::KVStore& kv) {
        return kv.reduceScatter({all, n * static_cast<std::size_t>(kv.numWorkers())}, {mine, n});
      });
    },
    [](void* store) { return onStore(store, [](troupe::KVStore& kv) { return kv.barrier(); }); },
    [](void* store, float* values, std::size_t n, int root) {
      return onStore(store, [&](troupe::KVStore& kv) { return kv.broadcast({values, n}, root); });
    },
};

}  // namespace

PYBIND11_MODULE(_troupe, m) {
  m.doc() = "troupe's C++ library: the KVStore (include/troupe/kvstore.h)";
  m.attr("__version__") = troupe::version();
  errorType() = py::reinterpret_borrow<py::object>(
      PyErr_NewExceptionWithDoc("troupe.Error",
                                "A troupe call failed: `kind` says how (input, io, timeout, "
                                "peer, numeric, ...), the message names the culprit.",
                                PyExc_RuntimeError, nullptr));
  m.attr("Error") = errorType();
  m.attr("_C_API") = py::capsule(&kCApi, TROUPE_C_API_CAPSULE);

  py::class_<troupe::OptimizerSpec>(m, "OptimizerSpec")
      .def(py::init<>())
      .def_readwrite("name", &troupe::OptimizerSpec::name)
      .def_readwrite("learning_rate", &troupe::OptimizerSpec::learning_rate)
      .def_readwrite("momentum", &troupe::OptimizerSpec::momentum)
      .def_readwrite("weight_decay", &troupe::OptimizerSpec::weight_decay)
      .def_readwrite("rescale_grad", &troupe::OptimizerSpec::rescale_grad)
      .def_readwrite("nesterov", &troupe::OptimizerSpec::nesterov)
      .def_readwrite("beta1", &troupe::OptimizerSpec::beta1)
      .def_readwrite("beta2", &troupe::OptimizerSpec::beta2)
      .def_readwrite("epsilon", &troupe::OptimizerSpec::epsilon)
      .def_readwrite("rho", &troupe::OptimizerSpec::rho)
      .def_readwrite("eta", &troupe::OptimizerSpec::eta);

  py::class_<PyKVStore>(m, "KVStore")
      .def_property_readonly("type", &PyKVStore::type)
      .def_property_readonly("rank", &PyKVStore::rank)
      .def_property_readonly("num_workers", &PyKVStore::numWorkers)
      .def_property_readonly("closed", &PyKVStore::closed)
      .def("init", &PyKVStore::init, py::arg("key"), py::arg("value"))
      .def("push", &PyKVStore::push, py::arg("key"), py::arg("arrays"), py::arg("priority") = 0)
      .def("push_many", &PyKVStore::pushMany, py::arg("keys"), py::arg("arrays"),
           py::arg("priority") = 0)
      .def("pull", &PyKVStore::pull, py::arg("key"), py::arg("out").noconvert(),
           py::arg("priority") = 0)
      .def("pull_many", &PyKVStore::pullMany, py::arg("keys"), py::arg("outs").noconvert(),
           py::arg("priority") = 0)
      .def("allreduce", &PyKVStore::allreduce, py::arg("values").noconvert())
      .def("broadcast", &PyKVStore::broadcast, py::arg("values").noconvert(), py::arg("root"))
      .def("allgather", &PyKVStore::allgather, py::arg("mine"), py::arg("all").noconvert())
      .def("allgather_parts", &PyKVStore::allgatherParts, py::arg("mine"),
           py::arg("parts").noconvert())
      .def("reduce_scatter", &PyKVStore::reduceScatter, py::arg("all"), py::arg("mine").noconvert())
      .def("set_optimizer", &PyKVStore::setOptimizer, py::arg("spec"))
      .def("set_gradient_compression", &PyKVStore::setGradientCompression, py::arg("type"),
           py::arg("threshold") = 0.5f)
      .def("save_optimizer_states", &PyKVStore::saveOptimizerStates, py::arg("path"))
      .def("load_optimizer_states", &PyKVStore::loadOptimizerStates, py::arg("path"))
      .def("barrier", &PyKVStore::barrier)
      .def("close", &PyKVStore::close);

  m.def(
      "encoded_size",
      [](const std::string& type, std::int64_t n) {
        auto size = troupe::encodedSize(type, n);
        check(size.status());
        return size.value();
      },
      py::arg("type"), py::arg("n"), "Bytes that n values take encoded as type");
  m.def(
      "encode",
      [](const std::string& type, float threshold, const FloatArray& values,
         std::optional<FloatArray> residual) {
        auto size = troupe::encodedSize(type, values.size());
        check(size.status());
        // Made by numpy itself: pybind11 2.10 (Debian's) reads an element's size where numpy 1
        // kept it, and under numpy 2 an array it made had other strides (every byte past the
        // first read from the wrong place).
        auto out = py::module_::import("numpy")
                       .attr("empty")(size.value(), "uint8")
                       .cast<py::array_t<std::uint8_t>>();
        std::span<float> rest;
        if (residual) rest = {residual->mutable_data(), static_cast<std::size_t>(residual->size())};
        check(troupe::encode(type, threshold,
                             {values.data(), static_cast<std::size_t>(values.size())}, rest,
                             {out.mutable_data(), static_cast<std::size_t>(out.size())}));
        return out;
      },
      py::arg("type"), py::arg("threshold"), py::arg("values"),
      py::arg("residual").noconvert() = py::none(),
      "values (float32) encoded as troupe's transport does (2bit: the residual, float32 of the "
      "values' size, is read and updated in place)");
  m.def(
      "decode",
      [](const std::string& type, float threshold, const py::array_t<std::uint8_t>& bytes,
         FloatArray& out, bool accumulate) {
        check(
            troupe::decode(type, threshold, {bytes.data(), static_cast<std::size_t>(bytes.size())},
                           {out.mutable_data(), static_cast<std::size_t>(out.size())}, accumulate));
      },
      py::arg("type"), py::arg("threshold"), py::arg("bytes"), py::arg("out").noconvert(),
      py::arg("accumulate") = false, "bytes decoded into out (float32): out = or out += values");
  m.def(
      "create",
      [](const std::string& type, const troupe::KVStoreSettings& settings) {
        auto made = [&] {
          py::gil_scoped_release free;
          return troupe::KVStore::create(type, settings);
        }();
        check(made.status());
        return std::make_unique<PyKVStore>(std::move(made.value()));
      },
      py::arg("type"), py::arg("settings") = troupe::KVStoreSettings{},
      "A store of `type` (local, device, dist_sync, dist_async, ssp, ring), placed by the "
      "launcher's variables or `settings` (config keys)");
  m.def(
      "is_server",
      [](const troupe::KVStoreSettings& settings) { return troupe::KVStore::isServer(settings); },
      py::arg("settings") = troupe::KVStoreSettings{},
      "Whether this process was started as a parameter server");
  m.def(
      "run_server",
      [](const std::string& type, const troupe::KVStoreSettings& settings) {
        released([&] { return troupe::KVStore::runServer(type, settings); });
      },
      py::arg("type"), py::arg("settings") = troupe::KVStoreSettings{},
      "Serves this process's keys of a distributed store until every worker is done");
}
