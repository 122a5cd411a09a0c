#include "rendezvous/prefix_store.h"

#include <fmt/format.h>

#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string run_id)
      : inner_(std::move(inner)), prefix_(run_id + "/"), run_id_(std::move(run_id)) {}

  void set(const std::string& key, std::string_view value) override {
    inner_->set(prefixed(key), value);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(prefixed(key), timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_->add(prefixed(key), delta);
  }
  bool check(const std::vector<std::string>& keys) override {
    return inner_->check(prefixed(keys));
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(prefixed(keys), timeout);
  }
  bool remove(const std::string& key) override { return inner_->remove(prefixed(key)); }
  std::string describe() const override {
    return fmt::format("{} (run '{}')", inner_->describe(), run_id_);
  }

 private:
  std::string prefixed(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys)
      out.push_back(prefixed(key));
    return out;
  }

  std::shared_ptr<Store> inner_;
  std::string prefix_;
  std::string run_id_;
};

}  // namespace

std::unique_ptr<Store> prefixStore(std::shared_ptr<Store> inner, std::string run_id) {
  if (run_id.empty()) throw InputError("rendezvous: a run id for a prefix store must not be empty");
  TROUPE_ENFORCE(inner != nullptr);
  return std::make_unique<PrefixStore>(std::move(inner), std::move(run_id));
}

}  // namespace troupe::rendezvous
