// troupe: the command-line front of libtroupe. It only parses and wires; the work is in the
// library.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <exception>

#include "apps/commands.h"
#include "troupe/error.h"

int main(int argc, char** argv) {
  CLI::App app{"troupe: distributed deep-learning training"};
  app.require_subcommand(1);
  troupe::apps::addConvertCommand(app);
  troupe::apps::addTrainCommand(app);
  troupe::apps::addLaunchCommand(app);
  troupe::apps::addInfoCommand(app);
  troupe::apps::addBenchCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const troupe::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return 1;
  }
  return 0;
}
