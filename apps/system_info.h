// What `troupe info` says for a bug report: this build (version, compiler, libraries), this
// machine (CPU, cores, the kernels' instruction set, memory) and what the build can run
// (schedules, rendezvous stores, launchers), as text for people or JSON for machines.
#pragma once

#include <string>
#include <vector>

namespace troupe::apps {

// One fact: "compiler: GCC 12.2.0" in the text, "compiler": "GCC 12.2.0" in the JSON.
struct InfoField {
  std::string label;  // for people
  std::string key;    // JSON key, snake_case
  std::string value;
  bool number = false;  // a JSON number (value holds its digits) rather than a string
};

// One thing the build can run: a schedule, a rendezvous store or a launcher.
struct InfoItem {
  std::string name;
  std::vector<std::string> mxnet;  // MXNet's kvstore names that select it, accepted as they are
  std::string description;
};

// A section: fields (an object in the JSON) or items (an array of objects).
struct InfoSection {
  std::string title;  // "build", "libraries"; the first: buildSummary()
  std::string key;
  std::vector<InfoField> fields;
  std::vector<InfoItem> items;
};

// Gathers every section. Reads /proc, /sys/fs/cgroup, PATH and the CPU kernels' choice (a bad
// TROUPE_MAX_CPU_ISA is said, not thrown); never fails for a file it cannot read. Any thread.
std::vector<InfoSection> systemInfo();

// "label: value" lines under each title (items as "name (MXNet: names): description"; a size in
// bytes as GiB first).
std::string infoText(const std::vector<InfoSection>& sections);

// One JSON object: a member per section, keyed by InfoSection::key.
std::string infoJson(const std::vector<InfoSection>& sections);

}  // namespace troupe::apps
