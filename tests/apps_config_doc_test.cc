// docs/config.md is what `troupe docs config` prints: the key table rendered, so that the document
// cannot drift from the code.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "actors/config/train_config.h"
#include "cli_util.h"
#include "kernels/net.h"

namespace troupe::actors {
namespace {

using testing::contains;

using testing::runCommand;
using testing::slurp;
using testing::sourceDir;
using testing::troupeBinary;

std::string keyRow(const std::string& key) {
  return "| `" + key + "` |";
}

TEST(ConfigReference, TheCheckedInDocsConfigMdIsTheGeneratedOne) {
  const std::string path = sourceDir() + "/docs/config.md";
  const std::string checked_in = slurp(path);
  const std::string generated = configReferenceMarkdown();
  if (checked_in == generated) return;
  std::string missing;
  for (const auto& key : configKeys()) {
    if (!contains(checked_in, keyRow(key.name))) missing += " " + key.name;
  }
  // Rows of keys the code no longer has: "| `name` |" lines of the file that it does not generate.
  std::string gone;
  std::istringstream lines(checked_in);
  for (std::string line; std::getline(lines, line);) {
    const auto end = line.find("` |");
    if (line.starts_with("| `") && end != std::string::npos &&
        !contains(generated, line.substr(0, end + 3))) {
      gone += " " + line.substr(3, end - 3);
    }
  }
  ADD_FAILURE() << path << " is not what the code generates"
                << (missing.empty() ? "" : "; keys missing from it:" + missing)
                << (gone.empty() ? "" : "; rows the code no longer has:" + gone)
                << (missing.empty() && gone.empty() ? " (a row or the introduction differs)" : "")
                << ". Regenerate it: build/bin/troupe docs config > docs/config.md";
}

TEST(ConfigReference, EveryKeyHasARowWithItsTypeValuesAndDefault) {
  const std::string doc = configReferenceMarkdown();
  for (const auto& key : configKeys())
    EXPECT_TRUE(contains(doc, keyRow(key.name))) << key.name;
  EXPECT_TRUE(contains(doc,
                       "| `batch_size` | integer | `[1, 1048576]` | `64` | inputs per step, in "
                       "total over the replicas |"))
      << doc;
  EXPECT_TRUE(
      contains(doc, "| `momentum` | number | `[0, 1)` | `0.9` | sgd's and lars' momentum |"))
      << doc;
  EXPECT_TRUE(contains(doc, "| `nesterov` | boolean | `true`, `false` | `false` |")) << doc;
  EXPECT_TRUE(contains(doc, "| `model` | string |  | `lenet` |")) << doc;
  EXPECT_TRUE(contains(doc, "| `train_data` | string |  | (none) | training database; with"))
      << doc;
}

TEST(ConfigReference, EveryLayerTypeIsListedWithItsArguments) {
  const std::string doc = configReferenceMarkdown();
  for (const auto& type : kernels::layerTypes()) {
    EXPECT_TRUE(contains(doc, "`" + type.name + "`")) << type.name;
    for (const auto& arg : type.args)
      EXPECT_TRUE(contains(doc, arg.shown)) << type.name << " " << arg.key;
  }
}

TEST(ConfigReference, APipeInAHelpTextDoesNotEndItsCell) {
  EXPECT_TRUE(contains(configReferenceMarkdown(),
                       "tcp://HOST:PORT \\| file:///shared/dir \\| "
                       "redis://[:PASSWORD@]HOST[:PORT] |"));
}

TEST(ConfigReference, EveryLauncherVariableIsListedWithItsKey) {
  const std::string doc = configReferenceMarkdown();
  ASSERT_FALSE(launcherVariables().empty());
  for (const auto& [variable, key] : launcherVariables())
    EXPECT_TRUE(contains(doc, "| `" + variable + "` | `" + key + "` |")) << variable;
  EXPECT_TRUE(contains(doc, "TROUPE_LOG_LEVEL")) << doc;
}

TEST(ConfigReference, TroupeDocsConfigPrintsIt) {
  const auto r = runCommand(troupeBinary() + " docs config");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, configReferenceMarkdown());
}

}  // namespace
}  // namespace troupe::actors
